"""Benchmarks where the network is the bottleneck: one rank per network-namespace host, every host's
link limited by tc tbf (this kernel has tbf, not netem).

    python -m benchmarks.run --hosts 2,3 --link 1gbit --models resnet18,mlp --rounds 2 --steps 8 --out DIR
    python -m benchmarks.run --hosts 2 --smoke --out DIR        # CI: tiny MLP, two launches

The hosts come from tests/support/netns_cluster.py (the cluster tests' helper: namespaces on a bridge, one
sshd per host, a launcher namespace), imported as `tests.support.netns_cluster`, so benchmarks and tests share
one implementation of the namespace setup and its cleanup. Needs root, sshd and tc.

Variants at np>1: DDP (one torchrun per host, c10d rendezvous on host1), the compute-only step
(each rank alone), and per Horovod backend hvdtrain and the hand-written loop (horovodrun in the
launcher namespace, ssh into the hosts), plus hvdtrain with --compression fp16 and bf16 on the first backend.
np=1 runs hvdtrain and the plain loop in host1 (no traffic). Each group alternates its variants
A B C, C B A. Every rank counts the bytes its host sent over the timed steps (/proc/net/dev in its
namespace); benchmarks/netreport.py turns them into the ring bound and the fractions.

Entered through benchmarks/run.py (--hosts), which parses the options and calls main_network(); this
module takes launching and retrying from benchmarks/harness.py and imports nothing from run.py.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import netreport
from benchmarks.ab import launch_spec
from benchmarks.harness import BIN, ROOT, git_head, once_more, run_job
from tests.support.netns_cluster import IFACE, SSH_PORT, NamespaceCluster, rate_bits

RDZV_PORT = 29400


def net_variants(np: int, backends: list[str], smoke: bool) -> list[dict[str, Any]]:
    """What runs in one (model, np) group over the limited links."""
    if np == 1:
        return [{"name": "single", "variant": "single", "launcher": "python"},
                {"name": "hvdtrain", "variant": "hvdtrain", "launcher": "python"}]
    if smoke:
        return [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
                {"name": f"hvdtrain-{backends[0]}", "variant": "hvdtrain", "launcher": "horovodrun",
                 "backend": backends[0]}]
    rows = [{"name": "ddp", "variant": "ddp", "launcher": "torchrun"},
            {"name": "compute", "variant": "compute", "launcher": "horovodrun", "backend": backends[0]}]
    for backend in backends:
        rows += [{"name": f"hvdtrain-{backend}", "variant": "hvdtrain", "launcher": "horovodrun", "backend": backend},
                 {"name": f"horovod-{backend}", "variant": "horovod", "launcher": "horovodrun", "backend": backend}]
    for wire in ("fp16", "bf16"):   # half the bytes: fp16's range, or fp32's (bf16 needs the patched Horovod)
        rows.append({"name": f"hvdtrain-{backends[0]}-{wire}", "variant": "hvdtrain", "launcher": "horovodrun",
                     "backend": backends[0], "hvdtrain_args": f"--compression {wire}"})
    return rows


def env_variant(text: str, backend: str) -> dict[str, Any]:
    """--variant NAME:KEY=VALUE,...: hvdtrain on `backend` with that environment (an A/B of one setting);
    the key ARGS gives hvdtrain's command-line options instead, e.g. "b10:ARGS=--bucket-mb 10".
    NAME@VARIANT[-BACKEND]:... picks its own variant as in benchmarks.ab, e.g. "ddp1@ddp:BENCH_GLOO_THREADS=1"."""
    name, _, assignments = text.partition(":")
    env = dict(kv.split("=", 1) for kv in assignments.split(",") if kv)
    spec = {"name": name.partition("@")[0], **launch_spec(name, "hvdtrain", backend)}
    if "ARGS" in env:
        spec["hvdtrain_args"] = env.pop("ARGS")
    return {**spec, "env": env}


def in_namespace(cluster: NamespaceCluster, node: Any, *cmd: str) -> list[str]:
    """`cmd` inside a node's namespace, with the node's own host name (Horovod's Gloo context and
    torchrun's rendezvous look their host name up in /etc/hosts, which netns_cluster wrote)."""
    return ["ip", "netns", "exec", node.namespace, "unshare", "--uts", "sh", "-c",
            f'hostname {node.role} && exec "$0" "$@"', *cmd]


def commands(spec: dict[str, Any], np: int, cluster: NamespaceCluster, worker: list[str]) -> list[list[str]]:
    """The processes one job starts here: one launcher (horovodrun, or the plain process), or one
    torchrun per host (DDP)."""
    python = [sys.executable, *worker]
    hosts = cluster.workers[:np]
    if spec["launcher"] == "python":
        return [in_namespace(cluster, hosts[0], *python)]
    if spec["launcher"] == "torchrun":
        rdzv = f"{hosts[0].address}:{RDZV_PORT}"
        run_id = uuid.uuid4().hex[:8]
        return [in_namespace(cluster, node, str(BIN / "torchrun"), f"--nnodes={np}", "--nproc-per-node=1",
                             "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}", f"--rdzv-id={run_id}",
                             "--no-python", *python) for node in hosts]
    # horovodrun passes pml, btl and (from --network-interfaces) btl_tcp_if_include to mpirun itself,
    # and mpirun refuses a parameter given twice: only the out-of-band channel's interface is added
    mpi = ["--mpi-args", f"-mca oob_tcp_if_include {IFACE}"] if spec["backend"] == "mpi" else []
    launch = [str(BIN / "horovodrun"), "-np", str(np), "-H", ",".join(f"{n.role}:1" for n in hosts),
              "-p", str(SSH_PORT), "-i", str(cluster.key), "--network-interfaces", IFACE,
              "--start-timeout", "120", "--disable-cache", f"--{spec['backend']}", *mpi, *python]
    return [in_namespace(cluster, cluster.launcher, *launch)]


def run_jobs(cmds: list[list[str]], env: dict[str, str], timeout: int) -> tuple[str, int]:
    """All of a job's processes at once (DDP: one torchrun per host); the first failure's exit code."""
    if len(cmds) == 1:
        return run_job(cmds[0], env, timeout)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(len(cmds)) as pool:
        done = list(pool.map(lambda c: run_job(c, env, timeout), cmds))
    code = next((c for _, c in done if c != 0), 0)
    return "\n".join(f"--- process {i}:\n{out[-2500:]}" for i, (out, _) in enumerate(done)), code


def launch_once(spec: dict[str, Any], np: int, cluster: NamespaceCluster, worker_args: list[str],
                env: dict[str, str], timeout: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hvdtrain-netbench-") as scratch:
        result = Path(scratch) / "result.json"
        worker = ["-m", "benchmarks.worker", "--variant", spec["variant"], "--launcher", spec["launcher"],
                  "--result", str(result), *worker_args]
        if spec.get("hvdtrain_args"):
            worker += ["--hvdtrain-args", spec["hvdtrain_args"]]
        # sshd's privilege separation folder: another cluster's cleanup on this machine (a test run
        # beside the benchmark) removes it when it made it; our sshds refuse connections without it
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        cpu = netreport.CpuShare(cluster)
        out, code = run_jobs(commands(spec, np, cluster, worker), {**os.environ, **env, **spec.get("env", {})},
                             timeout)
        machine = cpu.stop()
        record = json.loads(result.read_text()) if code == 0 and result.exists() else None
        ranks = sorted((json.loads(p.read_text()) for p in Path(scratch).glob("result.json.rank*")),
                       key=lambda r: r["rank"])
    if code != 0:
        end_strays(cluster)
    if record is None:
        return {"error": f"exit {code}", "output_tail": out[-4000:], **machine}
    return {**record, "tx_bytes_per_rank": [r["tx_bytes_per_step"] for r in ranks], **machine}


def end_strays(cluster: NamespaceCluster) -> None:
    """SIGKILL what a failed job left in the hosts' namespaces (ranks can outlive their ssh
    session), sparing each host's sshd: only processes in namespaces this run made."""
    for node in cluster.workers:
        listed = subprocess.run(["ip", "netns", "pids", node.namespace], capture_output=True, text=True).stdout
        for pid in (int(p) for p in listed.split()):
            if node.sshd is None or pid != node.sshd.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def launch(spec: dict[str, Any], np: int, cluster: NamespaceCluster, worker_args: list[str],
           env: dict[str, str], timeout: int) -> dict[str, Any]:
    """launch_once, and once more after a failure (kept in the record), as benchmarks.harness.launch does."""
    return once_more(f"[netbench] {spec['name']} np={np}",
                     lambda: launch_once(spec, np, cluster, worker_args, env, timeout))


def set_up(cluster: NamespaceCluster, link: str) -> None:
    """Namespaces, sshd per host, and every host's link limited to `link` each way."""
    cluster.create_namespaces()
    cluster.start()
    for node in cluster.workers:
        cluster.limit(node, link)


RECEIVE = """import socket, sys, time
server = socket.create_server((sys.argv[1], 29411))
print("ready", flush=True)
conn, _ = server.accept()
got, start = conn.recv(1 << 20), time.perf_counter()
total = 0
while chunk := conn.recv(1 << 20):
    total += len(chunk)
print(total * 8 / (time.perf_counter() - start) / 1e6)
"""
SEND = """import socket, sys
conn = socket.create_connection((sys.argv[1], 29411))
conn.sendall(bytes(1 << 20))
conn.sendall(bytes(int(sys.argv[2])))
conn.close()
"""


def probe_link(cluster: NamespaceCluster, megabytes: int = 48) -> float:
    """One TCP stream host1 -> host2 through both tbfs, in Mbit/s (after a first MB that fills the
    burst): what the limited link carries here with this machine's CPU, next to the nominal rate."""
    sender, receiver = cluster.workers[0], cluster.workers[1]
    with subprocess.Popen(in_namespace(cluster, receiver, sys.executable, "-c", RECEIVE, receiver.address),
                          stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready": listening
        subprocess.run(in_namespace(cluster, sender, sys.executable, "-c", SEND, receiver.address,
                                    str(megabytes << 20)), check=True, timeout=120)
        return float(proc.stdout.readline())


def run_network(args: argparse.Namespace) -> dict[str, Any]:
    """Every (model, np) group over one cluster of max(hosts) namespaces, then the report."""
    hosts = [int(n) for n in str(args.hosts).split(",") if n]
    nps = [1, *hosts] if not args.smoke else hosts
    models = [m for m in args.models.split(",") if m]
    backends = [b for b in args.backends.split(",") if b]
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(args.threads), "BENCH_IFACE": IFACE,
           "GLOO_SOCKET_IFNAME": IFACE}  # DDP's gloo: the limited link, not lo
    env.update(kv.split("=", 1) for kv in args.env)
    worker_args = ["--warmup", str(args.warmup), "--threads", str(args.threads), "--steps", str(args.steps)]
    worker_args += ["--smoke"] if args.smoke else []
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count(),
            "loadavg_before": Path("/proc/loadavg").read_text().split()[:3], "link": args.link,
            "link_bits": rate_bits(args.link), "hosts": hosts, "rounds": args.rounds, "steps": args.steps,
            "warmup": args.warmup, "threads": args.threads, "pin": False, "smoke": args.smoke, "env": env,
            "argv": sys.argv[1:], "git": git_head(), "network": True}
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    cluster = NamespaceCluster(hosts=max(hosts), prefix=f"hvdb{os.getpid() % 100000}")
    meta["namespace_prefix"] = cluster.prefix
    try:
        set_up(cluster, args.link)  # inside the try: a half-made cluster is cleaned up too
        if len(cluster.workers) > 1:
            meta["link_probe_mbit"] = [round(probe_link(cluster)) for _ in range(2)]
            print(f"[netbench] one TCP stream over the {args.link} link: {meta['link_probe_mbit']} Mbit/s", flush=True)
        for model in models:
            for np in nps:
                group = f"{model}/np{np}"
                specs = [s for s in net_variants(np, backends, args.smoke)
                         if not args.only or s["name"] in args.only.split(",")]
                specs += [env_variant(v, backends[0]) for v in getattr(args, "variant", []) if np > 1]
                records: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in specs}
                for round_no in range(1 if args.smoke else args.rounds):
                    for spec in specs if round_no % 2 == 0 else specs[::-1]:
                        rec = launch(spec, np, cluster, [*worker_args, "--model", model], env, args.timeout)
                        records[spec["name"]].append(rec)
                        shown = (f"{rec['best_ms']:.1f} ms best, tx/rank {rec.get('tx_bytes_per_rank')}"
                                 if "best_ms" in rec else rec["error"])
                        print(f"[netbench] {group} round {round_no + 1} {spec['name']}: {shown} "
                              f"(load {rec['loadavg']}, others {rec['others_cpu_share']:.2f})", flush=True)
                groups[group] = {s["name"]: netreport.summarise_cell(s, records[s["name"]], np, meta["link_bits"])
                                 for s in specs}
    finally:
        problems = cluster.cleanup()
        if problems:
            print(f"[netbench] cleanup left: {problems}", file=sys.stderr)
    meta["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    return {"meta": meta, "groups": groups, "ratios": netreport.ratios(groups, backends, meta["link_bits"]),
            "scaling": netreport.scaling(groups, backends, meta["link_bits"])}


def main_network(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        print("benchmarks: --hosts needs root (network namespaces, sshd, tc)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # a stopped run (SIGTERM, as from `kill PID`) still tears its namespaces and sshds down
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"benchmarks: stopped by signal {signum}"))
    result = run_network(args)
    text = netreport.table(result)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text("```\n" + text + "\n```\n")
    print(text)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.md'}")
    failed = [f"{g} {r['name']}" for g, rows in result["groups"].items() for r in rows.values() if r.get("failed")]
    if failed:
        print(f"benchmarks: {len(failed)} variant(s) had failed runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
