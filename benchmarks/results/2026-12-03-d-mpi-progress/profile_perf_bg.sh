#!/bin/bash
# perf the busiest non-main thread of rank 0 of hvdtrain CNN np=2 with $1 backend
backend=$1; extra=$2
cd /tmp/prof
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=/tmp/prof:/work/wt-20 OMP_NUM_THREADS=1
env $extra horovodrun -np 2 -H localhost:2 --$backend --network-interfaces lo python -m benchmarks.worker --variant hvdtrain --launcher horovodrun --model cnn --steps 250 --pin --threads 1 > /tmp/prof/perf_run_$backend.log 2>&1 &
sleep 25
pid=$(for p in $(pgrep -f "model cnn --steps 250"); do [ "$(cat /proc/$p/comm)" = python ] && echo $p; done | head -1)
echo pid $pid
for t in /proc/$pid/task/*; do echo "$(basename $t) $(cut -d' ' -f14,15 $t/stat) $(cat $t/comm)"; done
tid=$(for t in /proc/$pid/task/*; do tt=$(basename $t); [ $tt = $pid ] && continue; echo "$(awk '{print $14+$15}' $t/stat) $tt"; done | sort -rn | head -1 | cut -d' ' -f2)
echo busiest bg tid $tid
perf record -g -t $tid -o /tmp/prof/perf_$backend.data -- sleep 4 2>&1 | tail -1
perf report -i /tmp/prof/perf_$backend.data --no-children --stdio --sort dso,symbol 2>/dev/null | grep -v "^#" | grep "%" | head -25
wait
