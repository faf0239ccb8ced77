"""The run index: the committed checkpoints of a run and its attempt history.

The index is the run's source of truth for "which checkpoints exist". It is written
atomically (write-then-rename on file systems, a single object write on object stores) and
only ever after the manifest of a checkpoint it adds, so every checkpoint it names is
committed. It can be rebuilt from the manifests alone (:func:`rebuild_index`), which
never takes in a user's copy of a checkpoint made inside the run directory.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cairn._src.checkpoint.manifest import Manifest, read_manifest
from cairn._src.errors import ConfigError, ManifestError, UnsafePathError
from cairn._src.run import schema
from cairn._src.run.events import (
    AttemptStart,
    CheckpointDeleting,
    CheckpointDropped,
    CheckpointStarted,
    Commit,
    Event,
    Failure,
    ReferenceRegistered,
    UnknownEvent,
    read_events,
)
from cairn._src.run.layout import (
    EVENTS_DIR,
    INDEX_NAME,
    LAYOUT_VERSION,
    METRICS_DIR,
    RESERVED_NAMES,
    default_checkpoint_dir_name,
    is_stored_dir_name,
)
from cairn._src.run.segment_log import read_log
from cairn._src.storage.fileio import (
    is_local_link,
    list_dir_names,
    read_bytes,
    write_bytes_atomic,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_absolute_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.text import plural

logger = logging.getLogger(__name__)

INDEX_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    """One committed checkpoint as the index knows it.

    ``dir_name`` names the directory under the run that holds the manifest. ``target_uri``
    is set for checkpoints registered by reference (NO_UPLOAD, ``checkpoint_upload_fn``)
    whose data lives elsewhere; ``target_path`` instead, for a reference on the run's own
    storage filesystem object (an absolute ``/``-separated path on it, which may have no
    URI); at most one of the two is set. ``managed`` is True when the data lives inside the
    run directory and so is Cairn's to delete.
    """

    dir_name: str
    report_index: int
    metrics: dict[str, Any] = field(default_factory=dict)
    target_uri: str | None = None
    managed: bool = True
    attempt: int = 0
    committed_at: float = 0.0
    size_bytes: int = 0
    target_path: str | None = None

    def __post_init__(self) -> None:
        if self.target_path is not None:
            check_absolute_path(self.target_path, argument="CheckpointRecord.target_path")
            if self.target_uri is not None:
                raise ConfigError(
                    f"CheckpointRecord.target_uri={self.target_uri!r} and "
                    f"CheckpointRecord.target_path={self.target_path!r} are both set; a "
                    "reference has one location."
                )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointRecord:
        """A record from its JSON object, which :data:`RECORD_SCHEMA` has accepted."""
        return cls(
            dir_name=data["dir_name"],
            report_index=data["report_index"],
            metrics=dict(data.get("metrics") or {}),
            target_uri=data.get("target_uri"),
            managed=data.get("managed", True),
            attempt=data.get("attempt", 0),
            committed_at=float(data.get("committed_at", 0.0)),
            size_bytes=data.get("size_bytes", 0),
            target_path=data.get("target_path"),
        )


_INDEX_HINT = ("Cairn rebuilds it from the checkpoint manifests (`cairn rebuild-index` does it "
               "by hand).")
RECORD_SCHEMA = schema.Object(
    {
        "dir_name": schema.DIR_NAME,
        "report_index": schema.REPORT_INDEX,
        "metrics": schema.USER_JSON,
        "target_uri": schema.Nullable(schema.URI),
        "target_path": schema.Nullable(schema.ABSOLUTE_PATH),
        "managed": schema.Boolean(),
        "attempt": schema.COUNT,
        "committed_at": schema.TIME,
        "size_bytes": schema.COUNT,
    },
    required=frozenset({"dir_name", "report_index"}),
    noun="a checkpoint record (an object with 'dir_name' and 'report_index')",
)
RETENTION_SCHEMA = schema.Object(
    {
        "num_to_keep": schema.Nullable(schema.Integer(minimum=1)),
        "score_attribute": schema.Nullable(schema.String()),
        "score_order": schema.String(expected="'max' or 'min'",
                                     test=lambda v: v in ("max", "min")),
    },
    required=frozenset({"score_order"}),
    noun="the run's retention settings (num_to_keep, score_attribute, score_order)",
)

INDEX_SCHEMA = schema.Document(
    "run index",
    schema.Object(
        {
            "version": schema.Integer(),
            "layout_version": schema.Integer(minimum=1),
            "next_report_index": schema.Integer(minimum=1,
                                                 maximum=schema.MAX_REPORT_INDEX + 1),
            "attempts": schema.COUNT,
            "failures": schema.COUNT,
            "preemptions": schema.COUNT,
            "resumed_from": schema.Nullable(schema.DIR_NAME),
            "created_at": schema.TIME,
            "updated_at": schema.TIME,
            "checkpoints": schema.ListOf(RECORD_SCHEMA, noun="checkpoint records"),
            "retention": schema.Nullable(RETENTION_SCHEMA),
        },
        required=frozenset({"version", "checkpoints"}),
        noun="a JSON object",
    ),
    hint=_INDEX_HINT,
)


@dataclass(frozen=True)
class Retention:
    """The checkpoint config's retention settings, as the driver that last ran the run had
    them: what orders ``Result.from_path``'s best checkpoints and explains `cairn show`'s
    kept ones."""

    num_to_keep: int | None = None
    score_attribute: str | None = None
    score_order: str = "max"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class RunIndex:
    """An immutable snapshot of the index; every change makes a new one."""

    checkpoints: tuple[CheckpointRecord, ...] = ()
    next_report_index: int = 1
    attempts: int = 0
    failures: int = 0
    # Restarts after a preemption notice: FailureConfig.max_preemption_failures's count.
    preemptions: int = 0
    resumed_from: str | None = None
    retention: Retention | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    version: int = INDEX_VERSION
    layout_version: int = LAYOUT_VERSION

    @property
    def latest(self) -> CheckpointRecord | None:
        """The committed checkpoint with the highest report index."""
        if not self.checkpoints:
            return None
        return max(self.checkpoints, key=lambda r: r.report_index)

    def find(self, dir_name: str) -> CheckpointRecord | None:
        for record in self.checkpoints:
            if record.dir_name == dir_name:
                return record
        return None

    def with_changes(self, **changes: Any) -> RunIndex:
        return replace(self, updated_at=time.time(), **changes)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "version": self.version,
            "layout_version": self.layout_version,
            "next_report_index": self.next_report_index,
            "attempts": self.attempts,
            "failures": self.failures,
            "resumed_from": self.resumed_from,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "checkpoints": [r.to_json() for r in self.checkpoints],
        }
        if self.retention is not None:
            body["retention"] = self.retention.to_json()
        if self.preemptions:
            body["preemptions"] = self.preemptions
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> RunIndex:
        """Parse the index; ``where`` (redacted) names it in errors.

        Raises :class:`ManifestError` for invalid JSON (nested too deeply included), an
        unknown version, a field that does not match :data:`INDEX_SCHEMA` (the message
        names the field and what it should be), a record that is not a valid
        :class:`CheckpointRecord` or two records with the same directory.
        One pass over the document.
        """
        body = schema.load_json(data, what="run index", where=where, hint=_INDEX_HINT)
        version = body.get("version") if isinstance(body, dict) else None
        if type(version) is not int or version != INDEX_VERSION:
            shown = version if type(version) is int or version is None else "unreadable"
            raise ManifestError(
                f"The run index {where} has version {shown!r}; this Cairn reads version "
                f"{INDEX_VERSION}. Upgrade Cairn, or rebuild the index from the manifests."
            )
        schema.validate(body, INDEX_SCHEMA, where=where)
        try:
            records = tuple(CheckpointRecord.from_json(r) for r in body["checkpoints"])
        except (ConfigError, UnsafePathError) as exc:
            # A record the schema accepts but a CheckpointRecord refuses (both target_uri
            # and target_path): the index is damaged, and open_run rebuilds it.
            raise ManifestError(f"The run index {where} is invalid: {exc} {_INDEX_HINT}"
                                ) from exc
        seen: set[str] = set()
        for record in records:
            if record.dir_name in seen:
                raise ManifestError(
                    f"The run index {where} is invalid: two checkpoint records name the "
                    f"directory {record.dir_name!r}. {_INDEX_HINT}"
                )
            seen.add(record.dir_name)
        now = time.time()
        return cls(
            checkpoints=records,
            next_report_index=body.get("next_report_index", 1),
            attempts=body.get("attempts", 0),
            failures=body.get("failures", 0),
            preemptions=body.get("preemptions", 0),
            resumed_from=body.get("resumed_from"),
            retention=_retention(body.get("retention")),
            created_at=float(body.get("created_at", now)),
            updated_at=float(body.get("updated_at", now)),
            version=version,
            layout_version=body.get("layout_version", LAYOUT_VERSION),
        )


def _retention(body: dict[str, Any] | None) -> Retention | None:
    if not body:
        return None
    return Retention(body.get("num_to_keep"), body.get("score_attribute"), body["score_order"])


def read_index(run: StorageLocation, retry: RetryPolicy) -> RunIndex | None:
    """The run's index, or None for a new run."""
    location = run.join(INDEX_NAME)
    try:
        data = read_bytes(location, retry)
    except FileNotFoundError:
        return None
    return RunIndex.from_json(data, where=location.display())


def write_index(run: StorageLocation, index: RunIndex, retry: RetryPolicy, *,
                durable: bool = True) -> None:
    """Replace the run's index atomically; ``durable`` as :func:`.manifest.write_manifest`."""
    write_bytes_atomic(run.join(INDEX_NAME), index.to_json(), retry, durable=durable)


def adoption_record(dir_name: str, manifest: Manifest) -> CheckpointRecord:
    """The index record of the committed checkpoint whose manifest ``<run>/<dir_name>``
    holds (its ``report_index`` set), for an index that did not name it."""
    assert manifest.report_index is not None
    target = manifest.target_uri
    return CheckpointRecord(
        dir_name=dir_name,
        report_index=manifest.report_index,
        metrics=dict(manifest.metrics),
        target_uri=target,
        target_path=manifest.target_path,
        managed=target is None and manifest.target_path is None,
        committed_at=manifest.created_at,
        size_bytes=sum(f.size for f in manifest.files.values()),
    )


def adopt_records(index: RunIndex, adopted: list[CheckpointRecord]) -> RunIndex:
    """``index`` with ``adopted`` (committed checkpoints it did not name) added, in report
    order, and its next report index past them."""
    if not adopted:
        return index
    records = sorted([*index.checkpoints, *adopted], key=lambda r: r.report_index)
    return index.with_changes(checkpoints=tuple(records), next_report_index=max(
        index.next_report_index, records[-1].report_index + 1))


def reports_made(run: StorageLocation, retry: RetryPolicy, index: RunIndex,
                 events: list[Event] | None = None) -> int:
    """How many reports the run has made, as far as its index, its metrics history and
    its event log (``events`` when already read) know (0 when none of them knows of any)."""
    made = index.next_report_index - 1
    for record in read_log(run.join(METRICS_DIR), retry):
        made = max(made, record.get("report_index", 0))
    if events is None:
        events = read_events(run.join(EVENTS_DIR), retry)
    for event in events:
        index_value = (event.record.get("index") if isinstance(event, UnknownEvent)
                       else getattr(event, "index", None))
        if type(index_value) is int:
            made = max(made, index_value)
    return made


def within_reports_made(run: StorageLocation, retry: RetryPolicy, index: RunIndex,
                        adopted: list[CheckpointRecord]) -> list[CheckpointRecord]:
    """``adopted`` without the manifests whose report this run cannot have made: at most
    one past the reports its index, metrics history and event log know of (the one whose
    commit a dead driver left half-done). Such a manifest was planted or belongs to
    another run: it is not adopted, nor deleted (it may not be this run's)."""
    if all(r.report_index <= index.next_report_index for r in adopted):
        return adopted
    limit = reports_made(run, retry, index) + 1
    for record in adopted:
        if record.report_index > limit:
            logger.warning(
                "Not adopting %s: its manifest is of report %d, but this run has made %d "
                "reports, so at most report %d can have a manifest the index does not name "
                "yet. It was not written by this run; it is left in place.",
                record.dir_name, record.report_index, limit - 1, limit)
    return [r for r in adopted if r.report_index <= limit]


def announced_dir_names(events: list[Event]) -> set[str]:
    """The names the run's event log announced before an upload began, or registered a
    reference under: besides the default names, the only ones this run writes a checkpoint
    to."""
    names = set()
    for event in events:
        if isinstance(event, CheckpointStarted) or (
                isinstance(event, ReferenceRegistered)
                and (event.target_uri is not None or event.target_path is not None)):
            if isinstance(event.dir_name, str):
                names.add(event.dir_name)
    return names


def copy_reason(dir_name: str, report_index: int, *, indexed: Mapping[int, str],
                announced: Collection[str]) -> str | None:
    """Why the manifest of report ``report_index`` in ``<run>/<dir_name>``, a directory the
    index does not name, is not a checkpoint this run wrote but a copy of one, or None
    when this run can have written it: under the report's default name or a name in
    ``announced`` (:func:`announced_dir_names`), for a report the index does not name
    (``indexed``: report index -> directory).

    A copy (a user's backup inside the run, manifest included) is neither adopted nor
    deleted: adopted, retention would delete it with whatever the user added to it.
    """
    holder = indexed.get(report_index)
    if holder is not None:
        return f"the index names {holder} as the checkpoint of report {report_index}"
    if dir_name != default_checkpoint_dir_name(report_index) and dir_name not in announced:
        return (f"this run writes the checkpoint of report {report_index} only to "
                f"{default_checkpoint_dir_name(report_index)} or to a name its event log "
                "records before the upload, and it records none for this one")
    return None


def copy_reasons(records: list[CheckpointRecord], announced: Collection[str], *,
                 indexed: Mapping[int, str] | None = None) -> dict[str, str]:
    """The copies among ``records`` (manifests the index does not name; ``indexed``: the
    index's report index -> directory), each with why (:func:`copy_reason`); of two or
    more of one report that this run can have written, all are copies (one is, and which
    one cannot be told)."""
    reasons: dict[str, str] = {}
    own: dict[int, list[str]] = {}
    for record in records:
        reason = copy_reason(record.dir_name, record.report_index, indexed=indexed or {},
                             announced=announced)
        if reason is None:
            own.setdefault(record.report_index, []).append(record.dir_name)
        else:
            reasons[record.dir_name] = reason
    for report_index, names in own.items():
        if len(names) > 1:
            for name in names:
                others = ", ".join(n for n in names if n != name)
                reasons[name] = f"{others} holds a manifest of report {report_index} too"
    return reasons


def without_copies(records: list[CheckpointRecord], announced: Collection[str], *,
                   indexed: Mapping[int, str] | None = None,
                   skipping: str = "Skipping {} while rebuilding the index",
                   ) -> list[CheckpointRecord]:
    """``records``, read from the manifests under the run (for a rebuilt index, or to be
    adopted into ``indexed``, the index's report index -> directory), without the copies
    of a checkpoint (:func:`copy_reasons`), each left in place, neither taken in nor
    deleted, with a warning that begins with ``skipping`` (``{}``: its name): taken in,
    retention would delete it with whatever the user added to it."""
    reasons = copy_reasons(records, announced, indexed=indexed)
    for record in records:
        if record.dir_name in reasons:
            logger.warning(
                "%s: its manifest is of report %d, but %s. It is taken for a copy of a "
                "checkpoint, and a run deletes only the checkpoint directories it created; "
                "it is left in place.", skipping.format(record.dir_name),
                record.report_index, reasons[record.dir_name])
    return [r for r in records if r.dir_name not in reasons]


def read_or_rebuild_index(run: StorageLocation, retry: RetryPolicy,
                          events: Callable[[], list[Event]]) -> tuple[RunIndex | None, str]:
    """The run's index as ``fit()`` and ``Result.from_path`` take it, and why it was
    rebuilt ("" when it was read as it is, or the run has none): rebuilt from the
    manifests (:func:`rebuild_index`, not written here) when it is damaged, or lost while
    the event log (``events``, read when needed) records commits."""
    try:
        index = read_index(run, retry)
    except ManifestError as exc:
        return rebuild_index(run, retry, events()), str(exc).rstrip(".")
    if index is None:
        logged = events()
        if any(isinstance(e, Commit) for e in logged):
            return rebuild_index(run, retry, logged), (
                f"{run.display()} has no run index, but its event log records commits")
    return index, ""


def rebuild_index(run: StorageLocation, retry: RetryPolicy,
                  events: list[Event] | None = None) -> RunIndex:
    """Rebuild the index from the manifests found under the run directory (``events``: its
    event log, when already read).

    Directories without a valid manifest are not checkpoints and are left out, and so are
    the checkpoints a resume found damaged and dropped, or retention dropped for deletion
    (the event log says so; their manifests may still read), and copies of a checkpoint
    (:func:`without_copies`: a manifest under a name that is neither its report's default
    name nor one the event log announced). Attempt, failure and
    preemption counts are the previous index's when it can still be read, and never fewer
    than the event log counts, so a rebuild (by ``fit()`` or ``cairn rebuild-index``)
    keeps the run's failure budget and attempt numbering.
    """
    try:
        previous = read_index(run, retry)
    except ManifestError:
        previous = None
    if events is None:
        events = read_events(run.join(EVENTS_DIR), retry)
    # The report each was dropped at (a name reused by a later report is that report's).
    dropped = {e.dir_name: e.report_index if type(e.report_index) is int else 2**63
               for e in events if isinstance(e, (CheckpointDropped, CheckpointDeleting))
               and isinstance(e.dir_name, str)}
    records = []
    for name in list_dir_names(run, retry):
        if name in RESERVED_NAMES or not is_stored_dir_name(name):
            continue
        if is_local_link(run.join(name)):
            logger.warning("Skipping %s while rebuilding the index: it is a symbolic link, "
                           "not a checkpoint directory this run wrote", name)
            continue
        try:
            manifest = read_manifest(run.join(name), retry)
        except ManifestError as exc:
            logger.warning("Skipping %s while rebuilding the index: %s", name, exc)
            continue
        if manifest is None or manifest.report_index is None:
            continue
        if dropped.get(name, -1) >= manifest.report_index:
            logger.warning("Skipping %s while rebuilding the index: the run dropped it "
                           "(damaged at a resume, or by retention)", name)
            continue
        records.append(adoption_record(name, manifest))
    records.sort(key=lambda r: r.report_index)
    records = without_copies(records, announced_dir_names(events))
    base = previous or RunIndex()
    base = base.with_changes(
        attempts=max(base.attempts, sum(isinstance(e, AttemptStart) for e in events)),
        failures=max(base.failures, sum(isinstance(e, Failure) and e.counted is True
                                        for e in events)),
        preemptions=max(base.preemptions, sum(isinstance(e, Failure) and e.preemption is True
                                              for e in events)))
    made = reports_made(run, retry, base, events)
    if made and records and records[-1].report_index > made + 1:
        # The logs know of this run's reports: a manifest beyond them was planted.
        for record in records:
            if record.report_index > made + 1:
                logger.warning("Skipping %s while rebuilding the index: its manifest is of "
                               "report %d, but the run has made %d reports; it is left in "
                               "place", record.dir_name, record.report_index, made)
        records = [r for r in records if r.report_index <= made + 1]
    next_index = max([base.next_report_index] + [r.report_index + 1 for r in records])
    logger.info("Rebuilt the index of %s from %s", run.display(),
                plural(len(records), "manifest"))
    return base.with_changes(checkpoints=tuple(records), next_report_index=next_index)
