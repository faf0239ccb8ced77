"""ReportHandle.wait(timeout): every timeout a user may pass is a deadline or a clear
error, never a failure from deep inside ``threading``."""

from __future__ import annotations

import math
import threading

import pytest

from cairn._src.errors import ReportError
from cairn._src.worker.report_handle import ReportHandle


def test_an_infinite_timeout_waits_without_a_deadline() -> None:
    # (It raised OverflowError from inside threading when the handle was pending.)
    handle = ReportHandle(7, has_checkpoint=True)
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(handle.wait(math.inf))
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    handle._resolve(None, None)  # before or while it waits: it ends with the outcome
    waiter.join(30)
    assert outcome == [None]


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True, [1]])
def test_a_timeout_that_is_not_seconds_is_refused_naming_it(timeout: object) -> None:
    handle = ReportHandle(8, has_checkpoint=True)
    with pytest.raises(ReportError, match=r"wait\(timeout=.*\) must be None .* >= 0"):
        handle.wait(timeout)  # type: ignore[arg-type]
