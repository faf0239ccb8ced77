"""A data-parallel training script written against Ray Train 2.x, as its docs write them.

`port.py` turns it into a Cairn script by rewriting its three import lines and nothing
else. Run either with STORAGE_PATH set to an absolute directory.
"""

import json
import os
import tempfile

import torch
from ray import train
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(samples: int = 256) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, 8, generator=generator)
    targets = features @ torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    return TensorDataset(features, targets)


def train_func(config):
    model = prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = prepare_data_loader(DataLoader(make_dataset(), batch_size=32, shuffle=True))

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "state.pt"))
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, config["epochs"]):
        total = 0.0
        for features, targets in loader:
            loss = nn.functional.mse_loss(model(features), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        metrics = {"loss": total / len(loader), "epoch": epoch}
        with tempfile.TemporaryDirectory() as temp_dir:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch},
                           os.path.join(temp_dir, "state.pt"))
                checkpoint = Checkpoint.from_directory(temp_dir)
            train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05, "epochs": 4},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="port",
            storage_path=os.environ["STORAGE_PATH"],
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
        ),
    )
    result = trainer.fit()
    print(json.dumps({
        "metrics": {k: result.metrics[k] for k in ("loss", "epoch")},
        "checkpoint": os.path.basename(result.checkpoint.path.rstrip("/")),
        "best_checkpoints": [m["epoch"] for _, m in result.best_checkpoints],
        "dataframe_epochs": result.metrics_dataframe["epoch"].tolist(),
        "path": result.path,
        "error": result.error,
    }))
