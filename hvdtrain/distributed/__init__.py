"""Everything that talks to Horovod. Only `dist.py` imports horovod.torch; the rest of hvdtrain calls it."""
