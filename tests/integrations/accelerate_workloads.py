"""Ray Train's Hugging Face Accelerate guide (``python/ray/train/examples/accelerate/
accelerate_torch_trainer_no_raydata.py``, its checkpoint step as the Ray Data variant and
``doc/source/train/doc_code/accelerate_torch_trainer.py`` write it), run by the
cairn.huggingface tests in real worker processes.

Ported by imports (``ray.train`` -> ``cairn``), with these stand-ins for what comes from
the Hugging Face Hub (there is no network): BERT and its tokenizer -> a two-layer
classifier on 8 features, GLUE MRPC -> 64 random rows, ``evaluate``'s GLUE metric ->
accuracy, ``transformers.set_seed`` -> ``accelerate.utils.set_seed``. The train loop and
the checkpoint step are the guide's.
"""

from __future__ import annotations

import os
from tempfile import TemporaryDirectory
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

import cairn
from cairn import Checkpoint


class TinyClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                          torch.nn.Linear(16, 2))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features)  # type: ignore[no-any-return]


def _rows(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(64, 8, generator=generator)
    return TensorDataset(features, (features.sum(1) > 0).long())


def train_func(config: dict[str, Any]) -> None:
    """The guide's train function. ``config["every_rank_saves"]``: each rank saves the
    unwrapped model with torch.save itself, as hand-written loops often do;
    ``config["shard_by_rank"]``: each rank trains on rows of its own, as Ray Data's
    ``get_dataset_shard`` gives them in the guide's Ray Data variant."""
    set_seed(config["seed"])
    accelerator = Accelerator()
    rows = _rows(1 + cairn.get_context().get_world_rank() if config.get("shard_by_rank") else 0)
    train_dataloader = DataLoader(rows, shuffle=True, batch_size=config["train_batch_size"],
                                  drop_last=True)
    eval_dataloader = DataLoader(_rows(100), shuffle=False, batch_size=config["eval_batch_size"],
                                 drop_last=True)
    model = TinyClassifier()
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=config["lr"])
    lr_scheduler = torch.optim.lr_scheduler.LinearLR(optimizer)
    (model, optimizer, train_dataloader, eval_dataloader, lr_scheduler) = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)

    for epoch in range(config["num_epochs"]):
        model.train()
        for features, labels in train_dataloader:
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        model.eval()
        correct = total = 0
        for features, labels in eval_dataloader:
            with torch.no_grad():
                predictions = model(features).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, labels))
            correct += int((predictions == references).sum())
            total += len(references)
        eval_metric = {"accuracy": correct / total, "epoch": epoch,
                       "num_processes": accelerator.num_processes}

        # Report Checkpoint and metrics to Ray Train (here Cairn), as the guide does.
        with TemporaryDirectory() as tmpdir:
            unwrapped_model = accelerator.unwrap_model(model)
            if config.get("every_rank_saves"):
                torch.save(unwrapped_model, f"{tmpdir}/ckpt_{epoch}.bin")
            else:
                accelerator.save(unwrapped_model, f"{tmpdir}/ckpt_{epoch}.bin")
            with open(os.path.join(config["scratch"], f"files_{epoch}_"
                                   f"{accelerator.process_index}.txt"), "w") as f:
                f.write(",".join(sorted(os.listdir(tmpdir))))
            checkpoint = Checkpoint.from_directory(tmpdir)
            cairn.report(metrics=eval_metric, checkpoint=checkpoint)
