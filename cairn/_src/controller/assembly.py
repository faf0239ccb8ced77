"""Builds a :class:`Controller` from a run's settings, with the real collaborators.

Each collaborator is made here and handed to the one that uses it (the controller takes
them all as constructor arguments; tests hand it fakes instead).
"""

from __future__ import annotations

from cairn._src.backends.factory import make_backend
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.config.run import RunConfig, ScalingConfig
from cairn._src.controller.attempt_loop import LoopParts
from cairn._src.controller.clock import SystemClock
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.controller import Controller
from cairn._src.controller.failure_policy import FailurePolicy
from cairn._src.controller.inbox import Inbox, ValidationApplied
from cairn._src.controller.payload import TrainSpec, WorkerPayload
from cairn._src.controller.validations import ValidationRunner
from cairn._src.observe.callbacks import CallbackDispatcher, TrainRunContext
from cairn._src.observe.live_view import LiveView
from cairn._src.observe.observer import EventLogWriter, EventStream, HistoryWriter
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.run.status import run_history
from cairn._src.storage.options import StorageOptions
from cairn._src.wire.channel_security import tls_enabled


def build_controller(spec: TrainSpec, scaling: ScalingConfig, run_config: RunConfig,
                     manager: CheckpointManager, history: SegmentLog, events: SegmentLog, *,
                     experiment_name: str, next_report_index: int,
                     options: StorageOptions) -> Controller:
    payload = WorkerPayload.pickle(spec, run_config)
    backend = make_backend(scaling, run_config)
    inbox = Inbox()
    # The driver node's address, never every interface (loopback for local workers).
    channels = WorkerChannels(backend.advertise_host(), inbox=inbox,
                              tls=tls_enabled(scaling.tls))
    callbacks = CallbackDispatcher(
        run_config.callbacks,
        TrainRunContext(run_config=run_config, train_loop_config=spec.config,
                        scaling_config=scaling),
        scaling.max_workers,
    )
    # The driver's live view (RunConfig.progress); its hooks never block the loop.
    view = LiveView.for_run(run_config, scaling.max_workers)
    # Every event is emitted once, to these observers in this order: the log first, so
    # that a callback that raises still leaves the record.
    stream = EventStream([EventLogWriter(events), HistoryWriter(history), view, callbacks],
                         log=events)
    manager.events = stream
    commits = CommitPipeline(manager, stream, run_config, inbox, channels.broadcast)
    validations = ValidationRunner(
        spec.validation_config, manager, stream, submit=commits.run_on_commit_thread,
        wake=lambda: inbox.post(ValidationApplied()), options=options)
    # Read before the commit thread starts: until then this thread is the manager's owner.
    earlier_events = read_events(manager.run.join(EVENTS_DIR), manager.retry)
    validations.resume(earlier_events)
    view.follow(earlier_events, validations.status)
    parts = LoopParts(backend=backend, inbox=inbox, channels=channels, commits=commits,
                      validations=validations, events=stream, view=view,
                      clock=SystemClock(), manager=manager, history=history, event_log=events,
                      run_config=run_config)
    return Controller(spec, scaling, parts, payload=payload,
                      policy=FailurePolicy(run_config.failure_config.max_failures),
                      experiment_name=experiment_name, next_report_index=next_report_index,
                      finished_before=run_history(earlier_events).status == "finished")
