"""A real job under attack (issues 36 and 51): while `hvdtrain launch` trains 2 (and 3) workers, a separate process
(tests/support/control_attacker.py) sprays forged, malformed and oversized datagrams at every UDP port of the job's
processes and replays the datagrams it sniffs, and sends every listening TCP port of them (the elastic
rendezvous, Horovod's services, Gloo's) pickles that would create a file, forged registrations and
rank_and_size GETs, DELETEs of the rendezvous scopes and bodies declaring 8 GiB. Against the elastic job it
also holds the job's key: datagrams sealed under the workers' real sender ids with the largest sequence
numbers. The job must finish, no worker dropped, ended or stalled, no pickle of the attacker's ever unpickled,
with the weights of the same job unattacked (one non-elastic run: an elastic job that never resets trains the same
steps); and the control key must never be on any process's command line.

Non-elastic jobs are attacked on their peer watches (rank to rank); the elastic job on its driver's watch
and its workers' heartbeat sockets as well.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from support.paths import ROOT
from support.processes import kill_tree

JOB = ["--dataset", "synthetic", "--synthetic-samples", "2048", "--synthetic-shape", "1,8,8", "--model", "mlp",
       "--hidden", "64", "--batch-size", "16", "--lr", "0.05", "--lr-scaling", "none", "--warmup-epochs", "0",
       "--max-steps", "800", "--log-interval", "100", "--threads", "1", "--seed", "7",
       "--peer-timeout-s", "10"]   # short: an attack that silenced a rank for 10 s would end the job
CONTROL_KEY = "HVDTRAIN_CONTROL_KEY"


def command(folder: Path, np: int, elastic: bool, name: str) -> list[str]:
    placement = (["--min-np", str(np), "--max-np", str(np), "--host-discovery-script",
                  str(ROOT / "hostfiles" / "discover-hosts.sh")] if elastic else ["-H", f"localhost:{np}"])
    return [sys.executable, "-m", "hvdtrain", "launch", "--secrets-dir", str(folder), "-np", str(np), *placement,
            "--gloo", "--network-interfaces", "lo", "--start-timeout", "120", "--disable-cache",
            sys.executable, "-m", "hvdtrain", *JOB, "--run-dir", str(folder), "--name", name,
            *(["--elastic", "true"] if elastic else [])]


def family(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def secrets_file_key(folder: Path) -> str | None:
    """The key as the launcher wrote it for its workers (the test may read it; the attacker never does)."""
    for path in folder.glob(".hvdtrain-secrets-*.env"):
        for line in path.read_text().splitlines():
            if line.startswith(f"{CONTROL_KEY}="):
                return line.partition("=")[2]
    return None


def run(folder: Path, np: int, elastic: bool, name: str, attack: bool) -> tuple[int, str, dict, dict]:
    """(exit status, output, the attacker's report, what the command lines showed)."""
    hosts = folder / "hosts.txt"
    hosts.write_text(f"localhost:{np}\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), HVDTRAIN_HOSTS_FILE=str(hosts))
    log_path = folder / f"{name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command(folder, np, elastic, name), cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    attacker = None
    report_path = folder / f"{name}-attack.json"
    if attack:
        # Over TCP too (every listening port of the job's processes), and as a key holder over UDP: pickles that
        # would create the marker, forged registrations and rank_and_size GETs, 8 GiB bodies, huge sequence numbers.
        extra = ["--tcp", str(folder / "unpickled")]
        if elastic:
            extra += ["--key-from", str(folder)]
        attacker = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "control_attacker.py"),
                                     str(proc.pid), str(report_path), *extra], cwd=ROOT)
    seen = {"processes": 0, "key": None, "key_on_a_command_line": [], "name_on_a_command_line": []}
    try:
        deadline = time.monotonic() + 420
        while proc.poll() is None and time.monotonic() < deadline:
            seen["key"] = seen["key"] or secrets_file_key(folder)
            for member in family(proc.pid):
                try:
                    line = " ".join(member.cmdline())
                except psutil.Error:
                    continue
                seen["processes"] += 1
                if seen["key"] and seen["key"] in line:
                    seen["key_on_a_command_line"].append(line)
                if CONTROL_KEY in line:
                    seen["name_on_a_command_line"].append(line)
            time.sleep(0.3)
        if proc.poll() is None:
            raise AssertionError(f"the job hung for 420 s:\n{log_path.read_text()[-4000:]}")
    finally:
        kill_tree(proc, 9)
        if attacker is not None:
            attacker.wait(timeout=30)
    report = json.loads(report_path.read_text()) if attack else {}
    return proc.returncode, log_path.read_text(), report, seen


def weights(folder: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(folder / name / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def unattacked(tmp_path_factory) -> Callable[[int], dict[str, torch.Tensor]]:
    """The weights of the job unattacked, by number of workers: one non-elastic launch each, which the attacked
    job must equal, elastic or not (an elastic job that never resets trains the same steps on the same shards:
    one reference serves both watches, instead of a launch for each)."""
    found: dict[int, dict[str, torch.Tensor]] = {}

    def reference(np: int) -> dict[str, torch.Tensor]:
        if np not in found:
            folder = tmp_path_factory.mktemp(f"unattacked-{np}")
            code, output, _, _ = run(folder, np, False, "reference", attack=False)
            assert code == 0, output[-5000:]
            found[np] = weights(folder, "reference")
        return found[np]

    return reference


# 2 workers (the peer watch) and elastic (the driver watch) in the default run; 3 workers is the long tier.
@pytest.mark.parametrize("np_, elastic", [(2, False), pytest.param(3, False, marks=pytest.mark.long), (2, True)],
                         ids=["2-workers", "3-workers", "2-workers-elastic"])
def test_a_job_under_attack_finishes_as_if_unattacked_and_no_command_line_holds_the_key(tmp_path, np_, elastic,
                                                                                         unattacked):
    code, output, report, seen = run(tmp_path, np_, elastic, "attacked", attack=True)
    print(f"\nattack on {np_} workers{' (elastic)' if elastic else ''}: {report}")
    assert code == 0, output[-5000:]
    assert "hvdtrain: done" in output, output[-5000:]
    for sign in ("hvdtrain: error", "has not answered", "dropped this worker", "has not been heard from",
                 "Traceback", "Exception occurred during processing of request"):
        assert sign not in output, (sign, output[-5000:])
    # The attack landed: every process with a control socket was hit, and said so once.
    assert len(report["ports"]) >= np_ + (1 if elastic else 0), report
    assert report["sent"] > 1000, report
    assert report["tcp_sent"] > 50 and not (tmp_path / "unpickled").exists(), report   # no pickle of ours ran
    if elastic:   # the rendezvous among the ports hit; its refusals said once, then counted
        assert "the elastic rendezvous refused a request" in output, output[-5000:]
        if report["could_sniff"]:
            assert report["key_holder_sent"] > 0 and report["senders"], report
    if report["could_sniff"]:
        assert report["sniffed"] > 0 and report["replayed"] > 0, report
    assert output.count("dropped a datagram that is not this job's") >= (1 if elastic else np_), output[-5000:]
    # The key: in the 0600 file for the driver and workers of every one-machine job, on no command line (nor its
    # name): the Gloo rendezvous refused the attacker's PUTs of rank addresses, which crash an unguarded job.
    assert seen["processes"] > np_
    assert seen["key"], "the one-machine launch wrote no control key in its secrets file"
    assert seen["key_on_a_command_line"] == [] and seen["name_on_a_command_line"] == [], seen
    assert "HVDTRAIN_CONTROL_KEY go to" not in output   # not announced as a user's credential

    got, want = weights(tmp_path, "attacked"), unattacked(np_)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], rtol=0, atol=1e-6), (key, (got[key] - want[key]).abs().max())
