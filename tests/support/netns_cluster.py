"""Several real hosts on one machine: network namespaces on a bridge, one sshd per host.

Used by the cluster tests and by benchmarks/network.py (imported as tests.support.netns_cluster). Each host
namespace runs its own /usr/sbin/sshd under `unshare --uts` (so it has its own host name); a
launcher namespace runs horovodrun. Only addresses inside our own namespaces are used (10.77.0.0/24
on a bridge with no address in the root namespace, so nothing is routed anywhere else). Keys live
in a temporary folder; nothing is written to ~/.ssh.

Why each piece is there (see shared/ENVIRONMENT.md):
- every namespace names its interface the same (`hvd0`): Horovod intersects interface names across
  hosts, and the launcher's too, so the launcher runs in a namespace of its own;
- `/etc/netns/NS/hosts` (bind-mounted over /etc/hosts by `ip netns exec`) makes each host's own name
  resolve to its namespace address: Horovod 0.28.1's Gloo context looks up its own host name;
- `/etc/netns/NS/ssh/ssh_config` turns off host key prompts and known_hosts writes for every ssh
  that horovodrun or mpirun starts there.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
IFACE = "hvd0"
SSH_PORT = 2222
SUBNET = "10.77.0"  # private, and only ever assigned inside our own namespaces


@dataclass
class Node:
    role: str        # host name inside the cluster: launcher, host1, host2
    namespace: str   # `ip netns` name, unique to this test process
    address: str
    sshd: subprocess.Popen | None = None


@dataclass
class NamespaceCluster:
    hosts: int = 2
    prefix: str = field(default_factory=lambda: f"hvdt{os.getpid() % 100000}")
    nodes: list[Node] = field(default_factory=list)
    keys: Path | None = None
    made_run_sshd: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def launcher(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    @property
    def key(self) -> Path:
        assert self.keys is not None
        return self.keys / "id_ed25519"

    # ------------------------------------------------------------ setup

    def create_namespaces(self) -> None:
        """Make the namespaces; raises CalledProcessError when this machine does not allow it."""
        roles = ["launcher"] + [f"host{i}" for i in range(1, self.hosts + 1)]
        for index, role in enumerate(roles):
            node = Node(role, f"{self.prefix}-{role}", f"{SUBNET}.{10 + index}")
            self.nodes.append(node)  # before creating, so cleanup covers a half-made one
            _run("ip", "netns", "add", node.namespace)

    def start(self, sshd: bool = True) -> None:
        """Bridge, addresses, name resolution, keys and (unless `sshd` is False) one sshd per host; waits
        until ssh works."""
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        for index, node in enumerate(self.nodes):
            veth = f"{self.prefix}v{index}"
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", IFACE, "netns", node.namespace)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            self.exec(node, "ip", "addr", "add", f"{node.address}/24", "dev", IFACE)
            self.exec(node, "ip", "link", "set", IFACE, "up")
            self.exec(node, "ip", "link", "set", "lo", "up")
        self.keys = Path(tempfile.mkdtemp(prefix="hvdtrain-two-hosts-"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdtrain-test", "-f", str(self.key))
        shutil.copy(self.key.with_suffix(".pub"), self.keys / "authorized_keys")
        hosts_text = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.role}\n" for n in self.nodes)
        for node in self.nodes:
            etc = Path("/etc/netns") / node.namespace
            (etc / "ssh").mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_text)
            (etc / "ssh" / "ssh_config").write_text(
                "Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n"
                "    LogLevel ERROR\n    BatchMode yes\n")
        if sshd:
            self.start_sshd()

    def start_sshd(self) -> None:
        """One sshd per host (those not already running); waits until ssh works."""
        if not Path("/run/sshd").is_dir():  # sshd's privilege separation folder (systemd makes it)
            Path("/run/sshd").mkdir(mode=0o755)
            self.made_run_sshd = True
        for node in self.workers:
            if node.sshd is None or node.sshd.poll() is not None:
                self._start_sshd(node)
        for node in self.workers:
            self._wait_for_ssh(node)

    def _start_sshd(self, node: Node) -> None:
        assert self.keys is not None
        host_key = self.keys / f"{node.role}_host_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = self.keys / f"{node.role}_sshd_config"
        config.write_text(
            f"ListenAddress {node.address}\nPort {SSH_PORT}\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {self.keys / 'authorized_keys'}\nPidFile {self.keys / node.role}.pid\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            # temp folders are world-writable; the default checks would refuse our key files
            "StrictModes no\n"
            # PAM sessions would touch the machine's login records; key auth needs none of it
            "UsePAM no\n")
        log = (self.keys / f"{node.role}_sshd.log").open("w")
        # ip netns exec -> unshare -> sh -> sshd all exec in turn, so the Popen pid is sshd's.
        node.sshd = subprocess.Popen(
            ["ip", "netns", "exec", node.namespace, "unshare", "--uts", "sh", "-c",
             f'hostname {node.role} && exec {SSHD} -D -e -f "$0"', str(config)],
            stdout=log, stderr=subprocess.STDOUT)

    def _wait_for_ssh(self, node: Node, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            proc = self.exec(self.launcher, "ssh", "-p", str(SSH_PORT), "-i", str(self.key),
                             "-o", "ConnectTimeout=5", f"root@{node.role}", "hostname", check=False)
            if proc.returncode == 0 and proc.stdout.strip() == node.role:
                return
            if time.monotonic() > deadline or (node.sshd and node.sshd.poll() is not None):
                assert self.keys is not None
                log = (self.keys / f"{node.role}_sshd.log").read_text()
                raise RuntimeError(f"ssh to {node.role} did not work: {proc.stdout}{proc.stderr}\nsshd log:\n{log}")
            time.sleep(0.5)

    def exec(self, node: Node, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a command inside a node's namespace."""
        return _run("ip", "netns", "exec", node.namespace, *cmd, check=check, timeout=timeout)

    def partition(self, node: Node) -> None:
        """Cut a node off the network: its interface down inside its namespace (no netem or iptables here).
        Its processes keep running and its TCP connections stay open, retransmitting into the void."""
        self.exec(node, "ip", "link", "set", "dev", IFACE, "down")

    def heal(self, node: Node) -> None:
        """Undo partition(): the interface up again (its address stays; the subnet's route comes back)."""
        self.exec(node, "ip", "link", "set", "dev", IFACE, "up")

    def unlimit(self, node: Node) -> None:
        """Remove the root qdiscs limit() put on a node's link, by name, both ends; no error if none."""
        self.exec(node, "tc", "qdisc", "del", "dev", IFACE, "root", check=False)
        _run("tc", "qdisc", "del", "dev", f"{self.prefix}v{self.nodes.index(node)}", "root", check=False)

    def pids(self, node: Node, needle: str) -> list[int]:
        """Processes in a node's namespace whose command line contains `needle` (ours: nothing else runs there)."""
        found = []
        for pid in _run("ip", "netns", "pids", node.namespace, check=False).stdout.split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline:
                found.append(int(pid))
        return found

    def netns_id(self, node: Node) -> str:
        """`net:[inode]` of the namespace, as /proc/PID/ns/net of a process in it reads."""
        assert node.sshd is not None
        return os.readlink(f"/proc/{node.sshd.pid}/ns/net")

    def veth(self, node: Node) -> str:
        """The bridge-side end of a node's link, in the root namespace (its peer is the node's IFACE)."""
        return f"{self.prefix}v{self.nodes.index(node)}"

    def limit(self, node: Node, rate: str) -> None:
        """Limit a node's link to `rate` (tc syntax: 1gbit, 500mbit) each way, like a switch port: a tbf
        on its IFACE (what it sends) and on the bridge-side veth (what it receives). The kernel here has
        tbf, not netem. The burst holds a few of veth's 64 KB GSO packets, or 2 ms at the rate."""
        burst = max(256 * 1024, int(rate_bits(rate) / 8 * 0.002))
        tbf = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
        self.exec(node, "tc", "qdisc", "replace", "dev", IFACE, *tbf)
        _run("tc", "qdisc", "replace", "dev", self.veth(node), *tbf)

    # ------------------------------------------------------------ teardown

    def cleanup(self) -> list[str]:
        """Undo everything, even after a half-done setup; returns what could not be undone."""
        problems: list[str] = []
        for node in self.nodes:
            if node.sshd is not None and node.sshd.poll() is None:
                node.sshd.terminate()
        for node in self.nodes:
            # Workers of a failed run can outlive their ssh session (reparented to PID 1).
            problems += _kill_namespace_processes(node.namespace)
            if node.sshd is not None:
                try:
                    node.sshd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.sshd.kill()
                    node.sshd.wait(timeout=10)
        for node in self.nodes:
            if _run("ip", "netns", "del", node.namespace, check=False).returncode != 0:
                if node.namespace in _run("ip", "netns", "list", check=False).stdout.split():
                    problems.append(f"namespace {node.namespace} not deleted")
            shutil.rmtree(Path("/etc/netns") / node.namespace, ignore_errors=True)
        for index in range(len(self.nodes)):  # the veth ends die with their namespaces; be sure
            _run("ip", "link", "del", f"{self.prefix}v{index}", check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        _remove_if_empty(Path("/etc/netns"))
        if self.made_run_sshd:
            _remove_if_empty(Path("/run/sshd"))
        if self.keys is not None:
            shutil.rmtree(self.keys, ignore_errors=True)
        return problems


def _kill_namespace_processes(namespace: str) -> list[str]:
    """SIGTERM, then SIGKILL, each pid `ip netns pids` lists: only processes in our namespace."""
    def pids() -> list[int]:
        out = _run("ip", "netns", "pids", namespace, check=False).stdout
        return [int(pid) for pid in out.split()]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)
    left = pids()
    return [f"processes {left} still in {namespace}"] if left else []


@contextmanager
def running_cluster(hosts: int = 2, tools: tuple[str, ...] = (), sshd: bool = True) -> Iterator[NamespaceCluster]:
    """A started cluster for a pytest fixture: skipped (not failed) where namespaces or sshd cannot exist
    here, and cleaned up afterwards with anything left behind reported as a failure. `tools`: other
    commands the test needs on PATH (e.g. tc)."""
    import pytest  # only the tests use this; benchmarks import the module without pytest's help

    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces and runs sshd (CI runs as root)")
    if not Path(SSHD).exists():
        pytest.skip(f"no {SSHD}: install Debian's openssh-server (scripts/install-horovod does, as root)")
    for tool in ("ip", "unshare", "ssh", "ssh-keygen", *tools):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on PATH (Debian: iproute2, util-linux, openssh-client)")
    made = NamespaceCluster(hosts=hosts)
    try:
        try:
            made.create_namespaces()
        except subprocess.CalledProcessError as err:
            pytest.skip(f"cannot create network namespaces here: `ip netns add` said {err.stderr.strip()!r}")
        made.start(sshd=sshd)
        yield made
    finally:
        problems = made.cleanup()
        assert not problems, f"cleanup left things behind: {problems}"


def rate_bits(rate: str) -> float:
    """tc's rate syntax in bits per second: '1gbit' -> 1e9, '500mbit' -> 5e8, '100kbit' -> 1e5."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit) and rate[:-len(unit)].replace(".", "", 1).isdigit():
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"link rate {rate!r}: expected a number and gbit/mbit/kbit, e.g. 1gbit")


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _run(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)
