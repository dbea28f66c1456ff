"""Credentials by the shape of a value, whatever its variable is called, and how to write text without them.

A URL with a password in its userinfo (`MLFLOW_TRACKING_URI=http://user:pw@host`, DATABASE_URL, HTTPS_PROXY),
a connection string with an AccountKey / Password / SharedAccessSignature (Azure storage, ODBC, Service
Bus, SAS query strings), or a token with a well-known prefix (ghp_, hf_, sk-, xoxb-, AKIA...). The launchers
keep such values off command lines (launcher/secrets.py); `redact()` writes them as `user:***@` / `***`
wherever hvdtrain shows or stores text that may hold them (run folders, MLflow / W&B params and tags,
warning lines).
"""
from __future__ import annotations

import re

# scheme://user:password@ (the password may be empty only if there is a colon: `user:@` is still redacted).
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:?#]*):(?P<secret>[^\s/@?#]*)@")
# Connection strings (Azure, ODBC, Service Bus) and SAS query strings: the value up to ; & or whitespace.
_KEYED_SECRET = re.compile(r"(?i)(?P<head>(?:^|[;?&\s])(?:AccountKey|SharedAccessKey|SharedAccessSignature|"
                           r"Password|Pwd|sig)=)(?P<secret>[^;&\s]+)")
# Tokens whose prefix names their issuer (GitHub, Hugging Face, OpenAI/Anthropic, Slack, AWS access key ids,
# GitLab, Google API keys, npm, PyPI, JWTs). Long enough after the prefix that ordinary words do not match.
_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
                    r"hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abposre]-[A-Za-z0-9-]{10,}|"
                    r"(?:AKIA|ASIA)[A-Z0-9]{16}|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}|"
                    r"npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|"
                    r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*)(?![A-Za-z0-9_-])")
MASK = "***"


def looks_secret(value: str) -> bool:
    """Whether a value is a credential by its shape alone (see the module's docstring).

    Example:
        >>> looks_secret("http://user:pw@mlflow:5000"), looks_secret("http://mlflow:5000")
        (True, False)
    """
    return bool(_URL_PASSWORD.search(value) or _KEYED_SECRET.search(value) or _TOKEN.search(value))


def redact(text: str) -> str:
    """`text` with every credential-shaped part masked: `scheme://user:***@host`, `AccountKey=***`, `***`.

    For whatever hvdtrain writes or shows that may hold a URI or a user's value: run folder files, tracker
    params and tags, warning lines. Text without such parts comes back unchanged.

    Example:
        >>> redact("http://alice:s3cret@mlflow:5000/api")
        'http://alice:***@mlflow:5000/api'
    """
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _KEYED_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
    return _TOKEN.sub(MASK, text)
