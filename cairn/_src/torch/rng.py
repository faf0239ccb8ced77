"""The random number generators a training step may draw from: capture and restore.

Python's ``random``, NumPy's global generator (when NumPy is installed), torch's CPU
generator and, when CUDA is in use in this process, every CUDA device's generator. The
captured state holds only plain Python values and tensors, so it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

logger = logging.getLogger(__name__)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # numpy is optional: its state is then neither saved nor restored
        return None
    return numpy


def capture_rng_state() -> dict[str, Any]:
    """The state of every generator this process uses, as plain values and tensors."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
        "numpy": None,
        "cuda": None,
    }
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = {"kind": str(kind), "keys": [int(k) for k in keys], "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    # Reading CUDA generators initializes CUDA; a process that never touched it has
    # nothing there to capture.
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every generator back to ``state`` (from :func:`capture_rng_state`)."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    torch.set_rng_state(state["torch"])
    numpy = _numpy()
    saved_numpy = state.get("numpy")
    if numpy is not None and saved_numpy is not None:
        keys = numpy.asarray(saved_numpy["keys"], dtype=numpy.uint32)
        numpy.random.set_state((saved_numpy["kind"], keys, saved_numpy["pos"],
                                saved_numpy["has_gauss"], saved_numpy["cached_gaussian"]))
    cuda = state.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning("The checkpoint holds the RNG state of %d CUDA device(s); this "
                           "process sees %d, so the CUDA generators are not restored", len(cuda),
                           torch.cuda.device_count() if torch.cuda.is_available() else 0)
