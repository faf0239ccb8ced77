"""``cairn plot -o`` draws values matplotlib cannot lay out as they are (past about
±1e306 its spans, margins and ticks overflow): divided by a power of ten the label names."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from cairn._src.plots import drawing
from cairn._src.plots.series import build_plot

BIGGEST = 1.7976931348623157e308


def record(report: int, step: float, g: float) -> dict[str, Any]:
    return {"report_index": report, "attempt": 0, "time": 100.0 + report,
            "metrics": {"step": step, "g": g, "small": 0.5, "flat": BIGGEST},
            **({"checkpoint_dir_name": f"checkpoint_{report:06d}"} if report == 2 else {})}


RECORDS = [record(1, -BIGGEST, 1.0), record(2, BIGGEST, BIGGEST), record(3, 1.0, 1e-200)]
EVENTS = [{"type": "session_start", "t": 100.0},
          {"type": "attempt_start", "attempt": 0, "t": 100.0, "resume": None},
          {"type": "commit", "index": 2, "t": 102.5},
          {"type": "failure", "attempt": 0, "t": 1e308, "ranks": [0], "reason": "boom",
           "errors": []}]


@pytest.mark.parametrize("x_axis", ["report", "step", "time"])
@pytest.mark.parametrize("log", [False, True])
def test_values_near_the_largest_double_are_drawn(x_axis: str, log: bool,
                                                  tmp_path: Path) -> None:
    plot = build_plot("huge", RECORDS, EVENTS, {}, ["g", "small", "flat"], x_axis, log=log)
    path = tmp_path / "huge.png"
    drawing.draw_metric_plot(plot, str(path))
    assert imread(str(path)).shape[0] > 100
    scaled, x_divisor, y_divisors = drawing.drawable(plot)
    assert y_divisors == {"g": 1e308, "small": 1.0, "flat": 1e308}
    assert x_divisor == {"report": 1.0, "step": 1e308, "time": 1e308}[x_axis]
    assert all(abs(v) < 10 for s in scaled.series for v in (*s.x, *s.y))
    assert all(math.isfinite(r.x) and abs(r.x) < 10 for r in scaled.restarts
               if r.x is not None)


def test_a_plot_matplotlib_draws_as_it_is_is_left_alone() -> None:
    records = [{**r, "metrics": {"step": i, "g": 1e299 * i}} for i, r in enumerate(RECORDS)]
    plot = build_plot("big", records, EVENTS[:3], {}, ["g"], "step")
    assert drawing.drawable(plot) == (plot, 1.0, {"g": 1.0})
