"""Which variables count as credentials, how the environment is split, and the secrets file round trip."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

import pytest

from hvdtrain.environment.credentials import is_credential, leak_warning, split_env
from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV, load_secrets_file, read_secrets_file, write_secrets_file
from hvdtrain.errors import LaunchError, UserError
from hvdtrain.launcher.horovodrun import worker_env

CREDENTIALS = ["HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AWS_SESSION_ID", "DB_PASSWORD", "PGPASSWORD", "ghtoken", "MY_SECRET", "GOOGLE_APPLICATION_CREDENTIALS",
               "OPENAI_APIKEY", "GITHUB_PAT", "ssh_key_passphrase", "HVDTRAIN_TEST_SECRET_TOKEN", "SECRET",
               # experiment trackers' (issue 27): never on a Gloo worker's command line
               "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD",
               # issue 51 item 7: missed by name before
               "MYSQL_PWD", "DB_PASS", "REDIS_PASS", "AUTHORIZATION", "HTTP_AUTH", "DOCKER_AUTH_CONFIG",
               "SLACK_WEBHOOK_URL", "NETRC", "HTTP_AUTHORIZATION", "DISCORD_WEBHOOK", "SMTP_PASS", "NPM_CONFIG__AUTH",
               "CI_JOB_JWT", "mysql_pwd"]
NOT_CREDENTIALS = ["PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME", "KEYBOARD", "MONKEY_COUNT",
                   "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD", "HOROVOD_SECRET_KEY", "HOROVOD_GLOO_TIMEOUT_SECONDS",
                   SECRETS_FILE_ENV, "OMP_NUM_THREADS", "KEYCLOAK_URL", "PASSAGE_LIMIT",
                   "AWS_REGION", "AWS_CA_BUNDLE", "AWS_PROFILE", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                   "WANDB_MODE",
                   # issue 51 item 7: the new word rules leave these alone
                   "PASSTHROUGH", "PASS_THROUGH", "BYPASS_CACHE", "COMPASS_URL", "PASSAGE", "SSH_AUTH_SOCK",
                   "AUTH_URL", "AUTH_TYPE", "OAUTH_CLIENT_ID", "AUTHOR", "GIT_AUTHOR_NAME", "WEBHOOKING_DISABLED",
                   "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "HOROVOD_FUSION_THRESHOLD",
                   "HOROVOD_GLOO_IFACE",
                   "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "AWS_DEFAULT_REGION", "AWS_RETRY_MODE",
                   "AWS_MAX_ATTEMPTS", "AWS_STS_REGIONAL_ENDPOINTS", "GIT_COMMIT", "GITHUB_SHA", "CI_COMMIT_SHA",
                   "KEYTAB_DIR", "PWD_HISTORY"]
# Values a plain setting may hold: the value rules must not turn these variables into credentials either.
PUBLIC_SETTINGS = {"PWD": "/home/alice/project", "OLDPWD": "/home/alice",
                   "GIT_COMMIT": "9fceb02d0ae598e95dc970b74767f19372d61af8",
                   "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
                   "NCCL_SOCKET_IFNAME": "^lo,docker0", "TOKENIZERS_PARALLELISM": "false", "AWS_REGION": "us-east-1",
                   "PIP_INDEX_URL": "https://pypi.internal/simple", "OMP_NUM_THREADS": "4"}


@pytest.mark.parametrize("name", CREDENTIALS)
def test_credential_names_are_recognised(name):
    assert is_credential(name)


@pytest.mark.parametrize("name", NOT_CREDENTIALS)
def test_ordinary_names_are_not(name):
    assert not is_credential(name)


@pytest.mark.parametrize("name", sorted(PUBLIC_SETTINGS))
def test_ordinary_settings_stay_public_with_their_usual_values(name):
    assert not is_credential(name, PUBLIC_SETTINGS[name])
    public, secret = split_env(PUBLIC_SETTINGS)
    assert secret == {} and public.keys() == PUBLIC_SETTINGS.keys() - {"OLDPWD"}   # OLDPWD: the launcher's own


def test_split_keeps_ordinary_variables_moves_credentials_and_drops_the_launchers_own():
    public, secret = split_env({"PYTHONPATH": "/src", "HF_TOKEN": "hf_x", "SSH_AUTH_SOCK": "/tmp/agent",
                                "AWS_ACCESS_KEY_ID": "AKIA"})
    assert public == {"PYTHONPATH": "/src"}
    assert secret == {"HF_TOKEN": "hf_x", "AWS_ACCESS_KEY_ID": "AKIA"}


def test_secrets_file_is_private_and_round_trips(tmp_path):
    values = {"HF_TOKEN": "a=b c'd\"e $f", "EMPTY_SECRET": ""}
    path = write_secrets_file(values, tmp_path / "new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_secrets_file(path) == values
    environ = {SECRETS_FILE_ENV: str(path)}
    assert load_secrets_file(environ) == ["EMPTY_SECRET", "HF_TOKEN"]
    assert environ["HF_TOKEN"] == values["HF_TOKEN"]


def test_a_secrets_file_written_by_hand_may_hold_comments(tmp_path):
    path = tmp_path / "creds.env"
    path.write_text("# for the workers\n\nDB_PASSWORD=x=y\n")
    assert read_secrets_file(path) == {"DB_PASSWORD": "x=y"}
    path.write_text("not a line\n")
    with pytest.raises(UserError, match="line 1: expected NAME=value"):
        read_secrets_file(path)
    with pytest.raises(UserError, match="cannot read it on this host"):
        load_secrets_file({SECRETS_FILE_ENV: str(tmp_path / "missing.env")})


def test_a_value_with_a_line_break_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(LaunchError, match="PRIVATE_KEY holds a line break"):
        write_secrets_file({"PRIVATE_KEY": "-----BEGIN\nabc"}, tmp_path / "keys")
    assert not (tmp_path / "keys").exists()


def test_worker_env_forwards_only_the_files_path(tmp_path):
    env, path, names = worker_env({"PATH": "/bin", "HF_TOKEN": "hf_secret"}, tmp_path)
    assert names == ["HF_TOKEN"] and path is not None
    assert env == {"PATH": "/bin", SECRETS_FILE_ENV: str(path)}
    assert "hf_secret" not in " ".join(env.values())
    assert worker_env({"PATH": "/bin"}, tmp_path) == ({"PATH": "/bin"}, None, [])
    assert os.listdir(tmp_path) == [path.name]


def test_leak_warning_only_for_credentials_that_came_on_a_gloo_command_line():
    gloo = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_RANK": "0", "HF_TOKEN": "x", "DB_PASSWORD": "y"}
    warning = leak_warning(gloo, loaded=["DB_PASSWORD"])
    assert warning is not None and "HF_TOKEN" in warning and "DB_PASSWORD" not in warning
    assert "\n" not in warning
    assert leak_warning(gloo, loaded=["DB_PASSWORD", "HF_TOKEN"]) is None
    assert leak_warning({"OMPI_COMM_WORLD_RANK": "0", "HF_TOKEN": "x"}, loaded=[]) is None


def test_tracker_credentials_reach_workers_in_the_file_and_their_settings_on_the_command_line(tmp_path):
    env, path, names = worker_env({"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_TRACKING_TOKEN": "tok",
                                   "MLFLOW_TRACKING_PASSWORD": "pw", "WANDB_API_KEY": "key"}, tmp_path)
    assert names == ["MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "WANDB_API_KEY"] and path is not None
    assert env == {"MLFLOW_TRACKING_URI": "http://mlflow:5000", SECRETS_FILE_ENV: str(path)}
    assert read_secrets_file(path)["MLFLOW_TRACKING_TOKEN"] == "tok"


def test_a_killed_launchers_secrets_file_is_removed_by_the_next_launch_in_that_folder(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its PID is now dead: what kill -9 of a launcher leaves
    host = socket.gethostname()
    leftover = tmp_path / f".hvdtrain-secrets-{host}-{gone.pid}-abc123.env"
    live = tmp_path / f".hvdtrain-secrets-{host}-{os.getpid()}-def456.env"   # a launcher still running
    elsewhere = tmp_path / f".hvdtrain-secrets-other-host-{gone.pid}-ghi789.env"  # shared folder, other host
    for path in (leftover, live, elsewhere):
        path.write_text("HF_TOKEN=old\n")
    _, path, _ = worker_env({"HF_TOKEN": "new"}, tmp_path)
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name, path.name])
    assert path.name.startswith(f".hvdtrain-secrets-{host}-{os.getpid()}-")
