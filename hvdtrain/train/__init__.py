"""The training loop and what it is made of: optimizer, LR schedule, precision, checkpoints, evaluation."""
