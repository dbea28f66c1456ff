"""Joining srun's Gloo world moved to train/slurm_gloo.py, where a script's Trainer reaches it too (through
train/run_start.py, which `python -m hvdtrain` uses as well). This name stays for callers that import it here."""
from __future__ import annotations

from hvdtrain.train.slurm_gloo import join

__all__ = ["join"]
