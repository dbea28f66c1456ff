"""A test dataset plug-in that leaves a mark when it loads: the synthetic data, after appending one line
(this process's PID) to the file named by $LOAD_PROBE_FILE, so a test can tell whether a run loaded data."""
import os

from hvdtrain.data.datasets import synthetic


def marked_synthetic(config):
    with open(os.environ["LOAD_PROBE_FILE"], "a") as handle:
        handle.write(f"{os.getpid()}\n")
    return synthetic(config)
