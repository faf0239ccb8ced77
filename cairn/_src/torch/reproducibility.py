"""``enable_reproducibility``: limit the sources of nondeterminism in a training process."""

from __future__ import annotations

import logging
import os
import random

import torch

from cairn._src.errors import ConfigError

logger = logging.getLogger(__name__)

_seed: int | None = None


def enable_reproducibility(seed: int = 0) -> None:
    """Limit sources of nondeterministic behaviour, as Ray Train's function of that name.

    In this process: seeds Python's ``random``, NumPy's global generator (when NumPy is
    installed) and torch (every CUDA device too); makes torch use deterministic
    algorithms (an operation without one then raises); turns cuDNN benchmarking off; and
    sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which deterministic cuBLAS needs, unless it is
    already set. Call it at the top of the train function, before any CUDA work.
    ``prepare_data_loader`` orders data from its own ``seed`` argument, whatever this one.
    Results can still differ across machines and library versions (see PyTorch's notes
    on randomness).
    """
    global _seed
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"enable_reproducibility(seed={seed!r}): the seed must be an integer.")
    _seed = seed
    random.seed(seed)
    try:
        import numpy
    except ImportError:  # numpy is optional
        pass
    else:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds every CUDA device as well
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # cuBLAS is deterministic only with a fixed workspace; torch raises otherwise. The
    # variable must be set before the first cuBLAS call, hence here.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    logger.info("Reproducibility enabled with seed %d", seed)


def reproducibility_seed() -> int | None:
    """The seed given to :func:`enable_reproducibility` in this process, or None."""
    return _seed
