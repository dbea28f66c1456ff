"""`hvdtrain-sealed-task -m horovod.runner.run_task ADDR PORT`: what each worker of `hvdtrain.launch()` runs, in place
of Horovod's run_task.

Why: Horovod 0.28.1's run_task GETs the job from the launcher's store and unpickles whatever answers
(codec.loads_base64) before any hvdtrain code runs: someone who can impersonate the launching host's address (ARP
or DNS spoofing) could hand the workers a pickle, which runs code. launch() names this console script as Horovod's
`executable`, so Horovod starts it with run_task's arguments. It GETs the job as raw ciphertext (no pickle),
opens it with the launch's key from the 0600 file HVDTRAIN_SECRETS_FILE names, and only then unpickles it
(authenticated: it was sealed with that key); runs it; and PUTs its rank's result sealed, with the token the store
checks before reading a body (sealed.result_token).

Nothing here imports Horovod.
"""
from __future__ import annotations

import base64
import os
import pickle
import sys
import urllib.request

from hvdtrain.errors import UserError
from hvdtrain.launcher.job_store import RAW_JOB_PATH
from hvdtrain.launcher.sealed import RESULT_AUTH_HEADER, read_key, result_token, run_sealed

HOROVOD_TASK = ["-m", "horovod.runner.run_task"]
TIMEOUT_S = 60


def _url(addr: str, port: int, path: str) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"http://{host}:{port}{path}"


def run(addr: str, port: int, key_file: str) -> None:
    key = read_key(key_file)
    with urllib.request.urlopen(_url(addr, port, RAW_JOB_PATH), timeout=TIMEOUT_S) as answer:
        sealed_job = answer.read()
    rank, sealed = run_sealed(key, sealed_job)   # opened with the key before anything is unpickled
    body = base64.b64encode(pickle.dumps(sealed, protocol=4))   # as Horovod's codec sends one bytes object
    request = urllib.request.Request(_url(addr, port, f"/runfunc_result/{rank}"), data=body, method="PUT",
                                     headers={RESULT_AUTH_HEADER: result_token(key, rank, len(body))})
    urllib.request.urlopen(request, timeout=TIMEOUT_S).close()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4 or args[:2] != HOROVOD_TASK or not args[3].isdigit():
        print("hvdtrain-sealed-task: error: expected -m horovod.runner.run_task ADDR PORT (launch() starts it; "
              "it is not meant to be run by hand)", file=sys.stderr, flush=True)
        return 2
    key_file = os.environ.get("HVDTRAIN_SECRETS_FILE", "")
    if not key_file:
        print("hvdtrain-sealed-task: error: no HVDTRAIN_SECRETS_FILE (launch() sets it)", file=sys.stderr, flush=True)
        return 2
    try:
        run(args[2], int(args[3]), key_file)
    except UserError as err:
        print(f"hvdtrain: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
