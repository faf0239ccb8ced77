"""Helpers for the control-channel tests: a real listener and real worker-side clients."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection, wait
from typing import Any

import pyarrow.fs as pafs

import cairn
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.inbox import NewConnection
from cairn._src.wire.bootstrap import Bootstrap
from cairn._src.worker.main import connect

# Waits below are for events (a connection, a refusal); the bound only stops a broken
# test from hanging on a loaded machine.
EVENT_TIMEOUT_S = 60.0


def bootstrap(channels: WorkerChannels, *, authkey: bytes | None = None,
              certificate: str | None = None, host: str | None = None) -> dict[str, Any]:
    boot = Bootstrap((host or channels.bind_host, channels.port),
                     authkey if authkey is not None else channels.authkey, 0,
                     tls_certificate=certificate if certificate is not None
                     else channels.certificate_pem)
    return boot.body(0)


def connect_worker(channels: WorkerChannels, **options: Any) -> tuple[Connection, Connection]:
    """A worker-side connection, and the controller's side of it once authenticated."""
    worker = connect(bootstrap(channels, **options))
    worker.send(("hello", 0, os.getpid(), 0))
    return worker, next_connection(channels)


def next_connection(channels: WorkerChannels) -> Connection:
    while True:
        item = channels.inbox.next_item()
        if item is not None:
            assert isinstance(item, NewConnection)
            return item.connection
        assert wait([channels.inbox.wake_r], EVENT_TIMEOUT_S), "no connection was accepted"
        channels.inbox.clear_wake()


def node_local_store(uri: str) -> pafs.FileSystem:
    """``nodelocal://path``: a directory under $CAIRN_TEST_NODE_ROOT, which each process
    may set differently, as a path that exists only on the driver's node would be."""
    return pafs.SubTreeFileSystem(os.environ["CAIRN_TEST_NODE_ROOT"], pafs.LocalFileSystem())


def any_local_store(uri: str) -> pafs.FileSystem:
    """``credstore://...``: the local disk, whatever credentials the URI carries."""
    return pafs.LocalFileSystem()


def report_and_checkpoint(config: dict[str, int]) -> int:
    import json
    import tempfile

    context = cairn.get_context()
    for step in range(config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank_{context.get_world_rank()}.json"), "w") as f:
                json.dump(step, f)
            cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(d))
    return context.get_world_size()
