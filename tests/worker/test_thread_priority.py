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


def _may_lower_niceness() -> bool:
    allowed: list[bool] = []

    def probe() -> None:
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, current + 1))
        try:
            os.setpriority(os.PRIO_PROCESS, thread, current)
            allowed.append(True)
        except OSError:
            allowed.append(False)

    started = threading.Thread(target=probe)
    started.start()
    started.join()
    return allowed[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness")
def test_a_late_snapshot_write_takes_the_train_loops_priority_until_it_ends() -> None:
    from cairn._src.worker.direct_write import AdaptivePriority

    if not _may_lower_niceness():
        pytest.skip("this process may not lower a thread's niceness (CAP_SYS_NICE)")
    seen: dict[str, int] = {}

    def background() -> None:
        thread = threading.get_native_id()
        lower_thread_priority()
        seen["niced"] = os.getpriority(os.PRIO_PROCESS, thread)
        young = AdaptivePriority(after_s=3600)
        young.check()
        seen["young"] = os.getpriority(os.PRIO_PROCESS, thread)
        late = AdaptivePriority(after_s=0)
        late.check()
        seen["late"] = os.getpriority(os.PRIO_PROCESS, thread)
        late.restore()
        seen["restored"] = os.getpriority(os.PRIO_PROCESS, thread)

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    loop = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert seen["niced"] == seen["young"] == min(19, loop + BACKGROUND_NICENESS)
    assert seen["late"] == loop
    assert seen["restored"] == seen["niced"]
