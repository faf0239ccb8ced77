"""The lease's fence reads again when a read of the lease does not parse: an object store
may hand back a torn read of the lease this driver is rewriting at that moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn._src.errors import ManifestError
from cairn._src.run import lease as lease_module
from cairn._src.run.lease import RunLease
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.001)


def test_a_torn_read_of_the_lease_is_read_again_and_the_fence_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = RunLease(resolve(str(tmp_path / "run")), RETRY)
    lease.acquire()
    try:
        real = lease_module.read_bytes
        torn = [2]

        def read_bytes(location: object, retry: RetryPolicy) -> bytes:
            data = real(location, retry)  # type: ignore[arg-type]
            if torn[0]:
                torn[0] -= 1
                return data[: len(data) // 2]
            return data

        monkeypatch.setattr(lease_module, "read_bytes", read_bytes)
        lease.fence()  # two torn reads, then the whole lease: still ours
        assert torn == [0]
    finally:
        monkeypatch.undo()
        lease.release()


def test_a_lease_that_stays_malformed_stops_the_fence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = RunLease(resolve(str(tmp_path / "run")), RETRY)
    lease.acquire()
    try:
        monkeypatch.setattr(lease_module, "read_bytes", lambda location, retry: b'{"host": ')
        with pytest.raises(ManifestError, match="is not valid JSON"):
            lease.fence()
    finally:
        monkeypatch.undo()
        lease.release()
