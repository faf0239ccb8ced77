"""Arguments that ``report_snapshot``, ``save_training_state`` and ``load_training_state``
do not take are refused at the call, by name, with the value and what is accepted;
nothing is written, reported or restored for such a call.

``report_snapshot`` has two forms, a training state (``model=...``) and a state dict; an
argument of the other form would be dropped without a word, so it is refused too."""

from __future__ import annotations

import os
import random
import re
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cairn import ConfigError, ReportError, ScalingConfig
from cairn._src.worker import session as session_module
from cairn.torch import (
    TorchTrainer,
    load_training_state,
    prepare_data_loader,
    report_snapshot,
    save_training_state,
)

# --- report_snapshot: an argument of the other form ----------------------------------------


def refused_then_accepted(config: dict[str, Any]) -> dict[str, Any]:
    """Two calls that mix the forms (caught), then one call of each form that passes the
    other form's arguments at their defaults (accepted: the same call as without them)."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2)).sum().backward()
    optimizer.step()
    errors = []
    for bad in (
        lambda: report_snapshot({"call": 1}, {"w": torch.ones(1)}, optimizer=optimizer,
                                step=7, checkpoint_dir_name="mixed_state_dict"),
        lambda: report_snapshot({"call": 2}, model=model, file_name="mine.pt", per_rank=True,
                                checkpoint_dir_name="mixed_training_state"),
    ):
        try:
            bad()
        except ReportError as exc:
            errors.append(str(exc))
    report_snapshot({"call": 3}, {"w": torch.ones(1)}, optimizer=None, step=0, epoch=0,
                    checkpoint_dir_name="state_dict").wait()
    report_snapshot({"call": 4}, model=model, file_name="state.pt", per_rank=False,
                    checkpoint_dir_name="training_state").wait()
    return {"errors": errors}


def test_report_snapshot_refuses_an_argument_of_the_other_form_and_commits_nothing(
        run_config: Any) -> None:
    result = TorchTrainer(refused_then_accepted, scaling_config=ScalingConfig(num_workers=1),
                          run_config=run_config()).fit()
    state_dict_error, training_state_error = result.return_value["errors"]
    assert state_dict_error.startswith(
        "report_snapshot(metrics, state_dict, optimizer=<Adam>, step=7): optimizer and step "
        "are arguments of the training-state form, report_snapshot(metrics, model=..., "
        "optimizer=..., scheduler=..., data_loader=..., step=..., epoch=..., extra=...).")
    assert "The state-dict form saves only the state dict and would drop them" in (
        state_dict_error)
    assert training_state_error.startswith(
        "report_snapshot(metrics, model=..., file_name='mine.pt', per_rank=True): file_name "
        "and per_rank are arguments of the state-dict form, report_snapshot(metrics, "
        "state_dict, file_name=..., per_rank=...).")
    assert "would ignore them; leave them out, or pass a state dict instead of model=." in (
        training_state_error)
    # The refused calls reported nothing: no metrics, no checkpoint, no report index.
    assert [metrics["call"] for _, metrics in result.best_checkpoints] == [3, 4]
    assert list(result.metrics_dataframe["call"]) == [3, 4]
    assert list(result.metrics_dataframe["report_index"]) == [1, 2]
    run = Path(result.path)
    assert not (run / "mixed_state_dict").exists()
    assert not (run / "mixed_training_state").exists()
    assert sorted(os.listdir(run / "training_state")) == [
        "_cairn_manifest.json", "model.pt", "progress.pt", "rank_0"]
    assert "state.pt" in os.listdir(run / "state_dict")


class RankZero:
    def get_world_rank(self) -> int:
        return 0


@pytest.fixture
def bare_session(monkeypatch: pytest.MonkeyPatch) -> None:
    # A session that can do nothing else: the call must stop before it needs one.
    monkeypatch.setattr(session_module, "_session", SimpleNamespace(context=RankZero()))


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("optimizer", torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), "<SGD>"),
    ("scheduler", SimpleNamespace(), "namespace()"),
    ("data_loader", [1, 2], "[1, 2]"),
    ("step", 3, "3"),
    ("epoch", 1.0, "1.0"),
    ("extra", {}, "{}"),
])
@pytest.mark.usefixtures("bare_session")
def test_each_training_state_argument_is_refused_with_a_state_dict(
        name: str, value: object, shown: str) -> None:
    with pytest.raises(ReportError) as raised:
        report_snapshot({"step": 1}, {"w": torch.ones(1)}, **{name: value})
    assert str(raised.value).startswith(
        f"report_snapshot(metrics, state_dict, {name}={shown}): {name} is an argument of the "
        "training-state form")
    assert "would drop it; put what you want saved into the state dict" in str(raised.value)


@pytest.mark.parametrize(("name", "value"), [
    ("file_name", "mine.pt"), ("file_name", None), ("per_rank", True), ("per_rank", "yes")])
@pytest.mark.usefixtures("bare_session")
def test_each_state_dict_argument_is_refused_with_a_model(name: str, value: object) -> None:
    with pytest.raises(ReportError, match=re.escape(
            f"report_snapshot(metrics, model=..., {name}={value!r}): {name} is an argument "
            "of the state-dict form")):
        report_snapshot({"step": 1}, model=nn.Linear(1, 1), **{name: value})


# --- save_training_state / load_training_state ---------------------------------------------


def saved(tmp_path: Path) -> tuple[nn.Module, str]:
    model = nn.Linear(2, 2)
    directory = str(tmp_path / "state")
    save_training_state(directory, model=model, step=1)
    return model, directory


@pytest.mark.parametrize("name", ["restore_rng", "weights_only"])
@pytest.mark.parametrize("value", ["no", 1, None])
def test_load_training_state_takes_only_true_or_false_for_its_flags(
        tmp_path: Path, name: str, value: object) -> None:
    _, directory = saved(tmp_path)
    torch.manual_seed(5)
    random.seed(5)
    fresh = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    rng_before = (torch.get_rng_state(), random.getstate())
    with pytest.raises(ConfigError, match=re.escape(
            f"load_training_state({name}={value!r}) must be True or False.")):
        load_training_state(directory, model=fresh, **{name: value})
    # Nothing was loaded or restored.
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng_before[0])
    assert random.getstate() == rng_before[1]


@pytest.mark.parametrize(("value", "message"), [
    ("nope", "load_training_state(map_location='nope') is not a device; pass a device "
             "(such as 'cpu', 'cuda:0' or a torch.device), a dict of device names, a "
             "function, or None, as torch.load takes."),
    (42, "load_training_state(map_location=42) must be a device"),
])
def test_load_training_state_refuses_a_map_location_torch_load_does_not_take(
        tmp_path: Path, value: object, message: str) -> None:
    model, directory = saved(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_training_state(directory, model=model, map_location=value)


def test_load_training_state_takes_the_map_locations_torch_load_takes(
        tmp_path: Path) -> None:
    model, directory = saved(tmp_path)
    for value in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, _: storage,
                  None):
        assert load_training_state(directory, model=model, map_location=value).step == 1


@pytest.mark.parametrize(("value", "message"), [
    (None, "load_training_state(checkpoint=None) must be a cairn.Checkpoint or the path of "
           "a local directory."),
    ("", "load_training_state(checkpoint='') names no directory; pass one (for the current "
         "directory, '.')."),
    ("s3://bucket/run/checkpoint_000001",
     "load_training_state(checkpoint='s3://bucket/run/checkpoint_000001') is a URI, and "
     "checkpoint is a local directory: for a checkpoint on storage pass "
     "cairn.Checkpoint(uri) (or cairn.get_checkpoint()), which downloads it."),
])
def test_load_training_state_refuses_a_checkpoint_that_is_no_local_directory(
        value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_training_state(value, model=nn.Linear(2, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "message"), [
    (None, "save_training_state(directory=None) must be the path of a local directory, as a "
           "str or os.PathLike (for example pathlib.Path), not NoneType."),
    (b"state", "save_training_state(directory=b'state') must be the path of a local "
               "directory, as a str or os.PathLike (for example pathlib.Path), not bytes."),
    ("", "save_training_state(directory='') names no directory; pass one (for the current "
         "directory, '.')."),
    ("s3://bucket/state", "save_training_state(directory='s3://bucket/state') is a URI, and "
                          "directory is a local directory: save into one"),
    ("file:///tmp/state", "save_training_state(directory='file:///tmp/state') is a URI"),
])
def test_save_training_state_refuses_a_directory_that_is_no_local_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        save_training_state(value, model=nn.Linear(2, 2))  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == [], "nothing was written (no ./s3:/bucket/state)"


def test_save_training_state_refuses_a_file_for_its_directory(tmp_path: Path) -> None:
    file = tmp_path / "a_file"
    file.write_text("kept")
    with pytest.raises(ConfigError, match=re.escape(
            f"save_training_state(directory={str(file)!r}) is a file, not a directory; pass "
            "a directory (it is created when missing).")):
        save_training_state(file, model=nn.Linear(2, 2))
    assert file.read_text() == "kept"


def test_save_training_state_still_takes_a_path_and_creates_it(tmp_path: Path) -> None:
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2))
    written = save_training_state(tmp_path / "new" / "state", model=nn.Linear(2, 2),
                                  data_loader=loader, step=2)
    assert written == ["model.pt", "progress.pt", "rank_0/rank_state.pt"]
    assert load_training_state(tmp_path / "new" / "state", model=nn.Linear(2, 2)).step == 2


@pytest.mark.parametrize("value, cause", [
    (lambda: 1, "PicklingError: Can't pickle <function"),
    (threading.Lock(), "TypeError: cannot pickle '_thread.lock' object"),
])
def test_save_training_state_names_an_extra_torch_save_cannot_pickle(
        tmp_path: Path, value: object, cause: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(
            f"save_training_state(extra=...) holds something torch.save cannot pickle "
            f"({cause}")) as caught:
        save_training_state(tmp_path, model=nn.Linear(2, 2), extra={"step_fn": value})
    assert "pass tensors, plain values and objects of importable classes" in str(caught.value)
    assert not (tmp_path / "progress.pt").exists(), "no partial progress.pt is left"
    # An error of another argument than extra is not said to be extra's.
    with pytest.raises(TypeError, match=re.escape("_thread.lock")):
        save_training_state(tmp_path, model=nn.Linear(2, 2), optimizer=_LockedOptimizer(),
                            extra={"fine": 1})


class _LockedOptimizer(torch.optim.SGD):
    def __init__(self) -> None:
        super().__init__(nn.Linear(2, 2).parameters(), lr=0.1)

    def state_dict(self) -> dict[str, Any]:
        return {"lock": threading.Lock()}
