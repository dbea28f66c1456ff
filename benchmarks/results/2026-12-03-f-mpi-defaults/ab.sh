#!/bin/bash
# A/B of hvdtrain's MPI defaults (dist.mpi_defaults, worktree snapshot in /tmp/prof2) against the
# previous behaviour (HVDTRAIN_MPI_DEFAULTS=0) and yield only, DDP alternated beside.
cd /tmp/prof2
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=/tmp/prof2
OUT=/work/wt-20/benchmarks/results/2026-12-03-f-mpi-defaults
run() { python -m benchmarks.ab --backend mpi --out $OUT "$@"; }
S="default: yield:HVDTRAIN_MPI_DEFAULTS=yield off:HVDTRAIN_MPI_DEFAULTS=0 ddp@ddp:"
run --model cnn --reps 4 --steps 60 --name cnn_mpi $S
run --model mlp --reps 2 --steps 60 --name mlp_mpi $S
run --model transformer --reps 2 --steps 40 --name transformer_mpi default: off:HVDTRAIN_MPI_DEFAULTS=0 ddp@ddp:
run --model resnet18 --reps 2 --steps 15 --name resnet18_mpi default: off:HVDTRAIN_MPI_DEFAULTS=0 ddp@ddp:
