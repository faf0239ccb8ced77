# Ported from Ray Train 2.60's python/ray/train/v2/tests/test_torch_trainer.py
# (ray-project/ray, Apache License 2.0), by changing its imports and Ray-only fixtures.
# The test bodies are as upstream wrote them. Edits:
# - `import ray` -> the stand-in module `ray_suite.ray_stand_in` imported as `ray`.
# - `from ray.train import ScalingConfig`, `from ray.train.torch import TorchTrainer` ->
#   `from ray_suite.cairn_names import ...` (Cairn's names).
# - `ray.train.examples.pytorch.torch_linear_example` -> `ray_suite.torch_linear_example`,
#   Ray's example ported by changing its imports only.
# - `ray.train.v2._internal.constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR` -> its value, Ray's
#   variable name; Cairn does not poll worker health, so setting it changes nothing.
# - fixture `ray_start_4_cpus`: no Ray cluster to start; it only yields.
# - skip/xfail/slow marks are applied by conftest.py from port_status.py (the test code
#   itself carries none).
import pytest

from ray_suite import ray_stand_in as ray  # noqa: F401  (upstream imports it)
from ray_suite.cairn_names import ScalingConfig, TorchTrainer
from ray_suite.torch_linear_example import (
    train_func as linear_train_func,
)

HEALTH_CHECK_INTERVAL_S_ENV_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


@pytest.fixture(scope="module")
def ray_start_4_cpus():
    yield


@pytest.fixture(autouse=True)
def reduce_health_check_interval(monkeypatch):
    monkeypatch.setenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, "0.2")
    yield


def test_minimal(ray_start_4_cpus):
    def train_func():
        pass

    trainer = TorchTrainer(train_func)
    trainer.fit()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_torch_linear(ray_start_4_cpus, num_workers):
    def train_func(config):
        result = linear_train_func(config)
        assert len(result) == epochs
        assert result[-1]["loss"] < result[0]["loss"]

    num_workers = num_workers
    epochs = 3
    scaling_config = ScalingConfig(num_workers=num_workers)
    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config=config,
        scaling_config=scaling_config,
    )
    trainer.fit()


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main(["-v", "-x", __file__]))
