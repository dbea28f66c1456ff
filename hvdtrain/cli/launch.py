"""`hvdtrain launch [--secrets-dir DIR] [--grace-s N] ARGS...`: horovodrun, with credentials off every command line.

Everything after the optional --secrets-dir and --grace-s goes to horovodrun unchanged, but for one thing: each
worker's command starts through launcher/worker_start.py, which sets, before any user code, the credentials and a
thread share (below), then execs it (`python -m hvdtrain` starts as it is: it does the same itself).
Credential-like variables (hvdtrain/environment/secrets_file.py) go to the workers in a 0600 file in DIR (default: the
launching directory, which horovodrun makes every worker's working directory, so it must be visible at the same
path on every host, as a relative --run-dir must), and from there into each worker's environment, whatever program
it runs; the file is removed when horovodrun exits. Without OMP_NUM_THREADS or MKL_NUM_THREADS, each worker gets
its host's cores // the workers on that host in both (rank 0 says so in one line).
An elastic job (--min-np or --host-discovery-script) ends with a one-line error naming the lost
hosts when it has had fewer than --min-np slots for --start-timeout seconds (launcher/elastic_driver.py).
Its workers' heartbeats to that driver are sealed with a fresh per-job key, which travels in the same 0600
file (HVDTRAIN_CONTROL_KEY; distributed/control_wire.py).
SIGTERM to this process reaches the workers through horovodrun, which kills them 5 s later; --grace-s N (or
HVDTRAIN_GRACE_S=N) gives them N seconds to write their stop checkpoint (launcher/grace.py; Gloo, not elastic).
Either way horovodrun stops each worker's shell with launcher/shell_stop.py, not Horovod's own function, whose
races could hold the job for the whole grace or report a stopped job's exit as 0.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from hvdtrain.cli.args import Commands, Parser, command_parser
from hvdtrain.errors import UserError
from hvdtrain.launcher.grace import GRACE_ENV, grace_s
from hvdtrain.launcher.worker_start import command_prefix

ELASTIC_FLAGS = ("--min-np", "--host-discovery-script")


def is_elastic(args: list[str]) -> bool:
    """As horovodrun decides: any of its elastic options makes the job elastic."""
    return any(arg.split("=", 1)[0] in ELASTIC_FLAGS for arg in args)


def parser(commands: Commands | None = None) -> Parser:
    """For --help only: main reads the command line itself, since argparse would take horovodrun's options
    (-np, -H, ...) for its own and refuse them."""
    p = command_parser(commands, "launch", __doc__)
    p.add_argument("--secrets-dir", metavar="DIR", help="folder of the 0600 credentials file (default: the "
                   "launching directory)")
    p.add_argument("--grace-s", metavar="N", help="seconds between SIGTERM and SIGKILL for the workers when the "
                   f"job is stopped (default: ${GRACE_ENV}, else Horovod's 5)")
    p.add_argument("horovodrun_args", nargs="...", metavar="HOROVODRUN_ARGS",
                   help="passed to horovodrun unchanged, e.g. -np 2 -H a:1,b:1 python -m hvdtrain")
    return p


def main(args: list[str]) -> int:
    from hvdtrain.distributed.control_wire import CONTROL_KEY_ENV, new_key
    from hvdtrain.distributed.horovod_settings import mpirun_defaults
    from hvdtrain.environment.credentials import split_env
    from hvdtrain.launcher.horovodrun import remove_quietly, worker_env
    from hvdtrain.output.console import console

    if not args:
        raise UserError("launch: needs horovodrun's arguments, e.g. hvdtrain launch -np 2 -H a:1,b:1 python -m "
                        "hvdtrain (see `hvdtrain launch --help`)")
    if args[0] in ("-h", "--help"):
        parser().print_help()
        return 0
    secrets_dir, grace, args = _own_options(args)
    command = worker_command(args)
    if isinstance(command, int):
        return command   # horovodrun's --help, --version or --check-build, answered
    if not is_hvdtrain_cli(command):
        args = with_worker_start(args, command, command_prefix())
    elastic = is_elastic(args)
    if grace and elastic:
        raise UserError("launch: --grace-s (HVDTRAIN_GRACE_S) is not supported for elastic jobs yet: Horovod's "
                        "elastic driver stops its workers on its own terms")
    # The job's key: the workers' Horovod proves it to Gloo's rendezvous (a stranger's PUT of a rank's address there
    # would crash the job at start-up), the elastic driver and its workers seal their heartbeats and registrations
    # with it, the peer watch too. A credential, so it goes in the secrets file: for every job on one machine, and
    # wherever there is a secrets file anyway (elastic, credentials). A multi-host job without credentials gets
    # none (the file may not reach the other hosts): its rendezvous is bounded, not authenticated (docs/security.md).
    job_env = dict(os.environ)
    if elastic or split_env(job_env)[1] or one_machine(args):
        job_env[CONTROL_KEY_ENV] = new_key()
    if grace:
        job_env[GRACE_ENV] = grace
    env, secrets_file, names = worker_env(job_env, secrets_dir)
    env.update(mpirun_defaults(env))   # under --mpi: mpirun gives up on a host cut off, instead of waiting for ever
    names = [name for name in names if name != CONTROL_KEY_ENV]
    if names:
        console.line(f"hvdtrain: {', '.join(names)} go to the workers in {secrets_file} (mode 0600), "
                     "not on their command lines")
    try:
        # An elastic job runs horovodrun in a child Python that also bounds the time below --min-np. Any other
        # runs it in a Python that sets the grace and hvdtrain's stop of a worker first (launcher/grace.py).
        runner = [sys.executable, "-m", "hvdtrain.launcher.elastic_driver" if elastic else "hvdtrain.launcher.grace"]
        proc = subprocess.Popen([*runner, *args], env=env)
        # horovodrun passes SIGTERM on to its workers; Ctrl-C reaches it directly (same process group).
        # A hangup stops the job the same way: left to its default, SIGHUP would end this process before
        # the `finally` that removes the secrets file.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, lambda _signum, _frame: proc.send_signal(signal.SIGTERM))
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue  # horovodrun got the same SIGINT and stops its workers; wait for it
    finally:
        remove_quietly(secrets_file)


def horovodrun_parsed(args: list[str]) -> Any:
    """horovodrun's own parse of `args`, its output held back: its namespace; None where it refuses `args`
    (horovodrun, run next, reports that itself); an exit code where the parser answered alone (--help, --version,
    --check-build), its output printed here."""
    from hvdtrain.distributed.horovod_runner import horovodrun_args

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")   # deprecated options: horovodrun warns about them itself
            return horovodrun_args(args)
    except SystemExit as done:
        if done.code in (0, None):
            sys.stdout.write(out.getvalue())
            sys.stderr.write(err.getvalue())
            return 0
        return None
    except Exception:   # e.g. a --config-file it cannot read: horovodrun's own run says so
        return None


def worker_command(args: list[str]) -> list[str] | int:
    """The command horovodrun `args` runs on each worker, as horovodrun's own parser finds it ([] where it finds
    none or refuses `args`); an exit code where the parser answered alone (horovodrun_parsed)."""
    parsed = horovodrun_parsed(args)
    if isinstance(parsed, int):
        return parsed
    return list(parsed.command or []) if parsed is not None else []


def one_machine(args: list[str]) -> bool:
    """Whether horovodrun `args` start every worker on this host (no -H, no --hostfile, or only this host's names).

    Example:
        >>> one_machine(["-np", "2", "python", "x.py"]), one_machine(["-np", "2", "-H", "localhost:2", "python", "x"])
        (True, True)
        >>> one_machine(["-np", "2", "-H", "node1:1,node2:1", "python", "x.py"])
        False
    """
    import socket

    parsed = horovodrun_parsed(args)
    if parsed is None or isinstance(parsed, int):
        return False
    if getattr(parsed, "hostfile", None) or getattr(parsed, "host_discovery_script", None):
        return False
    hosts = getattr(parsed, "hosts", None) or "localhost"
    here = {"localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn()}
    return all(entry.rpartition(":")[0] in here if ":" in entry else entry in here
               for entry in hosts.split(",") if entry.strip())


def is_hvdtrain_cli(command: list[str]) -> bool:
    """`python -m hvdtrain ...` or `hvdtrain ...`: the CLI loads the secrets file itself, with the same function
    (cli/main.py), and its Trainer sets its threads (--threads), so it starts as it is.

    Example:
        >>> is_hvdtrain_cli(["/venv/bin/python3", "-m", "hvdtrain", "--epochs", "2"]), is_hvdtrain_cli(["python", "x"])
        (True, False)
    """
    first = Path(command[0]).name if command else ""
    return first == "hvdtrain" or (first.startswith("python") and command[1:3] == ["-m", "hvdtrain"])


def with_worker_start(args: list[str], command: list[str], prefix: list[str]) -> list[str]:
    """horovodrun's `args` with `prefix` in front of the worker `command` (their tail), so every worker starts
    through launcher/worker_start.py; `args` unchanged where there is no such tail.

    Example:
        >>> with_worker_start(["-np", "2", "--gloo", "python", "t.py", "-v"], ["python", "t.py", "-v"], ["START"])
        ['-np', '2', '--gloo', 'START', 'python', 't.py', '-v']
    """
    if not command or args[len(args) - len(command):] != command:
        return args
    return [*args[:len(args) - len(command)], *prefix, *command]


def _own_options(args: list[str]) -> tuple[Path, str, list[str]]:
    """(--secrets-dir, --grace-s as text or '' for Horovod's own, horovodrun's arguments) from the front of
    `args`; argparse is not used as it would take horovodrun's options for its own."""
    secrets_dir, grace = Path.cwd(), os.environ.get(GRACE_ENV, "").strip()
    while args and args[0] in ("--secrets-dir", "--grace-s"):
        if len(args) < 2:
            what = "a folder" if args[0] == "--secrets-dir" else "a number of seconds"
            raise UserError(f"launch: {args[0]} needs {what}, then horovodrun's arguments "
                            "(see `hvdtrain launch --help`)")
        if args[0] == "--secrets-dir":
            secrets_dir = Path(args[1]).resolve()
        else:
            grace = args[1]
        args = args[2:]
    if grace:
        try:
            grace = str(grace_s(grace))
        except ValueError as err:
            raise UserError(f"launch: --grace-s / {GRACE_ENV}: {err}") from None
    return secrets_dir, grace, args
