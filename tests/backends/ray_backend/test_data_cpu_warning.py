"""On the Ray backend, workers that hold every CPU leave Ray Data none: the run says so at
once, naming the cause and the fixes, instead of waiting in silence at the first batch."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Callable, Iterator

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import cairn  # noqa: E402
from cairn import ScalingConfig, Trainer  # noqa: E402

RunConfigFactory = Callable[..., cairn.RunConfig]
WARNING = (r"Ray Data has no CPU left for Trainer\(datasets=...\): the Ray cluster has 2 CPUs "
           r"and the 2 workers hold 2 of them")


@pytest.fixture(scope="module", autouse=True)
def two_cpu_cluster() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="cairn-ray-"))
    yield
    ray.shutdown()


def leave_the_data_alone() -> None:
    cairn.report({"done": 1})


def _fit(workers: int, run_config: RunConfigFactory) -> None:
    result = Trainer(leave_the_data_alone, datasets={"train": ray.data.range(8)},
                     scaling_config=ScalingConfig(num_workers=workers, backend="ray"),
                     run_config=run_config()).fit()
    assert result.error is None


@pytest.mark.slow
def test_workers_holding_every_cpu_warn_naming_the_cause_and_the_fix(
    run_config: RunConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cairn"):
        _fit(2, run_config)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "cairn._src.controller.datasets"]
    assert len(warnings) == 1, warnings
    assert re.search(WARNING, warnings[0])
    assert "resources_per_worker={'CPU': 0.5}" in warnings[0]
    assert "fewer workers" in warnings[0] and "ray.init(num_cpus=...)" in warnings[0]


@pytest.mark.slow
def test_a_cpu_left_for_ray_data_is_no_warning(
    run_config: RunConfigFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="cairn"):
        _fit(1, run_config)
    assert not [r for r in caplog.records if r.name == "cairn._src.controller.datasets"]
