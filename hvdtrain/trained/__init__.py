"""What training left behind, read back: a finished run (finished_run.py) for `hvdtrain predict`, `hvdtrain
compress` and tuning's best.yaml. Beside train/, which writes what is read here, and above checkpoint/, whose
files are one way a run is read."""
