"""Hugging Face Transformers for Cairn, as ``ray.train.huggingface.transformers``.

``CairnReportCallback`` (also named ``RayTrainReportCallback``) reports every checkpoint a
``transformers.Trainer`` saves, with its logged metrics; ``prepare_trainer`` checks the
Trainer. A Ray script ports by changing
``from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer``
to ``from cairn.huggingface import RayTrainReportCallback, prepare_trainer``; see
docs/integrations.md.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
    import transformers as _transformers  # noqa: F401
except ImportError as _missing:
    raise ImportError(
        "cairn.huggingface needs Hugging Face Transformers and PyTorch: "
        "pip install 'cairn-train[huggingface]'"
    ) from _missing

from cairn._src.integrations.huggingface import (
    CairnReportCallback,
    RayTrainReportCallback,
    prepare_trainer,
)

__all__ = ["CairnReportCallback", "RayTrainReportCallback", "prepare_trainer"]
