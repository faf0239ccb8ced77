"""bench/ray_cluster.py's own options, Cairn's restart phases and the node-loss note;
pure logic on recorded times, no cluster."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

pytest.importorskip("ray")

import ray_cluster  # noqa: E402


def test_own_options_are_taken_out_of_the_command_line() -> None:
    rest, own = ray_cluster._own_options(["--quick", "--repeats", "5", "--warm-standby",
                                          "--keep-survivors"])
    assert rest == ["--quick"]
    assert (own.repeats, own.warm_standby, own.keep_survivors) == (5, True, True)
    rest, own = ray_cluster._own_options(["--no-ray"])
    assert rest == ["--no-ray"]
    assert (own.repeats, own.warm_standby, own.keep_survivors) == (None, False, False)
    with pytest.raises(SystemExit, match=r"--repeats 0: give at least 1 run a side"):
        ray_cluster._own_options(["--repeats", "0"])


def _run(tmp_path: Path) -> tuple[dict[str, Any], float]:
    events = tmp_path / "events"
    events.mkdir()
    records = [{"type": "failure", "attempt": 1, "t": 100.3},
               {"type": "attempt_start", "attempt": 2, "t": 100.4},
               {"type": "workers_ready", "attempt": 2, "t": 103.0}]
    (events / "segment_0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    ranks = [{"first_line_t": 103.2, "process_start_t": 101.0},
             {"first_line_t": 103.1, "process_start_t": 100.9}]
    run = {"run_path": str(tmp_path),
           "backend_times": {"placed": [50.0, 100.9], "actors": [51.0, 102.5]},
           "node_loss": {"attempt": 2, "restore_t": 103.5, "ranks": ranks}}
    return run, 100.0


def test_cairn_phases_split_the_fault_to_restored(tmp_path: Path) -> None:
    run, fault_t = _run(tmp_path)
    phases = ray_cluster._cairn_run_phases(run, run["node_loss"], fault_t)
    assert phases is not None
    assert list(phases) == [key for key, _ in ray_cluster.PHASES]
    expected = {"detect": 0.3, "relaunch": 0.1, "place": 0.5, "actors": 1.6, "connect": 0.5,
                "train": 0.2, "restore": 0.3}
    assert phases == pytest.approx(expected)
    assert sum(phases.values()) == pytest.approx(3.5)  # fault to the last rank restored
    note = ray_cluster._cairn_phases([run], "node_loss", [fault_t])
    assert note.startswith("Cairn phases (median s): detection 0.30, new attempt 0.10, "
                           "placement 0.50, actor start 1.60")
    assert "a new process's start to its train function: 2.20" in note


def test_with_kept_survivors_the_phases_are_those_of_the_replaced_rank(tmp_path: Path) -> None:
    run, fault_t = _run(tmp_path)
    # keep_survivors: no new placement group; the failed rank's actor replaced at 101.4.
    run["backend_times"] = {"placed": [50.0], "actors": [51.0], "replaced": [101.4]}
    # Rank 0 kept its process (started before the fault), rank 1's is new.
    run["node_loss"]["ranks"][0]["process_start_t"] = 40.0
    phases = ray_cluster._cairn_run_phases(run, run["node_loss"], fault_t)
    assert phases is not None
    assert list(phases) == [key for key, _ in ray_cluster.KEPT_PHASES]
    assert phases == pytest.approx({"detect": 0.3, "relaunch": 0.1, "replace": 1.0,
                                    "connect": 1.6, "train": 0.2, "restore": 0.3})
    note = ray_cluster._cairn_phases([run], "node_loss", [fault_t])
    assert note.startswith("Cairn phases (median s): detection 0.30, new attempt 0.10, "
                           "replacement 1.00, worker connect 1.60")
    # Only the new process counts: the kept rank's started before the fault.
    assert note.endswith("(a new process's start to its train function: 2.20)")


def test_node_loss_note_gives_the_worst_runs_and_the_load() -> None:
    def side(times: list[float], load: list[float]) -> dict[str, Any]:
        return {"times": times, "behind": [0] * len(times), "phases": "",
                "remove_s": [0.1] * len(times), "load": load}

    rows = ray_cluster._rows("node_loss", {"cairn": side([1.0, 3.0, 2.0], [9.0, 10.0, 11.0]),
                                           "ray": side([6.0, 5.0, 7.0], [9.5, 10.5, 11.5])},
                             3, options=("warm_standby", "keep_survivors"))
    note = rows[0].note
    assert rows[0].cairn == 2.0 and rows[0].reference == 6.0
    assert "Cairn with FailureConfig(warm_standby=True, keep_survivors=True)" in note
    assert "worst Cairn 3.00, Ray 7.00 s" in note
    assert "Cairn's worst / Ray's median 0.50" in note
    assert "load average at each removal: Cairn 9.00, 10.00, 11.00; Ray 9.50, 10.50, 11.50" in note
