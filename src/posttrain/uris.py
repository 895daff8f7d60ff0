"""URIs as they may be stored or shown: without the credentials a user can write into them.

`http://user:pass@host` and `s3://KEY:SECRET@bucket/x` are accepted as settings (`tracking.connect` moves the
credentials into the environment variables the clients read), but every URI that is printed, logged to MLflow
(params, experiment location, artifact URIs) or written to disk goes through `redact_uri` first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# scheme://userinfo@ : the userinfo runs to the last "@" before the authority ends ("/", "?", "#" or a space), so an
# unescaped "@" in a password is stripped with the rest of it instead of leaking its tail
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")


def redact_uri(text: str) -> str:
    """`text` (a URI, or a message with URIs in it) with the `user:password@` of every URI removed."""
    return _USERINFO.sub(r"\g<scheme>", text)


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(`uri` without its userinfo, user, password); user and password are percent-decoded, None when absent."""
    match = _USERINFO.search(uri)
    if match is None or match.start() != 0:
        return uri, None, None
    user, sep, password = match["userinfo"].partition(":")
    return redact_uri(uri), unquote(user), unquote(password) if sep else None


def error_line(error: BaseException) -> str:
    """An exception as one short line for a user: its first line, without credentials."""
    text = str(error).strip()
    return redact_uri(text.splitlines()[0] if text else type(error).__name__)[:300]
