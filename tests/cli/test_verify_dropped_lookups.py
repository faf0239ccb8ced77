"""``cairn verify``'s list of checkpoints a resume dropped as damaged looks each name up
on storage once, however often the event log (read from storage: it may be damaged or
planted) repeats it, and takes the first reason logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli import show
from cairn._src.run.events import CheckpointDropped
from cairn._src.storage.location import resolve


def test_a_name_the_log_repeats_is_looked_up_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "checkpoint_000002").mkdir()
    events = [CheckpointDropped(t=float(i), dir_name=name, reason=f"reason {i}")
              for i, name in enumerate(["checkpoint_000001", "checkpoint_000002"] * 500)]
    monkeypatch.setattr(show, "read_events", lambda *args: iter(events))
    looked: list[str] = []
    real_is_dir = show.is_dir

    def counting_is_dir(location: Any, retry: Any) -> bool:
        looked.append(location.path)
        return real_is_dir(location, retry)

    monkeypatch.setattr(show, "is_dir", counting_is_dir)
    dropped = show.dropped_on_storage(resolve(str(tmp_path)))
    assert dropped == {"checkpoint_000002": "reason 1"}  # 000001 is not on storage
    assert sorted(looked) == [str(tmp_path / "checkpoint_000001"),
                              str(tmp_path / "checkpoint_000002")]
