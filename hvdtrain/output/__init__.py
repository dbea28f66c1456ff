"""What rank 0 shows and keeps: the console, the run directory and the history of metrics."""
