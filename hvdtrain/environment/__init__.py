"""Who this process is in a job: rank, size and launcher, from one place."""
