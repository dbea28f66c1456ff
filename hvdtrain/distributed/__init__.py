"""Everything that talks to Horovod, split by concern; only `runtime.py` imports horovod.torch and the rest
of hvdtrain calls these modules (model code never imports Horovod)."""
