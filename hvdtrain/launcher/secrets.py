"""Credentials never ride on a command line: which variables count as credentials, and how they travel.

Why: horovodrun with Gloo starts every worker as `sh -c 'env NAME=value ... python ...'`, and on a
remote host inside `ssh HOST 'cd DIR ; env NAME=value ...'`, so every exported variable's value is in
the process list of the launching host and of every worker host (horovod/runner/gloo_run.py,
`_slot_info_to_command_fn`). With MPI, horovodrun passes `mpirun -x NAME` (names only) and Open MPI
sends the values over its own channel. hvdtrain's launchers therefore take credential-like variables
out of the environment they hand to Horovod and deliver them another way: inside the pickled job
(`launch()`, Spark) or in a 0600 file whose *path* is forwarded as HVDTRAIN_SECRETS_FILE
(`hvdtrain launch`, `hvdtrain tune`); workers load that file before any user code runs.

A credential is recognised by its variable's name (HF_TOKEN, DB_PASSWORD, AWS_*) or by the shape of its
value, whatever the name (environment/credentials.py: a URL with a password such as
`MLFLOW_TRACKING_URI=http://user:pw@host`, a connection string with an AccountKey, a token such as ghp_...).

Nothing here imports Horovod; the calling process and the workers both use it.
"""
from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from hvdtrain.environment import process
from hvdtrain.environment.credentials import looks_secret
from hvdtrain.errors import LaunchError, UserError

SECRETS_FILE_ENV = "HVDTRAIN_SECRETS_FILE"
_PREFIX = ".hvdtrain-secrets-"
# Whole words of a variable's name (split at '_'), so KEYBOARD, MONKEY or TOKENIZERS_PARALLELISM do not match.
CREDENTIAL_WORDS = frozenset({"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE",
                              "CREDENTIAL", "CREDENTIALS", "KEY", "KEYS", "APIKEY", "PAT", "COOKIE", "JWT",
                              "AUTHORIZATION", "WEBHOOK", "WEBHOOKS", "NETRC"})
# Long enough to match at the end of a word too (PGPASSWORD, GHTOKEN); KEY is not (MONKEY, HOTKEY).
CREDENTIAL_ENDINGS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIALS", "APIKEY", "WEBHOOK")
# Short words that name a credential only as the last word of a longer name: MYSQL_PWD, DB_PASS, HTTP_AUTH; not
# the shell's PWD (its current directory) or OLDPWD, nor PASS_THROUGH, SSH_AUTH_SOCK or AUTH_URL.
CREDENTIAL_LAST_WORDS = frozenset({"PWD", "PASS", "AUTH"})
# Whole names that hold a credential but match no word rule (GitLab CI's registry logins, JSON).
CREDENTIAL_NAMES = frozenset({"DOCKER_AUTH_CONFIG"})
# Every AWS_* is treated as one (AWS_SESSION_TOKEN, AWS_SECRET_ACCESS_KEY, ...) but its plain settings.
CREDENTIAL_PREFIXES = ("AWS_",)
AWS_SETTINGS = frozenset({"AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE", "AWS_PROFILE", "AWS_CONFIG_FILE",
                          "AWS_DEFAULT_OUTPUT", "AWS_ENDPOINT_URL", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE",
                          "AWS_STS_REGIONAL_ENDPOINTS", "AWS_SDK_LOAD_CONFIG", "AWS_EC2_METADATA_DISABLED"})
# Variables the workers need by name, never secret themselves: Horovod's own (its secret key it never
# forwards) and the path of our file.
NEVER = frozenset({SECRETS_FILE_ENV})
# The launching shell's own state: meaningless on a worker, and some of it (an ssh agent socket) is sensitive.
LAUNCHER_ONLY = frozenset({"SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY",
                           "LS_COLORS", "DISPLAY", "XAUTHORITY", "PS1", "PROMPT_COMMAND", "HISTFILE", "MAIL",
                           "DBUS_SESSION_BUS_ADDRESS", "XDG_SESSION_ID", "XDG_RUNTIME_DIR", "OLDPWD"})


def is_credential(name: str, value: str | None = None) -> bool:
    """Whether a variable's value should never appear on a command line: by its name, or by its value's shape.

    Example:
        >>> [is_credential(n) for n in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SESSION_ID", "KEYBOARD", "AWS_REGION")]
        [True, True, True, False, False]
        >>> [is_credential(n) for n in ("MYSQL_PWD", "DB_PASS", "HTTP_AUTH", "PWD", "OLDPWD", "SSH_AUTH_SOCK")]
        [True, True, True, False, False, False]
        >>> [is_credential("MLFLOW_TRACKING_URI", v) for v in ("http://u:pw@mlflow", "http://mlflow")]
        [True, False]
    """
    if value and looks_secret(value):
        return True
    upper = name.upper()
    if upper in NEVER or upper in AWS_SETTINGS or upper.startswith("HOROVOD_"):
        return False
    words = upper.split("_")
    return (upper in CREDENTIAL_NAMES or upper.startswith(CREDENTIAL_PREFIXES)
            or not CREDENTIAL_WORDS.isdisjoint(words) or (len(words) > 1 and words[-1] in CREDENTIAL_LAST_WORDS)
            or any(word.endswith(CREDENTIAL_ENDINGS) for word in words))


def split_env(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(what workers may get on their command line, credentials), launcher-only variables dropped."""
    public: dict[str, str] = {}
    secret: dict[str, str] = {}
    for name, value in env.items():
        if name in LAUNCHER_ONLY:
            continue
        (secret if is_credential(name, value) else public)[name] = value
    return public, secret


def write_secrets_file(secrets: Mapping[str, str], folder: Path) -> Path:
    """Write `NAME=value` lines to a new file only its owner can read, in `folder`; returns its path.

    The folder must be visible to the workers at the same path (the run directory's file system).
    """
    for name, value in secrets.items():
        if "\n" in value or "\r" in value:
            raise LaunchError(f"variable {name} holds a line break and cannot go in a secrets file; "
                              "put its value in a file of its own and pass that file's path instead")
    folder.mkdir(parents=True, exist_ok=True)
    remove_leftovers(folder)
    # mkstemp creates the file 0600 from the start: no moment where it is readable by others. The name
    # carries host and PID, so a later launch can tell a killed launcher's file from a live one's.
    handle, path = tempfile.mkstemp(prefix=f"{_PREFIX}{socket.gethostname()}-{os.getpid()}-", suffix=".env",
                                    dir=folder)
    with os.fdopen(handle, "w") as out:
        out.write("".join(f"{name}={value}\n" for name, value in secrets.items()))
    return Path(path)


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete secrets files in `folder` written on this host by launchers no longer running (kill -9 leaves
    them, as no handler runs); returns them. Files of other hosts or of live processes are left alone."""
    removed = []
    for path in folder.glob(f"{_PREFIX}{socket.gethostname()}-*-*.env"):
        pid = path.name[len(_PREFIX) + len(socket.gethostname()) + 1:].split("-", 1)[0]
        try:
            # Another user's file (a shared /tmp, sticky) is theirs to remove: unlinking it would fail, and
            # a file planted under our name pattern must not stop our launch.
            if path.lstat().st_uid != os.getuid() or not pid.isdigit() or _alive(int(pid)):
                continue
            path.unlink()
        except OSError:
            continue   # gone meanwhile, or not ours to remove
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True   # someone else's process
    return True


def read_secrets_file(path: Path) -> dict[str, str]:
    """`NAME=value` per line (blank lines and # comments skipped), as `docker run --env-file` reads them."""
    try:
        text = path.read_text()
    except OSError as err:
        raise UserError(f"{SECRETS_FILE_ENV}={path}: cannot read it on this host ({err.strerror}); the file "
                        "must exist at that path on every worker host") from None
    found = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip().isidentifier():
            raise UserError(f"{SECRETS_FILE_ENV}={path} line {number}: expected NAME=value")
        found[name.strip()] = value
    return found


def load_secrets_file(environ: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """On a worker: set the variables of HVDTRAIN_SECRETS_FILE (if set) in `environ`; returns their names."""
    location = environ.get(SECRETS_FILE_ENV)
    if not location:
        return []
    path = Path(location)
    found = read_secrets_file(path)
    environ.update(found)
    return sorted(found)


def leak_warning(environ: Mapping[str, str], loaded: list[str]) -> str | None:
    """On a Gloo worker under horovodrun: a one-line warning naming credentials that came on its command line."""
    started = process.from_env(environ)
    if environ.get("HOROVOD_CONTROLLER") != "gloo" or started is None or started.launcher != "gloo":
        return None  # MPI passes names only (mpirun -x); schedulers set the environment directly
    leaked = sorted(name for name, value in environ.items() if is_credential(name, value) and name not in loaded)
    if not leaked:
        return None
    return (f"warning: {', '.join(leaked)} reached the workers on horovodrun's command line, readable in the "
            f"process list of every host; use `hvdtrain launch` instead of horovodrun, or pass them in a "
            f"0600 file named by {SECRETS_FILE_ENV} (docs/security.md)")
