"""The Ray reference's quick session, with a fake child: no Ray, no processes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import _ray_reference  # noqa: E402

FAKE_PARTS: dict[str, dict[str, Any]] = {
    "startup": {"fit_to_first_line_s": 10.0, "fit_to_first_line_min_s": 9.0,
                "fit_total_s": 11.0, "ray_init_s": 3.0},
    "metric": {"median_s": 2.0, "p99_s": 2.1, "num_samples": 12, "fast_poll_median_s": 0.02,
               "fast_poll_p99_s": 0.03, "fast_poll_num_samples": 200,
               "fast_poll_interval_s": 0.01},
    "checkpoint": {"sync": 0.4, "sync_samples": [0.4], "async": 0.01, "async_samples": [0.01]},
    "snapshot": {"blocking_s": 1.2, "save_s": 1.1, "report_s": 0.1, "repeats": 1},
    "recovery": {"crash_to_first_step_s": 7.0, "last_reported_step": 3,
                 "resumed_from_step": 2, "checkpoints_behind": 1, "fit_total_s": 40.0},
}


@pytest.fixture(autouse=True)
def empty_cache() -> Iterator[None]:
    _ray_reference._CACHE.clear()
    _ray_reference._FAILED.clear()
    yield
    _ray_reference._CACHE.clear()
    _ray_reference._FAILED.clear()


def test_quick_rows_come_from_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_child(kind: str, kwargs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        calls.append((kind, kwargs))
        assert kind == "quick_session", f"a separate child for {kind} in quick mode"
        return {part: dict(FAKE_PARTS[part]) for part in kwargs if part in FAKE_PARTS}

    monkeypatch.setattr(_ray_reference, "_run_child", fake_child)
    groups = _ray_reference.QUICK_SESSION_GROUPS
    rows = _ray_reference.reference_rows(quick=True, groups=groups)
    assert [kind for kind, _ in calls] == ["quick_session"]
    assert sorted(k for k in calls[0][1] if k != "num_workers") == sorted(FAKE_PARTS)
    assert not [row for row in rows if row.metric.endswith("error")]
    by_metric = {row.metric: row.reference for row in rows}
    assert by_metric[_ray_reference.METRIC_RECOVERY] == 7.0
    assert by_metric[_ray_reference.METRIC_SYNC_REPORT] == 0.4
    assert by_metric[_ray_reference.METRIC_FIT_TO_FIRST_LINE] == 10.0
    # Asking again (as run_all does after the modules) starts nothing.
    _ray_reference.reference_rows(quick=True, groups=groups)
    assert len(calls) == 1


def test_a_failed_part_is_an_error_row_and_the_rest_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake_child(kind: str, kwargs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        partial = {"startup": dict(FAKE_PARTS["startup"]), "errors": {}}
        raise _ray_reference.RayReferenceError("Ray died", partial)

    monkeypatch.setattr(_ray_reference, "_run_child", fake_child)
    rows = _ray_reference.reference_rows(quick=True, groups=("startup", "recovery"))
    errors = [row for row in rows if row.metric.endswith("error")]
    assert [row.benchmark for row in errors] == ["recovery"]
    assert "failed in the quick session: Ray died" in errors[0].note
    assert any(row.metric == _ray_reference.METRIC_FIT_TO_FIRST_LINE for row in rows)


def test_full_mode_runs_no_session(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds: list[str] = []

    def fake_child(kind: str, kwargs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        kinds.append(kind)
        return dict(FAKE_PARTS["recovery"])

    monkeypatch.setattr(_ray_reference, "_run_child", fake_child)
    _ray_reference.reference_rows(quick=False, groups=("recovery",))
    assert kinds == ["recovery"]
