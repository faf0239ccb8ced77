"""``report_snapshot``: an ASYNC checkpoint report that blocks the train loop only for a
memory copy.

The train loop copies the state's tensors into reused CPU buffers
(:mod:`.snapshot_buffers`) and hands the copy to the worker's upload thread, which
serializes it (:func:`serialize`, the ``torch.save`` format) straight into the
checkpoint's directory on storage, hashing as it writes
(:mod:`cairn._src.worker.direct_write`), and commits it, one report after another. The
copy is what makes this safe: training may change the live tensors as soon as
``report_snapshot`` returns. The time spent copying is recorded as checkpoint stall (kind
``snapshot_copy``) in the run's goodput timeline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, BinaryIO

from torch import nn

from cairn._src.checkpoint.checkpoint import METADATA_FILE_NAME
from cairn._src.errors import ReportError
from cairn._src.run.layout import MANIFEST_NAME
from cairn._src.storage.fileio import TEMPORARY_MARK
from cairn._src.storage.paths import check_relative_path
from cairn._src.torch.snapshot_buffers import BufferSet, SnapshotBuffers, copy_state
from cairn._src.torch.training_state import (
    check_state_arguments,
    collect_training_state,
    write_files,
)
from cairn._src.wire.messages import TimingMessage
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.session import get_session
from cairn._src.worker.shared_state import describe, serialize

logger = logging.getLogger(__name__)

STATE_FILE = "state.pt"

_buffers = SnapshotBuffers()


def snapshot_buffers() -> SnapshotBuffers:
    """The process-wide buffer pool of :func:`report_snapshot` (for tests and benchmarks)."""
    return _buffers


def report_snapshot(
    metrics: dict[str, Any],
    state_dict: Mapping[str, Any] | None = None,
    *,
    model: nn.Module | None = None,
    optimizer: Any = None,
    scheduler: Any = None,
    data_loader: Any = None,
    step: int = 0,
    epoch: int = 0,
    extra: Mapping[str, Any] | None = None,
    file_name: str = STATE_FILE,
    per_rank: bool = False,
    checkpoint_dir_name: str | None = None,
) -> ReportHandle:
    """Report ``metrics`` with an in-memory snapshot of a state, uploaded in the background.

    Call it on every rank, like ``cairn.report``; it is report n of each rank. Two forms:

    * ``report_snapshot(metrics, model=..., optimizer=..., scheduler=..., data_loader=...,
      step=..., epoch=..., extra=...)``: the whole training state, in the layout of
      :func:`save_training_state` (rank 0 the replicated state, every rank its RNGs and
      data position), so :func:`load_training_state` restores it;
    * ``report_snapshot(metrics, state_dict)``: any nested dict/list of tensors and plain
      values, saved by rank 0 as ``file_name`` (other ranks report metrics only), or with
      ``per_rank=True`` by every rank as ``rank_<r>/<file_name>``; read it back with
      ``torch.load``. ``file_name`` is one name without ``/`` that is none of Cairn's own
      files in a checkpoint directory (the manifest, the metadata file, a name with the
      temporary-file mark): those raise :class:`ReportError` here.

    ``checkpoint_dir_name`` applies to both forms. An argument of the other form (given
    a value other than its default) raises :class:`ReportError` before anything is
    copied or reported: ``file_name`` or ``per_rank`` with ``model=``, or
    ``optimizer``, ``scheduler``, ``data_loader``, ``step``, ``epoch`` or ``extra``
    with a state dict.

    It returns once the tensors are copied to CPU memory (buffers reused across calls:
    no allocation when shapes match; pinned, and asynchronous, for CUDA tensors), or
    later only when ``CheckpointConfig.max_pending_uploads`` snapshots are already
    pending. Tensors that share a storage stay linked in the copy, as ``torch.save``
    keeps them, and meta tensors pass through (:func:`.snapshot_buffers.copy_state`
    says what is kept); the copy is the same whatever the caller's default device,
    grad or inference mode. Serialization, upload and commit happen on the upload
    thread; the returned :class:`ReportHandle` follows the commit, and the run does not
    finish before it.
    """
    session = get_session("report_snapshot")
    if (state_dict is None) == (model is None):
        raise ReportError(
            "report_snapshot(...) takes either a state dict (report_snapshot(metrics, "
            "state_dict)) or a training state (report_snapshot(metrics, model=..., "
            f"optimizer=...)), not {'both' if model is not None else 'neither'}."
        )
    if model is not None:
        _refuse_other_form(training_state=True, given={
            "file_name": (file_name, STATE_FILE), "per_rank": (per_rank, False)})
    else:
        _refuse_other_form(training_state=False, given={
            "optimizer": (optimizer, None), "scheduler": (scheduler, None),
            "data_loader": (data_loader, None), "step": (step, 0), "epoch": (epoch, 0),
            "extra": (extra, None)})
    rank = session.context.get_world_rank()
    if model is not None:
        check_state_arguments("report_snapshot", model=model, optimizer=optimizer,
                              scheduler=scheduler, data_loader=data_loader, step=step,
                              epoch=epoch, extra=extra)
        files = collect_training_state(model=model, optimizer=optimizer, scheduler=scheduler,
                                       data_loader=data_loader, step=step, epoch=epoch,
                                       extra=extra)
    else:
        files = _state_dict_files(state_dict, file_name, per_rank, rank)
    if not files:
        # This rank contributes nothing to the checkpoint (rank 0 writes it).
        return session.report(metrics)
    started = time.perf_counter()
    buffer_set = _buffers.acquire()
    try:
        copied = copy_state(files, buffer_set, shared=session.memory is not None)
        copy_s = time.perf_counter() - started
        handle = session.report_deferred(metrics, files=list(copied),
                                         write=_Writer(copied, buffer_set),
                                         checkpoint_dir_name=checkpoint_dir_name)
    except BaseException:
        _buffers.release(buffer_set)
        raise
    _buffers.track(buffer_set, handle)
    logger.debug("Snapshot of report %d: %.1f MiB copied in %.3fs", handle.index,
                 buffer_set.nbytes / 2**20, copy_s)
    session.send(TimingMessage(rank, "snapshot_copy", copy_s, time.time(), handle.index))
    return handle


def _refuse_other_form(*, training_state: bool,
                       given: Mapping[str, tuple[object, object]]) -> None:
    """:class:`ReportError` naming the arguments of ``given`` (name -> (value, default))
    set to anything but their default: the other form's arguments, which this form would
    drop. A default passed explicitly is the same call as one left out."""
    names = [name for name, (value, default) in given.items()
             if not (value is default or (type(value) is type(default) and value == default))]
    if not names:
        return
    shown = ", ".join(f"{name}={_short_repr(given[name][0])}" for name in names)
    them = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    verb, it = ("is an argument", "it") if len(names) == 1 else ("are arguments", "them")
    if training_state:
        raise ReportError(
            f"report_snapshot(metrics, model=..., {shown}): {them} {verb} of the state-dict "
            "form, report_snapshot(metrics, state_dict, file_name=..., per_rank=...). The "
            "training-state form writes its own files (rank 0 model.pt, optimizer.pt, "
            "scheduler.pt and progress.pt, every rank rank_<r>/rank_state.pt) and would "
            f"ignore {it}; leave {it} out, or pass a state dict instead of model=.")
    raise ReportError(
        f"report_snapshot(metrics, state_dict, {shown}): {them} {verb} of the training-state "
        "form, report_snapshot(metrics, model=..., optimizer=..., scheduler=..., "
        "data_loader=..., step=..., epoch=..., extra=...). The state-dict form saves only the "
        f"state dict and would drop {it}; put what you want saved into the state dict, or "
        "pass model=... instead of a state dict.")


def _short_repr(value: object) -> str:
    # An optimizer's or a data loader's repr spans lines; the type then names it.
    text = repr(value)
    return f"<{type(value).__name__}>" if "\n" in text or len(text) > 80 else text


def _state_dict_files(
    state_dict: object, file_name: object, per_rank: object, rank: int
) -> dict[str, Any]:
    if not isinstance(state_dict, Mapping):
        raise ReportError(
            f"report_snapshot(state_dict={type(state_dict).__name__}) must be a dict (a "
            "state dict: names to tensors and plain values)."
        )
    if not isinstance(per_rank, bool):
        raise ReportError(f"report_snapshot(per_rank={per_rank!r}) must be True or False.")
    if not isinstance(file_name, str) or "/" in file_name:
        raise ReportError(
            f"report_snapshot(file_name={file_name!r}) must be a file name without '/', such "
            f"as {STATE_FILE!r}."
        )
    name = check_relative_path(file_name, argument="report_snapshot(file_name)")
    _check_not_reserved(name)
    if per_rank:
        return {f"rank_{rank}/{name}": state_dict}
    return {name: state_dict} if rank == 0 else {}


def _check_not_reserved(name: str) -> None:
    # The manifest (its presence is the commit) and the metadata file are Cairn's own
    # files in every checkpoint directory; a name with the temporary mark is taken for a
    # torn write and deleted. In any letter case: a case-insensitive store folds them.
    folded = name.casefold()
    if (folded in (MANIFEST_NAME.casefold(), METADATA_FILE_NAME.casefold())
            or TEMPORARY_MARK.casefold() in folded):
        raise ReportError(
            f"report_snapshot(file_name={name!r}) names one of Cairn's own files in a "
            f"checkpoint directory; choose another file name without '/', such as "
            f"{STATE_FILE!r} (reserved: {MANIFEST_NAME!r}, the manifest, "
            f"{METADATA_FILE_NAME!r}, the checkpoint's metadata, and any name containing "
            f"{TEMPORARY_MARK!r}, in any letter case)."
        )


class _Writer:
    """Runs on the upload thread: serialize the copy, then free its buffers.

    Straight into the checkpoint's directory on storage, each file through a hashing sink
    (:meth:`write_file`, see :mod:`cairn._src.worker.direct_write`); or, where the worker
    keeps a local copy of what it uploads (a local tier), into a local directory
    (:meth:`__call__`) that is uploaded and then kept in the tier.
    """

    def __init__(self, copied: dict[str, Any], buffer_set: BufferSet) -> None:
        self._copied = copied
        self._buffer_set = buffer_set
        self._waited = False

    def names(self) -> list[str]:
        return list(self._copied)

    def write_file(self, rel: str, sink: BinaryIO) -> None:
        if not self._waited:
            self._buffer_set.wait_for_copies()
            self._waited = True
        serialize(self._copied[rel], sink)

    def value(self, rel: str) -> Any:
        """The copied state of file ``rel`` (what :meth:`write_file` serializes)."""
        return self._copied[rel]

    def describe_shared(self, rel: str) -> tuple[Any, bytes, list[Any]] | None:
        """File ``rel`` as a peer on this machine can map it: the arena's wire, the
        skeleton and its tensors' places (:func:`.shared_state.describe`); None when the
        copy is not in shared memory."""
        arena = self._buffer_set.arena
        if arena is None or rel not in self._copied:
            return None
        described = describe(self._copied[rel], arena)
        return None if described is None else (arena.wire(), *described)

    def retain(self) -> bool:
        """Keep the copy after it was written (a kept rank's memory copy of the
        checkpoint): :meth:`write_file` serializes it again, the same bytes, until
        :meth:`close`."""
        if not self._copied:
            return False
        _buffers.hold(self._buffer_set)
        return True

    def close(self) -> None:
        if self._copied:
            self._copied = {}
            _buffers.release(self._buffer_set)

    def __call__(self, directory: str) -> None:
        try:
            self._buffer_set.wait_for_copies()
            write_files(directory, self._copied)
        finally:
            self.close()
