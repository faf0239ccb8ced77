# Ported from Ray Train's python/ray/train/v2/tests/test_lightning_integration.py
# (ray-project/ray at commit 09e245dd, the version for Ray 2.60's local mode; Apache
# License 2.0), by changing its imports and Ray-only fixtures. The test bodies are as
# upstream wrote them. Edits:
# - `pytest.importorskip("cairn.lightning")` first: the file skips where Lightning (or
#   torch) is not installed.
# - `from ray.train import ScalingConfig`, `from ray.train.torch import TorchTrainer` ->
#   `from ray_suite.cairn_names import ...` (Cairn's names).
# - `from ray.train.lightning import ...` -> `from cairn.lightning import ...` (the same
#   names).
# - `ray.train.lightning._lightning_utils.import_lightning` and
#   `ray.train.tests.lightning_test_utils` -> `ray_suite.lightning_test_utils`, Ray's
#   helpers ported by changing their imports only.
# - `ray.train.v2._internal.constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR` -> its value, Ray's
#   variable name; Cairn does not poll worker health, so setting it changes nothing.
# - fixture `ray_start_4_cpus` comes from conftest.py (no Ray cluster).
# - skip/xfail/slow marks are applied by conftest.py from port_status.py (the test code
#   itself carries none).
# ruff: noqa: I001  (imports after importorskip, in upstream's order)
import pytest

pytest.importorskip("cairn.lightning", exc_type=ImportError)

from ray_suite.cairn_names import ScalingConfig
from cairn.lightning import (
    RayDDPStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
)
from ray_suite.lightning_test_utils import import_lightning
from ray_suite.lightning_test_utils import DummyDataModule, LinearModule
from ray_suite.cairn_names import TorchTrainer

HEALTH_CHECK_INTERVAL_S_ENV_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"

pl = import_lightning()


@pytest.fixture(autouse=True)
def reduce_health_check_interval(monkeypatch):
    monkeypatch.setenv(HEALTH_CHECK_INTERVAL_S_ENV_VAR, "0.2")
    yield


@pytest.mark.parametrize("strategy_name", ["ddp", "fsdp"])
@pytest.mark.parametrize("accelerator", ["cpu"])
# @pytest.mark.parametrize("accelerator", ["cpu", "gpu"])  # TODO: Enable GPU test
@pytest.mark.parametrize("datasource", ["dataloader", "datamodule"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_trainer_with_native_dataloader_for_distributed_and_local_mode(
    ray_start_4_cpus, strategy_name, accelerator, datasource, num_workers
):
    """Test basic ddp and fsdp training with dataloader and datamodule."""

    if accelerator == "cpu" and strategy_name == "fsdp":
        return

    num_epochs = 1
    batch_size = 8
    dataset_size = 256
    dataset_shard_size = num_workers if num_workers > 0 else 1

    strategy_map = {"ddp": RayDDPStrategy(), "fsdp": RayFSDPStrategy()}

    def train_loop():
        model = LinearModule(input_dim=32, output_dim=4, strategy=strategy_name)

        strategy = strategy_map[strategy_name]

        trainer = pl.Trainer(
            max_epochs=num_epochs,
            devices="auto",
            accelerator=accelerator,
            strategy=strategy,
            plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()],
        )

        datamodule = DummyDataModule(batch_size, dataset_size)

        if datasource == "dataloader":
            trainer.fit(
                model,
                train_dataloaders=datamodule.train_dataloader(),
                val_dataloaders=datamodule.val_dataloader(),
            )
        if datasource == "datamodule":
            trainer.fit(model, datamodule=datamodule)

    trainer = TorchTrainer(
        train_loop_per_worker=train_loop,
        scaling_config=ScalingConfig(
            num_workers=num_workers, use_gpu=(accelerator == "gpu")
        ),
    )

    results = trainer.fit()
    assert results.metrics["epoch"] == num_epochs - 1
    assert (
        results.metrics["step"]
        == num_epochs * dataset_size / dataset_shard_size / batch_size
    )
    assert "loss" in results.metrics
    assert "val_loss" in results.metrics


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main(["-v", "-x", __file__]))
