"""URI strings and what a pyarrow filesystem is: pure helpers, no storage access.

Credentials rule: credentials never reach storage or logs. A URI may carry them (a
password in its user info, or a secret-looking query parameter such as ``secret_key=``,
``access_key=``, ``token=``, ``session_token=`` or ``password=``) only while it stays in
memory, as ``RunConfig(storage_path=...)`` may. Everything shown or written uses a
credential-free form: :func:`redact` (secrets masked as ``***``, for messages that should
show where a secret was) or :func:`public_uri` (secrets removed, so the result still
resolves with credentials from the environment). A URI Cairn must persist (a NO_UPLOAD
reference, the checkpoint a ``checkpoint_upload_fn`` returns) must not carry credentials
at all: :func:`credentials_in` names what it carries, and ``report()`` refuses it.

A near-URI, a URI mistyped as ``scheme:`` followed by fewer than two slashes
(``s3:/KEY:SECRET@bucket``, ``s3:KEY:SECRET@bucket``) or as ``scheme//`` without the colon
(``s3//KEY:SECRET@bucket``), resolves nowhere, but carries the same user info: these
helpers mask it as a URI's. A user info without a password (``https://TOKEN@host``) may
be a token given as the user name, so shown text masks it whole (``***@host``).
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow.fs as pafs
from pyarrow.fs import FSSpecHandler

SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# "scheme:" followed by anything but "//": a URI with a malformed separator, or a path.
_ALMOST_URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(?!//)(.*)$", re.DOTALL)
# "scheme//" with the colon left out: read as a path, it is a directory named "scheme".
_NO_COLON_URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)//(.*)$", re.DOTALL)
# The head of a near-URI (tried after SCHEME_RE): "scheme:" with no slash or one
# ("s3:", "s3:/"), or "scheme//". What follows it is read as a URI's authority and path.
_NEAR_URI_HEAD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(?::/?|//)")
# Query parameters whose values are credentials. Matched as substrings of the lower-cased
# name, so 'aws_secret_access_key' and 'x-amz-security-token' are caught too.
_SECRET_WORDS = (
    "secret", "password", "passwd", "token", "access_key", "key_id", "credential",
    "signature", "sas", "sig", "auth", "private", "apikey", "api_key", "account_key",
)
# A user info without a password this long is masked wherever a backend's message quotes
# it (a token); a shorter one is a user name ('git', 'hdfs') that other words may hold.
_TOKEN_LENGTH = 8
# Parameter names that are credentials as a whole (not as a part: 'keyfile' is none).
_SECRET_NAMES = frozenset({"key"})


def _uri_head(uri: str) -> str | None:
    """``scheme://`` of a URI, the head of a near-URI (``s3:``, ``s3:/``, ``s3//``), or
    None for a plain path."""
    match = SCHEME_RE.match(uri) or _NEAR_URI_HEAD_RE.match(uri)
    return match.group(0) if match else None


def _split_authority(uri: str) -> tuple[str, str, str, str] | None:
    """``(head, authority, rest_after_authority, query)`` of a URI with a scheme (or of a
    near-URI, see :func:`_uri_head`), else None.

    The authority ends at the first ``/``, except where what comes before the last ``@``
    (before ``?``) is a user info whose password holds a ``/``
    (:func:`_is_slashed_userinfo`): an AWS secret key may, and the user info is then
    everything up to that ``@``."""
    head = _uri_head(uri)
    if head is None:
        return None
    rest, question, query = uri[len(head):].partition("?")
    authority, slash, tail = rest.partition("/")
    if "@" not in authority and "@" in rest:
        userinfo, _, after = rest.rpartition("@")
        if _is_slashed_userinfo(userinfo):
            host, slash, tail = after.partition("/")
            authority = f"{userinfo}@{host}"
    return head, authority, slash + tail, query if question else ""


def _is_slashed_userinfo(text: str) -> bool:
    """Whether ``text``, all before the last ``@`` of a URI whose first ``/`` comes before
    it, reads as ``user:password`` with a ``/`` in the password, not as a host (or
    ``host:port``) and a path that holds ``@``: its first segment has a ``:`` followed by
    something other than a port number."""
    first = text.partition("/")[0]
    _, colon, after = first.partition(":")
    return bool(colon) and not after.isdigit()


def _loose_userinfo(uri: str) -> str | None:
    """For redaction: everything between ``scheme://`` (or a near-URI's head) and the last
    ``@`` before ``?``, or None when there is no ``@`` there. A path may hold ``@`` (then
    more is masked than needed); a password may hold ``/`` (then it is masked whole)."""
    head = _uri_head(uri)
    if head is None:
        return None
    rest = uri[len(head):].partition("?")[0]
    return rest.rpartition("@")[0] if "@" in rest else None


def backend_message(message: str, uri: str) -> str:
    """What a backend's error ``message`` about ``uri`` may show: :func:`scrub`-bed, or
    nothing of it where ``uri`` may carry a password that holds ``/`` (an ``@`` after
    the first ``/``, with a ``:`` before it): a backend that cannot parse such a user
    info quotes it in pieces :func:`scrub` cannot know. A plain ``user:password@host``
    is masked whole, so its message stays."""
    loose = _loose_userinfo(uri)
    if loose is not None and ":" in loose and "/" in loose:
        return ("(the backend's message is left out: it may quote the password of the "
                "URI's user info; percent-encode a password that holds '/' or '@', or leave "
                "it out of the URI for the environment or a credentials file to supply)")
    return scrub(message, uri)


def without_userinfo(uri: str) -> str:
    """``uri`` (which must have a scheme) without its user info (``user[:password]@``,
    see :func:`_split_authority`): the user info names who connects, never the path."""
    head, authority, tail, query = _split_authority(uri)  # type: ignore[misc]
    if "@" in authority:
        authority = authority.rpartition("@")[2]
    out = f"{head}{authority}{tail}"
    return f"{out}?{query}" if query else out


def _is_secret_parameter(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(word in lowered for word in _SECRET_WORDS)


def credentials_in(uri: str) -> list[str]:
    """What credentials ``uri`` carries, in words (empty when none): for error messages.

    Names the query parameters, never their values.
    """
    parts = _split_authority(uri)
    if parts is None:
        return []
    _, authority, _, query = parts
    found = []
    if "@" in authority and ":" in authority.rpartition("@")[0]:
        found.append("a password in its user info ('user:password@')")
    for item in query.split("&") if query else ():
        name, eq, _value = item.partition("=")
        if eq and _is_secret_parameter(name):
            found.append(f"the query parameter {name!r}")
    return found


def public_uri(uri: str) -> str:
    """``uri`` with every credential removed: a user info that holds a password, and
    secret-looking query parameters, are dropped whole.

    The result names the same place and still resolves when the credentials come from the
    environment or a credential chain. Plain paths come back unchanged. A near-URI
    (``s3:/KEY:SECRET@bucket``) names no place to resolve again: it comes back as
    :func:`redact` shows it, its user info masked whole or to ``user:***@``.
    """
    parts = _split_authority(uri)
    if parts is None:
        return uri
    if SCHEME_RE.match(uri) is None:
        return redact(uri)
    head, authority, tail, query = parts
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        if ":" in userinfo:
            authority = host
    kept = [item for item in query.split("&") if item
            and not (item.partition("=")[1] and _is_secret_parameter(item.partition("=")[0]))]
    out = f"{head}{authority}{tail}"
    return f"{out}?{'&'.join(kept)}" if kept else out


def typo_correction(text: str, known_schemes: frozenset[str] | set[str]) -> str | None:
    """The URI ``text`` was probably meant to be, when it is ``scheme:`` plus a path
    with fewer than two slashes and ``scheme`` is one of ``known_schemes``; else ``None``.

    ``s3:/bucket/x`` and ``s3:bucket/x`` give ``s3://bucket/x``; ``file:/x`` gives
    ``file:///x``. A local path such as ``./a:b`` or ``a:b`` (unknown scheme) gives None.
    """
    match = _ALMOST_URI_RE.match(text)
    if match is None:
        return None
    scheme, rest = match.group(1), match.group(2)
    if scheme.lower() not in known_schemes:
        return None
    if scheme.lower() == "file":
        return f"{scheme}:///{rest.lstrip('/')}"
    return f"{scheme}://{rest.lstrip('/')}"


def missing_colon_correction(text: str,
                              known_schemes: frozenset[str] | set[str]) -> str | None:
    """The URI ``text`` was probably meant to be when its first path component is one of
    ``known_schemes`` followed by ``//`` (``s3//bucket/x`` gives ``s3://bucket/x``,
    ``file//tmp/x`` gives ``file:///tmp/x``); else ``None``."""
    match = _NO_COLON_URI_RE.match(text)
    if match is None or match.group(1).lower() not in known_schemes:
        return None
    scheme, rest = match.group(1), match.group(2).lstrip("/")
    return f"{scheme}:///{rest}" if scheme.lower() == "file" else f"{scheme}://{rest}"


def redact(uri: str) -> str:
    """``uri`` with its password (``user:password@`` shows as ``user:***@``), a user info
    without a password (a token given as the user name: ``***@``) and secret query values
    hidden.

    Plain paths come back unchanged; a near-URI (``s3:/KEY:SECRET@bucket``, see
    :func:`_uri_head`) is masked as a URI is. Meant for logs and error messages.
    An ``@`` after the first ``/`` with a ``:`` before it is taken for the end of a user
    info whose password holds ``/`` (an AWS secret key may): all before it is masked.
    """
    parts = _split_authority(uri)
    if parts is None:
        return uri
    head, authority, tail, query = parts
    loose = _loose_userinfo(uri)
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        shown = bool(colon and user) and "/" not in user
        authority = f"{user}:***@{host}" if shown else f"***@{host}"
    elif loose is not None and ":" in loose:
        user = loose.partition(":")[0]
        rest = uri[len(head):].partition("?")[0][len(loose) + 1:]
        authority, tail = (f"{user}:***@" if user and "/" not in user else "***@"), rest
    out = f"{head}{authority}{tail}"
    if query:
        params = []
        for item in query.split("&"):
            name, eq, _value = item.partition("=")
            if eq and _is_secret_parameter(name):
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


def local_os_join(root: str, path: str) -> str:
    """The OS path of ``path`` on a local file system whose :func:`local_root` is ``root``.

    Always absolute: ``root`` ``""`` is the disk's root, for a ``LocalFileSystem`` (whose
    paths are absolute already) and for a ``SubTreeFileSystem`` rooted at ``/`` (whose
    paths are relative to it) alike.
    """
    return f"{root.rstrip('/')}/{path.lstrip('/')}"


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


def dot_component(path: str) -> str | None:
    """The first ``.`` or ``..`` component of ``path``, or None. Storage that is not a
    local disk may resolve one for some requests and not others (pyarrow's S3 writes
    ``a/../b/x`` as ``b/x`` but lists ``a/../b/`` as written), so a run there would write
    over what it cannot find."""
    return next((part for part in path.split("/") if part in (".", "..")), None)


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


# A URI anywhere; or a near-URI word (see _uri_head) with an "@" that something follows (a
# host), where it starts a word: not after a character of a path or a URI
# ('/runs/x:alice@corp' is a local path; "('user:password@')" names a form).
_URI_IN_TEXT = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+"
    r"|(?<![\w/\\.+\-@:%~])[A-Za-z][A-Za-z0-9+.\-]*(?::/?|//)[^\s'\"<>]*@[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """``text`` with every URI in it redacted (:func:`redact`), near-URIs
    (``s3:/KEY:SECRET@bucket``) included: for free text, such as an exception message,
    that is written to storage or printed."""
    return _WORD.sub(_redact_word, text)


# What _URI_IN_TEXT can match lies inside one such word; only words that may hold a URI
# are searched (the search is quadratic on a long word: a traceback holds many).
_WORD = re.compile(r"[^\s'\"<>]+")


def _redact_word(word: re.Match[str]) -> str:
    text = word.group(0)
    if "@" not in text and "://" not in text:
        return text
    return _URI_IN_TEXT.sub(lambda match: redact(match.group(0)), text)


def scrub(message: str, uri: str) -> str:
    """``message`` with any copy of ``uri`` (a backend may quote it whole) redacted, and
    any secret value of ``uri`` (a backend may quote one parameter) masked too."""
    message = message.replace(uri, redact(uri))
    for secret in _secret_values(uri):
        message = message.replace(secret, "***")
    return message


def _secret_values(uri: str) -> list[str]:
    parts = _split_authority(uri)
    if parts is None:
        return []
    _, authority, _, query = parts
    values = []
    user_only = authority.rpartition("@")[0]
    if user_only and ":" not in user_only and len(user_only) >= _TOKEN_LENGTH:
        values.append(user_only)  # a token given as the user name
    for userinfo in (authority.rpartition("@")[0], _loose_userinfo(uri) or ""):
        if ":" in userinfo:
            password = userinfo.partition(":")[2]
            # A message may quote a part of a password with "/" (a path it parsed).
            values += [password, *(part for part in password.split("/") if len(part) >= 6)]
    for item in query.split("&") if query else ():
        name, eq, value = item.partition("=")
        if eq and value and _is_secret_parameter(name):
            values.append(value)
    # Longest first, so that a value containing another is masked whole.
    return sorted((v for v in values if len(v) >= 3), key=len, reverse=True)
