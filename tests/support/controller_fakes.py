"""A fake backend, fake workers and a fake clock: the controller stepped without processes.

A :class:`FakeWorker` is a pipe: its exit watcher becomes readable when the test ends it.
Its connection to the controller is one end of a :func:`multiprocessing.Pipe`, handed to
the controller's inbox as the acceptor would; the test holds the other end and plays the
worker's side of the protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import cloudpickle

from cairn._src.checkpoint.index import RunIndex
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.retention import make_policy
from cairn._src.config.failure import FailureConfig
from cairn._src.config.run import CheckpointConfig, RunConfig, ScalingConfig
from cairn._src.controller.attempt_loop import LoopParts
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.controller import Controller
from cairn._src.controller.driver_copies import DriverCopies
from cairn._src.controller.failure_policy import FailurePolicy
from cairn._src.controller.inbox import Inbox, NewConnection
from cairn._src.controller.payload import TrainSpec, WorkerPayload
from cairn._src.controller.validations import (
    PendingValidations,
    ProtectPending,
    ValidationRunner,
)
from cairn._src.observe.callbacks import CallbackDispatcher, TrainRunContext
from cairn._src.observe.live_view import LiveView
from cairn._src.observe.observer import EventLogWriter, EventStream, HistoryWriter, Observer
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.bootstrap import Bootstrap
from cairn._src.wire.messages import DoneMessage, ErrorMessage, TimingMessage


class FakeClock:
    """Time moves only when the controller waits and nothing is ready: by the whole wait,
    or up to the first action :meth:`after` scheduled within it (then run)."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self._scheduled: list[tuple[float, int, Callable[[], None]]] = []

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` (a worker's side: a message sent, a connection closed) once the
        controller's waits have moved the clock ``seconds`` on."""
        self._scheduled.append((self.now + seconds, len(self._scheduled), action))
        self._scheduled.sort()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wait(self, objects: list[Any], timeout: float) -> list[Any]:
        ready = list(wait(objects, 0))
        end = self.now + max(timeout, 0.001)
        while not ready and self._scheduled and self._scheduled[0][0] <= end:
            at, _, action = self._scheduled.pop(0)
            self.now = max(self.now, at)
            action()
            ready = list(wait(objects, 0))
        if not ready:
            self.now = end
        return ready


class FakeWorker:
    def __init__(self, rank: int, attempt: int) -> None:
        self.rank = rank
        self.attempt = attempt
        self.pid = 10_000 + rank
        self.node_id = "node-0"
        self.preempted = False
        # Its last message may trail its end (a Ray task that returned).
        self.last_message_may_trail = False
        self._exit_r, self._exit_w = os.pipe()
        self.exited = False
        self.peer: Connection | None = None  # the worker's end of its connection

    @property
    def exit_watcher(self) -> Any:
        return self

    def fileno(self) -> int:
        return self._exit_r

    def describe_exit(self) -> str:
        return "exited with code 1"

    def wait_exit(self, timeout: float) -> bool:
        return self.exited

    def exit_seen(self) -> None:
        """Only the exit watcher fires (a Ray task's return, on Ray's own channel): the
        connection stays as it is."""
        self.exited = True
        os.write(self._exit_w, b"x")

    def end(self) -> None:
        """The process is gone: its connection closes, its exit watcher fires."""
        if not self.exited:
            self.exited = True
            if self.peer is not None:
                self.peer.close()
            os.write(self._exit_w, b"x")


@dataclass
class FakeBackend:
    name: str = "fake"
    bind_host: str = "127.0.0.1"
    groups: list[list[FakeWorker]] = field(default_factory=list)
    bootstraps: list[Bootstrap] = field(default_factory=list)
    kills: int = 0
    shutdowns: int = 0
    standby_prepared: int = 0
    standby_stopped: int = 0

    def advertise_host(self) -> str:
        return "127.0.0.1"

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[Any]:
        self.bootstraps.append(bootstrap)
        group = [FakeWorker(rank, bootstrap.attempt) for rank in range(num_workers)]
        self.groups.append(group)
        return list(group)

    def shutdown(self, *, grace_s: float = 5.0) -> None:
        self.shutdowns += 1

    def kill(self) -> None:
        self.kills += 1

    def prepare_standby(self) -> None:
        self.standby_prepared += 1

    def stop_standby(self) -> None:
        self.standby_stopped += 1


@dataclass
class ReplacingFakeBackend(FakeBackend):
    """A fake backend that can replace single ranks (FailureConfig(keep_survivors=True))."""

    killed_ranks: list[set[int]] = field(default_factory=list)
    replaced: list[set[int]] = field(default_factory=list)
    refusal: str | None = None

    def replace_refusal(self) -> str | None:
        return self.refusal

    def kill_ranks(self, ranks: Any) -> None:
        self.killed_ranks.append(set(ranks))
        for worker in self.groups[-1]:
            if worker.rank in ranks:
                worker.end()

    def replace(self, ranks: Any, bootstrap: Bootstrap, *,
                env: dict[str, str] | None = None) -> list[Any]:
        self.bootstraps.append(bootstrap)
        self.replaced.append(set(ranks))
        group = [FakeWorker(w.rank, bootstrap.attempt) if w.rank in ranks else w
                 for w in self.groups[-1]]
        self.groups.append(group)
        return list(group)


def _train(config: dict[str, Any]) -> None:
    pass


@dataclass
class Harness:
    controller: Controller
    backend: FakeBackend
    clock: FakeClock
    inbox: Inbox
    events: SegmentLog
    history: SegmentLog
    manager: CheckpointManager

    def connect(self, worker: FakeWorker, *, attempt: int | None = None) -> Connection:
        """The worker connects (as the acceptor hands a connection over); the
        controller's end of it."""
        ours, theirs = Pipe()
        worker.peer = theirs
        self.inbox.post(NewConnection(ours, worker.rank, worker.pid,
                                      worker.attempt if attempt is None else attempt))
        # Its set-up ends at once: its train function begins.
        theirs.send(TimingMessage(worker.rank, "train_start", 0.0, self.clock.time()))
        return ours

    def received(self, worker: FakeWorker) -> list[Any]:
        """Everything the controller has sent the worker so far."""
        assert worker.peer is not None
        messages = []
        while worker.peer.poll():
            messages.append(worker.peer.recv())
        return messages

    def done(self, worker: FakeWorker, value: Any = None) -> None:
        assert worker.peer is not None
        worker.peer.send(DoneMessage(worker.rank, 0, cloudpickle.dumps(value)))

    def error(self, worker: FakeWorker, *, fatal: bool = False) -> None:
        assert worker.peer is not None
        worker.peer.send(ErrorMessage(worker.rank, "ValueError", "boom", "", None, fatal))

    def event_types(self) -> list[str]:
        self.events.flush()
        return [str(r["type"]) for r in read_log(self.manager.run.join(EVENTS_DIR),
                                                 self.manager.retry)]

    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.controller.close({"status": "finished"})


def make_harness(tmp_path: Path, *, workers: int = 2, max_failures: int = 0,
                 observers: Sequence[Observer] = (), keep_survivors: bool = False,
                 failure_config: FailureConfig | None = None,
                 replace_refusal: str | None = None) -> Harness:
    """A controller over fakes, opened; ``observers`` follow its events after the real
    ones (the event log, the metrics history, the live view, the callbacks).
    ``failure_config`` replaces ``FailureConfig(max_failures=max_failures)``;
    ``replace_refusal``: what the replacing backend answers ``replace_refusal()``."""
    run = resolve(str(tmp_path)).join("run")
    retry = RetryPolicy()
    failure = failure_config or FailureConfig(max_failures=max_failures,
                                              keep_survivors=keep_survivors)
    run_config = RunConfig(progress=0, failure_config=failure)
    scaling = ScalingConfig(num_workers=workers)
    history = SegmentLog(run.join(METRICS_DIR), retry)
    events = SegmentLog(run.join(EVENTS_DIR), retry)
    backend = (ReplacingFakeBackend(refusal=replace_refusal) if keep_survivors
               else FakeBackend())
    clock = FakeClock()
    inbox = Inbox()
    channels = WorkerChannels("127.0.0.1", inbox=inbox)
    callbacks = CallbackDispatcher([], TrainRunContext(run_config=run_config,
                                                      train_loop_config={},
                                                      scaling_config=scaling), workers)
    view = LiveView.for_run(run_config, workers)
    driver_copies = DriverCopies()
    stream = EventStream([EventLogWriter(events), HistoryWriter(history), view, callbacks,
                          driver_copies, *observers], log=events)
    pending = PendingValidations()
    config = CheckpointConfig()
    manager = CheckpointManager(run, config, retry, RunIndex(), history, events=stream,
                                policy=ProtectPending(make_policy(config.num_to_keep, None, "max"),
                                                      pending.protected))
    commits = CommitPipeline(manager, stream, run_config, inbox, channels.broadcast)
    validations = ValidationRunner(None, manager, stream, submit=commits.run_on_commit_thread,
                                   wake=lambda: None, options=run_config.storage_options(),
                                   pending=pending)
    parts = LoopParts(backend=backend, inbox=inbox, channels=channels, commits=commits,
                      validations=validations, events=stream, view=view, clock=clock,
                      manager=manager, history=history, event_log=events,
                      run_config=run_config, driver_copies=driver_copies)
    spec = TrainSpec(_train, {}, True)
    controller = Controller(spec, scaling, parts, payload=WorkerPayload.pickle(spec, run_config),
                            policy=FailurePolicy(failure.max_failures,
                                                 failure.max_preemption_failures),
                            experiment_name="steps",
                            next_report_index=1)
    controller.open()
    return Harness(controller, backend, clock, inbox, events, history, manager)
