# Ported from Ray Train 2.60's python/ray/train/v2/tests/test_config.py
# (ray-project/ray, Apache License 2.0), by changing its imports only:
# `from ray.train import RunConfig, ScalingConfig` -> `from ray_suite.cairn_names import
# ...` (Cairn's names). The test bodies are as upstream wrote them. skip/xfail marks are
# applied by conftest.py from port_status.py (the test code itself carries none).
import pyarrow.fs
import pytest

from ray_suite.cairn_names import RunConfig, ScalingConfig


def test_scaling_config_validation():
    assert ScalingConfig(
        num_workers=2, use_gpu=True, resources_per_worker={"CPU": 1}
    ).total_resources == {"CPU": 2, "GPU": 2}

    with pytest.raises(ValueError, match="`use_gpu` is False but `GPU` was found in"):
        ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"GPU": 1})

    with pytest.raises(ValueError, match="Cannot specify both"):
        ScalingConfig(num_workers=2, use_gpu=True, use_tpu=True)

    with pytest.raises(
        ValueError,
        match="If `label_selector` is a list, it must be the same length as `num_workers`",
    ):
        ScalingConfig(num_workers=2, label_selector=[{"subcluster": "my_subcluster"}])


def test_scaling_config_accelerator_type():
    scaling_config = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")
    assert scaling_config.accelerator_type == "A100"
    assert scaling_config._resources_per_worker_not_none == {
        "GPU": 1,
        "accelerator_type:A100": 0.001,
    }
    assert scaling_config.total_resources == {
        "GPU": 2,
        "accelerator_type:A100": 0.002,
    }
    assert scaling_config.additional_resources_per_worker == {
        "accelerator_type:A100": 0.001
    }


def test_storage_filesystem_repr():
    """Test for https://github.com/ray-project/ray/pull/40851"""
    config = RunConfig(storage_filesystem=pyarrow.fs.S3FileSystem())
    repr(config)


def test_scaling_config_tpu_validation_missing_workers():
    """Test that num_workers is required when use_tpu=True."""
    with pytest.raises(ValueError, match="`num_workers` must be specified"):
        ScalingConfig(use_tpu=True, accelerator_type="TPU-V4", topology="2x2x2")


def test_scaling_config_tpu_validation_topology_overflow(monkeypatch):
    """Test that num_workers cannot exceed topology limits for a given TPU slice."""
    # Create a valid Scaling config for a TPU slice that can accomodate at most 4 workers.
    ScalingConfig(
        use_tpu=True, num_workers=4, accelerator_type="v4-32", topology="2x2x4"
    )

    # Attempt to create an invalid ScalingConfig with num_workers greater than max allowed.
    with pytest.raises(ValueError, match="exceeds the maximum number of workers"):
        ScalingConfig(
            use_tpu=True, num_workers=5, accelerator_type="v4-32", topology="2x2x4"
        )


def test_scaling_config_default_workers():
    """Test that num_workers defaults to 1 for non-TPU workloads."""
    config = ScalingConfig()
    assert config.num_workers == 1
    assert config.total_resources == {"CPU": 1}

    config_gpu = ScalingConfig(use_gpu=True)
    assert config_gpu.num_workers == 1
    assert config_gpu.total_resources == {"GPU": 1}


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main(["-v", "-x", __file__]))
