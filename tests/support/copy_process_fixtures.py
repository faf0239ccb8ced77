"""A pytest fixture shared by the tests of the small-file copy processes."""

from __future__ import annotations

import pytest

from cairn._src.storage import batch


@pytest.fixture
def few_files_a_share(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lowers the share threshold to 4 files (on 4 cores, whatever this machine has) and
    counts the copy processes started."""
    monkeypatch.setattr(batch, "MIN_SHARE_FILES", 4)
    monkeypatch.setattr(batch, "_cores", lambda: 4)
    monkeypatch.setattr(batch, "_copy_processes_failed", False)
    started: list[int] = []
    real = batch._CopyProcess.start

    def counting(self: batch._CopyProcess, interpreter: str) -> None:
        started.append(1)
        real(self, interpreter)

    monkeypatch.setattr(batch._CopyProcess, "start", counting)
    return started
