"""The subcommands that chart a run: ``plot`` (metrics' history) and ``goodput`` (where the
run's wall time went). The data comes from :mod:`cairn._src.plots.series` and
:mod:`cairn._src.goodput.timeline` (pure), the drawing from :mod:`cairn._src.plots.drawing`
(matplotlib, optional)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from cairn._src.cli.common import RETRY, open_run, print_json
from cairn._src.errors import ConfigError
from cairn._src.goodput.summary import summarize
from cairn._src.goodput.timeline import build_timeline
from cairn._src.plots import drawing
from cairn._src.plots.series import X_AXES, build_plot
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import StorageLocation
from cairn._src.text import printable, printable_lines


def _run_name(run: StorageLocation) -> str:
    return run.path.rstrip("/").rpartition("/")[2] or run.display()


def _check_out(path: str | None) -> None:
    if path is not None and path.rpartition(".")[2].lower() not in drawing.FORMATS:
        raise ConfigError(f"-o={path!r} must end in one of "
                          f"{', '.join('.' + f for f in drawing.FORMATS)}")


def cmd_goodput(args: argparse.Namespace) -> int:
    _check_out(args.out)
    run, _ = open_run(args.run)
    events = read_events(run.join(EVENTS_DIR), RETRY)
    summary = summarize(events)
    if args.out:
        drawing.draw_timeline(build_timeline(events), summary, _run_name(run), args.out)
    if args.json:
        print_json(summary.as_dict())
    else:
        print(printable_lines(summary.format()))
    if args.out and not args.json:
        print(f"wrote {printable(args.out)}")
    return 0


# The levels a finite value is drawn with, lowest first; a gap (NaN, inf) is a blank, so
# the lowest value (all of a constant metric) is never drawn as one.
_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 72) -> str:
    """A one-line chart of ``values`` (bucketed to ``width`` by averaging). Any finite
    values are drawn, ±1.7e308 included; a bucket holding a NaN or an infinity is a gap."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    if len(values) > width:
        size = len(values) / width
        buckets = [values[int(i * size): int((i + 1) * size)] for i in range(width)]
        # Each value divided first: a sum of huge values would overflow to inf.
        values = [sum(v / len(bucket) for v in bucket) for bucket in buckets]
    low, high = min(finite), max(finite)
    return "".join(_BLOCKS[round(_position(v, low, high) * (len(_BLOCKS) - 1))]
                   if math.isfinite(v) else " " for v in values)


def _position(value: float, low: float, high: float) -> float:
    """Where ``value`` lies from ``low`` (0) to ``high`` (1), all finite; 0 when they are
    equal. Halved first when ``high - low`` overflows (``-1e308`` to ``1e308``)."""
    span = high - low
    if math.isinf(span):
        value, low, span = value / 2, low / 2, high / 2 - low / 2
    return min(1.0, max(0.0, (value - low) / span)) if span else 0.0


def cmd_plot(args: argparse.Namespace) -> int:
    _check_out(args.out)
    run, index = open_run(args.run)
    records = read_log(run.join(METRICS_DIR), RETRY)
    metrics = list(dict.fromkeys(args.metric))
    events = read_events(run.join(EVENTS_DIR), RETRY)
    kept = {r.dir_name: r.report_index for r in index.checkpoints}
    plot = build_plot(_run_name(run), records, events, kept, metrics, args.x, log=args.log,
                      resumed_from=index.resumed_from)
    if args.out:
        drawing.draw_metric_plot(plot, args.out)
    if args.json:
        print_json(plot.as_dict())
        return 0
    if args.out:
        print(f"wrote {printable(args.out)}")
        return 0
    for metric in metrics:
        values = [y for series in plot.series_of(metric) for y in series.y]
        if not values:
            print(f"{printable(metric)}: no report has a value for --x {args.x}")
            continue
        print(f"{printable(metric)}: {len(values)} reports, first {values[0]:.4g}, "
              f"last {values[-1]:.4g}, min {min(values):.4g}, max {max(values):.4g}")
        print(sparkline(values))
    return 0


def register(commands: Any) -> None:
    """Add this module's subcommands to the ``cairn`` parser's subparsers."""
    plot: argparse.ArgumentParser = commands.add_parser(
        "plot", help="Chart metrics of the run's history.",
        description="Chart metrics of the run's history: one axis per metric, one line per "
        "attempt, restarts and checkpoints marked. Without -o or --json, a text chart.")
    plot.add_argument("run", help="the run directory: a path or URI")
    plot.add_argument("--metric", required=True, action="append",
                      help="a metric the run reports (repeat for more)")
    plot.add_argument("--x", choices=X_AXES, default="report",
                      help="the x axis: report index, the 'step' metric, or wall time in "
                      "seconds since the run started (default: report)")
    plot.add_argument("--log", action="store_true", help="a logarithmic y scale")
    plot.add_argument("-o", "--out", metavar="FILE",
                      help="write a chart (.png, .svg or .pdf; needs matplotlib)")
    plot.add_argument("--json", action="store_true",
                      help="print the plotted series as JSON (docs/plots.md)")
    plot.set_defaults(func=cmd_plot)
    goodput: argparse.ArgumentParser = commands.add_parser(
        "goodput", help="Where the run's wall time went.",
        description="Where the run's wall time went: a summary, and with -o a timeline "
        "with one lane per attempt and rank.")
    goodput.add_argument("run", help="the run directory: a path or URI")
    goodput.add_argument("-o", "--out", metavar="FILE",
                         help="also write a timeline (.png, .svg or .pdf; needs matplotlib)")
    goodput.add_argument("--json", action="store_true")
    goodput.set_defaults(func=cmd_goodput)
