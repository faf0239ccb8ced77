"""Local mode (``ScalingConfig(num_workers=0)``) with ``Trainer(datasets=...)``: the train
function runs in the driver's process, where Ray Data's current ``DataContext`` stays the
user's, as in Ray Train's local mode. Worker processes get the driver's copy
(``test_ray_datasets.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ray_clusters import own_ray_cluster

import cairn
from cairn import ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    yield from own_ray_cluster(num_cpus=2)


def test_local_mode_leaves_the_driver_s_data_context_alone(
        ray_cluster: None, run_config: RunConfigFactory) -> None:
    from ray.data import DataContext

    context = DataContext.get_current()
    block_size = context.target_max_block_size
    seen: dict[str, Any] = {}

    def train() -> None:
        shard = cairn.get_dataset_shard("train")
        seen["rows"] = sorted(int(row["id"]) for row in shard.iter_rows())
        current = DataContext.get_current()
        seen["context"] = (current is context, current.target_max_block_size)
        cairn.report({"rows": len(seen["rows"])})

    trainer = Trainer(train, datasets={"train": ray.data.range(10)},
                      scaling_config=ScalingConfig(num_workers=0), run_config=run_config())
    # A change made after the Trainer was built holds in the train function and after it.
    context.target_max_block_size = 12345
    try:
        assert trainer.fit().error is None
        assert seen == {"rows": list(range(10)), "context": (True, 12345)}
        assert DataContext.get_current() is context
        assert context.target_max_block_size == 12345
    finally:
        context.target_max_block_size = block_size
        DataContext._set_current(context)
