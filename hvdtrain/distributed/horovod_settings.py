"""Horovod's and Open MPI's settings, as the environment variables hvd.init() reads: pure functions of
a config or an environment mapping (no Horovod import)."""
from __future__ import annotations

import os
from collections.abc import Mapping

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment import process


def horovod_env(config: TrainConfig) -> dict[str, str]:
    """Horovod's own settings asked for in `config`, as the environment variables hvd.init() reads.

    Only what differs from Horovod's defaults, so horovodrun's flags (--timeline-filename, ...) still apply
    when the config says nothing.
    """
    env = {}
    if config.timeline_file:
        env["HOROVOD_TIMELINE"] = os.path.abspath(config.timeline_file)  # written by rank 0 (the coordinator)
    if config.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    if config.stall_check_s == 0:
        env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
    elif config.stall_check_s != 60:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(config.stall_check_s)
    if config.stall_shutdown_s:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(config.stall_shutdown_s)
    if config.gloo_timeout_s != GLOO_TIMEOUT_S:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(config.gloo_timeout_s)
    return env


# Gloo's collective timeout when neither the config nor the environment (horovodrun
# --gloo-timeout-seconds) names one. Horovod's own 30 s fails a collective caught in a network blip that
# TCP rides out: after a 20 s partition the retransmission that gets through comes about 25 s in
# (docs/troubleshooting.md, "Network faults"). hvdtrain's peer watch (peer_watch.py,
# --peer-timeout-s 45) ends a lost host's job first, with a line naming it; this is the backstop.
GLOO_TIMEOUT_S = 60


def timeout_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """Gloo's timeout, unless `env` already has one (horovodrun's flag or the config's own value).

    Example:
        >>> timeout_defaults({}), timeout_defaults({"HOROVOD_GLOO_TIMEOUT_SECONDS": "5"})
        ({'HOROVOD_GLOO_TIMEOUT_SECONDS': '60'}, {})
    """
    return {} if "HOROVOD_GLOO_TIMEOUT_SECONDS" in env else {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S)}


# Open MPI settings hvdtrain sets before MPI_Init (inside hvd.init()), measured in
# benchmarks/README.md ("Issue #20"): at np=2 on one core per rank, Horovod's background thread
# (one small collective per 1 ms cycle) busy-polled 50-165 ms of CPU per CNN step, time the other
# rank's training thread lacked. Gloo jobs ignore them. HVDTRAIN_MPI_DEFAULTS=0 turns them off,
# =yield keeps only the first.
# - yield while waiting (Open MPI does this itself only when it sees more ranks than slots); a value
#   already in the environment wins;
MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1"}
# - on one host, no OFI (libfabric) BTL: shared memory carries everything there; the OFI BTL's progress
#   (with epoll_wait syscalls) was most of the polling in a perf profile, and its init deadlocked once
#   in MPI_Init (a gdb backtrace in benchmarks/results/2026-12-03-f-mpi-defaults). horovodrun --mpi passes
#   `-mca btl ^openib`, which reaches the ranks as OMPI_MCA_btl=^openib (and beats the launcher's
#   environment), so an exclusion list is extended; a list of BTLs to use is left alone. Not set
#   across hosts, where OFI may be the network.
ONE_HOST_EXCLUDED_BTL = "ofi"


def mpi_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The Open MPI settings hvdtrain adds for a process with environment `env` (mpirun's world and
    local sizes tell whether all ranks share one host).

    Example:
        >>> mpi_defaults({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        ...               "OMPI_MCA_btl": "^openib"})
        {'OMPI_MCA_mpi_yield_when_idle': '1', 'OMPI_MCA_btl': '^openib,ofi'}
    """
    choice = env.get("HVDTRAIN_MPI_DEFAULTS", "1")
    if choice == "0":
        return {}
    wanted = {key: value for key, value in MPI_DEFAULTS.items() if key not in env}
    started = process.from_env(env)
    one_host = started is not None and started.launcher == "openmpi" and started.size == started.local_size
    if choice != "yield" and one_host:
        btl = env.get("OMPI_MCA_btl", "")
        if not btl:
            wanted["OMPI_MCA_btl"] = "^" + ONE_HOST_EXCLUDED_BTL
        elif btl.startswith("^") and ONE_HOST_EXCLUDED_BTL not in btl[1:].split(","):
            wanted["OMPI_MCA_btl"] = f"{btl},{ONE_HOST_EXCLUDED_BTL}"
    return wanted


# mpirun's own link to each host's daemon (Open MPI's out-of-band TCP) is idle while training runs, so a host
# cut off goes unnoticed by mpirun: after the peer watch ends the ranks, it waits to hear that the lost host's
# processes ended, until the host is back (measured: for ever, in docs/troubleshooting.md "Network faults").
# With a TCP keepalive probe every 5 s and 10 missed, it gives up on the host 50-55 s after the cut, after
# the peer watch's line (45 s); a 20 s blip misses 4 probes. `hvdtrain launch` sets these for mpirun; a value
# already in the environment wins.
MPIRUN_KEEPALIVE = {"OMPI_MCA_oob_tcp_keepalive_time": "5", "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
                    "OMPI_MCA_oob_tcp_keepalive_probes": "10"}


def mpirun_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The settings hvdtrain adds to mpirun's own environment (not the ranks'), unless `env` has them.

    Example:
        >>> mpirun_defaults({"OMPI_MCA_oob_tcp_keepalive_time": "60"})
        {'OMPI_MCA_oob_tcp_keepalive_intvl': '5', 'OMPI_MCA_oob_tcp_keepalive_probes': '10'}
    """
    return {key: value for key, value in MPIRUN_KEEPALIVE.items() if key not in env}


# Horovod's cycle time when its ops run over Gloo (horovodrun --gloo, elastic jobs, hvdtrain.launch):
# every cycle is a coordination round over loopback TCP even when no tensor is waiting, and on one core
# per rank those wake-ups slow the training thread. At 2 ms instead of Horovod's 1: CNN, ResNet-18 and
# transformer faster, the MLP level (benchmarks/README.md, "Issue #20 (2026-12-04)"). Not set for MPI
# ops (slower there at 2 ms, CNN and MLP), with autotune (it tunes the cycle), or over a HOROVOD_CYCLE_TIME of
# the user's.
GLOO_CYCLE_TIME_MS = "2"


def gloo_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The Horovod settings hvdtrain adds for a process with environment `env` whose ops run over Gloo.

    Example:
        >>> gloo_defaults({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"})
        {'HOROVOD_CYCLE_TIME': '2'}
    """
    over_gloo = "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or env.get("HOROVOD_CONTROLLER") == "gloo"
    if not over_gloo or "HOROVOD_CYCLE_TIME" in env or env.get("HOROVOD_AUTOTUNE", "0") not in ("", "0"):
        return {}
    return {"HOROVOD_CYCLE_TIME": GLOO_CYCLE_TIME_MS}


# With Gloo ops, a rank with no tensor outstanding waits for its next enqueue (at most this long) instead of
# negotiating every cycle: those idle rounds (forward pass, optimizer step, data loading) were ~60% of the
# background thread's CPU in a profile; skipping them took Horovod's and Gloo's threads from 9.2 to 3.8-4.2 ms
# of CPU per CNN step and 11.8-19.7 to 6.7-7.8 on the transformer (benchmarks/results/2026-12-06-b-idle-cycles).
# Read only by a Horovod built with hvdtrain's patch (scripts/horovod/patches, 0008); others ignore it. Not for MPI
# ops: a peer already in the round would poll Open MPI for that long.
IDLE_CYCLE_TIME_MS = "50"


def idle_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """HOROVOD_IDLE_CYCLE_TIME for a process with environment `env` whose ops run over Gloo, unless set.

    Example:
        >>> idle_defaults({"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}), idle_defaults({"OMPI_COMM_WORLD_SIZE": "2"})
        ({'HOROVOD_IDLE_CYCLE_TIME': '50'}, {})
    """
    over_gloo = "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env or env.get("HOROVOD_CONTROLLER") == "gloo"
    if not over_gloo or "HOROVOD_IDLE_CYCLE_TIME" in env:
        return {}
    return {"HOROVOD_IDLE_CYCLE_TIME": IDLE_CYCLE_TIME_MS}
