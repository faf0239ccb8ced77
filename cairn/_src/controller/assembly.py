"""Builds a :class:`Controller` from a run's settings, with the real collaborators.

Each collaborator is made here and handed to the one that uses it (the controller takes
them all as constructor arguments; tests hand it fakes instead).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cairn._src.backends.factory import make_backend
from cairn._src.backends.protocol import WorkerBackend
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.opening import OpenedRun
from cairn._src.checkpoint.retention import make_policy
from cairn._src.config.data import DataConfig
from cairn._src.config.run import RunConfig, ScalingConfig
from cairn._src.controller.attempt_loop import LoopParts
from cairn._src.controller.clock import SystemClock
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.controller import Controller
from cairn._src.controller.datasets import DataIngest
from cairn._src.controller.driver_copies import DriverCopies
from cairn._src.controller.failure_policy import FailurePolicy
from cairn._src.controller.inbox import Inbox, ValidationApplied
from cairn._src.controller.payload import TrainSpec, WorkerPayload
from cairn._src.controller.validations import (
    PendingValidations,
    ProtectPending,
    ValidationRunner,
)
from cairn._src.observe.callbacks import CallbackDispatcher, TrainRunContext
from cairn._src.observe.live_view import LiveView
from cairn._src.observe.observer import EventLogWriter, EventStream, HistoryWriter
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.run.status import run_history
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.options import StorageOptions
from cairn._src.wire.channel_security import tls_enabled


@dataclass(frozen=True)
class Observers:
    """The run's event stream and the observers the controller also talks to."""

    stream: EventStream
    view: LiveView
    callbacks: CallbackDispatcher
    driver_copies: DriverCopies


def build_observers(spec: TrainSpec, scaling: ScalingConfig, run_config: RunConfig,
                    history: SegmentLog, events: SegmentLog) -> Observers:
    """The run's event stream, built before the checkpoint manager that emits to it."""
    callbacks = CallbackDispatcher(
        run_config.callbacks,
        TrainRunContext(run_config=run_config, train_loop_config=spec.config,
                        scaling_config=scaling),
        max(1, scaling.max_workers),  # local mode (num_workers=0) runs one worker
    )
    # The driver's live view (RunConfig.progress); its hooks never block the loop.
    view = LiveView.for_run(run_config, max(1, scaling.max_workers))
    # Every event is emitted once, to these observers in this order: the log first, so
    # that a callback that raises still leaves the record.
    driver_copies = DriverCopies()
    stream = EventStream([EventLogWriter(events), HistoryWriter(history), view, callbacks,
                          driver_copies], log=events)
    return Observers(stream, view, callbacks, driver_copies)


def build_manager(run: StorageLocation, run_config: RunConfig, opened: OpenedRun,
                  history: SegmentLog, *, fence: Callable[[], None], stream: EventStream,
                  pending: PendingValidations) -> CheckpointManager:
    """The run's checkpoint manager, with every collaborator it uses: the run's retry
    budget and transfer settings, the lease's fence, the event stream, the references the
    run registered and a retention policy that keeps checkpoints pending validation."""
    config = run_config.checkpoint_config
    policy = ProtectPending(make_policy(config.num_to_keep, config.checkpoint_score_attribute,
                                        config.checkpoint_score_order), pending.protected)
    manager = CheckpointManager(run, config, run_config.storage_retry, opened.index, history,
                                fence=fence, events=stream, registered=opened.registered,
                                policy=policy, transfer=run_config.storage_transfer,
                                fsync=run_config.storage_fsync)
    # Logged by an earlier driver or `cairn prune`: deleted at the first attempt's start
    # (retry_deletions), through the same ownership check as retention's own.
    manager.failed_deletions.update({r.dir_name: r for r in opened.unfinished_deletions})
    return manager


def build_controller(spec: TrainSpec, scaling: ScalingConfig, run_config: RunConfig,
                     manager: CheckpointManager, observers: Observers,
                     pending: PendingValidations, history: SegmentLog, events: SegmentLog, *,
                     experiment_name: str, next_report_index: int,
                     options: StorageOptions,
                     backend: WorkerBackend | None = None) -> Controller:
    """The controller of a run; ``backend`` (default: the one ``scaling`` names) is given
    by local mode, whose caller serves it."""
    payload = WorkerPayload.pickle(spec, run_config, in_driver=scaling.local_mode)
    backend = backend if backend is not None else make_backend(scaling, run_config)
    inbox = Inbox()
    # The driver node's address, never every interface (loopback for local workers).
    channels = WorkerChannels(backend.advertise_host(), inbox=inbox,
                              tls=tls_enabled(scaling.tls))
    stream, view = observers.stream, observers.view
    commits = CommitPipeline(manager, stream, run_config, inbox, channels.broadcast)
    validations = ValidationRunner(
        spec.validation_config, manager, stream, submit=commits.run_on_commit_thread,
        wake=lambda: inbox.post(ValidationApplied()), options=options, pending=pending)
    # Read before the commit thread starts: until then this thread is the manager's owner.
    earlier_events = read_events(manager.run.join(EVENTS_DIR), manager.retry)
    validations.resume(earlier_events)
    view.follow(earlier_events, validations.status)
    parts = LoopParts(backend=backend, inbox=inbox, channels=channels, commits=commits,
                      validations=validations, events=stream, view=view,
                      clock=SystemClock(), manager=manager, history=history, event_log=events,
                      run_config=run_config, driver_copies=observers.driver_copies)
    return Controller(spec, scaling, parts, payload=payload,
                      policy=FailurePolicy(
                          run_config.failure_config.max_failures,
                          run_config.failure_config.max_preemption_failures),
                      experiment_name=experiment_name, next_report_index=next_report_index,
                      finished_before=run_history(earlier_events).status == "finished",
                      data=_data_ingest(spec, scaling))


def _data_ingest(spec: TrainSpec, scaling: ScalingConfig) -> DataIngest | None:
    """What splits ``Trainer(datasets=...)`` for the workers; None without datasets."""
    if not spec.datasets:
        return None

    def cpus_per_worker() -> float:
        from cairn._src.backends.ray_resources import worker_bundle

        return float(worker_bundle(scaling).get("CPU", 0.0))

    return DataIngest(spec.datasets, spec.dataset_config or DataConfig(), spec.data_context,
                      scaling, cpus_per_worker=cpus_per_worker)
