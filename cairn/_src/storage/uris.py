"""URI strings and what a pyarrow filesystem is: pure helpers, no storage access."""

from __future__ import annotations

import re
from typing import Any

import pyarrow.fs as pafs
from pyarrow.fs import FSSpecHandler

SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# Query parameters whose values are credentials. Matched as substrings of the lower-cased
# name, so 'aws_secret_access_key' and 'x-amz-security-token' are caught too.
_SECRET_WORDS = (
    "secret", "password", "passwd", "token", "access_key", "key_id", "credential",
    "signature", "sas", "sig", "auth", "private",
)


def redact(uri: str) -> str:
    """``uri`` with its password (``user:password@``) and secret query values hidden.

    Plain paths come back unchanged. Meant for logs and error messages.
    """
    match = SCHEME_RE.match(uri)
    if match is None:
        return uri
    head = match.group(0)
    rest = uri[len(head):]
    rest, _, query = rest.partition("?")
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user = userinfo.partition(":")[0]
        authority = f"{user}:***@{host}" if user else f"***@{host}"
    out = f"{head}{authority}{slash}{tail}"
    if query:
        params = []
        for item in query.split("&"):
            name, eq, _value = item.partition("=")
            lowered = name.lower()
            if eq and any(word in lowered for word in _SECRET_WORDS):
                params.append(f"{name}=***")
            else:
                params.append(item)
        out = f"{out}?{'&'.join(params)}"
    return out


def fsspec_filesystem(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem that ``fs`` adapts, or ``None`` when it adapts none."""
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, FSSpecHandler):
        return fs.handler.fs
    return None


def local_root(fs: pafs.FileSystem) -> str | None:
    """The OS path that path ``""`` of ``fs`` maps to when ``fs`` is the local disk.

    ``"/"``-rooted for ``LocalFileSystem`` and fsspec's local filesystem, the base path
    of a ``SubTreeFileSystem`` over either; ``None`` for anything that is not local.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        return ""
    if isinstance(fs, pafs.SubTreeFileSystem):
        base = local_root(fs.base_fs)
        if base is None:
            return None
        return base + str(fs.base_path).rstrip("/")
    inner = fsspec_filesystem(fs)
    if inner is not None and "file" in _protocols(inner):
        return ""
    return None


def _protocols(fsspec_fs: Any) -> tuple[str, ...]:
    protocol = fsspec_fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def supports_atomic_rename(fs: pafs.FileSystem) -> bool:
    """Whether ``fs.move`` replaces a file atomically (local disks, HDFS).

    Object stores, fsspec's memory filesystem and custom stores rename by copying, so
    atomic writes there use a single object write instead.
    """
    if local_root(fs) is not None:
        return True
    if isinstance(fs, pafs.SubTreeFileSystem):
        return supports_atomic_rename(fs.base_fs)
    return bool(fs.type_name == "hdfs")


def join_path(path: str, rel: str) -> str:
    """``rel`` below ``path``; ``""`` is the top of a bucket, ``"/"`` the local root."""
    if not rel:
        return path
    if path == "":
        return rel
    return f"{path.rstrip('/')}/{rel}"


def scheme_of(uri: str) -> str | None:
    """The lower-cased scheme of ``uri``, or ``None`` for a plain path."""
    match = SCHEME_RE.match(uri)
    return match.group(1).lower() if match else None


def strip_uri(text: str) -> str:
    """The part of a URI (which must have a scheme) after ``scheme://``, before ``?``/``#``."""
    rest = text[len(SCHEME_RE.match(text).group(0)):]  # type: ignore[union-attr]
    return re.split(r"[?#]", rest, maxsplit=1)[0]


def normalize_path(path: str) -> str:
    """``path`` without trailing slashes, except the root ``/`` itself."""
    stripped = path.rstrip("/")
    return stripped if stripped or not path.startswith("/") else "/"


def normalize_uri(text: str) -> str:
    """A URI (which must have a scheme) without trailing slashes before its query."""
    base, question, query = text.partition("?")
    head = SCHEME_RE.match(base).group(0)  # type: ignore[union-attr]
    body = base[len(head):].rstrip("/")
    return f"{head}{body}{question}{query}"


def scrub(message: str, uri: str) -> str:
    """``message`` with any copy of ``uri`` (a backend may quote it whole) redacted."""
    return message.replace(uri, redact(uri))
