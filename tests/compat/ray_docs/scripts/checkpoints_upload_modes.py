# Ray Train's checkpointing guide (doc/source/train/user-guides/checkpoints.rst), the
# sections __checkpoint_upload_mode_sync_start__ and __checkpoint_upload_mode_async_start__
# of doc_code/checkpoints.py (ray-project/ray, Apache License 2.0): report with
# CheckpointUploadMode.SYNC, then with ASYNC from a tempfile.mkdtemp() directory. The
# guide's snippets leave placeholders (`...`) and define `train_fn` twice; this copy fills
# the placeholders, each fill marked `# filled:`, renames the second function
# `train_fn_async`, and adds the driver that runs both with 2 workers.
# tests/compat/ray_docs/test_ray_docs.py ports it by rewriting its imports.
# flake8: noqa
# isort: skip_file
# ruff: noqa
import json  # filled
import os  # filled
import tempfile

from ray import train
from ray.train import Checkpoint


# __checkpoint_upload_mode_sync_start__
def train_fn(config):
    for epoch in range(3):  # filled: `...`
        metrics = {"epoch": epoch, "mode": "sync"}  # filled: `{...}`
        with tempfile.TemporaryDirectory() as tmpdir:
            with open(os.path.join(tmpdir, "state.txt"), "w") as f:  # filled: `...`
                f.write(str(epoch))
            checkpoint = Checkpoint.from_directory(tmpdir)
            train.report(
                metrics,
                checkpoint=checkpoint,
                checkpoint_upload_mode=train.CheckpointUploadMode.SYNC,
            )


# __checkpoint_upload_mode_sync_end__

# __checkpoint_upload_mode_async_start__
def train_fn_async(config):  # filled: the guide names it train_fn too
    for epoch in range(3):  # filled: `...`
        metrics = {"epoch": epoch, "mode": "async"}  # filled: `{...}`
        tmpdir = tempfile.mkdtemp()
        with open(os.path.join(tmpdir, "state.txt"), "w") as f:  # filled: `...`
            f.write(str(epoch))
        checkpoint = Checkpoint.from_directory(tmpdir)
        train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
        )


# __checkpoint_upload_mode_async_end__

# filled: a driver for both functions, 2 workers, and a summary for the test
from ray.train.torch import TorchTrainer

summary = {}
for fn in (train_fn, train_fn_async):
    result = TorchTrainer(
        fn,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=train.RunConfig(
            name=fn.__name__, storage_path=os.environ["STORAGE_PATH"]
        ),
    ).fit()
    with result.checkpoint.as_directory() as checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "state.txt")) as f:
            state = f.read()
    summary[fn.__name__] = {
        "metrics": result.metrics,
        "checkpoints": len(result.best_checkpoints),
        "state": state,
    }
print(json.dumps(summary))
