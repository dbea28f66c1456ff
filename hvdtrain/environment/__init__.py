"""Who this process is in a job: rank, size and launcher, from one place (process.py); the caller's os.environ
around an in-process run (caller.py)."""
