#!/bin/bash
# usage: prof.sh NAME MODEL BACKEND SETTING...   profiles rank 0 of one long run with perf (dwarf call graphs)
# SNAP (the code), OUT_ROOT (where prof-NAME goes) and PY (the interpreter) default to this run's own paths.
name=$1; model=$2; backend=$3; shift 3
cd ${SNAP:-/tmp/E/snap}
out=${OUT_ROOT:-/tmp/E}/prof-$name; mkdir -p $out
${PY:-.venv/bin/python} -m benchmarks.ab --model $model --backend $backend --reps 1 --steps ${STEPS:-500} "$@" > $out/ab.log 2>&1 &
abpid=$!
pid=""
for i in $(seq 120); do
  sleep 1
  for p in $(pgrep -f "benchmarks.worker"); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qE '^(HOROVOD_RANK|RANK|OMPI_COMM_WORLD_RANK)=0$'; then
      if tr '\0' ' ' < /proc/$p/cmdline | grep -q -- "--result"; then pid=$p; fi
    fi
  done
  [ -n "$pid" ] && break
done
echo "rank0 pid $pid" > $out/info
sleep ${SETTLE:-15}
ls /proc/$pid/task > $out/tids
for t in $(cat $out/tids); do echo "$t $(cat /proc/$pid/task/$t/comm) $(awk '{print $14+$15}' /proc/$pid/task/$t/stat)"; done > $out/tasks_before
perf record -F ${FREQ:-1999} --call-graph dwarf,8192 -p $pid -o $out/perf.data -- sleep ${DUR:-6} 2> $out/perf.err
for t in $(cat $out/tids); do echo "$t $(cat /proc/$pid/task/$t/comm) $(awk '{print $14+$15}' /proc/$pid/task/$t/stat)"; done > $out/tasks_after
uptime >> $out/info
wait $abpid
