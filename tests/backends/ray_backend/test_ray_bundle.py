"""What each worker's placement-group bundle asks the Ray cluster for (no cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from cairn import ScalingConfig
from cairn._src.backends.ray import RayBackend


def test_accelerator_type_becomes_ray_trains_custom_resource() -> None:
    backend = RayBackend(ScalingConfig(num_workers=2, backend="ray", use_gpu=True,
                                       accelerator_type="A100"))
    # No CPU, as Ray Train's ScalingConfig(use_gpu=True)._resources_per_worker_not_none.
    assert backend._bundle() == {"GPU": 1.0, "accelerator_type:A100": 0.001}


def test_resources_per_worker_are_kept_and_the_accelerator_added() -> None:
    backend = RayBackend(ScalingConfig(num_workers=1, backend="ray",
                                       resources_per_worker={"CPU": 2, "custom": 1},
                                       accelerator_type="H100"))
    assert backend._bundle() == {"CPU": 2, "custom": 1, "accelerator_type:H100": 0.001}


def test_without_accelerator_type_the_bundle_is_unchanged() -> None:
    assert RayBackend(ScalingConfig(backend="ray"))._bundle() == {"CPU": 1.0}


def test_an_elastic_group_is_not_kept_around_a_replaced_rank() -> None:
    # FailureConfig(keep_survivors=True): a fixed size replaces single ranks; an elastic
    # range restarts the whole group, which can start smaller when a node is gone.
    assert RayBackend(ScalingConfig(num_workers=2, backend="ray")).replace_refusal() is None
    refusal = RayBackend(ScalingConfig(num_workers=(1, 3), backend="ray")).replace_refusal()
    assert refusal == ("ScalingConfig(num_workers=(1, 3)) is elastic: the whole group "
                       "restarts, so that it can start with fewer workers when a node is gone")


def test_use_gpu_adds_a_gpu_to_resources_per_worker_without_one() -> None:
    # As Ray Train: resources_per_worker without "GPU" and use_gpu=True asks for one GPU
    # per worker, as ScalingConfig.total_resources says.
    scaling = ScalingConfig(backend="ray", num_workers=2, use_gpu=True,
                            resources_per_worker={"CPU": 2})
    assert RayBackend(scaling)._bundle() == {"CPU": 2, "GPU": 1.0}
    assert scaling.total_resources == {"CPU": 4, "GPU": 2}


def test_zero_resources_per_worker_are_dropped_from_the_bundle() -> None:
    scaling = ScalingConfig(backend="ray", resources_per_worker={"CPU": 1, "custom": 0})
    assert RayBackend(scaling)._bundle() == {"CPU": 1}


def test_a_gpu_count_in_resources_per_worker_is_kept() -> None:
    scaling = ScalingConfig(backend="ray", use_gpu=True,
                            resources_per_worker={"CPU": 1, "GPU": 0.5})
    assert RayBackend(scaling)._bundle() == {"CPU": 1, "GPU": 0.5}
