"""Per-thread CPU per step of rank 0, np=2, variants alternated (the one-off behind the README's
profile table; run from a copy of the repo as `python profile_threads.py cnn 2 60`)."""
import json
import os
import sys

from benchmarks.run import launch

model, reps, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
specs = [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
         {"name": "hvdtrain-gloo", "variant": "hvdtrain", "launcher": "horovodrun", "backend": "gloo"},
         {"name": "hvdtrain-mpi", "variant": "hvdtrain", "launcher": "horovodrun", "backend": "mpi"},
         {"name": "horovod-gloo", "variant": "horovod", "launcher": "horovodrun", "backend": "gloo"},
         {"name": "compute", "variant": "compute", "launcher": "horovodrun", "backend": "gloo"}]
env = {"PYTHONPATH": "/tmp/prof:/work/wt-20", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
out = []
for rep in range(reps):
    for s in specs if rep % 2 == 0 else specs[::-1]:
        load = os.getloadavg()[0]
        rec = launch(s, 2, ["--steps", steps, "--warmup", "5", "--threads", "1", "--pin", "--model", model], env, 300)
        if "error" in rec:
            print(s["name"], rec["error"], rec["output_tail"][-500:])
            continue
        th = rec["threads_cpu"]
        main = sum(t["cpu_ms_per_step"] for t in th if t["born"] == "main")
        comm = sum(t["cpu_ms_per_step"] for t in th if t["born"] == "comm-init")
        other = sum(t["cpu_ms_per_step"] for t in th if t["born"] not in ("main", "comm-init"))
        print(f"rep{rep} {s['name']:<14} load {load:4.2f} best {rec['best_ms']:6.1f} median {rec['median_ms']:6.1f} "
              f"cpu/step main {main:6.2f} comm-init {comm:6.2f} other {other:6.2f}  "
              + " ".join(f"{t['born']}:{t['name']}:{t['cpu_ms_per_step']:.2f}" for t in th[:6]), flush=True)
        out.append({"name": s["name"], "rep": rep, "load1": load,
                    **{k: rec[k] for k in ("best_ms", "median_ms", "threads_cpu", "step_ms")}})
with open(f"/tmp/prof/threads_{model}.json", "w") as f:
    json.dump(out, f)
