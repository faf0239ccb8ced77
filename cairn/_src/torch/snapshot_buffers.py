"""Reusable CPU memory that in-memory snapshots copy tensors into.

A snapshot copies the tensors of a state (nested dicts, lists and tuples, such as a
model's and an optimizer's state dicts) into a *buffer set* of CPU tensors: one buffer per
storage the state's tensors view (per dtype), holding the part of it they use, each
tensor of the copy a view of its buffer as ``torch.save`` keeps it (:func:`copy_state`).
A set is busy from the copy until its snapshot has been serialized; the next snapshot
takes a free set and reuses each buffer whose shape and dtype still match (``copy_`` into
memory that is already mapped, no allocation), so steady-state snapshots cost one memory
copy. Buffers for CUDA tensors are pinned, and those copies are asynchronous: the
snapshot records a CUDA event that the writer waits on.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

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
            self._forget_abandoned()
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
        """Forget every free set (their memory goes when nothing else holds it), and
        every set whose snapshot was refused."""
        with self._lock:
            self._forget_abandoned()
            self._sets = [s for s in self._sets if s.busy]

    def _forget_abandoned(self) -> None:
        # A busy set whose report is already resolved was never written (its report was
        # refused): forget it. A writer still running keeps its own reference.
        self._sets = [s for s in self._sets
                      if not (s.busy and not s.held and s.handle is not None
                              and s.handle.done())]

    @property
    def sets(self) -> int:
        with self._lock:
            return len(self._sets)


def copy_state(state: Any, buffer_set: BufferSet, *, shared: bool = False) -> Any:
    """A copy of ``state`` whose tensors live in ``buffer_set`` (on the CPU).

    Containers are rebuilt (dicts keep their type and a state dict's ``_metadata``), other
    values are deep-copied. Views keep the layout ``torch.save`` keeps: tensors that
    share a storage (tied weights, a flat buffer and the views of it, a broadcast
    ``expand``) share one buffer in the copy, which holds the part of the storage they use
    (once per dtype), and each is a view of it with its own shape, strides and offset; so
    a restore gets them linked as they were, and a small storage viewed large stays small.
    Conjugate and negative views are copied on their own, dense; meta tensors (no data)
    are kept as they are; sparse, quantized and subclass tensors (``DTensor``) are copied
    with ``.to("cpu")``, each on its own. Buffers not used by this state are dropped from
    the set. With
    ``shared`` (a kept rank's), the buffers of a state of CPU tensors are carved from one
    arena of shared memory, made again only when the state's layout changes.

    The copy does not depend on the caller's grad or inference mode, nor on torch's
    default device: its buffers are ordinary CPU tensors that later snapshots reuse.
    """
    # Inference mode would make inference tensors of new buffers, which no later copy
    # outside it may write into again.
    with torch.inference_mode(False), torch.no_grad():
        plan = _Planner()
        plan.visit(state, ())
        if shared:
            _place_in_arena(plan, buffer_set)
        copier = _Copier(plan, buffer_set.tensors)
        result = copier.copy(state, ())
        buffer_set.tensors = copier.used
        buffer_set.events = copier.record_events()
    return result


def _place_in_arena(plan: _Planner, buffer_set: BufferSet) -> None:
    layout = plan.layout()
    if layout == buffer_set.layout and layout and not plan.cuda_devices:
        return
    # No arena (pinned buffers for CUDA, none to be had): the set's buffers are private.
    made = (allocate([(shape, dtype) for _, shape, dtype in layout])
            if layout and not plan.cuda_devices else None)
    buffer_set.arena, buffer_set.layout = None, []
    if made is None:
        return
    buffer_set.arena, tensors = made
    buffer_set.layout = layout
    buffer_set.tensors = {path: t for (path, _, _), t in zip(layout, tensors, strict=True)}


# How a snapshot copies a tensor: kept as it is (meta: no data), copied plainly (sparse,
# quantized, subclasses, other devices), made empty, copied on its own (a conjugate or
# negative view), or read through the region of its storage.
_META, _OTHER, _EMPTY, _DENSE, _REGION = "meta", "other", "empty", "dense", "region"


def _kind(source: torch.Tensor, device: torch.device) -> str:
    if device.type == "meta":
        return _META
    if (
        (type(source) is not torch.Tensor and type(source) is not nn.Parameter)
        or source.layout is not torch.strided
        or source.is_nested
        or source.is_quantized
        or device.type not in ("cpu", "cuda")
    ):
        return _OTHER
    if source.numel() == 0:
        return _EMPTY
    # Their bits, not their storage, say which value they are.
    return _DENSE if source.is_conj() or source.is_neg() else _REGION


def _extent(source: torch.Tensor) -> tuple[int, int]:
    """The elements of its storage a non-empty tensor views: ``[start, end)``."""
    start = int(source.storage_offset())
    if source.is_contiguous():
        return start, start + source.numel()
    last = 0
    for size, stride in zip(source.shape, source.stride(), strict=True):
        last += (size - 1) * stride
    return start, start + last + 1


def _view_key(source: torch.Tensor) -> tuple[Any, ...]:
    """Equal for tensors that are the same view of the same memory."""
    return (source.untyped_storage().data_ptr(), source.storage_offset(), source.shape,
            source.stride(), source.dtype, source.device, source.is_conj(), source.is_neg())


def _same_view(one: torch.Tensor, other: torch.Tensor) -> bool:
    """Of two tensors over one storage, in one dtype: whether they view the same elements
    alike (tied weights)."""
    return (one.storage_offset() == other.storage_offset() and one.shape == other.shape
            and one.stride() == other.stride())


@dataclass(eq=False, slots=True)
class _Region:
    """The elements ``[start, end)`` of one storage that a state's tensors of one dtype
    view: one buffer of the copy."""

    path: Path  # the first of those tensors met: the buffer's key in a BufferSet
    source: torch.Tensor  # one of them, to read the storage through
    start: int
    end: int
    # Viewed by ``source`` alone (tied tensors included), contiguous: most tensors. The
    # buffer is then its copy, of its shape, made without a view on either side.
    whole: bool

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape) if self.whole else (self.end - self.start,)


class _Planner:
    """What a copy of a state needs, copying nothing: each tensor met (in the order the
    copy meets them) with its kind and region, a region per storage and dtype they view,
    a dense buffer per conjugate or negative view."""

    def __init__(self) -> None:
        # Per tensor met (parallel lists: a snapshot may hold thousands of tensors).
        self.kinds: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self.placed: list[_Region | None] = []
        self.regions: dict[tuple[Any, ...], _Region] = {}
        self.dense: dict[tuple[Any, ...], tuple[Path, tuple[int, ...], torch.dtype]] = {}
        self.cuda_devices: set[torch.device] = set()

    def visit(self, value: Any, path: Path) -> None:
        # The containers _Copier.copy rebuilds, in its order.
        if isinstance(value, torch.Tensor):
            self.tensor(value, path)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                self.visit(item, (*path, key))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                self.visit(item, (*path, index))

    def tensor(self, value: torch.Tensor, path: Path) -> None:
        # Read as it is (a parameter too): the copy runs under no_grad.
        device = value.device
        kind = _kind(value, device)
        region = None
        if kind == _REGION:
            key = (value.untyped_storage().data_ptr(), device, value.dtype)
            region = self.regions.get(key)
            if region is None:
                start, end = _extent(value)
                region = self.regions[key] = _Region(path, value, start, end,
                                                     value.is_contiguous())
            elif not _same_view(value, region.source):
                start, end = _extent(value)
                region.start, region.end = min(region.start, start), max(region.end, end)
                region.whole = False
        elif kind == _DENSE:
            self.dense.setdefault(_view_key(value), (path, tuple(value.shape), value.dtype))
        if device.type == "cuda" and kind in (_REGION, _DENSE):
            self.cuda_devices.add(device)
        self.kinds.append(kind)
        self.tensors.append(value)
        self.placed.append(region)

    def layout(self) -> list[tuple[Path, tuple[int, ...], Any]]:
        """(key, shape, dtype) of each buffer, none empty."""
        return [*((r.path, r.shape, r.source.dtype) for r in self.regions.values()),
                *self.dense.values()]


class _Copier:
    """The copy of a state along its plan: containers rebuilt, tensors into the set's
    buffers (reused where they fit), other values deep-copied."""

    def __init__(self, plan: _Planner, previous: dict[Path, torch.Tensor]) -> None:
        self.leaves = zip(plan.kinds, plan.tensors, plan.placed, strict=True)
        self.previous = previous
        self.used: dict[Path, torch.Tensor] = {}
        self.dense: dict[tuple[Any, ...], torch.Tensor] = {}
        self.filled: dict[_Region, torch.Tensor] = {}
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
        return copy.deepcopy(value)

    def tensor(self, value: torch.Tensor, path: Path) -> torch.Tensor:
        kind, source, region = next(self.leaves)
        if source is not value:
            # (A container that gives its items in another order each time.)
            raise RuntimeError(f"the state changed while it was copied, at {path!r}")
        if region is not None:
            return self._region_view(region, source)
        if kind == _META:
            return source
        if kind == _OTHER:
            # Sparse, quantized, tensor subclasses (DTensor ...): a plain copy, no reuse.
            return source.detach().to("cpu", copy=True)
        if kind == _EMPTY:
            return torch.empty(source.shape, dtype=source.dtype, device="cpu")
        key = _view_key(source)
        copied = self.dense.get(key)
        if copied is None:
            copied = self.dense[key] = self._buffer(path, tuple(source.shape), source)
            copied.copy_(source, non_blocking=source.device.type == "cuda")
        return copied

    def _region_view(self, region: _Region, source: torch.Tensor) -> torch.Tensor:
        buffer = self.filled.get(region)
        if buffer is None:
            buffer = self._buffer(region.path, region.shape, region.source)
            read = (region.source if region.whole else
                    region.source.as_strided(region.shape, (1,), region.start))
            buffer.copy_(read, non_blocking=source.device.type == "cuda")
            self.filled[region] = buffer
        if region.whole:
            return buffer  # (tied tensors: the same one)
        return buffer.as_strided(source.shape, source.stride(),
                                 source.storage_offset() - region.start)

    def _buffer(self, path: Path, shape: tuple[int, ...], source: torch.Tensor) -> torch.Tensor:
        """The set's buffer ``path`` when it fits, else a new one; on the CPU whatever
        torch's default device, pinned for a CUDA source."""
        on_cuda = source.device.type == "cuda"
        buffer = self.previous.get(path)
        if (
            buffer is None
            or tuple(buffer.shape) != shape
            or buffer.dtype != source.dtype
            or (on_cuda and not buffer.is_pinned())
        ):
            buffer = torch.empty(shape, dtype=source.dtype, device="cpu", pin_memory=on_cuda)
        if on_cuda:
            self.cuda_devices.add(source.device)
        self.used[path] = buffer
        return buffer

    def record_events(self) -> list[Any]:
        events = []
        for device in self.cuda_devices:
            with torch.cuda.device(device):
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                event.record()
                events.append(event)
        return events
