"""The subcommands that list, check and change runs: ls, verify, prune, rebuild-index and
lease break (``show`` lives in :mod:`cairn._src.cli.show`). ``prune`` refuses to touch a
run that a live driver holds and deletes only what the run owns
(:mod:`cairn._src.checkpoint.ownership`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from cairn._src.checkpoint.deletion_log import DeletionLog
from cairn._src.checkpoint.index import (
    CheckpointRecord,
    Retention,
    RunIndex,
    read_index,
    rebuild_index,
    write_index,
)
from cairn._src.checkpoint.manager import CheckpointManager, checkpoint_view
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.checkpoint.ownership import registered_references
from cairn._src.checkpoint.retention import resume_protection, retention_reasons
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.cli.common import (
    RETRY,
    format_metrics,
    heartbeat_age_s,
    hold_run,
    live_lease,
    live_run_error,
    open_run,
    print_json,
    read_lease,
    refuse_live_run,
)
from cairn._src.cli.show import checkpoint_statuses, dropped_on_storage
from cairn._src.config.run import CheckpointConfig
from cairn._src.errors import CairnError, CheckpointDamagedError
from cairn._src.observe.observer import EventLogWriter, EventStream
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME, METRICS_DIR
from cairn._src.run.lease import LeaseChangedError, break_lease, is_live, lease_state
from cairn._src.run.report_checks import score_present
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.run.status import run_history
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.fileio import exists, is_dir, list_dir_names
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.transfer import verify_directory
from cairn._src.storage.uris import redact_text
from cairn._src.text import plural, printable


def cmd_verify(args: argparse.Namespace) -> int:
    run, index = open_run(args.run)
    records = [r for r in index.checkpoints if not args.checkpoint or r.dir_name in args.checkpoint]
    unknown = set(args.checkpoint or ()) - {r.dir_name for r in records}
    on_storage = dropped_on_storage(run) if unknown else None  # read once, used below
    if unknown:  # A checkpoint a resume dropped as damaged may be named: listed below.
        known = {r.dir_name for r in index.checkpoints}.union(on_storage or ())
        if unknown - known:
            raise CairnError(f"--checkpoint {sorted(unknown - known)} not in the run; known: "
                             f"{sorted(known)}")
    records.sort(key=lambda r: r.report_index)
    results: list[dict[str, Any]] = []
    gone: set[str] = set()

    def say(line: str) -> None:
        if not args.json:
            print(printable(line))

    with VerifyProgress(records, shown=not args.json and sys.stderr.isatty()) as progress:
        for record in records:
            progress.start(record)
            entry: dict[str, Any] = {"dir_name": record.dir_name,
                                     "report_index": int(record.report_index),
                                     "status": "ok", "files": None, "size_bytes": None,
                                     "error": None}
            results.append(entry)
            try:
                # In the try: a reference this process cannot resolve (a scheme the training
                # script registered in code) fails its checkpoint, not the whole command.
                view = checkpoint_view(run, record)
                manifest = read_manifest(view.manifest_at, RETRY)
                if manifest is None:
                    raise CairnError("no manifest")
                verify_files(view, manifest.files, progress)
            except (CairnError, OSError) as exc:
                if no_longer_indexed(run, record):
                    # A live driver's retention dropped it meanwhile (the index stops
                    # naming a checkpoint before its files go): gone, not damaged.
                    results.remove(entry)
                    gone.add(record.dir_name)
                    say(f"gone    {record.dir_name}: dropped from the run's index while "
                        "it was verified")
                    continue
                # A storage library's text may quote a URI with its credentials.
                error = redact_text(str(exc))
                entry.update(status="failed", error=error)
                say(f"FAILED  {record.dir_name}: {error}")
                continue
            entry.update(files=len(manifest.files), size_bytes=int(manifest.total_bytes))
            say(f"ok      {record.dir_name} ({plural(len(manifest.files), 'file')}, "
                f"{manifest.total_bytes / 2**20:.2f} MiB)")
    indexed = {r.dir_name for r in index.checkpoints} - gone
    dropped = {name: reason for name, reason in (
        dropped_on_storage(run) if on_storage is None else on_storage).items()
        if name not in indexed}
    for name in [n for n in dropped if not args.checkpoint or n in args.checkpoint]:
        results.append({"dir_name": name, "report_index": None, "status": "dropped",
                        "files": None, "size_bytes": None, "error": dropped[name]})
        say(f"DROPPED {name}: damaged, dropped from the index at resume ({dropped[name]}); "
            "delete it by hand when inspected")
    counts = {status: sum(r["status"] == status for r in results)
              for status in ("ok", "failed", "dropped")}
    if args.json:
        print_json({"run": run.display(), "checkpoints": results, "verified": counts["ok"],
                    "failed": counts["failed"], "dropped": counts["dropped"]})
    else:
        print(f"{counts['ok']} verified, {counts['failed']} failed"
              + (f", {counts['dropped']} dropped as damaged" if counts["dropped"] else ""))
    return 1 if counts["failed"] or counts["dropped"] else 0


def no_longer_indexed(run: StorageLocation, record: CheckpointRecord) -> bool:
    """Whether the run's index, read again now, no longer names ``record``."""
    try:
        index = read_index(run, RETRY)
    except (CairnError, OSError):
        return False
    return index is not None and not any(
        r.dir_name == record.dir_name and r.report_index == record.report_index
        for r in index.checkpoints)


class VerifyProgress:
    """A progress bar on stderr over the bytes of ``records`` when ``shown`` (stderr is a
    terminal, no --json); gone when the ``with`` block ends. Without ``shown``, every
    method does nothing."""

    def __init__(self, records: list[CheckpointRecord], *, shown: bool) -> None:
        self.shown = shown and bool(records)
        self._sizes = {r.dir_name: max(0, r.size_bytes) for r in records}
        self._done = 0
        self._progress: Any = None
        if not self.shown:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("verifying {task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
            transient=True,
            # Lines on stdout go above the bar when both are the terminal; a redirected
            # stdout is left alone.
            redirect_stdout=sys.stdout.isatty(), redirect_stderr=False)
        self._task = self._progress.add_task(_bar_text(records[0].dir_name),
                                             total=max(1, sum(self._sizes.values())))

    def __enter__(self) -> VerifyProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self, record: CheckpointRecord) -> None:
        """``record``'s verification starts: the bar stands at the bytes before it."""
        if self._progress is not None:
            self._progress.update(self._task, description=_bar_text(record.dir_name),
                                  completed=self._done)
            self._done += self._sizes.get(record.dir_name, 0)

    def advance(self, size: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, max(0, size))


def _bar_text(name: str) -> str:
    """``name`` as the bar's text: control characters escaped, and rich's markup too (a
    name ``[bold]`` is printed as itself)."""
    from rich.markup import escape

    return escape(printable(name))


# With the bar, a checkpoint is verified in parts of about this size, so the bar moves
# within a large one.
BAR_STEP_BYTES = 256 * 2**20


def verify_files(view: CheckpointView, files: Mapping[str, FileEntry],
                 progress: VerifyProgress) -> None:
    """Verify ``files`` of ``view`` (see :func:`verify_directory`), moving ``progress``."""
    if not progress.shown:
        verify_directory(view.data, files, retry=RETRY)
        return
    parts: list[dict[str, FileEntry]] = [{}]
    size = 0
    for rel in sorted(files):
        if size >= BAR_STEP_BYTES:
            parts.append({})
            size = 0
        parts[-1][rel] = files[rel]
        size += max(0, files[rel].size)
    try:
        for part in parts:
            verify_directory(view.data, part, retry=RETRY)
            progress.advance(sum(max(0, entry.size) for entry in part.values()))
    except CheckpointDamagedError:
        # A part's error counts and names its own files only: the whole checkpoint's names
        # them all, as without the bar.
        verify_directory(view.data, files, retry=RETRY)
        raise


# How many metric names a --score error lists, and how deep it looks into nested metrics.
SHOWN_METRICS = 20
NESTED_DEPTH = 4


def metric_paths(records: Sequence[CheckpointRecord]) -> list[str]:
    """The metrics of ``records`` that ``--score`` can name, sorted: each flat key, and for
    nested metrics (``{"val": {"loss": ...}}``) their ``/`` paths (``val/loss``) instead,
    :data:`NESTED_DEPTH` levels deep at most."""
    paths: set[str] = set()
    stack: list[tuple[str, Any, int]] = [(str(k), v, 1) for r in records
                                         for k, v in r.metrics.items()]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, Mapping) and value and depth < NESTED_DEPTH:
            stack.extend((f"{path}/{k}", v, depth + 1) for k, v in value.items())
        else:
            paths.add(path)
    return sorted(paths)


def prune_ranking(args: argparse.Namespace, index: RunIndex
                  ) -> tuple[str | None, Literal["max", "min"], str]:
    """The metric and order ``prune`` ranks by, and a line that says where they come from.

    The run's own ranking (``checkpoint_score_attribute`` and ``checkpoint_score_order``,
    as the index recorded them) is the default: ``--score`` of that attribute takes its
    order, and no ``--score`` ranks as the run does. Any other metric needs ``--order``:
    guessing ``max`` for a loss would keep the worst checkpoints and delete the best.
    """
    recorded = index.retention
    attribute = recorded.score_attribute if recorded is not None else None
    run_order: Literal["max", "min"] = (
        "min" if recorded is not None and recorded.score_order == "min" else "max")
    if args.latest:
        if args.score is not None or args.order is not None:
            raise CairnError("--latest keeps the latest N and ranks by no metric: pass it "
                             "without --score and --order.")
        return None, "max", f"keeping the latest {args.keep} (--latest)"
    if args.score is None:
        if args.order is not None:
            raise CairnError(f"--order={args.order} needs --score METRIC: it says whether a "
                             "higher or a lower METRIC is better; pass both, or neither to "
                             "rank as the run does.")
        if recorded is None:
            # Guessing "the latest" here would delete the best checkpoints of a run that
            # ranked by a metric.
            raise CairnError(
                "The run's index records no ranking (an index rebuilt by `cairn "
                "rebuild-index`, or written by an older Cairn), so the run's own is not "
                "known: pass --score METRIC with --order max or min, or --latest to keep "
                "the latest N; nothing changed.")
        if attribute is None:
            return None, "max", (f"keeping the latest {args.keep} (the run ranks by no "
                                 "score: no checkpoint_score_attribute recorded)")
        return attribute, run_order, (
            f"ranking by {attribute} ({run_order}), the run's own checkpoint_score_attribute "
            "and checkpoint_score_order (--score and --order choose another)")
    # As retention finds it: the flat key, else a '/' path into nested metrics (val/loss).
    if not any(score_present(r.metrics, args.score) for r in index.checkpoints):
        known = metric_paths(index.checkpoints)
        shown = ", ".join(known[:SHOWN_METRICS]) + (
            f", ... ({len(known) - SHOWN_METRICS} more)" if len(known) > SHOWN_METRICS else "")
        raise CairnError(f"--score={args.score!r} is not a metric of this run's "
                         f"checkpoints; they have: {shown or 'no metrics'}.")
    if args.order is not None:
        return args.score, args.order, f"ranking by {args.score} ({args.order})"
    if args.score == attribute:
        return attribute, run_order, (f"ranking by {attribute} ({run_order}), the run's own "
                                      "checkpoint_score_order")
    ranks = (f"the run ranks by {attribute} ({run_order})" if attribute is not None
             else "the run recorded no checkpoint_score_attribute")
    raise CairnError(f"--score={args.score!r} needs --order max or --order min ({ranks}, so "
                     f"no order is known for {args.score}): pass --order max to keep the "
                     f"highest {args.score}, --order min to keep the lowest.")


PRUNE_ADVICE = "Prune it when the run has stopped; nothing changed."


def cmd_prune(args: argparse.Namespace) -> int:
    run, index = open_run(args.run)
    if args.dry_run:
        refuse_live_run(run, PRUNE_ADVICE)
        return _prune(args, run, index, None)
    # The lease, held until the end: a driver that starts meanwhile is refused instead of
    # having its index written over by one computed from what was read before.
    with hold_run(run, PRUNE_ADVICE) as fence:
        # Read again, now that no driver can change it.
        run, index = open_run(args.run)
        return _prune(args, run, index, fence)


def _prune(args: argparse.Namespace, run: StorageLocation, index: RunIndex,
           fence: Callable[[str], None] | None) -> int:
    """``prune`` of ``run``, whose ``index`` was read under its lease (``fence`` checks
    that it is still held), or a dry run without (``fence`` None)."""
    if args.keep < 1:
        raise CairnError(f"--keep={args.keep} must be an integer >= 1.")
    score, order, ranking = prune_ranking(args, index)
    if not args.json:
        print(printable(ranking))
    records = sorted(index.checkpoints, key=lambda r: r.report_index)
    # Records, not typed events: registered_references (checkpoint/ownership.py) reads them.
    events = read_log(run.join(EVENTS_DIR), RETRY)
    # A validation that had not finished when the driver stopped runs again when the run
    # continues: its checkpoint stays, as the driver's own retention keeps it.
    pending = {name for name, status in checkpoint_statuses(events, records).items()
               if status == "PENDING_VALIDATION"}
    reasons = retention_reasons(records, Retention(args.keep, score, order),
                                resumed_from=resume_protection(records, index), pending=pending)
    kept = [(r, why) for r, why in zip(records, reasons, strict=True) if why]
    dropped = [r for r, why in zip(records, reasons, strict=True) if not why]
    deleted: dict[str, bool] = {}
    if not args.json:
        for record, why in kept:
            print(printable(f"{'would keep' if args.dry_run else 'keeping':<10} "
                            f"{record.dir_name}: {'; '.join(reason.text for reason in why)}"))
        for record in dropped:
            print(printable(f"{'would drop' if args.dry_run else 'dropping':<10} "
                            f"{record.dir_name}"))
    if fence is not None and dropped:
        # Index first, deletion after: a crash in between leaves only unreferenced data.
        pruned = index.with_changes(checkpoints=tuple(r for r, _ in kept))
        fence("nothing changed.")
        write_index(run, pruned, RETRY)
        announce_deletions(run, index, dropped, fence)
        # What the run recorded decides what may be deleted, never the index alone; the
        # data of a kept checkpoint stays (the manager looks in the pruned index).
        manager = CheckpointManager(run, CheckpointConfig(), RETRY, pruned,
                                    SegmentLog(run.join(METRICS_DIR), RETRY),
                                    registered=registered_references(events))
        for done, record in enumerate(dropped):
            fence(f"the index was pruned and {done} of {len(dropped)} checkpoints to drop "
                  f"deleted; the other {len(dropped) - done} are left in place (prune again "
                  "when the run has stopped).")
            deleted[record.dir_name] = manager.delete_owned(
                record, delete_references=args.delete_references)
            if not deleted[record.dir_name] and not args.json:
                print(f"left in place: {printable(record.dir_name)} (not a checkpoint "
                      "directory this run owns; see the warning above)")
    if args.json:
        print_json({
            "run": run.display(), "dry_run": bool(args.dry_run), "keep": int(args.keep),
            "score": score, "order": order,
            "kept": [{"dir_name": r.dir_name, "report_index": int(r.report_index),
                      "kept_because": [reason.as_dict() for reason in why]} for r, why in kept],
            "dropped": [{"dir_name": r.dir_name, "report_index": int(r.report_index),
                         "deleted": deleted.get(r.dir_name, False)} for r in dropped]})
        return 0
    verb = "to drop" if args.dry_run or not dropped else "dropped"
    left = list(deleted.values()).count(False)
    print(f"{plural(len(dropped), 'checkpoint')} {verb}, {len(kept)} kept"
          + (f", {plural(left, 'directory', 'directories')} left in place" if left else ""))
    return 0


def announce_deletions(run: StorageLocation, index: RunIndex,
                       dropped: Sequence[CheckpointRecord], fence: Callable[[str], None]) -> None:
    """Log the deletion of ``dropped`` durably in the event log (``checkpoint_deleting``), as
    the driver's retention does, before any of their data goes: a deletion that fails half
    way leaves a directory without a manifest that the next start deletes, not one it keeps
    as a committed checkpoint whose manifest went missing (checkpoint/recheck.py). When the
    log cannot be written, ``index`` (as read under the lease) is written back."""
    log = SegmentLog(run.join(EVENTS_DIR), RETRY, durable=True)
    fence("the index was pruned; nothing deleted (prune again when the run has stopped).")
    if DeletionLog(EventStream([EventLogWriter(log)], log=log)).announce(dropped,
                                                                          reason="cairn prune"):
        return
    fence("the index was pruned; nothing deleted, the event log could not record it.")
    write_index(run, index, RETRY)
    raise CairnError("The event log could not record the deletion of "
                     f"{plural(len(dropped), 'checkpoint')} (see the warning above), and no "
                     "data goes before that: the index was written back; nothing changed. "
                     "Prune again once storage answers.")


FORCE_HELP = ("remove the lease even though its heartbeat is fresh: a driver still running "
              "the run finds its lease gone at its next commit or renewal, stops committing "
              "checkpoints and fails with RunLeaseError (fit() again continues the run)")


def cmd_lease_break(args: argparse.Namespace) -> int:
    run = resolve(args.run)
    if (not exists(run.join(INDEX_NAME), RETRY) and not is_dir(run.join(EVENTS_DIR), RETRY)
            and read_lease(run) is None):
        # Not a run (a driver writes its lease first, then the index and the event log):
        # a lease.json there is someone else's file.
        raise CairnError(f"{run.display()} holds no run (no run index, no event log, no "
                         "lease a driver wrote); nothing removed.")
    # What is judged is what is removed: should another lease be there by the time it is
    # deleted (a driver started meanwhile), break_lease refuses.
    judged = lease_state(run, RETRY)
    live = judged.lease if judged.lease is not None and is_live(judged.lease) else None
    advice = ("Break the lease when its driver has stopped, or let it expire; "
              f"`cairn lease break --force {run.display()}` removes it anyway, and a driver "
              "still running then stops committing checkpoints and fails.")
    if live is not None and not args.force:
        raise live_run_error(run, live, advice)
    try:
        previous = break_lease(run, RETRY, judged=None if args.force else judged)
    except LeaseChangedError as exc:
        if is_live(exc.current):
            raise live_run_error(run, exc.current, advice) from exc
        raise
    if args.json:
        print_json({"run": run.display(), "previous": None if previous is None else {
            "host": previous.host, "pid": int(previous.pid),
            "heartbeat_at": float(previous.heartbeat_at)}})
        return 0
    if previous is None:
        print(f"cleared the lease of {printable(run.display())} (there was no readable lease)")
        return 0
    print(printable(f"cleared the lease of {run.display()} (was host {previous.host}, pid "
                    f"{previous.pid}, heartbeat {heartbeat_age_s(previous):.0f} s ago)"))
    if live is not None:
        print(printable(f"the driver (host {live.host}, pid {live.pid}) looked live: if it "
                        "still runs, it stops committing checkpoints and fails"))
    return 0


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    run = resolve(args.run)
    if not is_dir(run, RETRY):
        raise CairnError(f"{run.display()} does not exist (or is not a directory).")
    if (not exists(run.join(INDEX_NAME), RETRY) and not is_dir(run.join(EVENTS_DIR), RETRY)
            and not rebuild_index(run, RETRY).checkpoints):
        # Said before taking the lease: no lease file is written into a directory of the
        # user's own.
        raise CairnError(f"{run.display()} holds no run (no checkpoint manifests, no run index, "
                         "no event log); nothing written.")
    # The lease, held until the index is written (a live driver: refused, nothing written):
    # a driver that starts meanwhile is refused instead of having its index written over.
    with hold_run(run, "Rebuild its index when the run has stopped; nothing written.") as fence:
        index = rebuild_index(run, RETRY)
        fence("nothing written.")
        write_index(run, index, RETRY)
    if args.json:
        print_json({"run": run.display(), "checkpoints": len(index.checkpoints)})
        return 0
    print(f"rebuilt the index of {printable(run.display())}: "
          f"{plural(len(index.checkpoints), 'checkpoint')}")
    return 0


def _ls_entry(storage: StorageLocation, name: str) -> dict[str, Any] | None:
    run = storage.join(name)
    if not exists(run.join(INDEX_NAME), RETRY):
        return None  # not a run: skipped silently
    try:
        index = read_index(run, RETRY)
        if index is None:
            return None
        history = run_history(read_events(run.join(EVENTS_DIR), RETRY),
                              driver_live=live_lease(run) is not None)
    except (CairnError, OSError, ValueError, TypeError, KeyError) as exc:
        # A storage library's text may quote a URI with its credentials.
        return {"name": name, "status": "unreadable",
                "reason": redact_text(f"{type(exc).__name__}: {exc}".splitlines()[0])[:200]}
    last = max(index.checkpoints, key=lambda r: r.report_index, default=None)
    activity = max([t for t in (history.last_event_at,
                                last.committed_at if last else None) if t], default=None)
    return {"name": name, "status": history.status, "attempts": int(history.attempts),
            "failures": sum(f.counted for f in history.failures),
            "last_report": int(last.report_index) if last else None,
            "last_activity": activity,
            "last_metrics": dict(last.metrics) if last else {},
            "size_bytes": int(sum(r.size_bytes for r in index.checkpoints))}


def cmd_ls(args: argparse.Namespace) -> int:
    storage = resolve(args.storage)
    if not is_dir(storage, RETRY):
        # display(), not the argument: a URI's credentials stay out of the error.
        raise CairnError(f"{storage.display()} does not exist (or is not a directory).")
    # list_dir_names skips names that are not single safe components ('..' from a key
    # runs/../x), with a warning that counts them.
    entries = [e for e in (_ls_entry(storage, n) for n in list_dir_names(storage, RETRY))
               if e is not None]
    entries.sort(key=lambda e: e.get("last_activity") or 0.0, reverse=True)
    if args.json:
        print_json({"storage": storage.display(), "runs": entries})
        return 0
    if not entries:
        print(f"no runs under {printable(storage.display())}")
        return 0
    now = time.time()
    print(f"{'name':<24} {'status':<11} {'attempts':>8} {'failures':>8} {'last report':<16} "
          f"{'MiB':>9}  metrics")
    for e in entries:
        name = printable(e["name"])
        if e["status"] == "unreadable":
            print(f"{name:<24} {'unreadable':<11} {printable(e['reason'])}")
            continue
        age = (f"{e['last_report']} ({_age(now - e['last_activity'])} ago)"
               if e["last_report"] is not None and e["last_activity"] else "-")
        print(f"{name:<24} {e['status']:<11} {e['attempts']:>8} {e['failures']:>8} "
              f"{age:<16} {e['size_bytes'] / 2**20:>9.2f}  "
              f"{format_metrics(e['last_metrics'], 40)}")
    return 0


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def register(commands: Any) -> None:
    """Add this module's subcommands to the ``cairn`` parser's subparsers."""

    def command(name: str, help_text: str, aliases: tuple[str, ...] = ()
                ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(name, help=help_text,
                                                           description=help_text,
                                                           aliases=list(aliases))
        sub.add_argument("run", help="the run directory: a path or URI")
        return sub

    ls = commands.add_parser("ls", help="List the runs under a storage path or URI.",
                             description="List the runs under a storage path or URI; size is "
                             "the checkpoints' bytes.")
    ls.add_argument("storage", help="the storage path or URI that holds run directories")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    ls.set_defaults(func=cmd_ls)
    verify = command("verify", "Check every file of committed checkpoints against manifests.")
    verify.add_argument("--checkpoint", action="append", help="only this checkpoint (repeat)")
    verify.add_argument("--json", action="store_true", help="print the results as JSON")
    verify.set_defaults(func=cmd_verify)
    prune = command("prune", "Keep the best (or latest) N checkpoints, delete the rest.")
    prune.add_argument("--keep", type=int, required=True,
                       help="how many checkpoints to keep")
    prune.add_argument("--score", help="metric to rank by (default: the run's own "
                       "checkpoint_score_attribute, or the latest N when it has none)")
    prune.add_argument("--latest", action="store_true",
                       help="keep the latest N, whatever the run ranks by (needed, or "
                       "--score and --order, where the index records no ranking)")
    prune.add_argument("--order", choices=("max", "min"), default=None,
                       help="with --score: keep the highest (max) or lowest (min); default: "
                       "the run's own checkpoint_score_order for its score attribute, "
                       "required for any other metric")
    prune.add_argument("--delete-references", action="store_true",
                       help="also delete the data of references this run registered")
    prune.add_argument("--dry-run", action="store_true",
                       help="say what would be kept (and why) and dropped, delete nothing")
    prune.add_argument("--json", action="store_true", help="print the decision as JSON")
    prune.set_defaults(func=cmd_prune)
    rebuild = command("rebuild-index", "Rebuild the run index from the checkpoint manifests.")
    rebuild.add_argument("--json", action="store_true", help="print the result as JSON")
    rebuild.set_defaults(func=cmd_rebuild_index)
    lease = commands.add_parser("lease", help="Manage a run's lease.",
                                description="Manage a run's lease.")
    lease_commands = lease.add_subparsers(dest="lease_command", required=True)
    lease_break = lease_commands.add_parser(
        "break", help="Clear a run's lease by hand (only when no driver runs it).",
        description="Clear a run's lease by hand (only when no driver runs it): a lease "
        "whose heartbeat is fresh is refused without --force.")
    lease_break.add_argument("run", help="the run directory: a path or URI")
    lease_break.add_argument("--force", action="store_true", help=FORCE_HELP)
    lease_break.add_argument("--json", action="store_true", help="print the result as JSON")
    lease_break.set_defaults(func=cmd_lease_break, command="lease break")
