"""The ``cairn`` command line: inspect, verify, prune, plot and summarize runs.

Every command takes a run directory (a path or any URI Cairn resolves) and exits non-zero
with a one-line error on bad input: exit code 2 for a bad argument or a file that is not
what Cairn wrote (the run's files are untrusted input), never a traceback. ``prune``
refuses to touch a run that a live driver holds and deletes only what the run owns
(:mod:`cairn._src.checkpoint.ownership`). ``lease break`` clears a run's lease by hand.
This is the only place that configures logging handlers.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from cairn._src.checkpoint.index import RunIndex, read_index, rebuild_index, write_index
from cairn._src.checkpoint.manager import CheckpointManager, checkpoint_view
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.checkpoint.ownership import could_have_created, registered_references
from cairn._src.checkpoint.retention import decide_retention, make_policy
from cairn._src.config import CheckpointConfig
from cairn._src.errors import CairnError, ManifestError
from cairn._src.goodput.summary import summarize
from cairn._src.run.layout import EVENTS_DIR, LEASE_NAME, METRICS_DIR
from cairn._src.run.lease import LeaseInfo, break_lease, is_live
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.fileio import is_dir, read_bytes
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import verify_directory

RETRY = RetryPolicy()


def _open(path: str) -> tuple[StorageLocation, RunIndex]:
    run = resolve(path)
    index = read_index(run, RETRY)
    if index is None:
        raise CairnError(f"{run.display()} is not a Cairn run directory (no run index).")
    return run, index


def _live_lease(run: StorageLocation) -> LeaseInfo | None:
    try:
        lease = LeaseInfo.from_json(read_bytes(run.join(LEASE_NAME), RETRY))
    except (FileNotFoundError, ManifestError):
        # An invalid lease holds nothing: a driver takes it over too.
        return None
    return lease if is_live(lease) else None


def _format_metrics(metrics: dict[str, Any], limit: int = 60) -> str:
    text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in metrics.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cmd_inspect(args: argparse.Namespace) -> int:
    run, index = _open(args.run)
    if args.json:
        print(index.to_json().decode())
        return 0
    lease = _live_lease(run)
    print(f"run        {run.display()}")
    print(f"attempts   {index.attempts}  failures {index.failures}  "
          f"next report {index.next_report_index}")
    print(f"driver     {f'live: host {lease.host}, pid {lease.pid}' if lease else 'none'}")
    latest = index.latest
    print(f"resumed    {index.resumed_from or '-'}  latest {latest.dir_name if latest else '-'}")
    print(f"\n{'checkpoint':<24} {'report':>6} {'MiB':>9}  {'where':<8} metrics")
    for record in sorted(index.checkpoints, key=lambda r: r.report_index):
        where = "run" if record.target_uri is None else ("ref-run" if record.managed else "ref")
        print(f"{record.dir_name:<24} {record.report_index:>6} "
              f"{record.size_bytes / 2**20:>9.2f}  {where:<8} {_format_metrics(record.metrics)}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    run, index = _open(args.run)
    records = [r for r in index.checkpoints if not args.checkpoint or r.dir_name in args.checkpoint]
    unknown = set(args.checkpoint or ()) - {r.dir_name for r in records}
    if unknown:
        raise CairnError(f"--checkpoint {sorted(unknown)} not in the run; known: "
                         f"{sorted(r.dir_name for r in index.checkpoints)}")
    bad = 0
    for record in sorted(records, key=lambda r: r.report_index):
        view = checkpoint_view(run, record)
        try:
            manifest = read_manifest(view.manifest_at, RETRY)
            if manifest is None:
                raise CairnError("no manifest")
            verify_directory(view.data, manifest.files, retry=RETRY)
        except (CairnError, OSError) as exc:
            bad += 1
            print(f"FAILED  {record.dir_name}: {exc}")
            continue
        print(f"ok      {record.dir_name} ({len(manifest.files)} files, "
              f"{manifest.total_bytes / 2**20:.2f} MiB)")
    # Checkpoints a resume dropped as damaged: no longer in the index, still on storage.
    dropped = 0
    indexed = {r.dir_name for r in index.checkpoints}
    for event in read_log(run.join(EVENTS_DIR), RETRY):
        name = event.get("dir_name")
        if (event.get("type") != "checkpoint_dropped" or not isinstance(name, str)
                or name in indexed or not could_have_created(name)
                or (args.checkpoint and name not in args.checkpoint)
                or not is_dir(run.join(name), RETRY)):
            continue
        indexed.add(name)
        dropped += 1
        print(f"DROPPED {name}: damaged, dropped from the index at resume "
              f"({str(event.get('reason', ''))[:200]}); delete it by hand when inspected")
    print(f"{len(records) - bad} verified, {bad} failed"
          + (f", {dropped} dropped as damaged" if dropped else ""))
    return 1 if bad or dropped else 0


def cmd_prune(args: argparse.Namespace) -> int:
    run, index = _open(args.run)
    lease = _live_lease(run)
    if lease is not None:
        raise CairnError(f"A live driver (host {lease.host}, pid {lease.pid}) holds this run; "
                         "prune it when the run has stopped (`cairn lease break RUN` clears "
                         "the lease of a driver that is gone).")
    if args.keep < 1:
        raise CairnError(f"--keep={args.keep} must be an integer >= 1.")
    policy = make_policy(args.keep, args.score, args.order)
    records = list(index.checkpoints)
    keep = decide_retention(policy, records, protected=[index.resumed_from])
    dropped = [r for r, k in zip(records, keep, strict=True) if not k]
    for record in dropped:
        print(f"{'would drop' if args.dry_run else 'dropping'} {record.dir_name}")
    if args.dry_run or not dropped:
        print(f"{len(dropped)} to drop, {len(records) - len(dropped)} kept")
        return 0
    # Index first, deletion after: a crash in between leaves only unreferenced data.
    write_index(run, index.with_changes(
        checkpoints=tuple(r for r, k in zip(records, keep, strict=True) if k)), RETRY)
    # What the run recorded decides what may be deleted, never the index alone.
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, index,
                                SegmentLog(run.join(METRICS_DIR), RETRY))
    manager.registered = registered_references(read_log(run.join(EVENTS_DIR), RETRY))
    left = 0
    for record in dropped:
        if not manager.delete_owned(record, delete_references=args.delete_references):
            left += 1
            print(f"left in place: {record.dir_name} (not a checkpoint directory this run "
                  "owns; see the warning above)")
    print(f"{len(dropped)} dropped, {len(records) - len(dropped)} kept")
    return 0


def cmd_lease_break(args: argparse.Namespace) -> int:
    run = resolve(args.run)
    previous = break_lease(run, RETRY)
    if previous is None:
        print(f"cleared the lease of {run.display()} (there was no readable lease)")
    else:
        print(f"cleared the lease of {run.display()} (was host {previous.host}, pid "
              f"{previous.pid}, heartbeat {previous.heartbeat_at:.0f})")
    return 0


def cmd_goodput(args: argparse.Namespace) -> int:
    run, _ = _open(args.run)
    summary = summarize(read_log(run.join(EVENTS_DIR), RETRY))
    print(json.dumps(summary.as_dict(), indent=1) if args.json else summary.format())
    return 0


_BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 72) -> str:
    """A one-line chart of ``values`` (bucketed to ``width`` by averaging)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    if len(values) > width:
        size = len(values) / width
        values = [sum(values[int(i * size): int((i + 1) * size)])
                  / max(1, int((i + 1) * size) - int(i * size)) for i in range(width)]
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(_BLOCKS[round((v - low) / span * (len(_BLOCKS) - 1))]
                   if math.isfinite(v) else " " for v in values)


def cmd_plot(args: argparse.Namespace) -> int:
    run, _ = _open(args.run)
    records = read_log(run.join(METRICS_DIR), RETRY)
    series = [(r.get("report_index"), (r.get("metrics") or {}).get(args.metric))
              for r in records]
    points = [(i, float(v)) for i, v in series
              if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not points:
        names = sorted({k for r in records for k in (r.get("metrics") or {})})
        raise CairnError(f"--metric={args.metric!r} is not a numeric metric of this run; "
                         f"metrics: {names}")
    values = [v for _, v in points]
    if args.out:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise CairnError("--out needs matplotlib: pip install matplotlib") from exc
        figure, axes = plt.subplots(figsize=(8, 4))
        axes.plot([i for i, _ in points], values)
        axes.set_xlabel("report")
        axes.set_ylabel(args.metric)
        figure.savefig(args.out, dpi=100, bbox_inches="tight")
        print(f"wrote {args.out}")
        return 0
    print(f"{args.metric}: {len(values)} reports, first {values[0]:.4g}, last {values[-1]:.4g}, "
          f"min {min(values):.4g}, max {max(values):.4g}")
    print(sparkline(values))
    return 0


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    run = resolve(args.run)
    if _live_lease(run) is not None:
        raise CairnError("A live driver holds this run; rebuild the index when it has stopped.")
    index = rebuild_index(run, RETRY)
    write_index(run, index, RETRY)
    print(f"rebuilt the index of {run.display()}: {len(index.checkpoints)} checkpoints")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cairn", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log decisions")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("run", help="the run directory: a path or URI")
        return sub

    inspect = command("inspect", "Show a run's checkpoints, attempts and driver.")
    inspect.add_argument("--json", action="store_true", help="print the raw run index")
    inspect.set_defaults(func=cmd_inspect)
    verify = command("verify", "Check every file of committed checkpoints against manifests.")
    verify.add_argument("--checkpoint", action="append", help="only this checkpoint (repeat)")
    verify.set_defaults(func=cmd_verify)
    prune = command("prune", "Keep the best (or latest) N checkpoints, delete the rest.")
    prune.add_argument("--keep", type=int, required=True)
    prune.add_argument("--score", help="metric to rank by (default: the latest are kept)")
    prune.add_argument("--order", choices=("max", "min"), default="max")
    prune.add_argument("--delete-references", action="store_true",
                       help="also delete NO_UPLOAD data outside the run directory")
    prune.add_argument("--dry-run", action="store_true")
    prune.set_defaults(func=cmd_prune)
    plot = command("plot", "Chart a metric of the run's history.")
    plot.add_argument("--metric", required=True)
    plot.add_argument("--out", help="write a PNG (needs matplotlib) instead of a text chart")
    plot.set_defaults(func=cmd_plot)
    goodput = command("goodput", "Where the run's wall time went.")
    goodput.add_argument("--json", action="store_true")
    goodput.set_defaults(func=cmd_goodput)
    rebuild = command("rebuild-index", "Rebuild the run index from the checkpoint manifests.")
    rebuild.set_defaults(func=cmd_rebuild_index)
    lease = commands.add_parser("lease", help="Manage a run's lease.",
                                description="Manage a run's lease.")
    lease_commands = lease.add_subparsers(dest="lease_command", required=True)
    lease_break = lease_commands.add_parser(
        "break", help="Clear a run's lease by hand (only when no driver runs it).",
        description="Clear a run's lease by hand (only when no driver runs it).")
    lease_break.add_argument("run", help="the run directory: a path or URI")
    lease_break.set_defaults(func=cmd_lease_break)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except CairnError as exc:
        print(f"cairn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
        # The run's files are untrusted input: whatever they hold, one line, never a
        # traceback.
        print(f"cairn {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return code


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
