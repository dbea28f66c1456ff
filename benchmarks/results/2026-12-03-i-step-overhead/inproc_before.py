import sys, time, statistics as st, torch, horovod.torch as hvd
sys.path.insert(0, "/work/main")
from benchmarks.worker import bench_config, workload, StepClock, plain_loop
from hvdtrain.distributed import dist
from hvdtrain.config.train_config import load_config
import argparse, hvdtrain
model_name = sys.argv[1] if len(sys.argv) > 1 else "mlp"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 150
dist.init(dist.horovod_env(load_config(None, [])))
torch.set_num_threads(1)
args = argparse.Namespace(model=model_name, smoke=False, device="cpu")
config = bench_config(model_name, steps + 1, 1, False, 1)
res = {"hvdtrain": [], "horovod": []}
for r in range(12):
    for v in (["hvdtrain", "horovod"] if r % 2 == 0 else ["horovod", "hvdtrain"]):
        torch.manual_seed(0)
        work = workload(args, config, 0, 1)
        model = work["model"]
        clock = StepClock(model)
        if v == "hvdtrain":
            hvdtrain.Trainer(model, work["train"], None, config=config, step_fn=work["step_fn"]).fit()
        else:
            opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            plain_loop(model, opt, work["loader"], steps + 1, torch.device("cpu"), horovod=True)
        t = clock.step_ms(10)
        res[v].append(st.median(t))
    print(r, " ".join(f"{k}={v[-1]:.2f}" for k, v in res.items()), flush=True)
for k, v in res.items():
    print(k, "median %.3f" % st.median(v), "min %.3f" % min(v))
print("ratio horovod/hvdtrain (median of medians): %.3f" % (st.median(res["horovod"]) / st.median(res["hvdtrain"])))
