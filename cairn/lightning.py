"""Lightning for Cairn, with the names of ``ray.train.lightning``.

``RayTrainReportCallback`` (also ``CairnReportCallback``) reports a checkpoint at every
train epoch end; ``RayDDPStrategy`` / ``RayFSDPStrategy`` / ``RayDeepSpeedStrategy`` and
``RayLightningEnvironment`` (also ``Cairn*``) run Lightning on the process group of
:class:`cairn.torch.TorchTrainer`; ``prepare_trainer`` checks the Trainer. Imports
``lightning.pytorch``, or ``pytorch_lightning`` where only that is installed. A Ray script
ports by changing ``ray.train.lightning`` to ``cairn.lightning``; see docs/integrations.md.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401

    try:
        import lightning.pytorch as _lightning
    except ModuleNotFoundError:
        import pytorch_lightning as _lightning  # type: ignore[no-redef]  # noqa: F401
except ImportError as _missing:
    raise ImportError(
        "cairn.lightning needs Lightning and PyTorch: pip install 'cairn-train[lightning]'"
    ) from _missing

from cairn._src.integrations.lightning import (
    CairnDDPStrategy,
    CairnDeepSpeedStrategy,
    CairnFSDPStrategy,
    CairnLightningEnvironment,
    CairnReportCallback,
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)

__all__ = [
    "CairnDDPStrategy",
    "CairnDeepSpeedStrategy",
    "CairnFSDPStrategy",
    "CairnLightningEnvironment",
    "CairnReportCallback",
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]
