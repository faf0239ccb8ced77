"""Trainer runs with real worker processes: contract items 1-7."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import workloads
from workloads import run_dir

import cairn
from cairn import CheckpointConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.mark.parametrize("num_workers", [2, 4])
def test_fit_runs_every_rank_and_fills_the_result(
    num_workers: int, run_config: RunConfigFactory, capfd: pytest.CaptureFixture[str]
) -> None:
    config = run_config()
    result = Trainer(
        workloads.counting,
        train_loop_config={"steps": 5},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=config,
    ).fit()
    assert result.return_value == f"done by 0 of {num_workers}"
    assert result.metrics == {"step": 4, "rank": 0}
    assert result.error is None
    assert result.checkpoint is None and result.best_checkpoints == []
    assert result.path == run_dir(config)
    frame = result.metrics_dataframe
    assert list(frame["step"]) == [0, 1, 2, 3, 4]
    assert list(frame["report_index"]) == [1, 2, 3, 4, 5]
    out = capfd.readouterr().out
    for rank in range(num_workers):
        assert f"(rank {rank}) hello from rank {rank}" in out


def test_train_function_without_arguments_and_closures(run_config: RunConfigFactory) -> None:
    captured = {"answer": 42}

    def train() -> int:
        cairn.report({"x": 1})
        return captured["answer"]

    result = Trainer(train, run_config=run_config()).fit()
    assert result.return_value == 42


def test_metric_only_reports_never_wait_for_other_ranks(
    run_config: RunConfigFactory, scratch: str
) -> None:
    # Rank 1 is parked until rank 0 has made all of its reports: if a metric-only report
    # waited for rank 1 the run would deadlock (and fail on the pytest timeout).
    result = Trainer(
        workloads.metric_reports_do_not_wait,
        train_loop_config={"scratch": scratch},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(),
    ).fit()
    assert len(result.metrics_dataframe) == 200


@pytest.mark.parametrize(("mode", "workers"), [("SYNC", 2), ("ASYNC", 2), ("ASYNC", 4)])
def test_checkpoint_reports_merge_ranks_and_number_directories(
    mode: str, workers: int, run_config: RunConfigFactory
) -> None:
    config = run_config()
    result = Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 3, "mode": mode},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=config,
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(run_dir(config), "checkpoint_000003")
    assert sorted(os.listdir(run_dir(config))) == [
        "cairn_run.json", "checkpoint_000001", "checkpoint_000002", "checkpoint_000003",
        "events", "metrics",
    ]
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None
    assert set(manifest.files) == {f"rank_{r}.json" for r in range(workers)}
    assert manifest.ranks == tuple(range(workers))
    assert manifest.report_index == 3
    assert manifest.metrics == {"step": 2, "score": 2}
    assert result.checkpoint.get_metadata() == {"written_by": workers - 1}
    result.checkpoint.verify()
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "rank_1.json")) as f:
        assert json.load(f) == {"step": 2, "rank": 1}


def test_sync_report_returns_after_commit_and_every_rank_sees_it(
    run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config()
    Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 3, "scratch": scratch},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=config,
    ).fit()
    for step in range(3):
        seen = {open(os.path.join(scratch, f"latest_{rank}_{step}")).read() for rank in (0, 1)}
        assert seen == {os.path.join(run_dir(config), f"checkpoint_{step + 1:06d}")}


def test_retention_keeps_the_best_and_the_latest(run_config: RunConfigFactory) -> None:
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max"))
    scores = {"0": 5, "1": 9, "2": 1, "3": 7, "4": 0}
    result = Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 5, "scores": scores},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=config,
    ).fit()
    kept = sorted(n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint_"))
    # Best two by score: steps 1 (9) and 3 (7); plus the latest, step 4.
    assert kept == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    # Ray Train's order: worst to best by the score attribute.
    assert [m["score"] for _, m in result.best_checkpoints] == [0, 7, 9]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_000005")


def test_result_from_path_matches_fit(run_config: RunConfigFactory) -> None:
    config = run_config()
    result = Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=config,
    ).fit()
    loaded = cairn.Result.from_path(run_dir(config))
    assert loaded.checkpoint == result.checkpoint
    assert loaded.metrics == result.metrics
    assert loaded.metrics_dataframe.equals(result.metrics_dataframe)
    assert loaded.goodput.attempts == 1


def test_second_fit_continues_numbering_and_history(run_config: RunConfigFactory) -> None:
    config = run_config()
    trainer = Trainer(workloads.counting, train_loop_config={"steps": 3}, run_config=config)
    trainer.fit()
    result = Trainer(workloads.counting, train_loop_config={"steps": 2}, run_config=config).fit()
    assert list(result.metrics_dataframe["report_index"]) == [1, 2, 3, 4, 5]
    assert list(result.metrics_dataframe["attempt"]) == [0, 0, 0, 1, 1]


def test_context_describes_each_rank(run_config: RunConfigFactory) -> None:
    config = run_config()
    result = Trainer(workloads.describe_context, scaling_config=ScalingConfig(num_workers=3),
                     run_config=config).fit()
    contexts = result.return_value
    assert [c["world_rank"] for c in contexts] == [0, 1, 2]
    for rank, context in enumerate(contexts):
        assert context == {
            "world_rank": rank, "world_size": 3, "local_rank": rank, "local_world_size": 3,
            "node_rank": 0, "experiment_name": "run", "attempt": 0,
            "run_uri": run_dir(config), "checkpoint": None,
        }


class Recorder(cairn.Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def on_report(self, report_index: int, metrics: dict[str, object]) -> None:
        self.calls.append(("report", report_index))

    def on_checkpoint(self, dir_name: str, metrics: dict[str, object]) -> None:
        self.calls.append(("checkpoint", dir_name))

    def on_run_end(self, result: cairn.Result) -> None:
        self.calls.append(("end", result.metrics))


def test_callbacks_follow_the_run_in_order(run_config: RunConfigFactory) -> None:
    recorder = Recorder()
    Trainer(workloads.checkpoint_every_step, train_loop_config={"steps": 2},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=run_config(callbacks=[recorder])).fit()
    assert recorder.calls == [
        ("report", 1), ("checkpoint", "checkpoint_000001"),
        ("report", 2), ("checkpoint", "checkpoint_000002"),
        ("end", {"step": 1, "score": 1}),
    ]


def test_callbacks_must_be_a_list() -> None:
    with pytest.raises(cairn.ConfigError, match=r"RunConfig.callbacks=.* must be a list"):
        cairn.RunConfig(callbacks=Recorder())  # type: ignore[arg-type]


def test_a_silent_peer_on_the_controller_port_does_not_block_workers(
    run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from cairn._src.backends.local import LocalBackend

    silent: list[socket.socket] = []
    start = LocalBackend.start

    def start_after_a_silent_peer(self: LocalBackend, num_workers: int, bootstrap: Any,
                                  **kwargs: Any) -> Any:
        # Connects first and never says a word (a port scan, a health check).
        silent.append(socket.create_connection(bootstrap.address))
        return start(self, num_workers, bootstrap, **kwargs)

    monkeypatch.setattr(LocalBackend, "start", start_after_a_silent_peer)
    result = Trainer(workloads.counting, train_loop_config={"steps": 2},
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=run_config()).fit()
    assert result.metrics == {"step": 1, "rank": 0}
    for sock in silent:
        sock.close()
