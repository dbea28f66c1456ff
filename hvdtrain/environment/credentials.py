"""Credentials, the one home of telling them: by a variable's name (`is_credential`: HF_TOKEN, DB_PASSWORD, AWS_*),
by the shape of a value whatever its variable is called (`looks_secret`), and how to write text without them
(`redact`). The launchers keep credentials off command lines (`split_env`; they travel in the secrets file,
environment/secrets_file.py) and a Gloo worker names those that came on one anyway (`leak_warning`).

By the shape of a value:

A URL with a password in its userinfo (`MLFLOW_TRACKING_URI=http://user:pw@host`, DATABASE_URL, HTTPS_PROXY),
a connection string with an AccountKey / Password / SharedAccessSignature (Azure storage, ODBC, Service
Bus, SAS query strings), a URL's `token=` / `api_key=` / `X-Amz-Signature=` query parameter, an
`Authorization: Bearer ...` header, a `NAME=value` whose name says credential (`WANDB_API_KEY=...`), a PEM
private key, a Slack or Discord webhook URL, or a token with a well-known prefix (ghp_, hf_, sk-, xoxb-, AKIA,
dapi, sk_live_, ya29., SG....). The launchers keep such values off command lines (environment/secrets_file.py);
`redact()` writes them as `user:***@` / `***` wherever hvdtrain shows or stores text that may hold them (run
folders, MLflow / W&B params and tags, warning lines).

A bare 40-hex value is not a credential by its shape: a W&B API key is one, but so is every git commit id
(CI's GIT_COMMIT / GITHUB_SHA, a tracker's source-commit tag), and masking those would hide which code ran.
A W&B key is recognised by its context instead: its variable's name (WANDB_API_KEY, environment/secrets_file.py),
`WANDB_API_KEY=<key>` or `api_key=<key>` in text, `password <key>` in a netrc line, an Authorization header.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from hvdtrain.environment import process
from hvdtrain.environment.secrets_file import SECRETS_FILE_ENV

MASK = "***"

# A value that is a shell reference or a template is not the secret itself: `Password=$DB_PASSWORD`.
_VALUE = r"(?:'[^']*'|\"[^\"]*\"|\{[^}]*\}|(?!\$)[^;&\s]+)"
# scheme://user:password@host. The password may hold a raw '@' (user:p@ss@host): the match runs to the last
# '@' before the host's '/', '?', '#' or whitespace, so none of it is left. An empty password (`user:@`) too.
_URL_PASSWORD = re.compile(r"(?P<head>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:?#]*:)"
                           r"(?P<secret>[^\s/?#]*)(?=@)")
# Connection strings (Azure, ODBC, Service Bus), SAS / presigned (S3, GCS, CloudFront) URLs and OAuth-style
# query parameters: the value only, after one of ; ? & , ( - or whitespace.
_KEYED_SECRET = re.compile(r"(?i)(?P<head>(?:^|[;?&\s,(-])(?:AccountKey|SharedAccessKey|SharedAccessSignature|"
                           r"Password|Pwd|sig|Signature|token|access_token|refresh_token|id_token|auth_token|"
                           r"private_token|api_key|apikey|api-key|client_secret|secret|X-Amz-Signature|"
                           r"X-Amz-Security-Token|X-Amz-Credential|X-Goog-Signature|X-Goog-Credential)=)"
                           rf"(?P<secret>{_VALUE})")
# NAME=value where the name ends as a credential's does (`env WANDB_API_KEY=... MYSQL_PWD=...` quoted in an
# error, `-Dsome.password=...`): the value only. Ends, not words, so max_tokens= or tokenizer= stay as they are.
# (HTTP_AUTHORIZATION= is the header's rule: its value has a space.)
_NAMED_SECRET = re.compile(r"(?i)(?P<head>(?<![\w.-])[\w.-]*?(?:api_?key|access_?key|secret_?key|private_?key|"
                           r"token|secret|password|passwd|passphrase|_pwd|_pass|_auth)=)"
                           rf"(?P<secret>{_VALUE})")
# An HTTP header (`Authorization: Bearer ...`, `{'Authorization': 'Basic ...'}`, `-H "Proxy-Authorization: ..."`,
# `HTTP_AUTHORIZATION=...`): everything after the scheme word to the end of the line or quote.
_AUTH_HEADER = re.compile(r"(?P<head>(?<![A-Za-z0-9])(?i:(?:Proxy-)?Authorization)['\"]?\s*[:=]\s*['\"]?"
                          r"(?:(?i:Bearer|Basic|Token|Bot|Digest|Negotiate|NTLM|ApiKey|AWS4-HMAC-SHA256)\s+)?)"
                          r"(?P<secret>(?!\$)[^'\"\r\n]+)")
# `Bearer <token>` / `Basic <base64>` without the header's name: 8+ characters with a digit or a lowercase
# letter followed by a capital (base64), so prose such as "Basic authentication" or "Bearer Token" stays.
# (Possessive runs: linear in the token's length, whatever it is.)
_BEARER = re.compile(r"(?P<head>(?<![\w-])(?i:Bearer|Basic)\s+)"
                     r"(?P<secret>(?=[A-Za-z_.~+/-]*+[0-9]|[A-Z0-9_.~+/-]*+[a-z][a-z0-9_.~+/-]*+[A-Z])"
                     r"[A-Za-z0-9_.~+/-]{8,}=*)")
# A netrc entry (`machine api.wandb.ai login user password <key>`, one line or one key per line).
_NETRC = re.compile(r"(?im)(?P<head>(?:\blogin\s+\S+\s+|^\s*)password\s+)(?P<secret>\S+)")
# Webhook URLs carry their secret in the path.
_WEBHOOK = re.compile(r"(?P<head>\bhooks\.slack\.com/(?:services|workflows|triggers)/|"
                      r"\bdiscord(?:app)?\.com/api/webhooks/)(?P<secret>[A-Za-z0-9/_-]+)")
# The whole block, BEGIN line to END line (or to the end of a text cut before it).
_PEM_KEY = re.compile(r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                      r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|.*\Z)", re.S)
# Tokens whose prefix names their issuer (GitHub, Hugging Face, OpenAI/Anthropic, Slack bot/user/app, AWS access
# key ids, GitLab, Google API keys and OAuth access tokens, npm, PyPI, Databricks, Stripe, SendGrid, JWTs).
# Long enough after the prefix that ordinary words do not match.
_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
                    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|(?:xox[abposre]|xapp)-[A-Za-z0-9-]{10,}|"
                    r"(?:AKIA|ASIA)[A-Z0-9]{16}|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}|"
                    r"ya29\.[A-Za-z0-9._-]{20,}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|"
                    r"dapi[0-9a-f]{32}(?:-[0-9]+)?|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{20,}|"
                    r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|"
                    r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*)(?![A-Za-z0-9_-])")


def _keep_head(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}"


# In this order: a PEM block whole before its lines are looked at; a header before the Bearer rule sees it.
_RULES: tuple[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]], ...] = (
    (_PEM_KEY, MASK), (_AUTH_HEADER, _keep_head), (_BEARER, _keep_head), (_URL_PASSWORD, _keep_head),
    (_KEYED_SECRET, _keep_head), (_NAMED_SECRET, _keep_head), (_NETRC, _keep_head), (_WEBHOOK, _keep_head),
    (_TOKEN, MASK))


def looks_secret(value: str) -> bool:
    """Whether a value is a credential by its shape alone (see the module's docstring).

    Example:
        >>> looks_secret("http://user:pw@mlflow:5000"), looks_secret("http://mlflow:5000")
        (True, False)
    """
    return any(pattern.search(value) for pattern, _ in _RULES)


def redact(text: str) -> str:
    """`text` with every credential-shaped part masked: `scheme://user:***@host`, `AccountKey=***`, `***`.

    For whatever hvdtrain writes or shows that may hold a URI or a user's value: run folder files, tracker
    params and tags, warning lines. Text without such parts comes back unchanged, and redacting twice
    changes nothing more. Redact before cutting a value short: a cut URI may have lost the '@' that shows
    where its password ends.

    Example:
        >>> redact("http://alice:s3cret@mlflow:5000/api")
        'http://alice:***@mlflow:5000/api'
        >>> redact("curl -H 'Authorization: Bearer abc123' https://h/x?api_key=k3y&page=2")
        "curl -H 'Authorization: Bearer ***' https://h/x?api_key=***&page=2"
    """
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


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
