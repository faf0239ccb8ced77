"""Checks of the text of a storage location before it resolves: pure, no storage access.

A known scheme followed by ``:`` and fewer than two slashes (``s3:/b/x``, ``s3:b/x``,
``file:/x``), or by ``//`` without the colon (``s3//b/x``), is a mistyped URI: taken for
a relative local path it would create a directory named ``s3:`` or ``s3``, so it is
refused with the corrected URI. A path that is not valid UTF-8 (a directory name in
Latin-1, which Python holds with surrogate escapes) is refused as well: pyarrow, object
stores and the run's JSON files take text only. The messages show the location as
:func:`~cairn._src.storage.uris.redact` does: a user info in a mistyped URI is masked.
"""

from __future__ import annotations

from fsspec.registry import known_implementations

from cairn._src.errors import ConfigError
from cairn._src.storage import registry
from cairn._src.storage.uris import (
    missing_colon_correction,
    public_uri,
    redact,
    typo_correction,
)

__all__ = ["PYARROW_SCHEMES", "check_uri_typo", "check_utf8", "known_scheme_set",
           "known_schemes"]

# The schemes pyarrow serves itself; every other one goes to fsspec.
PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs"})


def known_schemes() -> list[str]:
    """Every scheme a URI may have here, sorted: ``file``, pyarrow's, fsspec's and the
    registered ones."""
    names = {"file"} | PYARROW_SCHEMES | set(known_implementations)
    names.update(registry.registered_schemes())
    return sorted(names)


def known_scheme_set() -> frozenset[str]:
    return frozenset(known_schemes())


def check_uri_typo(text: str, *, argument: str = "location") -> None:
    """Raise :class:`ConfigError` when ``text`` is a known scheme with a malformed
    separator (``s3:/bucket/x``, ``gs:bucket``, ``file:/x``, ``s3//bucket/x``), showing
    the corrected URI; credentials in either are masked (``s3:/KEY:***@bucket``)."""
    first = text.partition("/")[0]
    if ":" in first:
        corrected = typo_correction(text, known_scheme_set())
        escape = "A local path that starts with '<word>:'"
    elif first and text[len(first):len(first) + 2] == "//":
        corrected = missing_colon_correction(text.partition("?")[0], known_scheme_set())
        escape = "A local directory with that name"
    else:
        return  # a plain path (and no scheme scan per path)
    if corrected is not None:
        # The suggestion drops a password as Result.uri does; a user alone is masked.
        meant = redact(public_uri(corrected))
        raise ConfigError(
            f"{argument}={redact(text)!r} is not a valid URI: a scheme is followed by "
            f"'://'; did you mean {meant!r}? ({escape} can be written as './' followed by "
            "it.)"
        )


def check_utf8(text: str, *, argument: str = "location") -> None:
    """Raise :class:`ConfigError` when ``text`` is not valid UTF-8 (it holds surrogates,
    as ``os.fsdecode`` makes of bytes that are not UTF-8), showing it as escaped bytes."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = redact(text)
        try:
            escaped = repr(shown.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:
            escaped = ascii(shown)  # a lone surrogate no bytes decode to
        raise ConfigError(
            f"{argument}={escaped} is not valid UTF-8 (shown as its bytes, escaped): "
            "storage paths must be valid UTF-8, as pyarrow and the run's files hold them. "
            "Rename the directory to a UTF-8 name, or reach it through a symbolic link "
            "whose path is UTF-8."
        ) from None
