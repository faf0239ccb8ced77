"""Ray Train's documentation scripts, ported by rewriting their imports, run on Cairn.

The scripts under ``scripts/`` are copies of Ray Train 2.60's quickstart and of its
checkpointing, key-concepts, fault-tolerance and data-ingest guides (each file's header
names its source and any placeholder the guide leaves that the copy had to fill).
:func:`port` rewrites their Ray Train import lines and nothing else, then each test runs
the result as a script in a fresh process with 2 worker processes, the way a user runs
it, and checks what the guide says the run produces.

Import lines the example porter (``examples/ray_port/port.py``) knows are rewritten by
it. Scripts that write ``import ray.train`` and then call ``ray.train.report(...)`` get
``ray`` bound to a namespace whose ``train`` is :mod:`cairn`, on the same line, since Cairn
has no module that plays ``ray``:
``import cairn, cairn.torch, types; ray = types.SimpleNamespace(train=cairn)``.

torchvision is not installed here and FashionMNIST cannot be downloaded:
``stand_ins/torchvision`` (see its docstring) stands in for the names the quickstart
imports. The quickstart asks for ``use_gpu=True``; this machine has no GPU, so the test
also turns that one argument to ``False``, the quickstart's own CPU setting.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import cairn

HERE = Path(__file__).resolve().parent
DOCS = HERE / "scripts"
STAND_INS = HERE / "stand_ins"
PORTER = HERE.parents[2] / "examples" / "ray_port" / "port.py"

RAY_NAMESPACE = "import cairn, cairn.torch, types; ray = types.SimpleNamespace(train=cairn)"
# A committed checkpoint directory also holds its manifest (the README's contract item 4).
MANIFEST = "_cairn_manifest.json"
EXTRA_IMPORTS = {
    "import ray.train.torch": RAY_NAMESPACE,
    "import ray.train as train": "import cairn as train",
    "import ray.train": RAY_NAMESPACE,
    "from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer":
        "from cairn import Trainer as DataParallelTrainer",
    # The data-ingest guide imports only ``ray`` and reaches Ray Train as ``ray.train``
    # (``ray.train.DataConfig``) next to Ray Data (``ray.data``), which stays Ray's.
    "import ray": "import ray.data, cairn, types; ray = types.SimpleNamespace(data=ray.data, "
                  "train=cairn)",
}


def load_porter() -> object:
    spec = importlib.util.spec_from_file_location("ray_port", PORTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def port(source: str) -> str:
    """``source`` with every Ray Train import line replaced by Cairn's; nothing else."""
    lines = []
    for line in source.splitlines(keepends=True):
        for ray_import, cairn_import in EXTRA_IMPORTS.items():
            if line.rstrip("\n") == ray_import:
                line = cairn_import + "\n"
                break
        lines.append(line)
    ported: str = load_porter().port("".join(lines))  # type: ignore[attr-defined]
    return ported


def changed_lines(source: str, ported: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(source.splitlines(), ported.splitlines(), strict=True)
            if a != b]


def run_ported(script: str, tmp_path: Path, *, source: str | None = None,
               timeout: float = 600, env: dict[str, str] | None = None) -> tuple[str, Path]:
    """Port ``scripts/<script>`` (or ``source``), run it; (stdout, storage folder)."""
    text = source if source is not None else (DOCS / script).read_text()
    ported = tmp_path / script
    ported.write_text(port(text))
    storage = tmp_path / "storage"
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        # Runs without a storage_path go to Cairn's default folder: here, one per test.
        "CAIRN_STORAGE_PATH": str(storage),
        "STORAGE_PATH": str(storage),
        # key_concepts.py names ~/ray_results; keep it inside the test's folder.
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(STAND_INS), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    done = subprocess.run([sys.executable, str(ported)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=timeout, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    return done.stdout, storage


def user_files(directory: str) -> list[str]:
    """The files of a checkpoint directory, less the manifest Cairn commits it with."""
    return sorted(name for name in os.listdir(directory) if name != MANIFEST)


def only_run(storage: Path) -> Path:
    runs = [path for path in storage.iterdir() if path.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_port_changes_only_import_lines() -> None:
    for script in sorted(DOCS.glob("*.py")):
        source = script.read_text()
        for before, after in changed_lines(source, port(source)):
            assert before.startswith(("import ray", "from ray")), (script.name, before)
            assert "cairn" in after, (script.name, after)


@pytest.mark.slow
def test_quickstart_every_rank_saves_model_pt(tmp_path: Path) -> None:
    source = (DOCS / "getting_started_pytorch.py").read_text()
    assert source.count("use_gpu=True") == 1
    stdout, storage = run_ported("getting_started_pytorch.py", tmp_path,
                                 source=source.replace("use_gpu=True", "use_gpu=False"))
    assert "'epoch': 9" in stdout
    result = cairn.Result.from_path(str(only_run(storage)))
    assert result.metrics is not None and result.metrics["epoch"] == 9
    assert len(result.best_checkpoints) == 10
    with result.checkpoint.as_directory() as checkpoint_dir:  # type: ignore[union-attr]
        assert user_files(checkpoint_dir) == ["model.pt"]


def test_key_concepts_guide(tmp_path: Path) -> None:
    stdout, storage = run_ported("key_concepts.py", tmp_path)
    assert "Observed metrics: {'loss': 2}" in stdout
    assert "Minimum loss 0" in stdout
    assert stdout.count("Loss ") == 3
    assert "Restored loss 2" in stdout
    assert "Simulated training error" in stdout
    # Only the trainers that fit() write runs; the RunConfig examples are built only.
    assert not (tmp_path / "home" / "ray_results").exists()
    runs = sorted(path for path in storage.iterdir() if path.is_dir())
    assert len(runs) == 2, runs


def test_checkpoints_guide_saving_from_rank_zero(tmp_path: Path) -> None:
    _, storage = run_ported("checkpoints_pytorch_save.py", tmp_path)
    result = cairn.Result.from_path(str(only_run(storage)))
    assert len(result.best_checkpoints) == 5
    for checkpoint, _ in result.best_checkpoints:
        with checkpoint.as_directory() as checkpoint_dir:
            assert user_files(checkpoint_dir) == ["model.pt"]


def test_checkpoints_guide_resume_from_get_checkpoint(tmp_path: Path) -> None:
    _, storage = run_ported("checkpoints_pytorch_restore.py", tmp_path)
    result = cairn.Result.from_path(str(only_run(storage)))
    # Epochs 0 and 1, the intentional error, then epochs 2-4 after resuming from epoch 1.
    assert len(result.best_checkpoints) == 5
    frame = result.metrics_dataframe
    assert frame is not None and len(frame) == 5


def test_checkpoints_guide_saving_from_all_ranks(tmp_path: Path) -> None:
    stdout, _ = run_ported("checkpoints_rank_prefixed.py", tmp_path)
    listed = ast.literal_eval(stdout.strip().splitlines()[-1])
    assert [name for name in listed if name != MANIFEST] == ["model-rank=0.pt", "model-rank=1.pt"]


def test_checkpoints_guide_upload_modes(tmp_path: Path) -> None:
    stdout, _ = run_ported("checkpoints_upload_modes.py", tmp_path)
    summary = json.loads(stdout.strip().splitlines()[-1])
    for name, mode in (("train_fn", "sync"), ("train_fn_async", "async")):
        assert summary[name] == {"metrics": {"epoch": 2, "mode": mode}, "checkpoints": 3,
                                 "state": "2"}


def write_ray_example_data(folder: Path) -> None:
    """Local files of the shape of the three the data-ingest guide reads from Ray's bucket
    (the copy's header lists them): the iris table, an SMS spam text, daily index prices."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    varieties = ["Setosa", "Versicolor", "Virginica"]
    pq.write_table(pa.table({
        "sepal.length": np.round(rng.uniform(4.3, 7.9, 150), 1),
        "sepal.width": np.round(rng.uniform(2.0, 4.4, 150), 1),
        "petal.length": np.round(rng.uniform(1.0, 6.9, 150), 1),
        "petal.width": np.round(rng.uniform(0.1, 2.5, 150), 1),
        "variety": [varieties[i // 50] for i in range(150)],
    }), folder / "iris.parquet")
    (folder / "sms_spam_collection_subset.txt").write_text("".join(
        f"{'spam' if i % 7 == 0 else 'ham'}\tmessage number {i}\n" for i in range(40)))
    (folder / "dow_jones.csv").write_text("Date,Open,High,Low,Close,Volume\n" + "".join(
        f"2020-01-{day:02d},{28000 + day},{28100 + day},{27900 + day},{28050 + day},"
        f"{300000 + day}\n" for day in range(1, 21)))


# The guide's __options__ section sets a field of Ray Data's ExecutionResources, which Ray
# 2.60 made read-only: the line fails on Ray itself, so it cannot run on Cairn either.
OPTIONS_LINE = "options.resource_limits.object_store_memory = 10e9"


def test_data_ingest_guide_options_line_fails_on_ray_2_60_itself() -> None:
    ray_train = pytest.importorskip("ray.train")
    for config in (ray_train.DataConfig, cairn.DataConfig):
        options = config.default_ingest_options()
        with pytest.raises(AttributeError, match="property 'object_store_memory' of "
                           "'ExecutionResources' object has no setter"):
            exec(OPTIONS_LINE, {"options": options})


@pytest.mark.slow
def test_data_ingest_guide_streams_a_shard_to_each_worker(tmp_path: Path) -> None:
    write_ray_example_data(tmp_path)
    source = (DOCS / "data_ingest_torch_new.py").read_text()
    # Without the __options__ section's statements (its import stays: __custom__ uses it),
    # which stop the guide on Ray 2.60 (the test above).
    options = source[source.index("options = DataConfig"):source.index("# __options_end__")]
    assert OPTIONS_LINE in options
    # Ray Data starts Ray on first use; left alone, that ray.init() joins the cluster of
    # the machine's last `ray start` (Ray's /tmp/ray/ray_current_cluster), another test's.
    # A Ray folder of its own (short: Ray's socket paths are limited) starts a fresh one.
    ray_dir = tempfile.mkdtemp(prefix="cairn-ray-")
    stdout, storage = run_ported("data_ingest_torch_new.py", tmp_path,
                                 source=source.replace(options, ""),
                                 env={"RAY_TMPDIR": ray_dir})
    # Two fit() calls (the basic one and the custom DataConfig's), 2 workers, 10 epochs
    # of one batch each: a worker's shard is 75 of the 150 rows (batch_size=128).
    batches = [line for line in stdout.splitlines() if "Do some training on batch" in line]
    assert len(batches) == 2 * 2 * 10, stdout[-3000:]
    # normalize_length ran on every batch (a batch's print spans several lines).
    assert stdout.count("'normalized.sepal.length'") == len(batches)
    assert "'sepal.length'" not in stdout
    assert sum(line.startswith("(rank 1)") for line in batches) == 2 * 10
    runs = [path for path in storage.iterdir() if path.is_dir()]
    assert len(runs) == 2, runs


def test_fault_tolerance_guide(tmp_path: Path) -> None:
    # FailureConfig(max_preemption_failures=..., relax_collectives_on_preemption=...,
    # preemption_grace_s=...) and get_preemption_info() as the guide uses them; no node is
    # preempted here, so the just-in-time branch is left alone (tests/fault/
    # test_preemption.py sends the notice).
    _, storage = run_ported("fault_tolerance.py", tmp_path)
    runs = sorted(path for path in storage.iterdir() if path.is_dir())
    assert len(runs) == 2, runs
    results = [cairn.Result.from_path(str(run)) for run in runs]
    assert sorted(len(r.best_checkpoints) for r in results) == [0, 1]
    assert all(r.error is None for r in results)
    # The worker fault-tolerance example reports once; the preemption one never reports
    # without a notice.
    assert sorted(str(r.metrics) for r in results) == ["None", "{'loss': 0.1}"]
