"""Tier 3: a plain Horovod script (it never imports hvdtrain) under `hvdtrain launch -np 2 --gloo` on localhost
finds what the launching environment meant for it (issue 52): HF_TOKEN in its environment, never on a command
line, and cores // workers-on-this-host torch threads unless the user set OMP_NUM_THREADS (then theirs).

Each rank asserts (SCRIPT): the token's sha256 (the value itself is on no command line, the test's included),
torch.get_num_threads(), and that no /proc/*/cmdline on the machine holds the value while both workers are up.
Two launches of 2 Gloo workers, each a few seconds on 2 busy cores.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from pathlib import Path

from support.paths import BIN

SCRIPT = '''
import hashlib, os, sys
from pathlib import Path

import horovod.torch as hvd
import torch

digest, threads, variables = sys.argv[1], int(sys.argv[2]), sys.argv[3]
token = os.environ.get("HF_TOKEN")
assert token is not None, "HF_TOKEN did not reach this worker's environment"
assert hashlib.sha256(token.encode()).hexdigest() == digest, "HF_TOKEN reached this worker with another value"
seen = ",".join(os.environ.get(name, "-") for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))
assert (torch.get_num_threads(), seen) == (threads, variables), (torch.get_num_threads(), seen)

hvd.init()
hvd.allreduce(torch.ones(1), name="both.up")   # both workers, and so the whole job's processes, are up
holders = []
for entry in Path("/proc").iterdir():
    try:
        cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
    except OSError:   # gone meanwhile
        continue
    if token.encode() in cmdline:
        holders.append(f"pid {entry.name}: {cmdline[:200]!r}")
assert not holders, holders
hvd.allreduce(torch.ones(1), name="both.scanned")   # neither ends (taking its shell along) before both scanned
print(f"rank {hvd.rank()}: token ok, {torch.get_num_threads()} threads, no command line holds it", flush=True)
'''


def launch(tmp_path: Path, threads: int, variables: str, **env: str) -> tuple[subprocess.CompletedProcess, str]:
    """`hvdtrain launch -np 2 --gloo python SCRIPT` with a fresh HF_TOKEN and `env` (OMP_NUM_THREADS and
    MKL_NUM_THREADS only if there); (the run, its output). Each worker expects torch to run `threads` threads and
    OMP_NUM_THREADS,MKL_NUM_THREADS to read `variables` ('-': unset)."""
    script = tmp_path / "own_script.py"
    script.write_text(SCRIPT)
    token = f"hf_{secrets.token_hex(16)}"
    full_env = {name: value for name, value in os.environ.items() if name not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    full_env.update(HF_TOKEN=token, PYTHONUNBUFFERED="1", **env)
    done = subprocess.run([str(BIN / "hvdtrain"), "launch", "-np", "2", "-H", "localhost:2", "--gloo",
                           "--network-interfaces", "lo", "--start-timeout", "120", "--disable-cache", sys.executable,
                           str(script), hashlib.sha256(token.encode()).hexdigest(), str(threads), variables],
                          cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert token not in out
    return done, out


def test_a_plain_horovod_script_gets_the_token_and_its_share_of_the_cores(tmp_path: Path):
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // 2)
    done, out = launch(tmp_path, share, f"{share},{share}")
    assert done.returncode == 0, out[-6000:]
    assert out.count(", no command line holds it") == 2, out[-6000:]
    line = (f"hvdtrain: OMP_NUM_THREADS={share} per worker ({cores} core{'s' * (cores != 1)}, 2 workers on this "
            "host); set it to override")
    assert out.count(line) == 1, out[-6000:]   # rank 0 only
    assert not list(tmp_path.glob(".hvdtrain-secrets-*")), "the secrets file outlived the job"


def test_a_user_set_thread_count_stands(tmp_path: Path):
    cores = len(os.sched_getaffinity(0))   # torch runs no more threads than cores, whatever OMP_NUM_THREADS says
    done, out = launch(tmp_path, cores, f"{cores},-", OMP_NUM_THREADS=str(cores))
    assert done.returncode == 0, out[-6000:]
    assert out.count(f"{cores} threads, no command line holds it") == 2, out[-6000:]
    assert "per worker (" not in out, out[-6000:]
