"""The driver's live view of a run: step and metrics, uploads, commits, restarts, goodput.

``RunConfig(progress=...)`` picks the level: 0 shows nothing, 1 a status line and the
notices (which run ``fit()`` starts or continues and from where, why a failure ends the
run and what to do), 2 also one line per event (commit, skipped upload, failure, restart,
finished validation); ``None`` reads ``CAIRN_PROGRESS``, else 1. On a terminal
(``sys.stderr.isatty()``) the status is redrawn in place with :class:`rich.live.Live`, at
most :data:`TTY_REFRESH_S` apart;
elsewhere one plain line goes to stderr every ``CAIRN_PROGRESS_INTERVAL`` seconds
(:data:`DEFAULT_INTERVAL_S` by default) and once more when ``fit()`` ends.

Threads. The controller calls the ``on_*`` hooks on its own thread; they only update
in-memory state under the view's own lock (never held during I/O) and queue event lines.
All printing happens on one named thread, ``cairn-live-view``, so a slow terminal never
delays the controller. :meth:`LiveView.stop` joins it and restores the terminal; it is
safe to call more than once and after a failed :meth:`LiveView.start`.

While the in-place view runs, ``sys.stdout`` and ``sys.stderr`` (those that are terminals)
are replaced by streams that print whole lines through the view's console, above the
status, so worker output forwarded to the driver (``log_to_driver``, which writes to
``sys.stdout.buffer``) never tears the display. A stream object taken before the view
started (a logging handler configured earlier) still writes to the terminal directly.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from cairn._src.errors import ConfigError
from cairn._src.observe.driver_events import (
    AttemptFailed,
    CheckpointCommitted,
    CommitFailed,
    Notice,
    Reported,
    Uploaded,
    UploadFailed,
)
from cairn._src.observe.live_state import LiveState
from cairn._src.observe.observer import ObservedEvent
from cairn._src.run.events import AttemptStart, Blocked, TrainEnd, TrainStart

PROGRESS_ENV = "CAIRN_PROGRESS"
INTERVAL_ENV = "CAIRN_PROGRESS_INTERVAL"
# Seconds between two plain status lines when stderr is not a terminal.
DEFAULT_INTERVAL_S = 30.0
# Seconds between two redraws of the in-place view.
TTY_REFRESH_S = 0.25


# --- settings ------------------------------------------------------------------------------


def progress_level(configured: int | None, environ: Mapping[str, str] | None = None) -> int:
    """The level to use: ``RunConfig.progress`` when set, else ``CAIRN_PROGRESS``, else 1."""
    if configured is not None:
        return configured
    text = (os.environ if environ is None else environ).get(PROGRESS_ENV)
    if text is None or not text.strip():
        return 1
    if text.strip() not in ("0", "1", "2"):
        raise ConfigError(
            f"{PROGRESS_ENV}={text!r} is not accepted: use 0 (no live view), 1 (a status "
            "line) or 2 (a status line and a line per event); RunConfig(progress=...) "
            "overrides it."
        )
    return int(text)


def progress_interval(environ: Mapping[str, str] | None = None) -> float:
    """Seconds between plain status lines: ``CAIRN_PROGRESS_INTERVAL``, else 30."""
    text = (os.environ if environ is None else environ).get(INTERVAL_ENV)
    if text is None or not text.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(
            f"{INTERVAL_ENV}={text!r} is not accepted: use a number of seconds greater "
            f"than 0 (default {DEFAULT_INTERVAL_S:g})."
        )
    return value


# --- output --------------------------------------------------------------------------------


class _ConsoleLines(io.TextIOBase):
    """A text stream that prints whole lines through a rich console (above a live
    display); once deactivated it writes to the stream it replaced."""

    def __init__(self, console: Any, original: IO[str]) -> None:
        self._console = console
        self._original = original
        self._partial = ""
        self._lock = threading.Lock()
        self.active = True
        self.buffer = _ConsoleBytes(self)

    def write(self, text: str) -> int:
        if not self.active:
            return self._original.write(text)
        with self._lock:
            text_all = self._partial + text
            *lines, self._partial = text_all.split("\n")
        if lines:
            self._print(lines)
        return len(text)

    def _print(self, lines: list[str]) -> None:
        from rich.text import Text

        self._console.print(Text("\n").join(Text.from_ansi(line) for line in lines),
                            soft_wrap=True)

    def flush(self) -> None:
        if not self.active:
            self._original.flush()

    def drain(self) -> None:
        with self._lock:
            partial, self._partial = self._partial, ""
        if partial:
            self._print([partial])

    def isatty(self) -> bool:
        return bool(self._original.isatty())

    def fileno(self) -> int:
        return self._original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", None) or "utf-8"

    def writable(self) -> bool:
        return True


class _ConsoleBytes:
    """``.buffer`` of :class:`_ConsoleLines`: bytes are decoded and printed the same way."""

    def __init__(self, lines: _ConsoleLines) -> None:
        self._lines = lines

    def write(self, data: bytes) -> int:
        if not self._lines.active:
            original = getattr(self._lines._original, "buffer", None)
            if original is not None:
                written: int = original.write(data)
                return written
        self._lines.write(bytes(data).decode(errors="replace"))
        return len(data)

    def flush(self) -> None:
        self._lines.flush()


def _route_handlers(proxies: Mapping[int, _ConsoleLines]) -> list[
        tuple[logging.StreamHandler[Any], Any, _ConsoleLines]]:
    """Point every logging handler that writes to a stream the view replaced (by
    ``id``; ``sys.__stderr__`` too when it is that stream's file) at the stream's proxy,
    so its records print whole above the view instead of over it. Returns (handler, its
    stream, the proxy), to undo it."""
    if not proxies:
        return []
    by_fd: dict[int, _ConsoleLines] = {}
    for each in proxies.values():
        try:
            by_fd[each.fileno()] = each
        except (OSError, ValueError):
            pass
    loggers: list[Any] = [logging.getLogger()]
    loggers += [value for value in list(logging.Logger.manager.loggerDict.values())
                if isinstance(value, logging.Logger)]
    routed: list[tuple[logging.StreamHandler[Any], Any, _ConsoleLines]] = []
    for logger_ in loggers:
        for handler in list(logger_.handlers):
            if not isinstance(handler, logging.StreamHandler) or isinstance(
                    handler, logging.FileHandler):
                continue
            stream = handler.stream
            proxy: _ConsoleLines | None = proxies.get(id(stream))
            if proxy is None and stream in (sys.__stderr__, sys.__stdout__):
                try:
                    proxy = by_fd.get(stream.fileno())
                except (OSError, ValueError, AttributeError):
                    proxy = None
            if proxy is None or any(h is handler for h, _, _ in routed):
                continue
            handler.setStream(proxy)
            routed.append((handler, stream, proxy))
    return routed


_STOP = object()


class LiveView:
    """The live view of one ``fit()`` call (see the module docstring).

    ``console``: the :class:`rich.console.Console` to draw on (tests pass one with
    ``force_terminal=True`` over a ``StringIO``); by default one over ``sys.stderr``.
    ``interactive``: draw in place (default: whether the console is a terminal).
    ``redirect_streams``: route ``sys.stdout``/``sys.stderr`` through the console while
    drawing in place (default: those that are terminals). ``plain_file``: where plain
    lines go when not interactive (default: ``sys.stderr`` at the time of writing).
    """

    def __init__(self, level: int, num_workers: int, *, interval_s: float = DEFAULT_INTERVAL_S,
                 console: Any = None, interactive: bool | None = None,
                 redirect_streams: bool | None = None, plain_file: IO[str] | None = None,
                 earlier_events: Iterable[object] = (),
                 validation_status: Callable[[str], Any] | None = None,
                 upload_failure_policy: str = "fail",
                 clock: Callable[[], float] = time.time) -> None:
        if level not in (0, 1, 2):
            raise ConfigError(f"level={level!r} must be 0, 1 or 2.")
        self.level = level
        self._clock = clock
        self._interval_s = interval_s
        self._console = console
        self._interactive = interactive
        self._redirect = redirect_streams
        self._plain_file = plain_file
        self.validation_status = validation_status
        self._lock = threading.Lock()
        self._state = LiveState(num_workers, started_at=clock(), earlier_events=earlier_events,
                                upload_failure_policy=upload_failure_policy)
        self._lines: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._live: Any = None
        self._swapped: list[tuple[str, IO[str], _ConsoleLines]] = []
        # Logging handlers configured before the view (logging.basicConfig) that write to a
        # swapped stream: they write through its proxy while the view runs.
        self._handlers: list[tuple[logging.StreamHandler[Any], Any, _ConsoleLines]] = []
        self._stopped = False

    @classmethod
    def for_run(cls, run_config: Any, num_workers: int, **options: Any) -> LiveView:
        """The view ``run_config.progress`` (or ``CAIRN_PROGRESS``) asks for; raises
        :class:`ConfigError` for a bad environment value, before anything starts."""
        level = progress_level(run_config.progress)
        interval = progress_interval() if level else DEFAULT_INTERVAL_S
        policy = run_config.checkpoint_config.upload_failure_policy
        return cls(level, num_workers, interval_s=interval, upload_failure_policy=policy,
                   **options)

    @property
    def enabled(self) -> bool:
        return self.level > 0

    def follow(self, earlier_events: Iterable[object],
               validation_status: Callable[[str], Any] | None) -> None:
        """Count the run's earlier sessions in goodput, and report finished validations
        (``validation_status(dir_name)`` is polled from the view's thread)."""
        if not self.enabled:
            return
        with self._lock:
            self._state = LiveState(self._state.num_workers, started_at=self._clock(),
                                    earlier_events=earlier_events,
                                    upload_failure_policy=self._state.upload_failure_policy)
        self.validation_status = validation_status

    # --- hooks (controller thread; quick, no I/O) ----------------------------------------

    def _apply(self, method: str, *args: Any) -> None:
        if not self.enabled or self._stopped:
            return
        with self._lock:
            lines: list[str] = getattr(self._state, method)(*args)
        if self.level >= 2:
            for line in lines:
                self._lines.put(line)

    def notify(self, event: ObservedEvent) -> None:
        """An event of the run (the :class:`~.observer.Observer` protocol): the ones the
        view shows update its state; the others are ignored. Quick, no I/O."""
        if not self.enabled:
            return
        if isinstance(event, Reported):
            message = event.message
            intent = message.checkpoint
            by_reference = intent is not None and (intent.reference is not None
                                                   or intent.mode == "NO_UPLOAD")
            self._apply("on_report", message.rank, message.index, message.metrics,
                        dict(intent.files) if intent is not None else None, by_reference)
        elif isinstance(event, Uploaded):
            uploaded = event.message
            self._apply("on_uploaded", uploaded.rank, uploaded.index, uploaded.bytes_written,
                        uploaded.seconds)
        elif isinstance(event, UploadFailed):
            failed = event.message
            self._apply("on_upload_failed", failed.rank, failed.index, failed.error)
        elif isinstance(event, TrainStart):
            self._apply("on_train_start", event.t)
        elif isinstance(event, TrainEnd):
            self._apply("on_train_end", event.t)
        elif isinstance(event, Blocked):
            self._apply("on_blocked", event.rank, event.seconds, event.t)
        elif isinstance(event, AttemptStart):
            self._apply("on_attempt_start", event.attempt, event.t, event.resume)
        elif isinstance(event, CheckpointCommitted):
            ready = event.ready
            self._apply("on_committed", ready.index, event.view.dir_name, ready.bytes_uploaded,
                        event.seconds, self._clock(), ready.validation is not None)
        elif isinstance(event, CommitFailed):
            self._apply("on_commit_failed", event.ready.index, str(event.error))
        elif isinstance(event, AttemptFailed):
            record = event.record
            self._apply("on_failure", record.attempt, self._clock(), event.reason,
                        record.last_commit_t, record.counted)
        elif isinstance(event, Notice):
            self.notice(event.line)

    def notice(self, line: str) -> None:
        """A line every enabled level prints (which run starts, why the run gives up)."""
        if self.enabled and not self._stopped:
            self._lines.put(line)

    # --- reading (any thread) ------------------------------------------------------------

    def status_line(self) -> str:
        with self._lock:
            return self._state.status_line(self._clock())

    def rows(self) -> list[tuple[str, str]]:
        with self._lock:
            return self._state.rows(self._clock())

    # --- drawing -------------------------------------------------------------------------

    def start(self) -> None:
        """Start drawing (no-op at level 0)."""
        if not self.enabled or self._thread is not None:
            return
        interactive = self._interactive
        if interactive is None:
            interactive = (self._console.is_terminal if self._console is not None
                           else sys.stderr.isatty())
        if interactive:
            self._start_live()
        self._thread = threading.Thread(target=self._run, args=(bool(interactive),),
                                        name="cairn-live-view", daemon=True)
        self._thread.start()

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live

        if self._console is None:
            # Bound to the stream object itself: sys.stderr is replaced below.
            self._console = Console(file=sys.stderr)
        self._live = Live(self._renderable(), console=self._console, auto_refresh=False,
                          redirect_stdout=False, redirect_stderr=False, transient=False)
        self._live.start()
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            redirect = self._redirect
            if redirect is None:
                try:
                    redirect = bool(current.isatty())
                except (AttributeError, ValueError):
                    redirect = False
            if redirect:
                proxy = _ConsoleLines(self._console, current)
                setattr(sys, name, proxy)
                self._swapped.append((name, current, proxy))
        self._handlers = _route_handlers({id(original): proxy
                                          for _, original, proxy in self._swapped})

    def _renderable(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column(overflow="ellipsis")
        for label, value in self.rows():
            # Text, not markup: a failure reason ("[rank 0] ...", a path in brackets) or a
            # metric name is the user's, shown as written.
            table.add_row(Text(label), Text(value))
        return table

    def _run(self, interactive: bool) -> None:
        period = TTY_REFRESH_S if interactive else min(self._interval_s, TTY_REFRESH_S)
        next_status = time.monotonic() + self._interval_s
        while True:
            try:
                item = self._lines.get(timeout=period)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if item is not None:
                    self._print_event(str(item), interactive)
                self._poll_validations()
                if interactive:
                    self._live.update(self._renderable(), refresh=True)
                elif time.monotonic() >= next_status:
                    self._write_plain(self.status_line())
                    next_status = time.monotonic() + self._interval_s
            except Exception:  # a broken terminal must never break the run
                continue

    def _poll_validations(self) -> None:
        status = self.validation_status
        if status is None:
            return
        with self._lock:
            names = self._state.pending_validations()
        for name in names:
            value = status(name)
            text = str(getattr(value, "value", value))
            if text != "PENDING_VALIDATION":
                self._apply("on_validation_finished", name, text, self._clock())

    def _print_event(self, line: str, interactive: bool) -> None:
        if interactive:
            from rich.text import Text

            self._console.print(Text(f"cairn: {line}"), soft_wrap=True)
        else:
            self._write_plain(f"cairn: {line}")

    def _write_plain(self, line: str) -> None:
        out = self._plain_file or sys.stderr
        out.write(line + "\n")
        out.flush()

    def stop(self) -> None:
        """Stop drawing: print what is queued and the final status, restore the streams.
        Idempotent; never raises for a broken terminal."""
        if self._stopped:
            return
        self._stopped = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._lines.put(_STOP)
        thread.join()
        interactive = self._live is not None
        try:
            self._poll_validations_once()
            while True:
                try:
                    item = self._lines.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    self._print_event(str(item), interactive)
            for _, _, proxy in self._swapped:
                proxy.drain()
            if interactive:
                self._live.update(self._renderable(), refresh=True)
            else:
                self._write_plain(self.status_line())
        except Exception:
            pass
        finally:
            for handler, stream, proxy in self._handlers:
                if handler.stream is proxy:
                    handler.setStream(stream)
            self._handlers.clear()
            for name, original, proxy in reversed(self._swapped):
                proxy.active = False
                if getattr(sys, name) is proxy:
                    setattr(sys, name, original)
            self._swapped.clear()
            if self._live is not None:
                try:
                    self._live.stop()
                except Exception:
                    pass
                self._live = None

    def _poll_validations_once(self) -> None:
        self._stopped = False  # let the last finished validations through
        try:
            self._poll_validations()
        finally:
            self._stopped = True

    def __enter__(self) -> LiveView:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
