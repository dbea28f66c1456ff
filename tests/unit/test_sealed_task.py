"""launcher/sealed_task.py, the entry each launch() worker runs in place of Horovod's run_task (issue 51): it takes the
job from the store as raw ciphertext and opens it before anything is unpickled, so a host that answers in the
launcher's place cannot hand it a pickle; the result goes back sealed, with the token the store checks first.
A real store on a socket and the real console script in a child process; no Horovod."""
from __future__ import annotations

import base64
import operator
import os
import pickle
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cloudpickle

from hvdtrain.environment.secrets_file import write_secrets_file
from hvdtrain.launcher.guard import Guarded
from hvdtrain.launcher.job_store import RAW_JOB_PATH, JobStore
from hvdtrain.launcher.local import codec_body
from hvdtrain.launcher.sealed import KEY_VAR, SealedJob, new_key, seal

ENTRY = Path(sys.executable).parent / "hvdtrain-sealed-task"


class Planted:
    """Unpickling this creates a file: the proof that the worker unpickled what an impostor served."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def run_task(port: int, key_file: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HVDTRAIN_SECRETS_FILE=str(key_file), HOROVOD_RANK="1", HOROVOD_SIZE="2",
               HOROVOD_LOCAL_RANK="1", HOROVOD_LOCAL_SIZE="2")
    return subprocess.run([str(ENTRY), "-m", "horovod.runner.run_task", "127.0.0.1", str(port)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_worker_runs_the_sealed_job_and_its_result_is_taken_by_the_store(tmp_path):
    key = new_key()
    key_file = write_secrets_file({KEY_VAR: key.hex()}, tmp_path)
    job = SealedJob(str(key_file), seal(key, "job", cloudpickle.dumps(Guarded(operator.mul, (6, 7), {}))))
    store = JobStore(codec_body(job), key, num_proc=2, host="127.0.0.1", raw_job=job.job)
    port = store.start_server()
    try:
        done = run_task(port, key_file)
    finally:
        store.shutdown_server()
    assert done.returncode == 0, done.stderr
    assert store.result(1) == 42 and store.refused_count == 0


def test_an_impostor_serving_a_pickle_is_refused_and_nothing_of_it_is_unpickled(tmp_path):
    """Before: Horovod's run_task unpickled whatever answered at the launcher's address."""
    marker = tmp_path / "unpickled"
    body = pickle.dumps(Planted(marker))

    class Impostor(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - http.server's naming
            answer = body if self.path == RAW_JOB_PATH else base64.b64encode(body)
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    key_file = write_secrets_file({KEY_VAR: new_key().hex()}, tmp_path)
    try:
        done = run_task(server.server_address[1], key_file)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2 and not marker.exists(), done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("hvdtrain: error: launch(): the job is not this launch's")


def test_started_by_hand_it_says_what_it_is_in_one_line():
    done = subprocess.run([str(ENTRY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "launch()" in done.stderr
