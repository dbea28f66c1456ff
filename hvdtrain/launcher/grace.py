"""`python -m hvdtrain.launcher.grace HOROVODRUN_ARGS...`: horovodrun with a longer grace after SIGTERM, and
without the races of Horovod's stop of a worker (launcher/shell_stop.py).

Horovod 0.28.1's launcher gives its workers GRACEFUL_TERMINATION_TIME_S (5 s) between SIGTERM and SIGKILL
(horovod/runner/common/util/safe_shell_exec.py), too short for a checkpoint of a large model to reach disk.
`hvdtrain launch --grace-s N` (or HVDTRAIN_GRACE_S=N) runs horovodrun through this module, which sets that
constant to N. The constant is read in the "middleman" processes Horovod starts with multiprocessing's spawn
method; spawn re-imports this module (the main module, as __mp_main__) in each of them before it runs its
target, so the assignment below, at import time, holds there too.

The same import replaces, in each middleman, the function that stops its worker: Horovod's can hold a job for
its whole grace, or report a stopped worker's exit as 0 (launcher/shell_stop.py). `hvdtrain launch` and tune trials
start every Gloo job that is not elastic through this module, with or without a grace (an elastic one goes
through launcher/elastic_driver.py, which installs the same stop).

The private names themselves are touched only in the adapter (distributed/horovod_runner.py), which checks they exist.
Horovod's launcher owns the workers only under Gloo: with --mpi, horovodrun exec()s mpirun, whose own rules
apply after SIGTERM.
"""
from __future__ import annotations

import os
import sys

GRACE_ENV = "HVDTRAIN_GRACE_S"


def grace_s(text: str) -> int:
    """A grace in whole seconds, >= 1, or a ValueError saying why not.

    Example:
        >>> grace_s("60")
        60
    """
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"the grace must be a whole number of seconds >= 1, got {text!r}")
    return int(text)


def apply(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """Set Horovod's grace from HVDTRAIN_GRACE_S (unset: Horovod's own 5 s stays); the grace now in force."""
    from hvdtrain.distributed import horovod_runner

    text = environ.get(GRACE_ENV, "").strip()
    if not text:
        return None
    try:
        return horovod_runner.set_termination_grace(grace_s(text))
    except horovod_runner.AdapterError as err:
        raise RuntimeError(f"{GRACE_ENV}: {err}") from None


def install() -> int | None:
    """apply(), and hvdtrain's stop of a worker's shell in place of Horovod's; the grace now in force."""
    from hvdtrain.launcher import shell_stop

    grace = apply()
    shell_stop.install()
    return grace


if __name__ in ("__main__", "__mp_main__"):   # horovodrun's process, and each spawned middleman (see above)
    install()

if __name__ == "__main__":
    import os

    from hvdtrain.distributed import control_wire, horovod_rendezvous, horovod_runner
    from hvdtrain.distributed.rendezvous_auth import RefusedRequests

    sys.argv[0] = "horovodrun"
    # Gloo's rendezvous behind hvdtrain's checks: with the job's key where `hvdtrain launch` delivered one (its
    # workers' Horovod then sends the key's token), else bounded bodies only.
    key = control_wire.key_from_env(os.environ)
    refused = RefusedRequests("the Gloo rendezvous")
    try:
        with horovod_rendezvous.horovodrun_rendezvous_guarded(key, "", refused):
            code = horovod_runner.run_commandline()
    finally:
        refused.summary()
    sys.exit(code)
