"""Who this process is in a job: rank, size and launcher, from one place (process.py); the caller's os.environ
around an in-process run (caller.py); which variables are credentials (credentials.py) and the 0600 file they
travel in (secrets_file.py)."""
