"""The worker's preemption notice (worker/preemption.py's NoticeSource) across the
attachments of a kept process (FailureConfig(keep_survivors=True)): each attempt attaches
its own session's send."""

from __future__ import annotations

from cairn._src.wire.preemption import SIGTERM_SOURCE, PreemptionNoticeMessage
from cairn._src.worker.preemption import NoticeSource


def test_a_notice_held_before_the_session_is_sent_at_attach() -> None:
    notices = NoticeSource(SIGTERM_SOURCE)
    sent: list[object] = []
    notices.deliver(1234)
    assert sent == []
    notices.attach(3, sent.append)
    assert sent == [PreemptionNoticeMessage(3, 1234, SIGTERM_SOURCE)]


def test_a_notice_is_sent_once_per_attachment() -> None:
    notices = NoticeSource(SIGTERM_SOURCE)
    sent: list[object] = []
    notices.attach(0, sent.append)
    notices.deliver(None)
    notices.deliver(None)  # the same node's notice again: nothing new
    notices.deliver(99)
    assert sent == [PreemptionNoticeMessage(0, None, SIGTERM_SOURCE)]


def test_a_notice_sent_in_an_earlier_attempt_is_sent_again_at_the_next_attach() -> None:
    # A kept rank stopped; the notice came while the controller no longer read its old
    # connection (closed unread when the next attempt started): the next attempt's
    # controller learns it through the new connection, once.
    notices = NoticeSource(SIGTERM_SOURCE)
    old: list[object] = []
    new: list[object] = []
    notices.attach(0, old.append)
    notices.deliver(5000)
    assert old == [PreemptionNoticeMessage(0, 5000, SIGTERM_SOURCE)]
    notices.attach(0, new.append)
    notices.deliver(None)  # the signal again: still one notice in this attachment
    assert new == [PreemptionNoticeMessage(0, 5000, SIGTERM_SOURCE)]
    assert len(old) == 1


def test_a_send_that_fails_does_not_lose_the_notice_for_the_next_attach() -> None:
    notices = NoticeSource(SIGTERM_SOURCE)
    later: list[object] = []

    def closed(message: object) -> None:
        raise OSError("the controller closed this connection")

    notices.attach(1, closed)
    notices.deliver(None)
    notices.attach(1, later.append)
    assert later == [PreemptionNoticeMessage(1, None, SIGTERM_SOURCE)]
