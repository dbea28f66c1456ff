"""Train on a Ray cluster: one Horovod worker per Ray actor, the actors in one placement group, Gloo.

Written on Ray's own APIs (placement groups, actors, ray.wait); from Horovod it reuses only its
launcher's Gloo rendezvous server (horovod.runner.http.http_server.RendezvousServer), run in an actor
on rank 0's node, and the HOROVOD_* variables horovodrun --gloo sets (worker.py).
horovod.ray (RayExecutor) is not used: it is untested on current Ray and pins old dependencies.
Like the other launchers this module never imports horovod.torch: only the actors initialise Horovod.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment.credentials import split_env
from hvdtrain.environment.process import FIRST_GPU_ENV
from hvdtrain.errors import LaunchError, UserError, WorkerError, first_line
from hvdtrain.launcher.guard import Failure, Guarded, check_picklable, rank0_result, target, worker_pythonpath
from hvdtrain.ray.worker import (
    STRATEGIES,
    Rendezvous,
    Slot,
    Worker,
    first_gpus,
    horovod_env,
    plan,
    visible_devices,
)

# After one rank failed, how long the others get to report (their own error, or that a peer went away).
FAILURE_GRACE_S = 30


def fit(config_or_fn: TrainConfig | Callable[..., Any], *args: Any, num_workers: int = 2,
        cpus_per_worker: int = 1, gpus_per_worker: int = 0, address: str | None = None,
        strategy: str = "SPREAD", start_timeout: int = 120, all_ranks: bool = False,
        env: dict[str, str] | None = None, elastic: bool = False, min_workers: int = 1,
        max_workers: int | None = None, **kwargs: Any) -> Any:
    """Train on `num_workers` Ray actors, one Horovod worker (Gloo) each; returns rank 0's result.

    Each actor holds `cpus_per_worker` CPUs and `gpus_per_worker` GPUs of one placement-group bundle;
    with GPUs, each worker trains on the GPU Ray gave it. Every actor's console lines reach this process
    tagged `(hvdtrain rank N on NODE pid=...)`. Rank 0 writes the run directory (config.run_dir, made
    absolute here): on a multi-node cluster put it on storage every node shares.

    Args:
        config_or_fn: a TrainConfig (each actor runs `hvdtrain.fit(config)`) or a function to run on
            every actor (it may build its own hvdtrain.Trainer); it and its arguments must be picklable.
        num_workers: Horovod workers = Ray actors.
        cpus_per_worker, gpus_per_worker: Ray resources per actor. A config with threads 0 gets
            cpus_per_worker torch threads.
        address: the Ray cluster ("127.0.0.1:6379", "ray://head:10001", "auto"); default: the one this
            process is connected to, RAY_ADDRESS (set under `ray job submit`), else a local Ray.
        strategy: placement group strategy: SPREAD (nodes apart when possible), PACK, STRICT_PACK, STRICT_SPREAD.
        start_timeout: seconds for Ray to place all actors.
        all_ranks: return every rank's result as a list.
        env: extra variables for the workers. Credential-like ones (environment/credentials.py), here or in this
            process's environment, travel inside the pickled job, never in Ray's runtime_env, job
            metadata or a command line.
        elastic: train elastically (also when the config says elastic): Horovod's elastic driver in this
            process, the cluster's live nodes as its hosts (ray/ray_elastic.py). A lost node's workers are
            dropped and the others go on from the last commit; nodes that join get workers again, up to
            max_workers. The workers must reach this process (not through Ray Client); CPU workers only.
        min_workers, max_workers: elastic: go on while at least min_workers remain (default 1); grow up to
            max_workers (default num_workers).
    Raises:
        WorkerError: a worker raised, or its actor or node was lost; the message names rank and node.
        LaunchError: bad arguments, or Ray could not place the actors within start_timeout.
    Example:
        >>> history = hvdtrain.ray.fit(hvdtrain.load_config(model="mlp", epochs=5), num_workers=4,
        ...                            cpus_per_worker=2, address="auto")
    """
    if num_workers < 1 or cpus_per_worker < 0 or gpus_per_worker < 0 or cpus_per_worker + gpus_per_worker == 0:
        raise LaunchError(f"num_workers must be >= 1 and each worker needs a CPU or a GPU, got num_workers="
                          f"{num_workers}, cpus_per_worker={cpus_per_worker}, gpus_per_worker={gpus_per_worker}")
    if strategy.upper() not in STRATEGIES:
        raise LaunchError(f"strategy {strategy!r} is not a placement group strategy; use one of "
                          f"{', '.join(STRATEGIES)}")
    elastic = elastic or (isinstance(config_or_fn, TrainConfig) and config_or_fn.elastic)
    max_workers = max_workers or num_workers
    if elastic and not 1 <= min_workers <= num_workers <= max_workers:
        raise LaunchError(f"elastic needs 1 <= min_workers <= num_workers <= max_workers, got {min_workers}, "
                          f"{num_workers}, {max_workers}")
    if elastic and gpus_per_worker:
        raise LaunchError("elastic training on Ray runs CPU workers only so far (gpus_per_worker=0); "
                          "`hvdtrain launch --min-np N` runs elastic GPU jobs")
    fn, args = target(config_or_fn, args, "hvdtrain.ray.fit")
    args = tuple(_ray_config(a, cpus_per_worker, elastic) if isinstance(a, TrainConfig) else a for a in args)
    check_picklable(fn, args, kwargs)
    public, secrets = split_env({**os.environ, **(env or {})})
    worker_env = {k: v for k, v in public.items() if k in (env or {})}
    # Actors import what this process can (functions pickled by reference need their modules), and keep
    # their node's own PYTHONPATH: Ray expands ${PYTHONPATH} with the node's value.
    paths = worker_pythonpath(worker_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")))
    worker_env["PYTHONPATH"] = os.pathsep.join(filter(None, [paths, "${PYTHONPATH}"]))
    ray = _import_ray()
    started = not ray.is_initialized()
    if started:
        _connect(ray, address or os.environ.get("RAY_ADDRESS"))
    resources = {"CPU": cpus_per_worker, "GPU": gpus_per_worker}
    job = Guarded(fn, args, kwargs, secrets)
    try:
        if elastic:
            from hvdtrain.ray import ray_elastic as elastic_run

            results = elastic_run.run(ray, job, num_workers, min_workers, max_workers, resources, start_timeout,
                                      worker_env)
        else:
            results = _run(ray, job, num_workers, resources, strategy.upper(), start_timeout, worker_env)
    finally:
        if started:
            ray.shutdown()
    return rank0_result(results, all_ranks)


def _ray_config(config: TrainConfig, cpus: int, elastic: bool) -> TrainConfig:
    changes: dict[str, Any] = {"elastic": elastic}
    if config.run_dir:   # actors run in Ray's own working directory
        changes["run_dir"] = os.path.abspath(config.run_dir)
    if not config.threads and cpus:   # an actor owns its bundle's CPUs, not the node's
        changes["threads"] = cpus
    return dataclasses.replace(config, **changes)


def _import_ray() -> Any:
    # Ray merges equal lines of different actors ("[repeated 2x across cluster]"): each rank's own lines
    # should arrive. Read when Ray is first imported; a notebook that imported Ray already keeps its choice.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not sys.stdout.isatty():   # no colour codes around the rank tag in a log file or a job's output
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    try:
        import ray
        import ray.util.placement_group  # noqa: F401 - loads ray.util's submodule
    except ImportError as err:
        raise UserError(f"Ray support needs ray ({err}); install it with: pip install -e '.[ray]' in "
                        "hvdtrain's checkout") from None
    return ray


def _connect(ray: Any, address: str | None) -> None:
    # A wrong HOST:PORT would have ray.init retry for minutes: check that something listens there first.
    host, _, port = (address or "").rpartition(":")
    if address and host and port.isdigit() and "://" not in address:
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as err:
            raise LaunchError(f"cannot reach a Ray cluster at {address} ({err.strerror or err}); start one with "
                              "`ray start --head` there, or give its GCS address (HOST:6379) or ray://HOST:10001") \
                from None
    try:
        ray.init(address=address, log_to_driver=True, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise LaunchError(f"cannot connect to Ray at {address or 'this machine'}: {first_line(err)}") from None


def _run(ray: Any, job: Guarded, n: int, resources: dict[str, int], strategy: str, start_timeout: int,
         env: dict[str, str]) -> list[Any]:
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = {k: float(v) for k, v in resources.items() if v}
    group = placement_group([bundle] * n, strategy=strategy)
    actors: list[Any] = []
    try:
        if not group.wait(timeout_seconds=start_timeout):
            raise LaunchError(f"Ray could not place {n} worker(s) of {bundle} each ({strategy}) within "
                              f"{start_timeout} s; the cluster has {_cpus_gpus(ray.cluster_resources())} in all: "
                              "use fewer or smaller workers, add nodes, or raise start_timeout")
        bundle_nodes = [placement_group_table(group)["bundles_to_node_id"][b] for b in range(n)]
        ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        slots = plan(bundle_nodes, ips)

        def placed(slot: Slot) -> Any:
            return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=slot.bundle)

        actors = [ray.remote(Rendezvous).options(num_cpus=0, scheduling_strategy=placed(slots[0])).remote()]
        workers = [ray.remote(Worker).options(num_cpus=resources["CPU"], num_gpus=resources["GPU"], max_restarts=0,
                                              runtime_env={"env_vars": env}, scheduling_strategy=placed(s)
                                              ).remote(s.rank, s.node_ip) for s in slots]
        actors += workers
        try:
            rendezvous = ray.get(actors[0].start.remote(slots), timeout=start_timeout)
            described = ray.get([w.describe.remote() for w in workers], timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(f"Ray placed the workers but did not start their actors within {start_timeout} s "
                              "(a node short of memory, or a runtime_env still installing?); see `ray status` "
                              "and the nodes' logs, or raise start_timeout") from None
        gpus = {s.rank: d["gpus"] for s, d in zip(slots, described, strict=True)}
        devices, firsts = visible_devices(slots, gpus), first_gpus(slots, gpus)
        refs = {worker.run.remote({**horovod_env(s, rendezvous, d["iface"]),
                                   **({"CUDA_VISIBLE_DEVICES": devices[s.rank], FIRST_GPU_ENV: firsts[s.rank]}
                                      if s.rank in devices else {})},
                                  job): s
                for worker, s, d in zip(workers, slots, described, strict=True)}
        return _collect(ray, refs)
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)


def _cpus_gpus(resources: dict[str, float]) -> dict[str, float]:
    return {key: resources.get(key, 0.0) for key in ("CPU", "GPU")}


def _collect(ray: Any, refs: dict[Any, Slot]) -> list[Any]:
    """Every rank's result in rank order; a lost actor is a WorkerError at once, a rank's own error once
    the others have reported (or FAILURE_GRACE_S later: they may be blocked on the failed rank)."""
    from ray.exceptions import RayActorError, RayTaskError

    pending = dict(refs)
    results: dict[int, Any] = {}
    deadline = None
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        if not ready:
            break
        slot = pending.pop(ready[0])
        try:
            results[slot.rank] = ray.get(ready[0])
        except RayActorError as err:
            raise WorkerError(f"rank {slot.rank} on {slot.where} was lost: its Ray actor died "
                              f"({first_line(err)})", rank=slot.rank) from None
        except RayTaskError as err:   # raised outside the guard: e.g. the job could not be unpickled there
            cause = err.cause if err.cause is not None else err
            results[slot.rank] = Failure(slot.rank, type(cause).__name__, first_line(cause), str(err),
                                         slot.node_ip, isinstance(cause, UserError))
        if isinstance(results[slot.rank], Failure) and deadline is None:
            deadline = time.monotonic() + FAILURE_GRACE_S
    if pending:
        silent = sorted(pending.values(), key=lambda s: s.rank)
        failed = [f for f in results.values() if isinstance(f, Failure)]
        if all(f.consequential for f in failed):
            raise WorkerError(f"rank {silent[0].rank} on {silent[0].where} stopped answering; rank(s) "
                              f"{sorted(f.rank for f in failed)} failed as a consequence "
                              f"({failed[0].message})", rank=silent[0].rank)
        print(f"hvdtrain: rank(s) {[s.rank for s in silent]} did not report within {FAILURE_GRACE_S} s "
              "of the first failure", file=sys.stderr, flush=True)
    return [results[rank] for rank in sorted(results)]
