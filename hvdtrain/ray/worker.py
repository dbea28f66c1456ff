"""What runs inside each Ray actor (one Horovod worker), and the pure rank plan the driver computes for them.

Nothing here imports Ray or Horovod at module level: Ray imports this module in every actor process, and
the plan is tested without either.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvdtrain.environment.process import Process, launcher_env

# Ray's placement group strategies, for hvdtrain.ray.fit and `hvdtrain ray --strategy`.
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
AUTO_IFACE = "auto"   # HOROVOD_GLOO_IFACE to be found in the actor: the interface holding its node's address


@dataclass(frozen=True)
class Slot:
    """One actor's place in the job, Horovod's SlotInfo in our words: ranks are contiguous per node."""
    bundle: int
    node_id: str
    node_ip: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    @property
    def where(self) -> str:
        return f"node {self.node_ip} ({self.node_id[:8]})"


def plan(bundle_nodes: Sequence[str], node_ips: dict[str, str]) -> list[Slot]:
    """Ranks for placement-group bundles placed on `bundle_nodes` (a node id per bundle), in rank order.

    Horovod wants a node's ranks side by side (local and cross communicators), so nodes take turns in
    the order they first appear and each node's bundles get consecutive ranks.

    Example:
        >>> [(s.bundle, s.rank, s.local_rank, s.cross_rank) for s in plan(["b", "a", "b"], {"a": "h1", "b": "h2"})]
        [(0, 0, 0, 0), (2, 1, 1, 0), (1, 2, 0, 1)]
    """
    nodes = list(dict.fromkeys(bundle_nodes))
    slots = []
    for node in nodes:
        mine = [b for b, n in enumerate(bundle_nodes) if n == node]
        for local_rank, bundle in enumerate(mine):
            slots.append((bundle, node, local_rank, len(mine)))
    # Horovod's cross communicator joins the ranks with the same local rank across nodes.
    cross = {lr: [n for n in nodes if bundle_nodes.count(n) > lr] for lr in range(len(bundle_nodes))}
    return [Slot(bundle, node, node_ips.get(node, node), rank, len(slots), local_rank, local_size,
                 cross[local_rank].index(node), len(cross[local_rank]))
            for rank, (bundle, node, local_rank, local_size) in enumerate(slots)]


def horovod_env(slot: Slot, rendezvous: tuple[str, int], iface: str) -> dict[str, str]:
    """The variables horovodrun --gloo gives a worker (horovod/runner/gloo_run.py), for one actor."""
    place = Process(slot.rank, slot.size, slot.local_rank, slot.local_size, "gloo")
    return {**launcher_env(place, "gloo"), "HOROVOD_HOSTNAME": slot.node_id,
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous[0], "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous[1]),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface, "NCCL_SOCKET_IFNAME": iface}


def visible_devices(slots: Sequence[Slot], gpu_ids: dict[int, list[str]]) -> dict[int, str]:
    """CUDA_VISIBLE_DEVICES per rank: every GPU Ray gave the actors of its node, in local-rank order.

    Ray shows each actor only its own GPUs; hvdtrain picks cuda:<local_rank>, and NCCL wants to see its
    node's peers, so each actor sees its node's GPUs with its own at index local_rank (what horovod.ray does).

    Example:
        >>> s = plan(["n", "n"], {})
        >>> visible_devices(s, {0: ["3"], 1: ["1"]})
        {0: '3,1', 1: '3,1'}
    """
    by_node: dict[str, list[str]] = {}
    for slot in sorted(slots, key=lambda s: s.local_rank):
        by_node.setdefault(slot.node_id, []).extend(gpu_ids.get(slot.rank, []))
    return {s.rank: ",".join(by_node[s.node_id]) for s in slots if by_node[s.node_id]}


def first_gpus(slots: Sequence[Slot], gpu_ids: dict[int, list[str]]) -> dict[int, str]:
    """FIRST_GPU_ENV per rank: where its own GPUs start in its node's CUDA_VISIBLE_DEVICES (visible_devices).

    With gpus_per_worker > --stages, local_rank*stages would land on another actor's GPU; this index does not.

    Example:
        >>> s = plan(["n", "n"], {})
        >>> first_gpus(s, {0: ["3", "4"], 1: ["1", "2"]})
        {0: '0', 1: '2'}
    """
    offsets: dict[int, str] = {}
    taken: dict[str, int] = {}
    for slot in sorted(slots, key=lambda s: s.local_rank):
        own = gpu_ids.get(slot.rank, [])
        if own:
            offsets[slot.rank] = str(taken.get(slot.node_id, 0))
        taken[slot.node_id] = taken.get(slot.node_id, 0) + len(own)
    return offsets


def iface_of(address: str) -> str:
    """The network interface that holds `address` (Gloo binds to an interface by name), else "lo"."""
    import psutil  # a dependency of Ray

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return "lo"


class Rendezvous:
    """Horovod's Gloo rendezvous server (the one horovodrun --gloo runs), in a 0-CPU actor on rank 0's node:
    the workers reach it wherever the caller runs (a laptop through Ray Client, a job's driver)."""

    def start(self, slots: Sequence[Slot]) -> tuple[str, int]:
        import ray

        from hvdtrain.distributed import horovod_rendezvous

        # Serves from its own thread until this actor is killed.
        self.server, port = horovod_rendezvous.rendezvous_server(
            dict(hostname=s.node_id, rank=s.rank, local_rank=s.local_rank, cross_rank=s.cross_rank, size=s.size,
                 local_size=s.local_size, cross_size=s.cross_size) for s in slots)
        return ray.util.get_node_ip_address(), port


class Worker:
    """One Horovod worker in a Ray actor. Ray tags each console line the actor prints with its repr (and its
    pid, and its node's address only when that differs from the caller's): the repr names rank and node."""

    def __init__(self, rank: int, node_ip: str) -> None:
        self.rank, self.node_ip = rank, node_ip

    def __repr__(self) -> str:
        return f"hvdtrain rank {self.rank} on {self.node_ip}"

    def describe(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        ip = ray.util.get_node_ip_address()
        return {"node_id": context.get_node_id(), "ip": ip, "iface": iface_of(ip), "host": socket.gethostname(),
                "gpus": [str(g) for g in context.get_accelerator_ids().get("GPU", [])]}

    def run(self, env: dict[str, str], job: Any) -> Any:
        """Become rank `rank` (Horovod's variables) and run the guarded job; its result or Failure returns."""
        from hvdtrain.environment.process import export_rank_env

        if env.get("HOROVOD_GLOO_IFACE") == AUTO_IFACE:   # elastic: the driver does not know this node's interfaces
            import ray

            iface = iface_of(ray.util.get_node_ip_address())
            env = {**env, "HOROVOD_GLOO_IFACE": iface, "NCCL_SOCKET_IFNAME": iface}
        os.environ.update(env)
        export_rank_env()   # RANK/WORLD_SIZE for data libraries, as under horovodrun
        return job()
