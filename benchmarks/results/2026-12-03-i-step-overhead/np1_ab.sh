#!/bin/bash
# np=1 MLP A/B, alternating: hvdtrain (keep_host_memory, the new default), hvdtrain with it off (the
# old behaviour), and the hand-written Horovod loop. 10 rounds x 400 timed steps, one process each.
cd "$(dirname "$0")/../../.."
out=benchmarks/results/2026-12-03-i-step-overhead/np1
mkdir -p "$out"
for r in $(seq 1 10); do
  for v in hvdtrain off horovod; do
    case $v in
      off) args=(--variant hvdtrain --hvdtrain-args "--keep-host-memory false");;
      *) args=(--variant $v);;
    esac
    /usr/bin/time -f "%R" -o "$out/$v-$r.minflt" .venv/bin/python -m benchmarks.worker "${args[@]}" --model mlp \
      --steps 400 --warmup 10 --result "$out/$v-$r.json" >/dev/null 2>&1
  done
done
