"""The one schema validator for everything Cairn reads back from storage.

The run index, checkpoint manifests, metrics and event log records and the lease are read
from storage that others can write to, so each is checked against its schema before any
of it is used. A value of the wrong type, a name that could leave the run directory, or
JSON nested deeper than Python can parse raises :class:`ManifestError` with a message that
names the file, the field and what was expected, never a ``TypeError``, ``KeyError`` or
``RecursionError`` from deep inside Cairn.

A schema is a tree of small immutable checkers (:class:`Integer`, :class:`Object`, ...).
Checking is one pass over the document, linear in its size, and costs nothing beyond the
type tests on success: the path of a bad field ("checkpoints[3].dir_name") is assembled
only when a check fails. Unknown fields of an object are allowed and ignored, so that a
file written by a newer Cairn of the same format version still reads.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cairn._src.errors import ManifestError
from cairn._src.run.layout import is_stored_dir_name
from cairn._src.storage.paths import check_absolute_path, check_relative_path

# Deepest nesting of a metrics or metadata value Cairn accepts from users (report(),
# set_metadata()): far beyond any real metrics, and far below Python's recursion limit.
MAX_USER_DEPTH = 64
# Deepest nesting accepted when reading back: twice MAX_USER_DEPTH, so that every value a
# user may report (and so every value Cairn wrote) reads back, and far enough below the
# recursion limit (1000 frames) that every reader and writer of it has margin:
# dataclasses.asdict (RunIndex.to_json) and the CLI's json_safe take two frames a level
# on Python 3.11, and each runs nested in other calls. A deeper planted value is refused
# here, naming its file, instead of failing later with a RecursionError that names none.
MAX_STORED_DEPTH = 2 * MAX_USER_DEPTH


class _Invalid(Exception):
    """A value failed a check; ``path`` is filled in, innermost first, while unwinding."""

    def __init__(self, value: Any, expected: str) -> None:
        super().__init__(expected)
        self.value = value
        self.expected = expected
        self.path: list[str] = []


class Schema:
    """Checks one JSON value; ``expected`` says in words what it accepts."""

    expected: str = "a value"

    def check(self, value: Any) -> Any:
        """Return ``value`` (possibly normalized) or raise :class:`_Invalid`."""
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Schema):
    minimum: int | None = None
    maximum: int | None = None

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"

    def check(self, value: Any) -> Any:
        if (
            type(value) is not int
            or (self.minimum is not None and value < self.minimum)
        ):
            raise _Invalid(value, self.expected)
        if self.maximum is not None and value > self.maximum:
            raise _Invalid(value, f"an integer <= {self.maximum}")
        return value


# The smallest int that float() rounds to infinity (and refuses with OverflowError). JSON
# holds ints of any size ("ttl_s": 10**400 is valid JSON) and Cairn converts every number
# it reads back to a float, so a number field accepts only ints below it in magnitude:
# exactly the range of a finite double.
_FLOAT_OVERFLOW = 2**1024 - 2**970
_IN_FLOAT_RANGE = f"an integer of magnitude below {sys.float_info.max:.1e}, the range of a double"


@dataclass(frozen=True)
class Number(Schema):
    """An int or float; finite unless ``finite`` is False (metrics may be NaN).

    An int is accepted only where ``float()`` takes it: one of 400 digits would raise a
    bare ``OverflowError`` (naming no file) wherever Cairn reads the field as a float.
    """

    finite: bool = True
    minimum: float | None = None

    @property
    def expected(self) -> str:  # type: ignore[override]
        text = "a finite number" if self.finite else "a number"
        return text if self.minimum is None else f"{text} >= {self.minimum}"

    def check(self, value: Any) -> Any:
        kind = type(value)
        if kind is float:
            if self.finite and not math.isfinite(value):
                raise _Invalid(value, self.expected)
        elif kind is int:
            if not -_FLOAT_OVERFLOW < value < _FLOAT_OVERFLOW:
                raise _Invalid(value, f"{self.expected} ({_IN_FLOAT_RANGE})")
        else:
            raise _Invalid(value, self.expected)
        if self.minimum is not None and value < self.minimum:
            raise _Invalid(value, self.expected)
        return value


@dataclass(frozen=True)
class Boolean(Schema):
    expected: str = "true or false"

    def check(self, value: Any) -> Any:
        if type(value) is not bool:
            raise _Invalid(value, self.expected)
        return value


@dataclass(frozen=True)
class String(Schema):
    """A str; non-empty unless ``empty``; ``test`` (returns False or raises) refines it."""

    expected: str = "a non-empty string"
    empty: bool = False
    test: Callable[[str], object] | None = field(default=None, compare=False)

    def check(self, value: Any) -> Any:
        if type(value) is not str or (not self.empty and not value):
            raise _Invalid(value, self.expected)
        if self.test is not None:
            try:
                accepted = self.test(value)
            except ValueError:
                accepted = False
            if not accepted:
                raise _Invalid(value, self.expected)
        return value


@dataclass(frozen=True)
class Nullable(Schema):
    inner: Schema

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"null or {self.inner.expected}"

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.inner.check(value)
        except _Invalid as exc:
            if not exc.path:
                exc.expected = f"null or {exc.expected}"
            raise


@dataclass(frozen=True)
class ListOf(Schema):
    item: Schema
    noun: str = "values"

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a list of {self.noun}"

    def check(self, value: Any) -> Any:
        if type(value) is not list:
            raise _Invalid(value, self.expected)
        check = self.item.check
        for position, item in enumerate(value):
            try:
                check(item)
            except _Invalid as exc:
                exc.path.append(f"[{position}]")
                raise
        return value


@dataclass(frozen=True)
class MapOf(Schema):
    """An object whose keys pass ``key`` and whose values pass ``value``."""

    key: Schema
    value: Schema
    noun: str = "entries"

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"an object of {self.noun}"

    def check(self, value: Any) -> Any:
        if type(value) is not dict:
            raise _Invalid(value, self.expected)
        check_key, check_value = self.key.check, self.value.check
        for key, item in value.items():
            try:
                check_key(key)
            except _Invalid as exc:
                exc.expected = f"a key that is {exc.expected}"
                exc.path.append(f"[{_short_key(key)}]")
                raise
            try:
                check_value(item)
            except _Invalid as exc:
                exc.path.append(f"[{_short_key(key)}]")
                raise
        return value


@dataclass(frozen=True)
class Object(Schema):
    """A JSON object with known fields; ``required`` ones must be present."""

    fields: Mapping[str, Schema]
    required: frozenset[str] = frozenset()
    noun: str = "an object"

    @property
    def expected(self) -> str:  # type: ignore[override]
        return self.noun

    def check(self, value: Any) -> Any:
        if type(value) is not dict:
            raise _Invalid(value, self.expected)
        for name in self.required:
            if name not in value:
                error = _Invalid(_ABSENT, self.fields[name].expected)
                error.path.append(f".{name}")
                raise error
        for name, item in value.items():
            schema = self.fields.get(name)
            if schema is None:
                continue
            try:
                schema.check(item)
            except _Invalid as exc:
                exc.path.append(f".{name}")
                raise
        return value


@dataclass(frozen=True)
class JsonObject(Schema):
    """Any JSON object (str keys by construction), nested at most ``max_depth`` deep."""

    max_depth: int = MAX_STORED_DEPTH

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"an object nested at most {self.max_depth} levels deep"

    def check(self, value: Any) -> Any:
        if type(value) is not dict:
            raise _Invalid(value, self.expected)
        if nesting_depth(value, self.max_depth) > self.max_depth:
            raise _Invalid(value, self.expected)
        return value


def _short_key(key: str) -> str:
    return short_repr(key)


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: a name or value in a message, bounded
    whatever its size. Never raises: a value whose ``repr()`` fails (an int of more digits
    than Python turns into text, a structure nested too deeply, a ``__repr__`` that raises)
    is described by its type instead."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<a deeply nested {type(value).__name__}>"
    except Exception as exc:
        if isinstance(value, int):
            return f"<an int of {decimal_digits(value)} digits>"
        return f"<{type(value).__name__} object whose repr() raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decimal_digits(number: int) -> int:
    """How many decimal digits ``number`` has, its sign not counted, found without turning
    it into text (which Python refuses beyond ``sys.get_int_max_str_digits()`` digits)."""
    magnitude = abs(number)
    # From the bit length: exact, or one off (and float rounding could tip it either way).
    digits = max(1, int((magnitude.bit_length() - 1) * math.log10(2)) + 1)
    if magnitude >= 10**digits:
        return digits + 1
    if digits > 1 and magnitude < 10 ** (digits - 1):
        return digits - 1
    return digits


class _Absent:
    def __repr__(self) -> str:
        return "missing"


_ABSENT = _Absent()


def nesting_depth(value: Any, stop_beyond: int) -> int:
    """How deeply lists and dicts nest in ``value`` (a scalar is 0, ``{}`` is 1).

    Iterative, so any depth is measured without recursion; it stops counting once the
    depth passes ``stop_beyond``. Linear in the number of values.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > deepest:
            deepest = depth
            if deepest > stop_beyond:
                return deepest
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1))
    return deepest


def _describe(value: Any) -> str:
    """A short description of ``value`` for a message, bounded whatever its size."""
    if value is _ABSENT:
        return "missing"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    text = repr(value)
    if type(value) is int and len(text) > 60:
        # Its size is the point: "1000000000000000000000... (int of 401 digits)".
        return f"{text[:24]}... (int of {len(text.lstrip('-'))} digits)"
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


@dataclass(frozen=True)
class Document:
    """A kind of file Cairn reads back: its name in messages and what to do when bad."""

    what: str
    schema: Schema
    hint: str = ""


def load_json(data: bytes, *, what: str, where: str, hint: str = "") -> Any:
    """Parse UTF-8 JSON; any failure (a RecursionError included) is a ManifestError."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ManifestError(
            f"The {what} {where} is not a file Cairn wrote: its JSON is nested too deeply "
            f"to parse.{_space(hint)}"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(
            f"The {what} {where} is not valid JSON ({exc}).{_space(hint)}"
        ) from exc


def validate(value: Any, document: Document, *, where: str) -> Any:
    """Return ``value`` if it matches ``document.schema``, else raise :class:`ManifestError`.

    The message names the file (``where``, already redacted), the field and what it
    should be.
    """
    try:
        return document.schema.check(value)
    except _Invalid as exc:
        raise ManifestError(_message(document, where, exc)) from None


def check_value(value: Any, schema: Schema) -> str | None:
    """None if ``value`` matches ``schema``, else why not (the field and the expectation)."""
    try:
        schema.check(value)
    except _Invalid as exc:
        return _field_text(exc)
    return None


def _field_text(exc: _Invalid) -> str:
    path = "".join(reversed(exc.path)).lstrip(".")
    subject = f"field {path!r}" if path else "the document"
    return f"{subject} is {_describe(exc.value)}; expected {exc.expected}"


def _message(document: Document, where: str, exc: _Invalid) -> str:
    return f"The {document.what} {where} is invalid: {_field_text(exc)}.{_space(document.hint)}"


def _space(hint: str) -> str:
    return f" {hint}" if hint else ""


# --- field types shared by the documents ---------------------------------------------------

_HEX_128 = re.compile(r"[0-9a-f]{32}")

DIR_NAME = String(
    expected="a checkpoint directory name (one path component, no '/', '\\\\' or '..')",
    test=is_stored_dir_name,
)
RELATIVE_PATH = String(
    expected="a normalized relative path such as 'model/weights.pt'",
    test=lambda rel: check_relative_path(rel) == rel,
)
ABSOLUTE_PATH = String(
    expected="a normalized absolute path such as '/data/ckpt'",
    test=lambda path: check_absolute_path(path) == path,
)
# A stored URI names one place whatever the reader's working directory: a scheme, or an
# absolute path (a relative one would read wherever `cairn verify` runs).
_PLACE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|/|[A-Za-z]:[\\/]")
URI = String(expected="a URI with a scheme ('s3://bucket/ckpt') or an absolute path",
             test=lambda text: _PLACE.match(text) is not None)
TIME = Number()
# A count of things or bytes: at most what a signed 64-bit integer holds (no file, run or
# checkpoint comes near it). A planted 10**400 would overflow wherever a count is divided
# or turned into a float ("uploaded_bytes / 2**20").
MAX_COUNT = 2**63 - 1
COUNT = Integer(minimum=0, maximum=MAX_COUNT)
# The largest report index Cairn reads back: every integer up to it is exact in a double
# (other JSON readers), and no run reports that often. A planted 10**30 is refused here.
MAX_REPORT_INDEX = 2**53 - 1
REPORT_INDEX = Integer(minimum=0, maximum=MAX_REPORT_INDEX)
USER_JSON = JsonObject(MAX_STORED_DEPTH)
CHECKSUM = String(expected="32 lowercase hex digits", test=_HEX_128.fullmatch)


# --- the lease (read by cairn/_src/run/lease.py) -------------------------------------------

_LEASE_HINT = "It is not a lease Cairn wrote."
# The largest lease generation: a driver claims generation g by creating the file
# ``_cairn_lease.<g>``, and a claim's number has at most 12 digits (a driver starts
# generation 1 and adds one per start); longer ones are not claims Cairn wrote.
MAX_LEASE_GENERATION = 10**12 - 1
LEASE_DOCUMENT = Document(
    "lease",
    Object(
        {
            "version": Integer(minimum=1),
            "host": String(empty=True, expected="a string"),
            "pid": Integer(),
            "token": String(),
            "heartbeat_at": TIME,
            "ttl_s": TIME,
            "generation": Integer(minimum=0, maximum=MAX_LEASE_GENERATION),
        },
        required=frozenset({"host", "pid", "token", "heartbeat_at", "ttl_s"}),
        noun="a lease (an object with 'host', 'pid', 'token', 'heartbeat_at', 'ttl_s')",
    ),
    hint=_LEASE_HINT,
)


def parse_lease(data: bytes, *, where: str) -> dict[str, Any]:
    """The lease document in ``data``, checked for types only, or :class:`ManifestError`.

    Values that have the right types but make no sense (a pid <= 0, a heartbeat in the
    future, a huge ttl) are the lease module's to judge.
    """
    document = load_json(data, what="lease", where=where, hint=_LEASE_HINT)
    checked: dict[str, Any] = validate(document, LEASE_DOCUMENT, where=where)
    return checked
