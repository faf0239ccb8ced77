"""The benchmark harness's table, ratio, timing and goodput logic; no Ray, no workers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import _harness  # noqa: E402
import run_all  # noqa: E402
from _harness import GoodputJob, Row  # noqa: E402


def test_ratio_is_cairn_over_reference() -> None:
    row = Row(benchmark="report", metric="median", cairn=0.001, reference=2.0)
    assert row.ratio == pytest.approx(0.0005)


@pytest.mark.parametrize(
    ("cairn", "reference"), [(None, 2.0), (1.0, None), (None, None), (1.0, 0.0)]
)
def test_ratio_is_none_when_a_side_is_missing_or_zero(
    cairn: float | None, reference: float | None
) -> None:
    assert Row(benchmark="b", metric="m", cairn=cairn, reference=reference).ratio is None


def test_row_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match=r"Row\.cairn must be a number or None, got '1.0'"):
        Row(benchmark="b", metric="m", cairn="1.0")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Row\.reference must be a number"):
        Row(benchmark="b", metric="m", reference=True)


def test_coerce_accepts_dicts_and_ignores_ratio() -> None:
    row = Row.coerce({"benchmark": "b", "metric": "m", "cairn": 1, "reference": 4, "ratio": 9})
    assert row.cairn == 1.0
    assert row.ratio == 0.25


def test_coerce_names_unknown_keys() -> None:
    with pytest.raises(TypeError, match=r"unknown row key\(s\) \['speed'\]"):
        Row.coerce({"benchmark": "b", "metric": "m", "speed": 1})


def test_table_has_header_values_and_ratio() -> None:
    table = _harness.format_table(
        [
            Row(
                benchmark="transfer", metric="SYNC 256 MiB", cairn=0.1, reference=0.5, note="a | b"
            ),
            {"benchmark": "report", "metric": "median", "cairn": 0.0008, "reference": None},
        ]
    )
    lines = table.splitlines()
    assert lines[0].split("|")[1].strip() == "Benchmark"
    assert len(lines) == 4
    assert all(len(line) == len(lines[0]) for line in lines)
    first = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert first == [
        "transfer",
        "SYNC 256 MiB",
        "0.1",
        "0.5",
        "Ray Train 2.60",
        "s",
        "0.2x",
        "a / b",
    ]
    second = [cell.strip() for cell in lines[3].split("|")[1:-1]]
    assert second[2:5] == ["0.0008", "-", "-"]
    assert second[6] == "-"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0"),
        (15.5, "15.5"),
        (0.0123456, "0.0123"),
        (1234.5, "1,234"),
        (0.00001234, "1.23e-05"),
    ],
)
def test_format_value(value: float | None, text: str) -> None:
    assert _harness.format_value(value) == text


def test_percentiles_interpolate() -> None:
    samples = [4.0, 1.0, 3.0, 2.0]
    assert _harness.median(samples) == 2.5
    assert _harness.percentile(samples, 0) == 1.0
    assert _harness.percentile(samples, 100) == 4.0
    assert _harness.p99(list(range(101))) == pytest.approx(99.0)
    summary = _harness.summarize(samples)
    assert summary["count"] == 4 and summary["mean"] == 2.5 and summary["max"] == 4.0


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="empty"):
        _harness.median([])
    with pytest.raises(ValueError, match="pct must be between 0 and 100, got 101"):
        _harness.percentile([1.0], 101)


def test_write_results_creates_page_then_appends(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "benchmarks.md"
    machine = {
        "date": "2026-12-02 10:00 UTC",
        "cores": 2,
        "memory_gib": 23.4,
        "cpu": "Xeon",
        "os": "Linux",
        "python": "3.11",
        "pyarrow": "26",
        "torch": "2.13",
        "ray": "2.60.0",
        "cairn": "0.1.0",
    }
    rows = [Row(benchmark="report", metric="median", cairn=0.001, reference=2.0)]
    _harness.write_results(rows, page, command="python bench/run_all.py", machine=machine)
    _harness.write_results(
        rows,
        page,
        command="python bench/run_all.py --quick",
        machine={**machine, "date": "2026-12-03 10:00 UTC"},
    )
    text = page.read_text()
    assert text.startswith("# Benchmark results")
    assert text.count("## 2026-12-0") == 2
    assert text.index("## 2026-12-02") < text.index("## 2026-12-03")
    assert "Command: `python bench/run_all.py --quick`" in text
    assert "2 cores (Xeon), 23.4 GiB" in text
    assert "0.0005x" in text


def test_goodput_job_derives_steps() -> None:
    job = GoodputJob(duration_s=20.0, step_s=0.25, checkpoint_every_s=2.5, crash_at=[7.0, 14.5])
    assert job.num_steps == 80
    assert job.checkpoint_every_steps == 10
    assert job.crash_steps == (28, 58)
    assert job.crash_at == (7.0, 14.5)
    assert job.is_checkpoint_step(9) and job.is_checkpoint_step(79)
    assert not job.is_checkpoint_step(10)
    assert GoodputJob.from_config(job.to_config()) == job


def test_goodput_counts_each_step_once() -> None:
    job = GoodputJob(duration_s=2.0, step_s=0.5, checkpoint_every_s=1.0, crash_at=[1.0])
    # Steps 0-2 ran, a crash rolled back to after step 1, steps 2-3 ran again.
    summary = job.summarize(wall_s=4.0, executed_steps=[0, 1, 2, 2, 3])
    assert summary["useful_s"] == 2.0
    assert summary["goodput"] == 0.5
    assert summary["steps_redone"] == 1
    assert summary["redone_s"] == 0.5
    assert summary["completed"] is True
    assert job.summarize(wall_s=4.0, executed_steps=[0, 1])["completed"] is False


def test_goodput_job_validates() -> None:
    with pytest.raises(ValueError, match=r"crash_at values must lie in \(0, duration_s=10.0\)"):
        GoodputJob(duration_s=10.0, crash_at=(12.0,))
    with pytest.raises(ValueError, match=r"GoodputJob\.step_s must be > 0, got 0"):
        GoodputJob(step_s=0)


def _args(**overrides: object) -> argparse.Namespace:
    args = run_all.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_run_all_skips_missing_module_and_reports_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "bench_fake_ok.py").write_text(
        "def run(args):\n"
        "    return [{'benchmark': 'fake', 'metric': 'm', 'cairn': 1.0, 'reference': 2.0}]\n"
    )
    (tmp_path / "bench_fake_raises.py").write_text(
        "def run(args):\n    raise RuntimeError('boom')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = _args()
    assert run_all.run_module("bench_fake_ok", args)[0].ratio == 0.5
    missing = run_all.run_module("bench_fake_missing", args)
    assert missing[0].metric == "skipped"
    assert "does not exist yet" in missing[0].note
    failed = run_all.run_module("bench_fake_raises", args)
    assert failed[0].metric == "error"
    assert failed[0].note == "RuntimeError: boom"
    assert _harness.is_error_row(failed[0])


def test_merge_fills_reference_and_keeps_the_rest() -> None:
    rows = [
        Row(benchmark="transfer", metric="SYNC", cairn=0.1),
        Row(benchmark="report", metric="median", cairn=0.001, reference=1.9),
    ]
    reference = [
        Row(benchmark="report", metric="median", reference=2.0),
        Row(benchmark="startup", metric="fit", reference=10.0),
        Row(benchmark="transfer", metric="SYNC", reference=0.5, note="8 files"),
    ]
    merged = run_all.merge_reference(rows, reference)
    assert [(r.benchmark, r.metric) for r in merged] == [
        ("transfer", "SYNC"),
        ("report", "median"),
        ("startup", "fit"),
    ]
    assert merged[0].ratio == pytest.approx(0.2)
    assert merged[0].note == "ref: 8 files"
    assert merged[1].reference == 1.9


def test_only_selects_modules_and_reference_groups() -> None:
    args = run_all.parse_args(["--only", "report,startup"])
    assert run_all.selected_modules(args) == ["report"]
    assert run_all.selected_reference_groups(args) == ["report", "startup"]
    args = run_all.parse_args(["--only", "ray-reference"])
    assert run_all.selected_modules(args) == []
    assert len(run_all.selected_reference_groups(args)) == 6
    assert run_all.selected_reference_groups(run_all.parse_args(["--no-ray"])) == []
    scale = run_all.parse_args(["--only", "scale,report"])
    assert run_all.selected_modules(scale) == [
        name for name in run_all.MODULES if name in {*run_all.SELECTIONS["scale"], "report"}]
    assert "ray_cluster" not in run_all.selected_modules(scale)
    assert run_all.selected_reference_groups(run_all.parse_args(["--only", "scale"])) == []
    with pytest.raises(SystemExit):
        run_all.parse_args(["--only", "nope"])
