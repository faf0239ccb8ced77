"""The subcommands that chart a run: ``plot`` (a metric's history) and ``goodput`` (where
the run's wall time went)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

from cairn._src.cli.common import RETRY, open_run
from cairn._src.errors import CairnError
from cairn._src.goodput.summary import summarize
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import read_log


def cmd_goodput(args: argparse.Namespace) -> int:
    run, _ = open_run(args.run)
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
    run, _ = open_run(args.run)
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
        axes.plot([i for i, _ in points], values)  # type: ignore[arg-type]
        axes.set_xlabel("report")
        axes.set_ylabel(args.metric)
        figure.savefig(args.out, dpi=100, bbox_inches="tight")
        print(f"wrote {args.out}")
        return 0
    print(f"{args.metric}: {len(values)} reports, first {values[0]:.4g}, last {values[-1]:.4g}, "
          f"min {min(values):.4g}, max {max(values):.4g}")
    print(sparkline(values))
    return 0


def register(commands: Any) -> None:
    """Add this module's subcommands to the ``cairn`` parser's subparsers."""
    plot: argparse.ArgumentParser = commands.add_parser(
        "plot", help="Chart a metric of the run's history.",
        description="Chart a metric of the run's history.")
    plot.add_argument("run", help="the run directory: a path or URI")
    plot.add_argument("--metric", required=True)
    plot.add_argument("--out", help="write a PNG (needs matplotlib) instead of a text chart")
    plot.set_defaults(func=cmd_plot)
    goodput: argparse.ArgumentParser = commands.add_parser(
        "goodput", help="Where the run's wall time went.",
        description="Where the run's wall time went.")
    goodput.add_argument("run", help="the run directory: a path or URI")
    goodput.add_argument("--json", action="store_true")
    goodput.set_defaults(func=cmd_goodput)
