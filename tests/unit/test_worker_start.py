"""What a worker of `hvdtrain launch` does before its command (launcher/worker_start.py) and how `hvdtrain launch`
puts it there (cli/launch.py): the thread share, the credentials, the exec, the worker command found by
horovodrun's own parser. The exec runs for real in a child Python; the launch with horovodrun is
tests/multirank/test_launch_own_script.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hvdtrain.cli.launch import with_worker_start, worker_command
from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV, write_secrets_file
from hvdtrain.launcher.worker_start import (
    MODULE,
    command_prefix,
    set_threads,
    split_assignments,
    take_secrets,
    thread_share,
)

TWO_HERE = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}


@pytest.mark.parametrize("env, cores, share", [
    (TWO_HERE, 16, (8, 2)),
    (TWO_HERE, 2, (1, 2)),
    (TWO_HERE, 3, (1, 2)),                                            # rounded down: never more threads than cores
    ({**TWO_HERE, "HOROVOD_LOCAL_SIZE": "8"}, 2, (1, 8)),             # more workers than cores: still one each
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 8, (4, 2)),
    ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}, 8, (4, 2)),          # no local size: one host, as process.py reads it
    ({**TWO_HERE, "OMP_NUM_THREADS": ""}, 4, (2, 2)),                # empty is unset, as OpenMP reads it
])
def test_a_worker_gets_its_hosts_cores_divided_by_the_workers_on_it(env, cores, share):
    assert thread_share(env, cores) == share


@pytest.mark.parametrize("env", [{**TWO_HERE, "OMP_NUM_THREADS": "3"}, {**TWO_HERE, "MKL_NUM_THREADS": "3"}, {},
                                 {**TWO_HERE, "HOROVOD_LOCAL_SIZE": "1"}])
def test_a_users_own_setting_a_worker_alone_on_its_host_or_no_launcher_leave_threads_alone(env):
    assert thread_share(env, 16) is None
    before = dict(env)
    assert set_threads(env, 16) is None
    assert env == before


def test_the_share_is_set_for_openmp_and_mkl_and_said_in_one_line():
    env = dict(TWO_HERE)
    line = set_threads(env, 2)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert line == "OMP_NUM_THREADS=1 per worker (2 cores, 2 workers on this host); set it to override"
    assert set_threads(dict(TWO_HERE), 1) == ("OMP_NUM_THREADS=1 per worker (1 core, 2 workers on this host); set it "
                                              "to override")


def test_leading_assignments_are_the_commands_variables_as_env_reads_them():
    assert split_assignments(["A=1", "B_2=x=y", "python", "C=3"]) == ({"A": "1", "B_2": "x=y"}, ["python", "C=3"])
    assert split_assignments(["./run=fast", "x"]) == ({}, ["./run=fast", "x"])     # not a name: the command
    assert split_assignments(["A=1"]) == ({"A": "1"}, [])


def test_take_secrets_loads_the_file_and_warns_of_what_came_on_the_command_line(tmp_path):
    path = write_secrets_file({"HF_TOKEN": "hf_from_file"}, tmp_path)
    env = {**TWO_HERE, "HOROVOD_CONTROLLER": "gloo", SECRETS_FILE_ENV: str(path), "WANDB_API_KEY": "leaked"}
    warning = take_secrets(env)
    assert env["HF_TOKEN"] == "hf_from_file"
    assert warning is not None and "WANDB_API_KEY" in warning and "HF_TOKEN" not in warning


def test_horovodruns_parser_finds_the_worker_command_and_the_prefix_goes_in_front_of_it():
    args = ["-np", "2", "-H", "localhost:2", "--gloo", "--start-timeout", "60", "python", "t.py", "-np", "3", "-v"]
    command = worker_command(args)
    assert command == ["python", "t.py", "-np", "3", "-v"]     # the script's own -np and -v are the script's
    assert with_worker_start(args, command, ["START"]) == [*args[:7], "START", *command]
    assert with_worker_start(args, ["other"], ["START"]) == args   # not the tail: left as it is


def test_a_command_horovodrun_refuses_or_lacks_is_left_to_horovodrun(capsys):
    assert worker_command(["--no-such-option", "python", "t.py"]) == []
    assert worker_command(["-np", "2"]) == []
    assert capsys.readouterr() == ("", "")     # horovodrun, run next, says what is wrong


def test_horovodruns_own_answers_are_given_at_once(capsys):
    assert worker_command(["--version"]) == 0
    assert capsys.readouterr().out.strip()[0].isdigit()


def run_start(command: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", SECRETS_FILE_ENV)
             and not k.startswith(("HOROVOD_", "OMPI_"))}
    return subprocess.run([*command_prefix(), *command], env={**clean, **env}, input=stdin, capture_output=True,
                          text=True, timeout=60)


SHOW = "import os, sys; print(os.environ.get('HF_TOKEN'), os.environ.get('OMP_NUM_THREADS'), sys.stdin.read()); " \
       "sys.exit(7)"


def test_the_command_replaces_the_start_with_its_environment_stdin_and_exit_code(tmp_path):
    path = write_secrets_file({"HF_TOKEN": "hf_from_file"}, tmp_path)
    done = run_start([sys.executable, "-c", SHOW], {**TWO_HERE, SECRETS_FILE_ENV: str(path)}, stdin="in")
    assert done.returncode == 7, done.stderr
    assert done.stdout.split() == ["hf_from_file", str(max(1, len(os.sched_getaffinity(0)) // 2)), "in"]
    assert done.stderr.count("hvdtrain: OMP_NUM_THREADS=") == 1   # rank 0
    other = run_start(["OMP_NUM_THREADS=5", sys.executable, "-c", SHOW], {**TWO_HERE, "HOROVOD_RANK": "1"})
    assert other.returncode == 7 and other.stdout.split() == ["None", "5"] and other.stderr == ""


def test_a_command_that_cannot_run_and_a_missing_file_are_one_line_each(tmp_path):
    missing = run_start(["no-such-program-here"], {**TWO_HERE, "HOROVOD_RANK": "1"})
    assert missing.returncode == 127
    assert missing.stderr.strip() == "hvdtrain: error: cannot run 'no-such-program-here' on this worker: " \
                                     "No such file or directory"
    unread = run_start(["true"], {SECRETS_FILE_ENV: str(tmp_path / "gone.env")})
    assert unread.returncode == 2 and unread.stderr.count("\n") == 1 and "cannot read it" in unread.stderr
    assert run_start([], {}).returncode == 2


def test_the_command_gets_sigpipe_and_sigxfsz_back_though_python_ignores_them():
    done = run_start(["grep", "SigIgn", "/proc/self/status"], {})   # the exec'd program's own ignored signals
    ignored = int(done.stdout.split()[1], 16)
    assert ignored & (1 << (13 - 1) | 1 << (25 - 1)) == 0, done.stdout   # SIGPIPE 13, SIGXFSZ 25 on Linux
    assert command_prefix() == [sys.executable, "-m", MODULE]


def test_the_start_imports_neither_torch_nor_horovod_and_its_examples_hold():
    import doctest

    import hvdtrain.cli.launch
    import hvdtrain.launcher.worker_start

    code = (f"import sys, {MODULE}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('horovod', 'torch')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    for module in (hvdtrain.launcher.worker_start, hvdtrain.cli.launch):
        result = doctest.testmod(module)
        assert result.attempted and not result.failed, module.__name__
