"""ReportHandle: metric-only handles share one finished event, and stay independent."""

from __future__ import annotations

import threading

import pytest

from cairn._src.worker.report_handle import ReportHandle


def test_metric_only_handles_are_done_and_independent() -> None:
    first, second = (ReportHandle(i, has_checkpoint=False) for i in (1, 2))
    assert first.done() and second.done()
    assert first.wait(0) is None and first.checkpoint is None and first.error is None
    # A refusal resolves one handle: the other, which shares the finished event, is unchanged.
    first._resolve(None, ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        first.wait(0)
    assert second.wait(0) is None and second.error is None
    assert ReportHandle(3, has_checkpoint=False).done()


def test_a_checkpoint_handle_waits_for_its_own_commit() -> None:
    handle = ReportHandle(4, has_checkpoint=True)
    other = ReportHandle(5, has_checkpoint=True)
    assert not handle.done()
    with pytest.raises(TimeoutError, match="report 4 was not committed within 0s"):
        handle.wait(0)
    resolver = threading.Thread(target=handle._resolve, args=(None, None))
    resolver.start()
    assert handle.wait(None) is None and handle.done()
    resolver.join()
    assert not other.done()
