"""Elastic training on Ray: Horovod's own elastic driver, with Ray nodes as its hosts and Ray actors as its workers.

What horovodrun's elastic mode does with a discovery script and ssh, done with Ray: the hosts are the cluster's
live nodes (each with as many slots as it has room for workers), and a worker is an actor pinned to its node.
Reused from Horovod unchanged: the elastic driver (horovod.runner.elastic.driver.ElasticDriver: assignments,
blacklist and cooldown, re-rendezvous), its rendezvous handler and server, and its HostDiscovery interface.
horovod.ray.elastic_v2 is not used (it pins old dependencies and is untested on current Ray).

A node lost mid-run kills its actors: their calls fail, which the driver takes for the worker's failure; the
others go back to the last commit and train on; a node that joins later (or comes back after the blacklist
cooldown) gets workers again up to max_workers. A worker that freezes or is cut off without dying is dropped
by the workers' heartbeats after --peer-timeout-s (launcher/worker_watch.py), as under `hvdtrain launch`; their
key travels inside the pickled job, the watch listens on the address the workers reach this driver at.
The driver runs in the calling process, so the workers must reach it (a node of the cluster, or a Ray job's
driver on the head): not through Ray Client.
"""
from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.distributed import control_wire
from hvdtrain.distributed.rendezvous_auth import RefusedRequests
from hvdtrain.errors import LaunchError, WorkerError, first_line
from hvdtrain.launcher.guard import Failure, Guarded
from hvdtrain.launcher.worker_watch import WorkerWatch
from hvdtrain.ray.worker import AUTO_IFACE, Slot, Worker, horovod_env

POLL_S = 1.0
COOLDOWN_S = (10, 60)   # a failed node is tried again after 10-60 s (Horovod's blacklist cooldown)


def node_slots(nodes: list[dict[str, Any]], resources: dict[str, int]) -> dict[str, int]:
    """Workers each live node has room for, by node id: what Horovod's discovery calls hosts and slots.

    Example:
        >>> node_slots([{"NodeID": "a", "Alive": True, "Resources": {"CPU": 4.0}},
        ...             {"NodeID": "b", "Alive": True, "Resources": {"CPU": 0.0}},
        ...             {"NodeID": "c", "Alive": False, "Resources": {"CPU": 8.0}}], {"CPU": 2, "GPU": 0})
        {'a': 2}
    """
    slots = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        room = [math.floor(have.get(kind, 0.0) / need) for kind, need in resources.items() if need]
        if room and min(room) > 0:
            slots[node["NodeID"]] = min(room)
    return slots


def reachable_address(gcs_address: str) -> str:
    """This machine's address on its route to the cluster's head (no packet is sent): where the nodes reach
    the driver, as they reach each other. Ray's own idea of this node's address may be an interface the
    cluster cannot route to (a laptop's Wi-Fi beside its VPN).

    Example:
        >>> reachable_address("127.0.0.10:6379")
        '127.0.0.1'
    """
    host = gcs_address.rpartition(":")[0].strip("[]")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return str(probe.getsockname()[0])


def slot_env(slot: Any, rendezvous: tuple[str, int]) -> dict[str, str]:
    """What horovodrun's elastic mode gives a worker (gloo_run.create_slot_env_vars and create_run_env_vars):
    the non-elastic actors' variables for Horovod's SlotInfo, elastic, the interface found in the actor."""
    place = Slot(-1, slot.hostname, slot.hostname, slot.rank, slot.size, slot.local_rank, slot.local_size,
                 slot.cross_rank, slot.cross_size)
    return {**horovod_env(place, rendezvous, AUTO_IFACE), "HOROVOD_ELASTIC": "1"}


def run(ray: Any, job: Guarded, num_workers: int, min_workers: int, max_workers: int, resources: dict[str, int],
        start_timeout: int, env: dict[str, str]) -> list[Any]:
    """Every result of the last world, in its rank order (a worker's Failure included)."""
    from ray.exceptions import RayActorError, RayTaskError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hvdtrain.distributed import horovod_rendezvous

    key = control_wire.new_key()   # the heartbeats' and the rendezvous registrations'
    host = reachable_address(ray.get_runtime_context().gcs_address)   # the workers reach us here
    driver, rendezvous, port = horovod_rendezvous.elastic_driver(lambda: node_slots(ray.nodes(), resources),
                                                             min_workers, max_workers, timeout=start_timeout,
                                                             cooldown_range=COOLDOWN_S, key=key.encode(),
                                                             host=host, refused=RefusedRequests("the rendezvous"))
    address = (host, port)
    # The driver's own --peer-timeout-s: the config's, when the job is a config-driven fit.
    timeout_s = next((a.peer_timeout_s for a in job.args if isinstance(a, TrainConfig)), TrainConfig.peer_timeout_s)
    watch = WorkerWatch(key, timeout_s, address[0])
    worker_env = {**env, **watch.env()}
    job = Guarded(job.fn, job.args, job.kwargs, {**job.secrets, **watch.secrets()})   # the key: pickled, not env
    finished: dict[tuple[str, int], Any] = {}   # (node id, local rank) -> the worker's result
    lost: list[str] = []
    lock = threading.Lock()

    def create_worker(slot: Any, events: list[threading.Event]) -> tuple[int, float]:
        ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == slot.hostname), slot.hostname)
        actor = ray.remote(Worker).options(
            num_cpus=resources["CPU"], num_gpus=resources["GPU"], max_restarts=0,
            runtime_env={"env_vars": worker_env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(slot.hostname, soft=False)).remote(slot.rank, ip)
        ref = actor.run.remote(slot_env(slot, address), job)
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=POLL_S)
                if ready:
                    result = ray.get(ready[0])
                    with lock:
                        finished[(slot.hostname, slot.local_rank)] = result
                    return (1 if isinstance(result, Failure) else 0), time.time()
                if any(event.is_set() for event in events):   # the driver stops it, or dropped its node
                    return 1, time.time()
        except (RayActorError, RayTaskError) as err:
            with lock:
                lost.append(f"a worker on node {ip} ({slot.hostname[:8]}) was lost: {first_line(err)}")
            return 1, time.time()
        finally:
            ray.kill(actor, no_restart=True)

    try:
        try:
            driver.wait_for_available_slots(num_workers)
        except Exception as err:   # Horovod raises a bare Exception (timeout) or ValueError here
            raise LaunchError(f"Ray has no room for {num_workers} worker(s) of {resources} each within "
                              f"{start_timeout} s ({first_line(err)}); use fewer or smaller workers, or add "
                              "nodes") from None
        watch.watch(driver)
        driver.start(num_workers, create_worker)
        outcome = driver.get_results()
    finally:
        driver.stop()
        rendezvous.stop()
    if outcome.error_message is not None:
        raise WorkerError(f"the elastic job on Ray stopped: {outcome.error_message}"
                          + (f" ({lost[-1]})" if lost else ""), rank=0)
    # The last world's workers, in its rank order (ranks change as workers come and go).
    last = {driver.get_slot_info(host, local_rank).rank: result for (host, local_rank), result in finished.items()
            if f"{host}[{local_rank}]" in outcome.worker_results}
    return [last[rank] for rank in sorted(last) if rank >= 0]
