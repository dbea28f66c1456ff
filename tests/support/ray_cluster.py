"""A real Ray cluster on loopback for tests: a head and worker nodes, each its own `ray start --block`
process with its own node IP (127.0.0.x) and node id, each in a session (process group) of its own so a
node can be killed whole. Also the functions the Ray tests run on the actors (imported there by name).

Ray treats 127.0.0.1 as "localhost" and swaps in the machine's external address, so the nodes use
127.0.0.10 and up. Every port is given explicitly: nodes on one machine would otherwise collide on the
fixed defaults (the dashboard agent's 52365) or race for the same random ones.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .paths import BIN, ROOT

HEAD_IP = "127.0.0.10"


_TAKEN: set[int] = set()


def _free_port_block(count: int) -> int:
    """The first of `count` consecutive ports free on every address now and not handed out before: some of
    Ray's servers bind 0.0.0.0, so nodes on one machine need disjoint ports even with distinct IPs. Drawn
    below Linux's ephemeral range (32768+), where outgoing connections would take them meanwhile."""
    rng = random.Random()
    for _ in range(500):
        first = rng.randrange(20000, 32700 - count)
        block = set(range(first, first + count))
        if block & _TAKEN:
            continue
        try:
            for port in block:
                with socket.socket() as s:
                    s.bind(("", port))
        except OSError:
            continue
        _TAKEN.update(block)
        return first
    raise RuntimeError(f"no block of {count} free ports")


class RayCluster:
    def __init__(self, folder: Path, workers: int = 2, cpus_per_node: int = 1) -> None:
        self.folder = folder
        self.nodes: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0",
                    # Ray enables token auth on its own when ~/.ray/auth_token exists (any local ray.init
                    # writes one) and then worker nodes started without it are refused: loopback needs none.
                    "RAY_AUTH_MODE": "disabled",
                    # Actors import the tests' helper functions by name, and `hvdtrain` runs as a job entry point.
                    "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.env.pop("RAY_ADDRESS", None)
        self.gcs_port = 0
        self.dashboard_port = 0
        self.worker_cpus = cpus_per_node
        self.worker_ips = [f"127.0.0.{11 + i}" for i in range(workers)]

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://{HEAD_IP}:{self.dashboard_port}"

    def _ports(self) -> tuple[list[str], int]:
        first = _free_port_block(40)
        names = ["--node-manager-port", "--object-manager-port", "--runtime-env-agent-port",
                 "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--metrics-export-port"]
        args = [f"{name}={first + i}" for i, name in enumerate(names)]
        # Worker processes (actors, the job supervisor) take ports from this range.
        return args + [f"--min-worker-port={first + 10}", f"--max-worker-port={first + 39}"], first

    def _start(self, name: str, ip: str, args: list[str]) -> None:
        ports, _ = self._ports()
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - the node process owns it
        self.nodes[name] = subprocess.Popen(
            [str(BIN / "ray"), "start", "--block", f"--node-ip-address={ip}", "--object-store-memory=80000000",
             "--disable-usage-stats", *ports, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
            cwd=self.folder, start_new_session=True)

    def start(self, timeout: float = 120) -> None:
        self.gcs_port = _free_port_block(1)
        self.dashboard_port = _free_port_block(1)
        client_port = _free_port_block(1)
        # The head runs no actors (0 CPUs): every worker lands on a worker node. Its dashboard serves `ray job`.
        self._start("head", HEAD_IP, ["--head", f"--port={self.gcs_port}", "--num-cpus=0",
                                      "--include-dashboard=true", f"--dashboard-host={HEAD_IP}",
                                      f"--dashboard-port={self.dashboard_port}",
                                      f"--ray-client-server-port={client_port}",
                                      f"--temp-dir={self.folder / 'ray'}"])
        self._wait_for("head", timeout)
        for i, ip in enumerate(self.worker_ips):
            # A temp dir per node: nodes sharing one would bind the same Unix sockets (plasma store, raylet).
            self._start(f"worker{i}", ip, [f"--address={self.address}", f"--num-cpus={self.worker_cpus}",
                                           f"--temp-dir={self.folder / f'ray{i}'}"])
        for i in range(len(self.worker_ips)):
            self._wait_for(f"worker{i}", timeout)
        self.wait_for_nodes(1 + len(self.worker_ips), timeout)

    def add_worker(self, timeout: float = 120) -> str:
        """Start one more worker node (the next loopback address); its name."""
        i = len(self.worker_ips)
        self.worker_ips.append(f"127.0.0.{11 + i}")
        name = f"worker{i}"
        self._start(name, self.worker_ips[i], [f"--address={self.address}", f"--num-cpus={self.worker_cpus}",
                                               f"--temp-dir={self.folder / f'ray{i}'}"])
        self._wait_for(name, timeout)
        return name

    def alive(self) -> list[str]:
        return [name for name, proc in self.nodes.items() if proc.poll() is None]

    def alive_workers(self) -> dict[str, str]:
        """Live worker nodes: name -> IP."""
        return {f"worker{i}": ip for i, ip in enumerate(self.worker_ips) if self.nodes[f"worker{i}"].poll() is None}

    def alive_worker_ips(self) -> set[str]:
        return set(self.alive_workers().values())

    def top_up(self, workers: int, timeout: float = 120) -> None:
        """Start worker nodes until `workers` are alive (after a test killed some), and wait until they count."""
        if len(self.alive_worker_ips()) >= workers:
            return
        while len(self.alive_worker_ips()) < workers:
            self.add_worker(timeout)
        self.wait_for_nodes(len(self.alive()), timeout)

    def _wait_for(self, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        log = self.folder / f"{name}.log"
        while time.monotonic() < deadline:
            if "Ray runtime started" in log.read_text():
                return
            if self.nodes[name].poll() is not None:
                break
            time.sleep(0.3)
        raise RuntimeError(f"ray node {name} did not start:\n{log.read_text()[-3000:]}")

    def wait_for_nodes(self, count: int, timeout: float) -> None:
        """Until the head's GCS lists `count` live nodes (a started raylet registers a moment later)."""
        script = ("import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                  "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + timeout
        alive = ""
        while time.monotonic() < deadline:
            proc = subprocess.run([sys.executable, "-c", script, self.address], env=self.env,
                                  capture_output=True, text=True, timeout=timeout)
            alive = proc.stdout.strip()
            if alive == str(count):
                return
            time.sleep(1)
        raise RuntimeError(f"{alive or 'no'} Ray nodes alive, expected {count}")

    def kill(self, name: str) -> None:
        """SIGKILL a node's whole session: `ray start`, its raylet, agents and the workers and actors it runs
        (Ray puts each worker in a process group of its own, but they stay in the session we started)."""
        proc = self.nodes[name]
        for pid in session_pids(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Every node, worker nodes first; never `ray stop` (it would stop every Ray on the machine)."""
        for name in reversed(list(self.nodes)):
            self.kill(name)


def session_pids(session: int) -> list[int]:
    """PIDs of the processes in session `session` (one we started with start_new_session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# --- run on the actors -----------------------------------------------------------------------------------

def fit_and_report(config, secret_name: str) -> dict:
    """Train, then say where this actor ran, whether the credential arrived, and whether its value shows in
    any process's command line on this machine (every node of the test cluster is on it)."""
    import ray

    import hvdtrain

    history = hvdtrain.fit(config)
    value = os.environ.get(secret_name, "")
    on_command_lines = []
    for entry in Path("/proc").iterdir():
        try:
            if value and value.encode() in (entry / "cmdline").read_bytes():
                on_command_lines.append(entry.name)
        except OSError:
            continue
    return {"history": history, "node_id": ray.get_runtime_context().get_node_id(),
            "secret": value, "on_command_lines": on_command_lines}
