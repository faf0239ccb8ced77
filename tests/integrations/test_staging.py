"""The callbacks' staging directories, unit by unit (no worker processes): each goes once
its report is done whatever the outcome, an earlier attempt's leftovers go when the
callback starts, and Lightning's ranks all report rank 0's path."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

from cairn._src.errors import CheckpointSkippedError
from cairn._src.worker.report_handle import ReportHandle


class FakeRun:
    """Stands in for the worker's session: a context, and report() calls recorded, each
    answered with a pending handle the test resolves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, integration: Any, rank: int = 0,
                 attempt: int = 1, run: str = "/storage/run") -> None:
        self.reports: list[dict[str, Any]] = []
        self.handles: list[ReportHandle] = []
        self.rank, self.attempt, self.run = rank, attempt, run
        context = SimpleNamespace(
            get_world_rank=lambda: self.rank, get_world_size=lambda: 1,
            get_attempt=lambda: self.attempt,
            get_storage=lambda: SimpleNamespace(run_uri=None, run_path=self.run))
        # The reporting module the integration module uses (another test may have imported
        # fresh copies of both since this file was imported).
        shared = integration.report_staged.__globals__
        monkeypatch.setitem(shared, "get_context", lambda: context)
        monkeypatch.setitem(shared, "report", self._report)
        self.context = context

    def _report(self, metrics: dict[str, Any], checkpoint: Any = None,
                **kwargs: Any) -> ReportHandle:
        path = None if checkpoint is None else checkpoint.path
        files = [] if path is None else sorted(
            os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)
        self.reports.append({"metrics": metrics, "path": path, "files": files,
                             "rank": self.rank, **kwargs})
        handle = ReportHandle(len(self.handles), has_checkpoint=checkpoint is not None)
        self.handles.append(handle)
        return handle


def _skip(handle: ReportHandle) -> None:
    handle._resolve(None, CheckpointSkippedError("skipped"))


# --- Hugging Face -----------------------------------------------------------------------


@pytest.fixture
def hf(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeRun, Any]:
    pytest.importorskip("transformers")
    from cairn._src.integrations import huggingface

    run = FakeRun(monkeypatch, huggingface)
    monkeypatch.setattr(huggingface, "get_context", lambda: run.context)
    return run, huggingface


def _hf_save(module: Any, callback: Any, output_dir: Path, step: int) -> None:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_text(f"weights {step}")
    args = SimpleNamespace(output_dir=str(output_dir))
    state = SimpleNamespace(log_history=[{"loss": 1.0, "step": step}], global_step=step)
    callback.on_save(args, state, None)


def _staging(output_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(output_dir) if "cairn-staging" in name)


def test_hf_an_async_report_that_is_skipped_has_its_staging_folder_removed(
        hf: tuple[FakeRun, Any], tmp_path: Path) -> None:
    run, module = hf
    callback = module.CairnReportCallback(checkpoint_upload_mode="ASYNC")
    args = SimpleNamespace(output_dir=str(tmp_path))
    callback.on_train_begin(args, None, None)
    _hf_save(module, callback, tmp_path, 2)
    # Staged inside output_dir under a name push_to_hub skips ("_*"), kept while pending.
    [staged] = _staging(tmp_path)
    assert run.reports[0]["files"] == ["checkpoint/model.safetensors"]
    callback.on_step_end(args, None, None)
    assert _staging(tmp_path) == [staged]

    _skip(run.handles[0])   # upload_failure_policy="skip": Cairn leaves the folder
    callback.on_step_end(args, None, None)
    assert _staging(tmp_path) == []
    assert staged.startswith("_cairn-staging-") and "-a1-r0-" in staged

    # A save's own sweep, and train end waiting for a report still pending.
    _hf_save(module, callback, tmp_path, 4)
    _skip(run.handles[1])
    _hf_save(module, callback, tmp_path, 6)
    assert len(_staging(tmp_path)) == 1
    timer = threading.Timer(0.3, _skip, (run.handles[2],))
    timer.start()
    callback.on_train_end(args, None, None)
    timer.join()
    assert _staging(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


def test_hf_a_sync_report_removes_its_folder_at_once(
        hf: tuple[FakeRun, Any], tmp_path: Path) -> None:
    run, module = hf
    callback = module.CairnReportCallback()
    _hf_save(module, callback, tmp_path, 2)
    assert run.reports[0]["path"] is not None
    assert _staging(tmp_path) == []


def test_hf_leftovers_of_an_earlier_attempt_go_at_train_begin(
        hf: tuple[FakeRun, Any], tmp_path: Path) -> None:
    run, module = hf
    callback = module.CairnReportCallback(checkpoint_upload_mode="ASYNC")
    args = SimpleNamespace(output_dir=str(tmp_path))
    run.attempt = 0
    callback.on_train_begin(args, None, None)
    _hf_save(module, callback, tmp_path, 2)   # attempt 0 is killed with this one pending
    old = tmp_path / ".cairn-staging-abc123"  # the earlier versions' name
    old.mkdir()
    (old / "f").write_text("x")

    run.attempt = 1
    fresh = module.CairnReportCallback(checkpoint_upload_mode="ASYNC")
    # Another rank of attempt 1 on a shared output_dir has staged already: it stays.
    token = module.staging_token()
    current = tmp_path / f"_cairn-staging-{token}-r1-xyz"
    current.mkdir()
    # Another run sharing output_dir may be uploading from its folder now: it stays.
    other_run = tmp_path / "_cairn-staging-0123456789ab-a0-r0-xyz"
    other_run.mkdir()
    fresh.on_train_begin(args, None, None)
    assert _staging(tmp_path) == sorted([current.name, other_run.name])
    assert (tmp_path / "checkpoint-2" / "model.safetensors").exists()


# --- Lightning --------------------------------------------------------------------------


@pytest.fixture
def pl_callback(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    try:
        import lightning.pytorch
    except ModuleNotFoundError:
        pytest.importorskip("pytorch_lightning")
    from cairn._src.integrations import lightning

    def make(**kwargs: Any) -> Any:
        return lightning.CairnReportCallback(**kwargs)

    make.module = lightning  # type: ignore[attr-defined]
    return make


class StubStrategy:
    """Lightning's broadcast as a multi-machine group sees it: rank 0's object everywhere."""

    def __init__(self, rank0_value: list[Any]) -> None:
        self.rank0_value = rank0_value

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not self.rank0_value:
            self.rank0_value.append(obj)
        return self.rank0_value[0]


class StubTrainer:
    """save_checkpoint writes what a sharded strategy writes on each rank: its own shard,
    into the folder checkpoint.ckpt at the path it is given."""

    def __init__(self, rank: int, broadcast: list[Any]) -> None:
        self.global_rank = rank
        self.current_epoch = 0
        self.global_step = 4
        self.callback_metrics: dict[str, Any] = {"loss": 0.5}
        self.strategy = StubStrategy(broadcast)

    def save_checkpoint(self, path: str, weights_only: bool = False) -> None:
        os.makedirs(path, exist_ok=True)
        Path(path, f"shard_{self.global_rank}.distcp").write_text("shard")


def test_lightning_every_rank_reports_rank_zeros_path(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pl_callback: Callable[..., Any]) -> None:
    run = FakeRun(monkeypatch, pl_callback.module)  # type: ignore[attr-defined]
    broadcast: list[Any] = []
    machine_tmp = {0: tmp_path / "machine0", 1: tmp_path / "machine1"}
    for rank in (0, 1):
        run.rank = rank
        machine_tmp[rank].mkdir()
        monkeypatch.setenv("TMPDIR", str(machine_tmp[rank]))
        monkeypatch.setattr("tempfile.tempdir", None)
        pl_callback().on_train_epoch_end(StubTrainer(rank, broadcast), None)

    paths = [r["path"] for r in run.reports]
    assert paths[0] == paths[1]
    assert broadcast == [paths[0]] and paths[0].startswith(str(machine_tmp[0]))
    rank0_path = paths[0]
    assert [r["files"] for r in run.reports] == [["checkpoint.ckpt/shard_0.distcp"],
                                                 ["checkpoint.ckpt/shard_1.distcp"]]
    assert [r["metrics"]["step"] for r in run.reports] == [4, 4]
    assert not os.path.exists(rank0_path)  # SYNC: removed once reported


def test_lightning_skipped_and_stale_folders_are_removed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pl_callback: Callable[..., Any]) -> None:
    run = FakeRun(monkeypatch, pl_callback.module, attempt=0)  # type: ignore[attr-defined]
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    callback = pl_callback(checkpoint_upload_mode="ASYNC")
    trainer = StubTrainer(0, [])
    callback.on_train_start(trainer, None)
    callback.on_train_epoch_end(trainer, None)
    [first] = os.listdir(tmp_path)
    _skip(run.handles[0])
    trainer.strategy.rank0_value.clear()
    callback.on_train_epoch_end(trainer, None)   # the next epoch's sweep
    assert first not in os.listdir(tmp_path) and len(os.listdir(tmp_path)) == 1

    # Attempt 0 is killed with its second report pending; another run's folder stays.
    other_run = tmp_path / "cairn-lightning-0123456789ab-a0-e0-xyz"
    other_run.mkdir()
    run.attempt = 1
    pl_callback(checkpoint_upload_mode="ASYNC").on_train_start(trainer, None)
    assert os.listdir(tmp_path) == [other_run.name]
