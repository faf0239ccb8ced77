"""The worker's side of preemption: noticing that its node is about to be reclaimed, and
``get_preemption_info()``.

A *notice source* learns that this worker's node is going away and sends the controller
one :class:`PreemptionNoticeMessage` (once: a second notice of the same node says
nothing new; a kept rank's next attempt gets it again, see :class:`NoticeSource`). Two
sources exist:

* :class:`SigtermNotice` (local backend): ``SIGTERM`` to the worker process is the notice,
  the signal a cloud VM's shutdown, Kubernetes and Slurm send before they kill. The
  handler only writes a byte to a pipe; the ``cairn-preemption`` thread sends the
  message, so the handler never takes a lock the interrupted main thread may hold. The
  handler runs when the main thread next executes Python code (a long native call delays
  it). Forked children (data loader workers) get the default action back, and once the
  train function is done the default action returns too.
* ``backends/ray_drain.py`` (Ray backend): a drain of the worker's node.

The controller answers every rank with a :class:`PreemptionMessage`;
:class:`WorkerPreemption` keeps it, and ``get_preemption_info()`` hands it out through a
broadcast from rank 0, so every rank gets the same answer at the same call (Ray Train
2.60's contract: call it the same number of times on every rank).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from cairn._src.wire.preemption import (
    SIGTERM_SOURCE,
    PreemptionInfo,
    PreemptionMessage,
    PreemptionNoticeMessage,
)

logger = logging.getLogger(__name__)


class NoticeSource:
    """Sends the controller one notice through each session it is attached to (a notice
    that comes before the first is held until then). Thread-safe.

    A kept rank (``keep_survivors``) attaches each attempt's session in turn. A notice
    sent through an earlier one may never have been read: the controller stops reading a
    stopped rank's connection and closes it unread when the next attempt starts, and its
    preemption state is per attempt. It never keeps a rank whose notice it read, so a
    later attach means it did not act on it: the notice goes again through the new one."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._lock = threading.Lock()
        self._send: Callable[[object], None] | None = None
        self._rank = -1
        # (deadline_ms,) of the notice; None: none came.
        self._notice: tuple[int | None] | None = None

    def attach(self, rank: int, send: Callable[[object], None]) -> None:
        """A session exists: send the notice that came so far, and a later one at once."""
        with self._lock:
            self._rank, self._send = rank, send
            notice = self._notice
        if notice is not None:
            self._tell(send, rank, notice[0])

    def detach(self) -> None:
        """The attached session ended: a notice is held until the next attach (and the
        source keeps no reference to the session)."""
        with self._lock:
            self._send = None

    def deliver(self, deadline_ms: int | None) -> None:
        with self._lock:
            if self._notice is not None:
                return  # a second notice of the same node says nothing new
            self._notice = (deadline_ms,)
            send, rank = self._send, self._rank
        if send is not None:
            self._tell(send, rank, deadline_ms)

    def _tell(self, send: Callable[[object], None], rank: int,
              deadline_ms: int | None) -> None:
        logger.info("Rank %d: preemption notice (%s); telling the controller", rank,
                    self._source)
        try:
            send(PreemptionNoticeMessage(rank, deadline_ms, self._source))
        except (OSError, ValueError) as exc:  # the controller is gone: nobody to tell
            logger.debug("Could not send the preemption notice: %s", exc)

    def close(self) -> None:
        """The train function is done: stop noticing."""


class SigtermNotice(NoticeSource):
    """``SIGTERM`` is the notice (installed on the worker's main thread, before it reads
    its bootstrap)."""

    def __init__(self) -> None:
        super().__init__(SIGTERM_SOURCE)
        self._pid = os.getpid()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._closed = False
        self._masks = threading.local()  # each forking thread's signal mask before the fork
        self._previous: Any = signal.signal(signal.SIGTERM, self._on_signal)
        # A forked child (a data loader worker) is not the worker: SIGTERM ends it. The
        # signal stays blocked across the fork, so one sent to the child before it restored
        # the default action is not lost (Python drops the signals it caught before).
        os.register_at_fork(before=self._block, after_in_parent=self._unblock,
                            after_in_child=self._in_child)
        threading.Thread(target=self._wait, name="cairn-preemption", daemon=True).start()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        try:
            os.write(self._write_fd, b"T")
        except OSError:
            pass  # the pipe is full: a notice is already on its way

    def _block(self) -> None:
        self._masks.previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def _unblock(self) -> None:
        # The forking thread's own mask again (it may have blocked SIGTERM itself).
        previous = getattr(self._masks, "previous", None)
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        else:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def _in_child(self) -> None:
        if not self._closed and os.getpid() != self._pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._unblock()

    def _wait(self) -> None:
        try:
            data = os.read(self._read_fd, 64)
        except OSError:
            return
        if data:
            self.deliver(None)

    def close(self) -> None:
        """The default action again: a later SIGTERM (the backend stopping a finished
        worker) ends the process at once. Main thread only."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)


class WorkerPreemption:
    """What the controller said about a preemption (the receiver thread writes, the train
    function reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._info: PreemptionInfo | None = None

    def on_message(self, message: PreemptionMessage) -> None:
        with self._lock:
            self._info = message.info

    @property
    def local_info(self) -> PreemptionInfo | None:
        with self._lock:
            return self._info
