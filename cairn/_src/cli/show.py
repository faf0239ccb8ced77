"""``cairn show RUN`` (alias ``inspect``): how a run went and what it keeps.

Its status (:func:`cairn._src.run.status.run_history`), the final error of a failed run,
every failure (time, attempt, ranks, reason, each rank's error), and the committed
checkpoints with their size, score, status and why retention keeps each one
(:func:`cairn._src.checkpoint.retention.retention_reasons`). The text and ``--json`` are
built from one document (:func:`show_document`), so they always agree. Everything read
from the run is untrusted: the index is schema-checked, the event log's records are
skipped when malformed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Mapping
from typing import Any

from cairn._src.checkpoint.index import CheckpointRecord, Retention, RunIndex
from cairn._src.checkpoint.ownership import could_have_created
from cairn._src.checkpoint.retention import resume_protection, retention_reasons, score_of
from cairn._src.cli.common import (
    RETRY,
    format_metrics,
    live_lease,
    open_run,
    print_json,
)
from cairn._src.run.events import (
    CheckpointDropped,
    Event,
    Failure,
    ValidationFinished,
    ValidationRequested,
    as_events,
    read_events,
)
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.lease import LeaseInfo
from cairn._src.run.status import FailureInfo, run_history
from cairn._src.storage.fileio import is_dir
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.uris import redact, redact_text
from cairn._src.text import plural, printable
from cairn._src.wire.code_locations import describe_frame, read_frame

# Ray Train's ReportedCheckpointStatus names, as the validation events record them.
CHECKPOINT_STATUSES = ("COMMITTED", "PENDING_VALIDATION", "VALIDATED", "VALIDATION_TIMEOUT",
                       "VALIDATION_FAILED")
# What a message may take in the text output: the --json document has it whole.
MESSAGE_LINES = 8
LINE_LIMIT = 200


def checkpoint_statuses(events: Iterable[object],
                        records: Iterable[CheckpointRecord] = ()) -> dict[str, str]:
    """Each checkpoint's validation status from the event log (``COMMITTED`` for one that
    never had a validation: absent here).

    With the index's ``records``, a request counts only for the checkpoint its own report
    committed, as the driver reads it: a report whose commit failed leaves its request
    behind, and a later report may commit a checkpoint of the same name. A request logged
    without its report index is taken at its name."""
    committed = {r.dir_name: r.report_index for r in records}
    statuses: dict[str, str] = {}
    for event in as_events(events):
        if isinstance(event, ValidationRequested) and event.dir_name is not None:
            name, index = event.dir_name, event.index
            if name in committed and index and index != committed[name]:
                continue
            statuses[name] = "PENDING_VALIDATION"
        elif (isinstance(event, ValidationFinished) and event.dir_name is not None
              and event.status in CHECKPOINT_STATUSES):
            statuses[event.dir_name] = str(event.status)
    return statuses


def _dropped_as_damaged(events: Iterable[Event], indexed: set[str]) -> list[dict[str, str]]:
    dropped: dict[str, str] = {}
    for event in events:
        if (isinstance(event, CheckpointDropped) and event.dir_name is not None
                and event.dir_name not in indexed):
            dropped[event.dir_name] = redact_text(event.reason)[:2000]
    return [{"dir_name": name, "reason": reason} for name, reason in dropped.items()]


def dropped_on_storage(run: StorageLocation) -> dict[str, str]:
    """The checkpoints a resume dropped as damaged that are on storage: why. Each name is
    looked up once, however often a (damaged) log repeats it."""
    dropped: dict[str, str] = {}
    looked: set[str] = set()
    for event in read_events(run.join(EVENTS_DIR), RETRY):
        if (isinstance(event, CheckpointDropped) and (name := event.dir_name) is not None
                and name not in looked and could_have_created(name)):
            looked.add(name)
            if is_dir(run.join(name), RETRY):
                dropped[name] = redact_text(event.reason)[:200]
    return dropped


def _target(record: CheckpointRecord) -> str | None:
    if record.target_uri is not None:
        return redact(record.target_uri)
    return record.target_path


def _checkpoint(record: CheckpointRecord, retention: Retention, status: str,
                reasons: Iterable[Any]) -> dict[str, Any]:
    attribute = retention.score_attribute
    reference = record.target_uri is not None or record.target_path is not None
    return {
        "dir_name": record.dir_name,
        "report_index": int(record.report_index),
        "attempt": int(record.attempt),
        "committed_at": float(record.committed_at),
        "size_bytes": int(record.size_bytes),
        "metrics": dict(record.metrics),
        "score": None if attribute is None else score_of(record, attribute),
        "status": status,
        "location": "reference" if reference else "run",
        "target": _target(record),
        "kept_because": [reason.as_dict() for reason in reasons],
    }


def _driver(lease: LeaseInfo | None) -> dict[str, Any] | None:
    if lease is None:
        return None
    return {"host": lease.host, "pid": int(lease.pid), "heartbeat_at": float(lease.heartbeat_at)}


def _failure(failure: FailureInfo, event: Failure,
             frames: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    errors = [{**_redacted(e.as_dict()), "frame": frames.get(e.ranks[0]) if e.ranks else None}
              for e in failure.errors]
    return {"attempt": failure.attempt, "t": failure.t, "ranks": list(failure.ranks),
            "reason": redact_text(failure.reason), "errors": errors, "counted": event.counted,
            "preemption": event.preemption}


def _redacted(error: dict[str, Any]) -> dict[str, Any]:
    """An error's record with any URI credentials in its message masked (a log written
    before the driver masked them, or forged)."""
    return {**error, "message": redact_text(str(error.get("message", "")))}


def _frames(event: Failure) -> dict[int, dict[str, Any]]:
    """rank -> where that rank failed (``{"file", "line", "function"}``), for the ranks
    whose error recorded it (runs written before frames were recorded have none)."""
    frames: dict[int, dict[str, Any]] = {}
    for error in event.errors:
        frame = read_frame(error.frame)
        if frame is None:
            continue
        for rank in error.ranks:
            frames.setdefault(rank, frame)
    return frames


def show_document(run: StorageLocation, index: RunIndex, events: Iterable[object],
                  lease: LeaseInfo | None) -> dict[str, Any]:
    """What ``cairn show --json`` prints (the schema is in docs/cli.md); ``events`` are
    the run's events, typed or as the log stores them."""
    typed = as_events(events)
    history = run_history(typed, driver_live=lease is not None)
    retention = index.retention or Retention()
    records = sorted(index.checkpoints, key=lambda r: r.report_index)
    statuses = checkpoint_statuses(typed, records)
    pending = {name for name, status in statuses.items() if status == "PENDING_VALIDATION"}
    reasons = retention_reasons(records, retention, resumed_from=resume_protection(records, index),
                                pending=pending)
    latest = index.latest
    # In the order run_history lists them.
    failures = [event for event in typed if isinstance(event, Failure)]
    return {
        "run": run.display(),
        "status": history.status,
        "error": _redacted(history.error.as_dict()) if history.error else None,
        "sessions": int(history.sessions),
        "attempts": int(max(history.attempts, index.attempts)),
        "driver": _driver(lease),
        "started_at": history.started_at,
        "last_event_at": history.last_event_at,
        "next_report": int(index.next_report_index),
        "latest": latest.dir_name if latest else None,
        "resumed_from": index.resumed_from,
        "retention": None if index.retention is None else {
            "num_to_keep": retention.num_to_keep, "score_attribute": retention.score_attribute,
            "score_order": retention.score_order},
        "failures": [_failure(f, event, _frames(event)) for f, event in
                     zip(history.failures, failures, strict=True)],
        "checkpoints": [_checkpoint(r, retention, statuses.get(r.dir_name, "COMMITTED"), why)
                        for r, why in zip(records, reasons, strict=True)],
        "dropped_as_damaged": _dropped_as_damaged(typed, {r.dir_name for r in records}),
    }


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"t={t:.6g}"  # a time no calendar holds: the log is damaged, show it raw


def _ranks(ranks: Iterable[int]) -> str:
    listed = list(ranks)
    if not listed:
        return "the driver"
    return f"{'rank' if len(listed) == 1 else 'ranks'} {', '.join(map(str, listed))}"


def _shorten(line: str) -> str:
    return line if len(line) <= LINE_LIMIT else line[: LINE_LIMIT - 3] + "..."


def _message_lines(message: str) -> list[str]:
    lines = message.splitlines() or [""]
    shown = [_shorten(printable(line)) for line in lines[:MESSAGE_LINES]]
    if len(lines) > MESSAGE_LINES:
        shown.append(f"... {plural(len(lines) - MESSAGE_LINES, 'more line')} (--json has all)")
    return shown


def _retention_text(retention: dict[str, Any] | None) -> str:
    if retention is None:
        return ("not recorded (the index was rebuilt from the manifests, or an older Cairn "
                "wrote it): cairn prune needs --score or --latest")
    n, attribute = retention["num_to_keep"], retention["score_attribute"]
    attribute = None if attribute is None else printable(attribute)
    if n is None:
        return "every checkpoint (no num_to_keep)"
    if attribute is None:
        kept = f"the latest {n}"
    else:
        kept = f"the best {n} by {attribute} ({retention['score_order']})"
    return f"{kept}, the latest one and the one the last attempt resumed from"


def format_show(doc: dict[str, Any]) -> list[str]:
    """The text of ``cairn show``: the lines of ``doc`` for people."""
    out = [f"{'run':<10} {printable(doc['run'])}"]
    error: dict[str, Any] | None = doc["error"]
    status = doc["status"]
    if error is not None:
        first, *rest = _message_lines(error["message"])
        kind = printable(error["type"]) or "error"
        out.append(f"{'status':<10} {status}: {kind} on {_ranks(error['ranks'])}: {first}")
        out += [f"{'':<10}   {line}" for line in rest]
    elif status == "interrupted":
        out.append(f"{'status':<10} interrupted (the driver stopped before the run ended; "
                   "fit() with the same name and storage_path continues it)")
    else:
        out.append(f"{'status':<10} {status}")
    out.append(f"{'attempts':<10} {plural(doc['attempts'], 'attempt')} in "
               f"{plural(doc['sessions'], 'driver session')}, "
               f"{plural(len(doc['failures']), 'failure')}")
    driver = doc["driver"]
    where = (f"live: host {printable(driver['host'])}, pid {driver['pid']}" if driver
             else "none")
    out.append(f"{'driver':<10} {where}")
    out.append(f"{'started':<10} {_when(doc['started_at'])}   last event "
               f"{_when(doc['last_event_at'])}")
    out.append(f"{'resumed':<10} {printable(doc['resumed_from'] or '-')}   latest "
               f"{printable(doc['latest'] or '-')}"
               f"   next report {doc['next_report']}")
    out.append(f"{'keeps':<10} {_retention_text(doc['retention'])}")
    if doc["failures"]:
        out.append("")
        out.append(f"failures ({len(doc['failures'])}):")
    for failure in doc["failures"]:
        attempt = "-" if failure["attempt"] is None else failure["attempt"]
        reason = printable(failure["reason"])
        out.append(f"  {_when(failure['t'])}  attempt {attempt}  {_ranks(failure['ranks'])}: "
                   f"{_shorten(reason or '(no reason recorded)')}"
                   + (" (preemption: counted against max_preemption_failures)"
                      if failure["preemption"] else "" if failure["counted"] else
                      " (not counted: the checkpoint it resumed from was damaged)"))
        for rank_error in failure["errors"]:
            # Each rank's error, unless the reason (the grouped first lines) says it all,
            # and where it failed.
            first, *rest = _message_lines(rank_error["message"])
            detail = f"{printable(rank_error['type'])}: {first}"
            frame = rank_error["frame"]
            where = "" if frame is None else _shorten(printable(describe_frame(frame)))
            if detail not in reason:
                out.append(f"      {_ranks(rank_error['ranks'])}: {detail}"
                           + (f" (at {where})" if where else ""))
            elif where:
                out.append(f"      {_ranks(rank_error['ranks'])} failed at {where}")
            out += [f"        {line}" for line in rest]
    out.append("")
    checkpoints = doc["checkpoints"]
    if not checkpoints:
        out.append("no committed checkpoints")
    else:
        attribute = (doc["retention"] or {}).get("score_attribute")
        score_head = _shorten(printable(attribute or "score"))[:12]
        out.append(f"{'checkpoint':<24} {'report':>6} {'MiB':>9} {score_head:>12}  "
                   f"{'status':<18} {'where':<5}  {'metrics':<30}  kept because")
        for c in checkpoints:
            score = "-" if c["score"] is None else f"{c['score']:.4g}"
            name = printable(c["dir_name"])
            out.append(
                f"{name:<24} {c['report_index']:>6} {c['size_bytes'] / 2**20:>9.2f} "
                f"{score:>12}  {c['status'].lower().replace('_', ' '):<18} "
                f"{'run' if c['location'] == 'run' else 'ref':<5}  "
                f"{format_metrics(c['metrics'], 30):<30}  "
                + printable('; '.join(r['text'] for r in c['kept_because'])
                            or 'not kept: dropped next'))
        for c in checkpoints:
            if c["target"] is not None:
                out.append(f"  {printable(c['dir_name'])} refers to {printable(c['target'])}")
    for dropped in doc["dropped_as_damaged"]:
        out.append(f"dropped as damaged at a resume: {printable(dropped['dir_name'])} "
                   f"({_shorten(printable(dropped['reason']))})")
    return out


def cmd_show(args: argparse.Namespace) -> int:
    run, index = open_run(args.run)
    doc = show_document(run, index, read_events(run.join(EVENTS_DIR), RETRY), live_lease(run))
    if args.json:
        print_json(doc)
        return 0
    print("\n".join(format_show(doc)))
    return 0


def register(commands: Any) -> None:
    """Add ``show`` (alias ``inspect``) to the ``cairn`` parser's subparsers."""
    text = ("Show how a run went (status, error, every failure) and its checkpoints, with "
            "why each one is kept.")
    show = commands.add_parser("show", help=text, description=text, aliases=["inspect"])
    show.add_argument("run", help="the run directory: a path or URI")
    show.add_argument("--json", action="store_true",
                      help="print the document as JSON (schema: docs/cli.md)")
    show.set_defaults(func=cmd_show)
