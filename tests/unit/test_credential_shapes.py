"""Credentials by the shape of their value, redaction, and run-folder file modes under a umask. (Issue 36, item 5;
issue 51, item 7: the table of shapes.)"""
from __future__ import annotations

import os
import stat

import pytest

from hvdtrain.config.train_config import TrainConfig
from hvdtrain.environment.credentials import is_credential, leak_warning, looks_secret, redact, split_env
from hvdtrain.output.files import atomic_write, write_text
from hvdtrain.tracking import context

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


GIT_SHA = "9fceb02d0ae598e95dc970b74767f19372d61af8"   # a commit id: the same shape as a W&B key
WANDB_KEY = "3f2a9c81d7e64b0a5c1e8f9d2b7a6c4e0d1f3b5a"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"
# (what, text holding it, the parts of it that must not survive redact): every shape of issue 51 item 7, and the
# ones that passed before it.
SHAPES = [
    ("url password", "http://alice:s3cret@mlflow.internal:5000", ["s3cret"]),
    ("url password with @ in it", "mysql://app:Zq8@Ym3@Xw2@db.internal:3306/runs", ["Zq8", "Ym3", "Xw2"]),
    ("url with an empty user", "http://:only-a-token@proxy:3128", ["only-a-token"]),
    ("azure AccountKey", SECRET_VALUES["AZURE_STORAGE_CONNECTION_STRING"], ["bXlrZXk"]),
    ("service bus SharedAccessKey", SECRET_VALUES["SERVICE_BUS"], ["abc123"]),
    ("SAS sig=", SECRET_VALUES["BLOB_SAS_URL"], ["AbCdEf"]),
    ("ODBC Pwd=", "Driver={ODBC};Server=db;Uid=sa;Pwd=p4ss;", ["p4ss"]),
    ("ODBC Pwd={...} with a ;", "Driver={ODBC};Server=db;Pwd={p4;ss!};", ["p4", "ss!"]),
    ("Authorization: Bearer in a curl line", "curl -H 'Authorization: Bearer tok3nValue.part2' https://api",
     ["tok3nValue", "part2"]),
    ("Authorization: Basic in a headers dict", "{'Authorization': 'Basic YWxpY2U6czNjcmV0', 'Accept': 'json'}",
     ["YWxpY2U6czNjcmV0"]),
    ("Proxy-Authorization header", "Proxy-Authorization: Basic cHJveHk6cHcx", ["cHJveHk6cHcx"]),
    ("HTTP_AUTHORIZATION=", "HTTP_AUTHORIZATION=Bearer abcDEF123456", ["abcDEF123456"]),
    ("a bare Bearer token", "Bearer 8f2kQ9xLm3Zp7Wv", ["8f2kQ9xLm3Zp7Wv"]),
    ("a bare Basic credential", "Basic dXNlcjpwYXNz", ["dXNlcjpwYXNz"]),
    ("Databricks dapi", "dapi0123456789abcdef0123456789abcdef", ["0123456789abcdef0123456789abcdef"]),
    ("W&B key by its variable's name", f"env WANDB_API_KEY={WANDB_KEY} python train.py", [WANDB_KEY]),
    ("W&B key in a netrc", f"machine api.wandb.ai\n  login user\n  password {WANDB_KEY}\n", [WANDB_KEY]),
    ("W&B key on one netrc line", f"machine api.wandb.ai login user password {WANDB_KEY}", [WANDB_KEY]),
    ("token= query parameter", "https://api.example.com/v1/x?token=qZ81mKd0&page=2", ["qZ81mKd0"]),
    ("api_key= query parameter", f"https://api.example.com/v1/x?api_key={WANDB_KEY}", [WANDB_KEY]),
    ("apikey= query parameter", "https://api.example.com/x?format=json&apikey=Kp9sLq2w", ["Kp9sLq2w"]),
    ("access_token= query parameter", "https://graph.example.com/me?access_token=EAAB9xyz12", ["EAAB9xyz12"]),
    ("S3 presigned URL", "https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential="
     "ASIAXAMPLEKEY0123456%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Security-Token=IQoJb3JpZ2luX2Vj"
     "%2Fsession&X-Amz-Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7",
     ["ASIAXAMPLEKEY0123456", "IQoJb3JpZ2luX2Vj", "5d672d79c15b13162d92"]),
    ("GCS signed URL", "https://storage.googleapis.com/b/o?X-Goog-Credential=sa%40p.iam&X-Goog-Signature=a1b2c3d4e5",
     ["a1b2c3d4e5", "sa%40p.iam"]),
    ("Stripe sk_live_", "sk_live_51HqLyjWDarjtT1zdp7dc", ["51HqLyjWDarjtT1zdp7dc"]),
    ("Stripe rk_live_", "rk_live_51HqLyjWDarjtT1zdp7dc", ["51HqLyjWDarjtT1zdp7dc"]),
    ("Stripe sk_test_", "sk_test_4eC39HqLyjWDarjtT1zdp7dc", ["4eC39HqLyjWDarjtT1zdp7dc"]),
    ("Google OAuth ya29.", "ya29.a0AfH6SMBx3kLq9Zp7Wv2Nm5Rt8Yc", ["a0AfH6SMBx3kLq9Zp7Wv2Nm5Rt8Yc"]),
    ("Slack app xapp-", "xapp-1-A01BC2DEF3G-1234567890123-abcdef0123456789", ["A01BC2DEF3G", "abcdef0123456789"]),
    ("SendGrid SG.", "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",
     ["ngeVfQFYQlKU0ufo8x5d1A", "TwL2iGABf9DHoTf"]),
    ("PEM RSA private key", f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----\n",
     [PEM_BODY, PEM_BODY[:16]]),
    ("PEM OpenSSH private key", f"key:\n-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n"
     "-----END OPENSSH PRIVATE KEY-----", [PEM_BODY]),
    ("PEM key in a service-account JSON", '{"private_key": "-----BEGIN PRIVATE KEY-----\\n' + PEM_BODY +
     '\\n-----END PRIVATE KEY-----\\n", "client_email": "sa@p.iam"}', [PEM_BODY]),
    ("PEM key cut before its END", f"-----BEGIN EC PRIVATE KEY-----\n{PEM_BODY}", [PEM_BODY]),
    ("Slack webhook URL", "https://hooks.slack.com/services/T0123ABC/B0456DEF/Xy7zAbCdEfGhIjKlMnOp",
     ["Xy7zAbCdEfGhIjKlMnOp"]),
    ("Discord webhook URL", "https://discord.com/api/webhooks/123456789/Ab-Cd_Ef0123456789", ["Ab-Cd_Ef0123456789"]),
    ("NAME=value of MYSQL_PWD / DB_PASS / REDIS_PASS", "env MYSQL_PWD=hunter2 DB_PASS='two words' REDIS_PASS=r3d1s",
     ["hunter2", "two words", "r3d1s"]),
    ("a Java property", "JAVA_OPTS=-Xmx2g -Djavax.net.ssl.keyStorePassword=ch4ngeit", ["ch4ngeit"]),
    ("GitHub ghp_", "ghp_0123456789abcdefghijABCDEFGHIJ012345", ["0123456789abcdefghij"]),
    ("GitHub token in a URL", SECRET_VALUES["INDEX"], ["0123456789abcdefghij"]),
    ("GitHub github_pat_", "github_pat_11ABCDEFG0123456789_abcdefghijklmnop", ["0123456789_abcdefghij"]),
    ("Hugging Face hf_", "hf_abcdefghijklmnopqrstuvwxyz0123", ["abcdefghijklmnopqrstuvwxyz"]),
    ("OpenAI / Anthropic sk-", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz", ["abcdefghijklmnopqrstuvwxyz"]),
    ("Slack xoxb-", "xoxb-1234567890-abcdefghij", ["1234567890-abcdefghij"]),
    ("AWS access key id", "AKIAIOSFODNN7EXAMPLE", ["IOSFODNN7"]),
    ("GitLab glpat-", "glpat-abcdefghij0123456789", ["abcdefghij0123456789"]),
    ("Google API key AIza", "AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", ["abcdefghijklmnopqrstuvwxyz"]),
    ("npm_", "npm_abcdefghijklmnopqrstuvwxyz0123456789", ["abcdefghijklmnopqrstuvwxyz"]),
    ("PyPI pypi-", "pypi-AgEIcHlwaS5vcmcCJGFiY2RlZmdoLWlqa2wtbW5vcC1xcnN0LXV2d3g", ["AgEIcHlwaS5vcmcCJGFiY2Rl"]),
    ("JWT", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc123signature", ["eyJzdWIiOiIxMjM0In0"]),
]
# Text that must come back as it is: commit ids, versions, prose about credentials, values that look a little
# like the shapes above.
PUBLIC_TEXTS = [
    GIT_SHA, f"GIT_COMMIT={GIT_SHA}", f"mlflow.source.git.commit {GIT_SHA}", "0.3.1.dev12+g9fceb02.d20261207",
    "2.6.0a0+git9fceb02", f"python:3.11@sha256:{GIT_SHA}{GIT_SHA[:24]}", "Basic authentication is off",
    "the Bearer Token header", "max_tokens=512 tokenizer=bert-base num_keys=3", "Password=$DB_PASSWORD",
    "http://mlflow:5000/#/experiments/1?searchFilter=x", "http://host:5000/users/alice@example.com",
    "alice@example.com", "ssh://git@github.com/org/repo.git", "https://h/x?page=2&sort=asc&format=json",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBa\n-----END CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
    "pk_live_51HqLyjWDarjtT1zdp7dc", "https://hooks.slack.com/", "SG.small", "dapi-docs", *PUBLIC_VALUES.values()]


@pytest.mark.parametrize("what, text, parts", SHAPES, ids=[what for what, _, _ in SHAPES])
def test_every_credential_shape_is_recognised_and_none_of_it_survives_redact(what, text, parts):
    assert looks_secret(text)
    assert is_credential("VALUE", text)     # a name that says nothing: the value alone decides
    redacted = redact(text)
    assert not [part for part in parts if part in redacted], redacted
    assert "***" in redacted
    assert redact(redacted) == redacted     # a second pass (the sink redacts what context.params redacted)


@pytest.mark.parametrize("text", PUBLIC_TEXTS)
def test_ordinary_text_is_left_as_it_is(text):
    assert not looks_secret(text)
    assert redact(text) == text
    assert not is_credential("GIT_COMMIT", text)


def test_redact_keeps_what_tells_where_for_the_new_shapes():
    assert redact("mysql://app:Zq8@Ym3@Xw2@db.internal:3306/runs") == "mysql://app:***@db.internal:3306/runs"
    assert redact("https://b/k?X-Amz-Date=20260101&X-Amz-Signature=5d67&x-id=GetObject") == (
        "https://b/k?X-Amz-Date=20260101&X-Amz-Signature=***&x-id=GetObject")
    assert redact("{'Authorization': 'Bearer tok3n', 'Accept': 'json'}") == (
        "{'Authorization': 'Bearer ***', 'Accept': 'json'}")
    assert redact(f"ok\n-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\nafter") == "ok\n***\nafter"
    assert redact("https://hooks.slack.com/services/T0/B0/Xy7z") == "https://hooks.slack.com/services/***"


def test_tracker_params_are_redacted_before_they_are_cut(tmp_path):
    """A value longer than MLflow's limit whose password straddles the cut: not even its start is stored."""
    password = "Pa55-start-" + "w" * 40 + "-end"
    uri = f"postgresql://app:{password}@db.internal:5432/runs"
    long_value = "d" * (context.MAX_PARAM_CHARS - 60) + " " + uri
    at = long_value.index(password)
    assert at < context.MAX_PARAM_CHARS < at + len(password)          # the cut falls inside the password
    assert "Pa55" in redact(long_value[:context.MAX_PARAM_CHARS])   # so cutting first would leak its start
    config = TrainConfig(dataset=f"parquet:{uri}", features=long_value, label=f"api_key={WANDB_KEY}",
                         name=f"run-{GIT_SHA}")
    params = context.params(config, "mlflow")
    stored = " ".join(params.values())
    assert "Pa55" not in stored and WANDB_KEY not in stored
    assert params["dataset"] == "parquet:postgresql://app:***@db.internal:5432/runs"
    assert params["features"].endswith("postgresql://app:***@db.internal:5432/runs")
    assert all(len(value) <= context.MAX_PARAM_CHARS for value in params.values())
    assert params["name"] == f"run-{GIT_SHA}"   # a commit id is kept
    tags = context.tags(tmp_path / f"runs-{GIT_SHA}", config, backend="Gloo", device="cpu")
    assert tags["run_dir"].endswith(f"runs-{GIT_SHA}")


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
