"""What the ported Ray Train tests call ``ray``: ``ray.train`` is :mod:`cairn`.

Ray Train's tests write ``import ray`` / ``import ray.train`` and then call
``ray.train.report(...)``, ``ray.train.get_context()``, ``ray.train.collective.barrier()``
or ``ray.cloudpickle.dump(...)`` in their bodies. The ported files replace those import
lines with ``from ray_suite import ray_stand_in as ray`` so that the bodies stay as upstream
wrote them. This is a real module (not a namespace object), so cloudpickle sends train
functions that use it to the worker processes by reference.

Nothing else of Ray is here: a test body that calls ``ray.get`` or ``ray.remote`` needs a
Ray cluster and is marked skip in its ported file.
"""

from __future__ import annotations

import contextlib

import cloudpickle

import cairn
import cairn.torch

# ``ray.train.collective`` is ``cairn.collective`` where Cairn has it; importing it here
# makes the attribute exist on ``cairn`` (a missing module makes the tests that use it
# fail with AttributeError, which their xfail marks name).
with contextlib.suppress(ImportError):
    import cairn.collective

train = cairn

__all__ = ["cloudpickle", "train"]
