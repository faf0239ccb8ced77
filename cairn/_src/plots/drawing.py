"""Drawing :class:`MetricPlot` and :class:`Timeline` with matplotlib (an optional
dependency: ``pip install 'cairn-train[plot]'``).

Figures are made with the object API on the Agg canvas, never through ``pyplot``: nothing
global (the user's backend, open figures) is touched, and drawing is safe off the main
thread.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cairn._src.errors import CairnError
from cairn._src.goodput.summary import GoodputSummary
from cairn._src.goodput.timeline import CATEGORIES, Timeline, describe_failure
from cairn._src.plots.series import MetricPlot, Series, masked_failure
from cairn._src.text import plural

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'cairn-train[plot]'"
FORMATS = ("png", "svg", "pdf")
_DPI = 110
_MAX_NOTES = 6
_MAX_LANES = 64
# The least distance between two labels above a chart, as a fraction of its width.
_LABEL_GAP = 0.035
_NOTE_WIDTH = 110
_MAX_LEGEND_ATTEMPTS = 8
_RESTART_COLOR = "#c62828"
_CATEGORY_STYLE = {
    "training": ("#66bb6a", "training"),
    "checkpoint_stall": ("#ffa726", "checkpoint stall (blocked in report())"),
    "validation_wait": ("#4fc3f7", "validation wait (training done, validations running)"),
    "lost_work": ("#e53935", "lost work (redone after the restart)"),
    "startup": ("#90a4ae", "start-up"),
    "recovery": ("#7e57c2", "recovery (failure to training again)"),
}
_X_LABELS = {"report": "report", "step": "step",
             "time": "wall time since the run started (s)"}
# Past about 1e306, matplotlib's margins, spans and ticks overflow ("arange: cannot compute
# length"): values beyond this are drawn divided by a power of ten, which the label names.
_DRAWABLE_MAGNITUDE = 1e300


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise CairnError(f"Drawing a chart needs matplotlib, which is not installed: "
                         f"{INSTALL_HINT}") from exc
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _attempt_color(attempt: int) -> Any:
    from matplotlib import colormaps

    return colormaps["tab10"](attempt % 10)


def _save(figure: Figure, path: str) -> None:
    extension = path.rpartition(".")[2].lower()
    figure.savefig(path, dpi=_DPI, format=extension, bbox_inches="tight", pad_inches=0.15)


def _notes(figure: Figure, lines: list[str]) -> None:
    """The failures' details under the figure, wrapped, at most ``_MAX_NOTES`` of them."""
    if len(lines) > _MAX_NOTES:
        lines = [*lines[: _MAX_NOTES - 1], f"... and {len(lines) - _MAX_NOTES + 1} more"]
    wrapped = [part for line in lines
               for part in textwrap.wrap(line, _NOTE_WIDTH, subsequent_indent="    ")]
    if wrapped:
        figure.supxlabel("\n".join(wrapped), x=0.0, ha="left", fontsize=8.5,
                         fontfamily="monospace", color="#333333")


def _mark_labels(axes: Axes, labels: list[tuple[str, float]]) -> None:
    """``R1``, ``F1``, ... above the axes at their x; a label too close to the previous one
    drawn is left out (the note under the chart still lists it), so none overlap."""
    if not labels:
        return
    low, high = axes.get_xlim()
    gap = abs(high - low) * _LABEL_GAP
    last: float | None = None
    for text, x in sorted(labels, key=lambda item: item[1]):
        if last is not None and abs(x - last) < gap:
            continue
        axes.annotate(text, xy=(x, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 2),
                      textcoords="offset points", ha="center", va="bottom", fontsize=8,
                      color=_RESTART_COLOR, fontweight="bold")
        last = x


def metric_notes(plot: MetricPlot) -> list[str]:
    """The lines under a metric chart: one per restart, with its failure's detail (whose
    URI credentials :func:`~cairn._src.plots.series.build_plot` masked)."""
    return [f"R{r.number}  attempt {r.attempt} failed: {r.detail}"
            + ("" if r.counted else " (not counted against max_failures)")
            + (f"; resumed from {r.resumed_from}" if r.resumed_from else
               "; restarted from scratch" if r.restarted else "")
            for r in plot.restarts]


def timeline_notes(timeline: Timeline) -> list[str]:
    """The lines under a goodput timeline: one per failure, its detail made again from
    its errors and reason with their URI credentials masked (the event log is untrusted:
    written before the driver masked them, or forged)."""
    return [f"F{number}  attempt {f.attempt} failed: "
            f"{describe_failure(*masked_failure(f.errors, f.reason))[1]}"
            for number, f in enumerate(timeline.failures, start=1)]


def _divisor(values: Iterable[float]) -> float:
    """1, or the power of ten that brings the largest of ``values`` (finite) to 1-10 when
    it passes what matplotlib draws."""
    largest = max((abs(v) for v in values), default=0.0)
    return 1.0 if largest < _DRAWABLE_MAGNITUDE else 10.0 ** math.floor(math.log10(largest))


def _scaled(label: str, divisor: float) -> str:
    return label if divisor == 1.0 else f"{label} / {divisor:.0e}"


def drawable(plot: MetricPlot) -> tuple[MetricPlot, float, dict[str, float]]:
    """``plot`` with its x values and, per metric, its y values divided by
    :func:`_divisor`, and those divisors (all 1 for a plot matplotlib draws as it is). On a
    log scale a value over 1e323 times smaller than the largest becomes 0 and is not
    drawn (matplotlib masks it), as it is not drawn on 600 decades anyway."""
    x_divisor = _divisor([*(x for s in plot.series for x in s.x),
                          *(c.x for c in plot.checkpoints if c.x is not None),
                          *(r.x for r in plot.restarts if r.x is not None)])
    y_divisors = {m: _divisor(y for s in plot.series_of(m) for y in s.y) for m in plot.metrics}
    if x_divisor == 1.0 and set(y_divisors.values()) <= {1.0}:
        return plot, x_divisor, y_divisors

    def x_of(x: float | None) -> float | None:
        return None if x is None else x / x_divisor

    series = tuple(replace(s, x=tuple(x / x_divisor for x in s.x),
                           y=tuple(y / y_divisors.get(s.metric, 1.0) for y in s.y))
                   for s in plot.series)
    return (replace(plot, series=series,
                    checkpoints=tuple(replace(c, x=x_of(c.x)) for c in plot.checkpoints),
                    restarts=tuple(replace(r, x=x_of(r.x)) for r in plot.restarts)),
            x_divisor, y_divisors)


def draw_metric_plot(plot: MetricPlot, path: str) -> None:
    """Write ``plot`` to ``path`` (PNG, SVG or PDF by its extension): one axis per metric,
    one line per attempt, restarts as vertical lines, checkpoints as markers."""
    plot, x_divisor, y_divisors = drawable(plot)
    count = len(plot.metrics)
    notes = metric_notes(plot)
    figure = _figure(10.0, 1.3 + 2.6 * count + 0.3 * min(len(notes), _MAX_NOTES))
    axes_grid = figure.subplots(count, 1, sharex=True, squeeze=False)
    attempts = sorted({s.attempt for s in plot.series})
    for axes, metric in zip((row[0] for row in axes_grid), plot.metrics, strict=True):
        _draw_metric(axes, plot, metric)
        axes.set_ylabel(_scaled(metric, y_divisors[metric]))
    top, bottom = axes_grid[0][0], axes_grid[-1][0]
    _mark_labels(top, [(f"R{r.number}", r.x) for r in plot.restarts if r.x is not None])
    bottom.set_xlabel(_scaled(_X_LABELS[plot.x_axis], x_divisor))
    if plot.x_axis != "time":
        from matplotlib.ticker import MaxNLocator

        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    _metric_legend(top, plot, attempts)
    kept = sum(c.status == "kept" for c in plot.checkpoints)
    deleted = sum(c.status == "deleted" for c in plot.checkpoints)
    figure.suptitle(f"{plot.run}: {', '.join(plot.metrics)} by {plot.x_axis}\n"
                    f"{plural(len(attempts), 'attempt')}, "
                    f"{plural(sum(r.restarted for r in plot.restarts), 'restart')}, "
                    f"checkpoints: {kept} kept, {deleted} deleted",
                    fontsize=11)
    _notes(figure, notes)
    _save(figure, path)


def _split_lost(series: Series, lost_from: int | None) -> tuple[Series, Series | None]:
    """The part of ``series`` the run kept and, joined to it at the resume point, the part
    a later attempt redid."""
    if lost_from is None or not series.report or series.report[-1] <= lost_from:
        return series, None
    cut = next(i for i, r in enumerate(series.report) if r > lost_from)
    start = max(0, cut - 1)
    kept = Series(series.metric, series.attempt, series.report[:cut], series.x[:cut],
                  series.y[:cut])
    lost = Series(series.metric, series.attempt, series.report[start:], series.x[start:],
                  series.y[start:])
    return kept, lost


def _draw_metric(axes: Axes, plot: MetricPlot, metric: str) -> None:
    values: dict[tuple[int, int], float] = {}
    for series in plot.series_of(metric):
        color = _attempt_color(series.attempt)
        kept, lost = _split_lost(series, plot.lost_from(series.attempt))
        if kept.x:
            axes.plot(kept.x, kept.y, color=color, linewidth=1.6,
                      marker="." if len(kept.x) == 1 else None)
        if lost is not None:
            axes.plot(lost.x, lost.y, color=color, linewidth=1.4, linestyle=(0, (3, 2)),
                      alpha=0.7)
        values.update(((series.attempt, r), y)
                      for r, y in zip(series.report, series.y, strict=True))
    for status in ("deleted", "uncommitted", "kept"):
        marks = [(c.x, values[(c.attempt, c.report)], _attempt_color(c.attempt))
                 for c in plot.checkpoints if c.status == status and c.x is not None
                 and (c.attempt, c.report) in values]
        if not marks:
            continue
        xs, ys, colors = [m[0] for m in marks], [m[1] for m in marks], [m[2] for m in marks]
        if status == "kept":
            axes.scatter(xs, ys, marker="o", s=42, c=colors, edgecolors="black",
                         linewidths=0.9, zorder=3)
        elif status == "deleted":
            axes.scatter(xs, ys, marker="o", s=30, facecolors="white", edgecolors=colors,
                         linewidths=1.3, zorder=3)
        else:
            axes.scatter(xs, ys, marker="x", s=30, c="#555555", linewidths=1.3, zorder=3)
    for restart in plot.restarts:
        if restart.x is not None:
            axes.axvline(restart.x, color=_RESTART_COLOR, linewidth=1.1, linestyle="--",
                         alpha=0.8, zorder=1)
    if plot.log:
        axes.set_yscale("log")
    axes.grid(True, color="#e0e0e0", linewidth=0.7)
    axes.set_axisbelow(True)


def _metric_legend(axes: Axes, plot: MetricPlot, attempts: list[int]) -> None:
    from matplotlib.lines import Line2D

    handles: list[Any] = [Line2D([], [], color=_attempt_color(a), linewidth=1.6,
                                 label=f"attempt {a}")
                          for a in attempts[:_MAX_LEGEND_ATTEMPTS]]
    if len(attempts) > _MAX_LEGEND_ATTEMPTS:
        handles.append(Line2D([], [], color="none",
                              label=f"... {len(attempts) - _MAX_LEGEND_ATTEMPTS} more"))
    if any(plot.lost_from(a) is not None for a in attempts):
        handles.append(Line2D([], [], color="#555555", linestyle=(0, (3, 2)),
                              label="redone after a restart"))
    statuses = {c.status for c in plot.checkpoints}
    if "kept" in statuses:
        handles.append(Line2D([], [], color="none", marker="o", markerfacecolor="#555555",
                              markeredgecolor="black", label="checkpoint (kept)"))
    if "deleted" in statuses:
        handles.append(Line2D([], [], color="none", marker="o", markerfacecolor="white",
                              markeredgecolor="#555555", label="checkpoint (deleted)"))
    if "uncommitted" in statuses:
        handles.append(Line2D([], [], color="none", marker="x", markeredgecolor="#555555",
                              label="checkpoint (never committed)"))
    if plot.restarts:
        handles.append(Line2D([], [], color=_RESTART_COLOR, linestyle="--",
                              label="restart (R1, ...: see below)"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5,
                frameon=False)


def draw_timeline(timeline: Timeline, summary: GoodputSummary, run: str, path: str) -> None:
    """Write the goodput timeline of a run to ``path``: one lane per attempt and rank,
    coloured by what the time went to, failures as vertical lines, commits as ticks."""
    lanes = timeline.lanes[:_MAX_LANES]
    notes = timeline_notes(timeline)
    if timeline.lane_count > len(lanes):
        notes.insert(0, f"(the first {len(lanes)} of {timeline.lane_count} lanes are drawn)")
    figure = _figure(11.0, 2.3 + 0.32 * max(1, len(lanes))
                     + 0.3 * min(len(notes), _MAX_NOTES))
    axes = figure.subplots()
    for position, lane in enumerate(lanes):
        for category in CATEGORIES:
            bars = [(i.start, i.end - i.start) for i in lane.intervals if i.category == category]
            if bars:
                color = _CATEGORY_STYLE[category][0]
                axes.broken_barh(bars, (position - 0.38, 0.76), facecolors=color,
                                 edgecolors=color, linewidth=0.5)
    for position in range(1, len(lanes)):
        if lanes[position].attempt != lanes[position - 1].attempt:
            axes.axhline(position - 0.5, color="#9e9e9e", linewidth=0.8)
    for failure in timeline.failures:
        axes.axvline(failure.t, color=_RESTART_COLOR, linewidth=1.1, linestyle="--")
    if timeline.commits:
        axes.scatter(timeline.commits, [-0.62] * len(timeline.commits), marker="v", s=22,
                     color="#37474f", zorder=3, clip_on=False)
    axes.set_yticks(range(len(lanes)), [lane.label for lane in lanes], fontsize=9)
    axes.set_ylim(len(lanes) - 0.5, -0.8)
    axes.set_xlim(0.0, max(timeline.end, 1e-3) * 1.01)
    axes.set_xlabel("wall time since the run started (s)")
    axes.grid(True, axis="x", color="#e0e0e0", linewidth=0.7)
    axes.set_axisbelow(True)
    for side in ("top", "right", "left"):
        axes.spines[side].set_visible(False)
    _timeline_legend(axes, timeline)
    _mark_labels(axes, [(f"F{number}", f.t) for number, f in
                        enumerate(timeline.failures, start=1)])
    wall = summary.wall_s or 1.0
    shares = ", ".join(f"{name} {seconds:.1f}s ({100 * seconds / wall:.0f}%)" for name, seconds in (
        ("productive", summary.productive_s), ("start-up", summary.startup_s),
        ("checkpoint stall", summary.checkpoint_blocked_s),
        ("recovery", summary.recovery_s), ("lost work", summary.lost_work_s),
        ("validation wait", summary.validation_wait_s)))
    figure.suptitle(f"{run}: goodput {100 * summary.goodput:.1f}% "
                    f"({plural(summary.attempts, 'attempt')}, "
                    f"{plural(summary.failures, 'failure')}, wall {summary.wall_s:.1f}s)\n"
                    f"{shares}", fontsize=11)
    _notes(figure, notes)
    _save(figure, path)


def _timeline_legend(axes: Axes, timeline: Timeline) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    present = {i.category for lane in timeline.lanes for i in lane.intervals}
    handles: list[Any] = [Patch(color=_CATEGORY_STYLE[c][0], label=_CATEGORY_STYLE[c][1])
                          for c in CATEGORIES if c in present]
    if timeline.commits:
        handles.append(Line2D([], [], color="none", marker="v", markerfacecolor="#37474f",
                              markeredgecolor="#37474f", label="checkpoint commit"))
    if timeline.failures:
        handles.append(Line2D([], [], color=_RESTART_COLOR, linestyle="--",
                              label="failure (F1, ...: see below)"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5,
                frameon=False)
