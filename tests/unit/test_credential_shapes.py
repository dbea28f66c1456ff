"""Credentials by the shape of their value, redaction, and run-folder file modes under a umask. (Issue 36, item 5.)"""
from __future__ import annotations

import os
import stat

import pytest

from hvdtrain.environment.credentials import looks_secret, redact
from hvdtrain.launcher.secrets import is_credential, leak_warning, split_env
from hvdtrain.output.files import atomic_write, write_text

SECRET_VALUES = {
    "MLFLOW_TRACKING_URI": "http://alice:s3cret@mlflow.internal:5000",
    "DATABASE_URL": "postgresql://app:hunter2@db:5432/runs",
    "HTTPS_PROXY": "http://proxyuser:pr0xy@proxy:3128",
    "HTTP_PROXY": "http://:only-a-token@proxy:3128",
    "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=bXlrZXk=;"
                                       "EndpointSuffix=core.windows.net",
    "SERVICE_BUS": "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=abc123=",
    "BLOB_SAS_URL": "https://acct.blob.core.windows.net/c?sv=2022-11-02&sp=r&sig=AbCdEf%2B123",
    "ODBC": "Driver={ODBC};Server=db;Uid=sa;Pwd=p4ss;",
    "GIT_REMOTE": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "HUB": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "LLM": "sk-proj-abcdefghijklmnopqrstuvwxyz",
    "SLACK_HOOK_BOT": "xoxb-1234567890-abcdefghij",
    "AWS_LIKE": "AKIAIOSFODNN7EXAMPLE",
    "INDEX": "https://ghp_0123456789abcdefghijABCDEFGHIJ012345@github.com/org/repo.git",
}
PUBLIC_VALUES = {
    "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
    "HTTPS_PROXY": "http://proxy.internal:3128",
    "HTTP_PROXY": "http://user@proxy:3128",          # a user name is not a credential
    "NO_PROXY": "localhost,127.0.0.1,.internal",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTHONPATH": "/src/sk-learn-tools:/work",
    "GIT_URL": "git@github.com:org/repo.git",
    "DATA": "s3://bucket/path/to/shards",
    "TOKENIZERS_PARALLELISM": "false",
    "MODEL": "hf_hub:timm/resnet18",
    "LOG_FORMAT": "%(asctime)s %(message)s",
}


@pytest.mark.parametrize("name", sorted(SECRET_VALUES))
def test_a_credential_is_recognised_by_its_value_whatever_its_name(name):
    assert looks_secret(SECRET_VALUES[name])
    assert is_credential(name, SECRET_VALUES[name])


@pytest.mark.parametrize("name", sorted(PUBLIC_VALUES))
def test_ordinary_values_stay_public(name):
    assert not looks_secret(PUBLIC_VALUES[name])
    assert not is_credential(name, PUBLIC_VALUES[name])


def test_split_env_sends_a_uri_with_a_password_the_credentials_way_and_keeps_a_plain_one_public():
    public, secret = split_env({"MLFLOW_TRACKING_URI": "http://u:pw@h:5000", "HTTPS_PROXY": "http://proxy:3128"})
    assert secret == {"MLFLOW_TRACKING_URI": "http://u:pw@h:5000"}
    assert public == {"HTTPS_PROXY": "http://proxy:3128"}


def test_redact_keeps_what_tells_where_and_masks_only_the_secret():
    assert redact(SECRET_VALUES["MLFLOW_TRACKING_URI"]) == "http://alice:***@mlflow.internal:5000"
    assert redact(SECRET_VALUES["HTTP_PROXY"]) == "http://:***@proxy:3128"
    assert redact(SECRET_VALUES["AZURE_STORAGE_CONNECTION_STRING"]) == (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net")
    assert redact(SECRET_VALUES["BLOB_SAS_URL"]).endswith("&sp=r&sig=***")
    assert redact(SECRET_VALUES["INDEX"]) == "https://***@github.com/org/repo.git"
    assert redact("cannot reach http://u:pw@h:1/api (token hf_abcdefghijklmnopqrstuvwxyz0123)") == (
        "cannot reach http://u:***@h:1/api (token ***)")
    fragments = ["s3cret", "hunter2", "pr0xy", "only-a-token", "bXlrZXk", "abc123", "AbCdEf", "p4ss",
                 "0123456789abcdefghij", "abcdefghijklmnopqrstuvwxyz", "1234567890-abcdefghij", "IOSFODNN7"]
    for value in SECRET_VALUES.values():
        assert not [f for f in fragments if f in redact(value)], value
    for value in PUBLIC_VALUES.values():
        assert redact(value) == value


def test_the_gloo_leak_warning_names_a_variable_whose_value_is_a_credential():
    environ = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0",
               "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1",
               "HOROVOD_HOSTNAME": "localhost", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
               "MLFLOW_TRACKING_URI": "http://u:pw@h:5000"}
    warning = leak_warning(environ, [])
    assert warning is not None and "MLFLOW_TRACKING_URI" in warning and "pw" not in warning
    assert "docs/security.md" in warning


@pytest.fixture
def umask():
    """Set a umask for the test; the old one comes back."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


@pytest.mark.parametrize("mask, expected", [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_files_written_in_a_run_folder_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    path = write_text(tmp_path / "summary.json", "{}")
    assert stat.S_IMODE(path.stat().st_mode) == expected
    (tmp_path / ".again.json.tmp").write_text("a leftover, world-readable")
    os.chmod(tmp_path / ".again.json.tmp", 0o666)
    again = atomic_write(tmp_path / "again.json", lambda f: f.write(b"{}"))
    assert stat.S_IMODE(again.stat().st_mode) == expected


def test_a_credential_bearing_file_is_0600_whatever_the_umask(tmp_path, umask):
    umask(0o002)
    path = write_text(tmp_path / "creds.env", "X=1\n", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
