"""``enable_reproducibility``: limit the sources of nondeterminism in a training process."""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import torch

from cairn._src.errors import ConfigError, ReportError
from cairn._src.worker.session import get_session

logger = logging.getLogger(__name__)

def _attempt() -> Any:
    """The session of the train function running here, or None outside one."""
    try:
        return get_session("enable_reproducibility")
    except ReportError:
        return None


def enable_reproducibility(seed: int = 0) -> None:
    """Limit sources of nondeterministic behaviour, as Ray Train's function of that name.

    In this process: seeds Python's ``random``, NumPy's global generator (when NumPy is
    installed) and torch (every CUDA device too); makes torch use deterministic
    algorithms (an operation without one then raises); turns cuDNN benchmarking off; and
    sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which deterministic cuBLAS needs, unless it is
    already set. Call it at the top of the train function, before any CUDA work.
    In a train function, ``prepare_data_loader`` called later in the same attempt without
    its own ``seed`` orders data (and seeds DataLoader worker processes) from this seed
    (modulo 2**63).
    Results can still differ across machines and library versions (see PyTorch's notes
    on randomness).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"enable_reproducibility(seed={seed!r}): the seed must be an integer.")
    attempt = _attempt()
    if attempt is not None:  # its worker session: a new one every attempt
        attempt.reproducibility_seed = seed
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
    """The seed given to :func:`enable_reproducibility` by the train function running
    here, in this attempt; None outside a train function or when it gave none. A seed set
    in an earlier attempt, which a process kept for the next attempt
    (``FailureConfig(keep_survivors=True)``) or a local-mode driver still holds, does not
    count: a fresh process would not have it (each attempt has its own session)."""
    attempt = _attempt()
    seed: int | None = getattr(attempt, "reproducibility_seed", None)
    return seed
