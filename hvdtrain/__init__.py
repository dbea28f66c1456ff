"""hvdtrain: a maintained Horovod trainer for PyTorch 2.x."""
__version__ = "0.1.0"
