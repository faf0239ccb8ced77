"""TLS on the Ray backend: the certificate reaches Ray actors in their bootstrap."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from ray_clusters import own_ray_cluster

ray = pytest.importorskip("ray")

from channel_support import report_and_checkpoint  # noqa: E402

import cairn  # noqa: E402
from cairn import ScalingConfig, Trainer  # noqa: E402

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # A cluster of its own ("local"), never one another process started on this machine.
    yield from own_ray_cluster(num_cpus=2)


@pytest.mark.slow
def test_a_ray_run_over_tls(ray_cluster: None, run_config: RunConfigFactory) -> None:
    result = Trainer(report_and_checkpoint, train_loop_config={"steps": 2},
                     scaling_config=ScalingConfig(num_workers=2, backend="ray", tls=True),
                     run_config=run_config()).fit()
    assert result.error is None
    assert result.return_value == 2
    assert result.checkpoint is not None
    assert sorted(result.checkpoint.get_manifest().files) == ["rank_0.json", "rank_1.json"]
