"""Experiment tracking: rank 0 mirrors its run folder into MLflow (or W&B) from a background thread.

The run folder stays the record of a run; the tracker is a copy for comparing runs. So a tracker that
cannot be reached costs one warning and nothing else: the training thread only puts records on a queue,
a background thread sends them in batches, and the end of a run waits for it a bounded time.

Only the process that `environment.process` calls rank 0 tracks (never a RANK-like variable read here:
under `horovodrun --mpi` there is no HOROVOD_RANK, which is how peers end up with one run per worker).
"""
from hvdtrain.tracking.tracker import Tracker, start

__all__ = ["Tracker", "start"]
