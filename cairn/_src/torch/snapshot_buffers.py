"""Reusable CPU memory that in-memory snapshots copy tensors into.

A snapshot copies every tensor of a state (nested dicts, lists and tuples, such as a
model's and an optimizer's state dicts) into a *buffer set*: one CPU tensor per position
in the state. A set is busy from the copy until its snapshot has been serialized; the
next snapshot takes a free set and reuses each buffer whose shape and dtype still match
(``copy_`` into memory that is already mapped, no allocation), so steady-state snapshots
cost one memory copy. Buffers for CUDA tensors are pinned, and those copies are
asynchronous: the snapshot records a CUDA event that the writer waits on.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from cairn._src.worker.shared_state import Arena, allocate, mapping_like

logger = logging.getLogger(__name__)

Path = tuple[Hashable, ...]


@dataclass(eq=False)
class BufferSet:
    """The buffers of one snapshot in flight (or free for the next one)."""

    tensors: dict[Path, torch.Tensor] = field(default_factory=dict)
    busy: bool = False
    # Followed so that a set whose snapshot was refused before it was written (and so is
    # never released) is dropped instead of being held forever.
    handle: Any = None
    events: list[Any] = field(default_factory=list)
    # Written, and kept busy as a kept rank's memory copy of its checkpoint (see
    # cairn._src.worker.memory_copy) until released.
    held: bool = False
    # keep_survivors: the shared memory the tensors are carved from, and the layout
    # ((path, shape, dtype) of each) it was made for (see cairn._src.worker.shared_state).
    arena: Arena | None = None
    layout: list[tuple[Path, tuple[int, ...], Any]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def wait_for_copies(self) -> None:
        """Block until the asynchronous (CUDA) copies into this set are complete."""
        for event in self.events:
            event.synchronize()


class SnapshotBuffers:
    """A pool of :class:`BufferSet`. Thread-safe: the train loop acquires, the upload
    thread releases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sets: list[BufferSet] = []

    def acquire(self) -> BufferSet:
        """A free set (marked busy), or a new one when every set is busy."""
        with self._lock:
            # A busy set whose report is already resolved was never written (its report
            # was refused): forget it. A writer still running keeps its own reference.
            self._sets = [s for s in self._sets
                          if not (s.busy and not s.held and s.handle is not None
                                  and s.handle.done())]
            for buffer_set in self._sets:
                if not buffer_set.busy:
                    buffer_set.busy = True
                    buffer_set.handle = None
                    return buffer_set
            buffer_set = BufferSet(busy=True)
            self._sets.append(buffer_set)
            return buffer_set

    def track(self, buffer_set: BufferSet, handle: Any) -> None:
        """Tie a busy set to the report that will release it (its :class:`ReportHandle`)."""
        with self._lock:
            if buffer_set.busy:  # else its writer already ran and released it
                buffer_set.handle = handle

    def hold(self, buffer_set: BufferSet) -> None:
        """Keep a written set busy (a memory copy of a checkpoint) until :meth:`release`."""
        with self._lock:
            buffer_set.held = True

    def release(self, buffer_set: BufferSet) -> None:
        """Return ``buffer_set`` to the pool once nothing reads it any more."""
        with self._lock:
            buffer_set.held = False
            buffer_set.busy = False
            buffer_set.handle = None
            buffer_set.events = []

    def clear(self) -> None:
        """Forget every free set (their memory goes when nothing else holds it)."""
        with self._lock:
            self._sets = [s for s in self._sets if s.busy]

    @property
    def sets(self) -> int:
        with self._lock:
            return len(self._sets)


def copy_state(state: Any, buffer_set: BufferSet, *, shared: bool = False) -> Any:
    """A copy of ``state`` whose tensors live in ``buffer_set`` (on the CPU).

    Containers are rebuilt (dicts keep their type and a state dict's ``_metadata``),
    tensors that share memory in ``state`` share one buffer in the copy (tied weights),
    other values are deep-copied. Buffers not used by this state are dropped from the set.
    With ``shared`` (a kept rank's), the buffers of a state of CPU tensors are carved from
    one arena of shared memory, made again only when the state's layout changes.
    """
    if shared:
        _place_in_arena(state, buffer_set)
    previous = buffer_set.tensors
    copier = _Copier(previous)
    result = copier.copy(state, ())
    buffer_set.tensors = copier.used
    buffer_set.events = copier.record_events()
    return result


def _place_in_arena(state: Any, buffer_set: BufferSet) -> None:
    planner = _Copier({}, planning=True)
    planner.copy(state, ())
    layout = [entry for entry in planner.planned if all(entry[1])]
    if layout == buffer_set.layout and layout and not planner.cuda_devices:
        return
    # No arena (pinned buffers for CUDA, none to be had): the set's buffers are private.
    made = (allocate([(shape, dtype) for _, shape, dtype in layout])
            if layout and not planner.cuda_devices else None)
    buffer_set.arena, buffer_set.layout = None, []
    if made is None:
        return
    buffer_set.arena, tensors = made
    buffer_set.layout = layout
    buffer_set.tensors = {path: t for (path, _, _), t in zip(layout, tensors, strict=True)}


class _Copier:
    def __init__(self, previous: dict[Path, torch.Tensor], *, planning: bool = False) -> None:
        # planning: only list the buffers a copy needs (``planned``), copying nothing.
        self.planning = planning
        self.planned: list[tuple[Path, tuple[int, ...], Any]] = []
        self.previous = previous
        self.used: dict[Path, torch.Tensor] = {}
        self.seen: dict[tuple[Any, ...], torch.Tensor] = {}
        self.cuda_devices: set[torch.device] = set()

    def copy(self, value: Any, path: Path) -> Any:
        if isinstance(value, torch.Tensor):
            return self.tensor(value, path)
        if isinstance(value, Mapping):
            return mapping_like(value, {key: self.copy(item, (*path, key))
                                        for key, item in value.items()})
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
            return type(value)(*(self.copy(v, (*path, i)) for i, v in enumerate(value)))
        if isinstance(value, (list, tuple)):
            return type(value)(self.copy(v, (*path, i)) for i, v in enumerate(value))
        return value if self.planning else copy.deepcopy(value)

    def tensor(self, value: torch.Tensor, path: Path) -> torch.Tensor:
        source = value.detach()
        if (
            source.layout is not torch.strided
            or source.is_nested
            or source.is_quantized
            or type(source) is not torch.Tensor
            or source.device.type not in ("cpu", "cuda")
        ):
            # Sparse, quantized, tensor subclasses (DTensor ...): a plain copy, no reuse.
            return source if self.planning else source.to("cpu", copy=True)
        # A conjugate or negative view (z.conj()) shares z's storage, offset and strides:
        # only its bits say it is another value.
        key = (source.untyped_storage().data_ptr(), source.storage_offset(),
               tuple(source.shape), source.stride(), source.dtype, source.device,
               source.is_conj(), source.is_neg())
        shared = self.seen.get(key)
        if shared is not None:
            return shared
        on_cuda = source.device.type == "cuda"
        if self.planning:
            if on_cuda:
                self.cuda_devices.add(source.device)
            self.planned.append((path, tuple(source.shape), source.dtype))
            self.seen[key] = source
            return source
        buffer = self.previous.get(path)
        if (
            buffer is None
            or buffer.shape != source.shape
            or buffer.dtype != source.dtype
            or (on_cuda and not buffer.is_pinned())
        ):
            buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=on_cuda)
        buffer.copy_(source, non_blocking=on_cuda)
        if on_cuda:
            self.cuda_devices.add(source.device)
        self.used[path] = buffer
        self.seen[key] = buffer
        return buffer

    def record_events(self) -> list[Any]:
        events = []
        for device in self.cuda_devices:
            with torch.cuda.device(device):
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
                events.append(event)
        return events
