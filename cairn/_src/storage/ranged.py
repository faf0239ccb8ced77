"""Parallel ranged reads of large remote files, delivered in order as one stream.

A :class:`Fetcher` belongs to one transfer (a download or a verification of a directory)
and owns its fetch threads and its budget: at most ``max_concurrency`` parts are requested,
waiting, or being consumed at any time, across every file of the transfer, so the parts
held in memory never exceed ``max_concurrency * part_size`` however many large files
there are.

:meth:`Fetcher.stream` wraps a random-access file in a reader with ``readinto``: it keeps
requesting the next parts while the caller consumes the current one, so the caller hashes
and writes the bytes in file order (one streaming checksum, one sequential write) while
the requests overlap. Its last request asks for one byte more than the stored size: an
object that grew since it was listed then reads as longer, as a plain stream would show.

Closing a reader (done, failed or cancelled) stops its parts that have not started, tells
those running not to try again, and waits for them: the file is never closed under a
read in flight.

Each part is retried on its own per the transfer's :class:`RetryPolicy` (a timed-out
range costs one range again, not the whole file); a part that still fails raises from
``readinto``, and the caller's retry of the whole file takes over.

No deadlock: a reader waits only for its own requested parts (which the fetch threads,
as many as the budget, always complete) or, holding no part, for budget that another
reader holds only for parts it is about to consume.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from cairn._src.storage.checksum import TransferCancelled
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy, call_with_retry
from cairn._src.storage.tuning import TransferConfig


class Fetcher:
    """The fetch threads and the part budget of one transfer; use as a context manager."""

    def __init__(self, config: TransferConfig, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.config = config
        self.retry = retry
        self._budget = threading.BoundedSemaphore(config.max_concurrency)
        self._pool = ThreadPoolExecutor(config.max_concurrency,
                                        thread_name_prefix="cairn-ranged")

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the fetch threads once the requests in flight are done."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wants(self, size: int) -> bool:
        """Whether a file of ``size`` bytes is read in parallel parts."""
        return self.config.reads_in_parts(size)

    def stream(self, file: Any, size: int, what: str = "ranged read") -> RangedReader:
        """A reader of the ``size`` bytes of ``file`` (``read_at``), in parallel parts;
        ``what`` names the file in retry logs (no credentials)."""
        return RangedReader(file, size, self.config.part_size, self._budget, self._pool,
                            self.retry, what)


class RangedReader:
    """``readinto`` over a file fetched in parts ahead of the caller. Not thread-safe."""

    def __init__(self, file: Any, size: int, part_size: int,
                 budget: threading.BoundedSemaphore, pool: ThreadPoolExecutor,
                 retry: RetryPolicy = DEFAULT_RETRY, what: str = "ranged read") -> None:
        self._file = file
        self._retry = retry
        self._what = what
        self._end = size + 1  # One byte past the stored size: growth shows.
        self._part = part_size
        self._budget = budget
        self._pool = pool
        self._next_offset = 0
        self._pending: deque[Future[bytes]] = deque()
        self._current = memoryview(b"")
        self._holding = False  # Whether the part in _current still holds its budget.
        self._closed = False
        self._finished = False  # A part came back short: the file ends there.

    def _fetch(self, offset: int, length: int) -> bytes:
        return call_with_retry(lambda: self._read(offset, length), self._retry,
                               what=f"{self._what}, bytes {offset}-{offset + length - 1}")

    def _read(self, offset: int, length: int) -> bytes:
        if self._closed:
            raise TransferCancelled(f"{self._what}: the reader was closed")
        data = bytes(self._file.read_at(length, offset))
        if len(data) > length:
            raise OSError(f"{self._what}: asked for {length} bytes at offset {offset}, the "
                          f"store returned {len(data)}")
        return data

    def _request(self) -> None:
        length = min(self._part, self._end - self._next_offset)
        try:
            future = self._pool.submit(self._fetch, self._next_offset, length)
        except BaseException:
            self._budget.release()
            raise
        self._pending.append(future)
        self._next_offset += length

    def _top_up(self) -> None:
        while self._next_offset < self._end and not self._finished:
            if self._pending:
                if not self._budget.acquire(blocking=False):
                    return
            else:
                self._budget.acquire()
            self._request()

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            if not self._current:
                self._let_go()
                if self._finished:
                    break
                self._top_up()
                if not self._pending:
                    break
                future = self._pending.popleft()
                try:
                    data = future.result()
                except BaseException:
                    if future.done():
                        self._budget.release()
                    else:  # Interrupted while it runs: close() waits for it.
                        self._pending.appendleft(future)
                    raise
                self._holding = True
                if len(data) < self._part:
                    # Short (the last part, or the object shrank): nothing follows.
                    self._finished = True
                self._current = memoryview(data)
                if not data:
                    break
            count = min(len(view) - filled, len(self._current))
            view[filled:filled + count] = self._current[:count]
            self._current = self._current[count:]
            filled += count
        return filled

    def _let_go(self) -> None:
        if self._holding:
            self._holding = False
            self._budget.release()

    def close(self) -> None:
        """Stop the parts not started, wait for those running (the caller closes the file
        next), and give back the budget of every part not consumed."""
        self._closed = True
        self._current = memoryview(b"")
        self._let_go()
        running = [future for future in self._pending if not future.cancel()]
        wait(running)
        for _ in self._pending:
            self._budget.release()
        self._pending.clear()

    def __enter__(self) -> RangedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
