# Ray Train's checkpointing guide (doc/source/train/user-guides/checkpoints.rst), the
# section __distributed_checkpointing_start__ .. __distributed_checkpointing_end__ of
# doc_code/checkpoints.py (ray-project/ray, Apache License 2.0): every rank saves a
# rank-prefixed file into one checkpoint. The guide's snippet leaves placeholders (`...`)
# and stores to "s3://bucket/"; this copy fills them, each fill marked `# filled:`:
# the state saved, the metrics, and the storage path (the test's STORAGE_PATH).
# tests/compat/ray_docs/test_ray_docs.py ports it by rewriting its imports.
# flake8: noqa
# isort: skip_file
# ruff: noqa
import os  # filled: the snippet uses os and tempfile and torch without importing them
import tempfile  # filled
import torch  # filled

# __distributed_checkpointing_start__
from ray import train
from ray.train import Checkpoint
from ray.train.torch import TorchTrainer


def train_func(config):
    metrics = {"epoch": 0}  # filled: `...`

    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        rank = train.get_context().get_world_rank()
        torch.save(
            {"rank": rank},  # filled: `...`
            os.path.join(temp_checkpoint_dir, f"model-rank={rank}.pt"),
        )
        checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)

        train.report(metrics, checkpoint=checkpoint)


trainer = TorchTrainer(
    train_func,
    scaling_config=train.ScalingConfig(num_workers=2),
    run_config=train.RunConfig(storage_path=os.environ["STORAGE_PATH"]),  # filled
)
# The checkpoint in cloud storage will contain: model-rank=0.pt, model-rank=1.pt
# __distributed_checkpointing_end__
result = trainer.fit()  # filled: the snippet builds the trainer only
print(sorted(os.listdir(result.checkpoint.to_directory())))  # filled: for the test
