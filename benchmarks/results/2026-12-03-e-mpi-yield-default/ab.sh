#!/bin/bash
# A/B of hvdtrain's new default (Open MPI yields when idle) against the old behaviour, DDP alternated beside.
cd /tmp/prof
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=/work/wt-20
OUT=/work/wt-20/benchmarks/results/2026-12-03-e-mpi-yield-default
run() { python -m benchmarks.ab --backend mpi --out $OUT "$@"; }
run --model mlp --reps 4 --steps 60 --name mlp_mpi default: noyield:OMPI_MCA_mpi_yield_when_idle=0 noofi:OMPI_MCA_btl=^ofi ddp@ddp:
run --model cnn --reps 4 --steps 60 --name cnn_mpi default: noyield:OMPI_MCA_mpi_yield_when_idle=0 noofi:OMPI_MCA_btl=^ofi ddp@ddp:
run --model transformer --reps 2 --steps 40 --name transformer_mpi default: noyield:OMPI_MCA_mpi_yield_when_idle=0 ddp@ddp:
run --model resnet18 --reps 2 --steps 20 --name resnet18_mpi default: noyield:OMPI_MCA_mpi_yield_when_idle=0 ddp@ddp:
# Gloo ignores the setting: check that (CNN), and the hand-written Horovod loop with it
run --model cnn --backend gloo --reps 2 --steps 60 --name cnn_gloo default: noyield:OMPI_MCA_mpi_yield_when_idle=0
