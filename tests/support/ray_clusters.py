"""A Ray instance of a test module's own, on this machine."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator


def own_ray_cluster(num_cpus: int) -> Iterator[None]:
    """Start a Ray instance of its own ("local", never one another process started on
    this machine; on 127.0.0.1, tests/conftest.py), yield, shut it down: a module-scoped
    fixture's body. ``num_cpus``: the logical CPUs Ray's tasks (Ray Data's) may take."""
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="cairn-ray-"))
    yield
    ray.shutdown()
