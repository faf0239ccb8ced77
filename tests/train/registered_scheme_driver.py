"""A run whose checkpoints are NO_UPLOAD references on a scheme registered in code, and a
reader of it that did not register the scheme, each as its own process.

python registered_scheme_driver.py train STORAGE STORE
python registered_scheme_driver.py read RUN STORE
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pyarrow.fs as pafs

import cairn
from cairn.storage import register_scheme

SCHEME = "refstore"


def store_at(root: str) -> Any:
    def factory(uri: str) -> pafs.FileSystem:
        return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())
    return factory


def train_func(config: dict[str, Any]) -> None:
    for epoch in range(3):
        directory = os.path.join(config["store"], f"ck{epoch}")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "state.bin"), "wb") as file:
            file.write(f"epoch {epoch}".encode())
        cairn.report({"epoch": epoch}, checkpoint=cairn.Checkpoint(f"{SCHEME}://ck{epoch}"),
                     checkpoint_upload_mode="NO_UPLOAD")


def train(storage: str, store: str) -> dict[str, Any]:
    register_scheme(SCHEME, store_at(store))
    result = cairn.Trainer(train_func, train_loop_config={"store": store},
                           run_config=cairn.RunConfig(name="run", storage_path=storage)).fit()
    return {"checkpoint": result.checkpoint.uri if result.checkpoint else None}


def read(run: str, store: str) -> dict[str, Any]:
    result = cairn.Result.from_path(run)
    checkpoint = result.checkpoint
    assert checkpoint is not None
    shown = repr(result)
    try:
        unresolved = f"resolved to {checkpoint.path}"
    except cairn.UnknownSchemeError as exc:
        unresolved = str(exc)
    register_scheme(SCHEME, store_at(store))
    with checkpoint.as_directory() as directory:
        data = open(os.path.join(directory, "state.bin")).read()
    return {"metrics": result.metrics, "history": len(result.metrics_dataframe),
            "goodput_attempts": result.goodput.attempts, "repr": shown,
            "best": [c.uri for c, _ in result.best_checkpoints],
            "unresolved": unresolved, "data_after_registering": data}


if __name__ == "__main__":
    mode, *arguments = sys.argv[1:]
    print(json.dumps(train(*arguments) if mode == "train" else read(*arguments)))
