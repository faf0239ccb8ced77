"""What the Ray backend sets in a worker's environment (no cluster needed)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray")

from cairn import ScalingConfig
from cairn._src.backends.ray import RayBackend


def test_a_pythonpath_in_worker_env_stays_in_the_actors_pythonpath() -> None:
    # The actor sets PYTHONPATH for the processes it starts: the worker_env's entries come
    # first, then the driver's sys.path.
    backend = RayBackend(ScalingConfig(backend="ray"), env={"PYTHONPATH": "/opt/library"})
    env = backend._base_env(1, None, ["/driver/code"])
    assert env["PYTHONPATH"] == os.pathsep.join(["/opt/library", "/driver/code"])


def test_without_a_pythonpath_in_worker_env_the_actor_gets_the_drivers_path() -> None:
    env = RayBackend(ScalingConfig(backend="ray"))._base_env(1, None, ["/a", "/b"])
    assert env["PYTHONPATH"] == os.pathsep.join(["/a", "/b"])
