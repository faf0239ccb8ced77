"""Background upload threads run at a lower CPU priority than the train loop, and the
threads they start (a transfer's pool) inherit it."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from cairn._src.worker.session import BACKGROUND_NICENESS, lower_thread_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness")
def test_the_calling_thread_and_its_children_get_lower_priority() -> None:
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def background() -> None:
        before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        lower_thread_priority()
        seen["before"] = before
        seen["after"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        started = threading.Thread(target=child)
        started.start()
        started.join()

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen["after"] == min(19, seen["before"] + BACKGROUND_NICENESS)
    assert seen["child"] == seen["after"]
    # The caller's own priority is untouched.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == seen["before"]
