"""The ``torch.save`` format of a snapshot, and a kept rank's snapshot buffers in shared
memory, which a replacement rank on the same machine uses in place.

:func:`serialize` writes a snapshot's state as ``torch.save`` does (the checkpoint's
files), on the upload thread, on a peer server's and on a restore's.

With ``FailureConfig(keep_survivors=True)``, ``report_snapshot`` copies a state into buffers
carved from one anonymous shared-memory file per buffer set (an :class:`Arena`,
``memfd_create``; Linux) instead of private memory. The copy costs the same once the
buffers exist; their first allocation takes about half as long again (shared pages). A
surviving rank then serves its committed copy to a replacement on the same machine
without writing it anywhere: it sends the state's *skeleton* (the state serialized with
each arena tensor replaced by an empty one, a few KiB: :func:`describe`) and where each
of those tensors lies in the arena. The replacement opens the arena through
``/proc/<pid>/fd/<fd>`` (a regular file of its own user, of the device and inode the peer
named: :func:`open_arena`), maps it privately (its own writes never reach the peer's
memory), rebuilds the state over the mapping (:func:`rebuild`) and serializes it again
into a hasher: only a state that gives the manifest's size and checksum is used, as
for every other copy (:mod:`.peer_mapped`). Serializing a copy again into memory that
is new to the replacement cost it a gigabyte of page allocation per gigabyte of state;
mapping costs it none.

Where no arena exists (another OS, ``memfd_create`` refused, CUDA tensors, whose
buffers are pinned) or the replacement cannot open it (another machine or PID namespace,
another user), the copy is served as before (:mod:`.peer_shared`, or the socket).
"""

from __future__ import annotations

import collections
import copy
import fcntl
import inspect
import io
import itertools
import mmap
import os
import pickle
import stat
import weakref
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

# Where each tensor starts in an arena (torch.save aligns its records alike).
ALIGNMENT = 64
# The most bytes of tensors outside the arena a skeleton may carry (more: no skeleton).
INLINE_BYTES = 16 << 20

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)

Wire = tuple[int, int, int, int, int]  # (pid, fd, st_dev, st_ino, size) of an arena
# A tensor placed in the arena: (its index among the skeleton's tensors, the storage's
# offset in the arena and its bytes, dtype name, shape, stride, storage offset).
Placed = tuple[int, int, int, str, tuple[int, ...], tuple[int, ...], int]


def _zip_writer_parts() -> tuple[Any, Any, Any] | None:
    """torch's zip writer, its ``_save`` and storage alignment, when this torch has them
    as :func:`serialize` calls them (torch 2.x); None: use ``torch.save``."""
    import torch

    serialization = torch.serialization
    save = getattr(serialization, "_save", None)
    writer = getattr(torch._C, "PyTorchFileWriter", None)
    alignment = getattr(serialization, "_get_storage_alignment", None)
    if save is None or writer is None or alignment is None:
        return None
    try:
        parameters = list(inspect.signature(save).parameters)
    except (TypeError, ValueError):
        return None
    if parameters != ["obj", "zip_file", "pickle_module", "pickle_protocol",
                      "_disable_byteorder_record"]:
        return None
    return writer, save, alignment


def serialize(value: Any, sink: BinaryIO | Any) -> None:
    """``torch.save(value, sink)``, without the zip format's CRC-32 of every record.

    The checkpoint's own checksum (XXH3, computed by the sink as the bytes pass) already
    covers every byte, and the CRC-32 is most of torch.save's CPU time (about 0.4 s of
    0.55 s for 512 MB here): time the train loop's cores give to the upload. torch.load
    reads such files as it reads any other (``torch.serialization.set_crc32_options``
    documents them); ``unzip -t`` would call their CRCs wrong. On a torch without the
    parts this uses, plain ``torch.save``.
    """
    import torch

    parts = _zip_writer_parts()
    if parts is None:
        torch.save(value, sink)
        return
    writer_type, save, alignment = parts
    guarded = _FailOnce(sink)
    writer = writer_type(guarded, False, alignment())
    try:
        save(value, writer, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
        writer.write_end_of_file()
    except BaseException:
        # A writer left unfinished finishes its file when it is freed, which can be long
        # after this (the traceback holds it), into a sink the caller has closed by then:
        # its destructor throws in C++ and ends the process. Whatever raised (the pickler,
        # on a leaf it cannot pickle; the sink, mid-file: a peer that went away, a full
        # disk), finish it now, into nothing.
        guarded.failed = True
        try:
            writer.write_end_of_file()
        except Exception:
            pass
        raise


class _FailOnce:
    """``sink``, until a write to it raises (that error goes to the zip writer) or
    ``failed`` is set: every later write is dropped, so that the writer can still be
    finished (see :func:`serialize`)."""

    def __init__(self, sink: BinaryIO) -> None:
        self._sink = sink
        self.failed = False

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        if not self.failed:
            self._sink.flush()

    def write(self, data: Any) -> Any:
        if self.failed:
            return len(memoryview(data).cast("B"))
        try:
            return self._sink.write(data)
        except BaseException:
            self.failed = True
            raise


class Arena:
    """One anonymous shared-memory file, mapped (read and write) in this process; its
    descriptor stays open for as long as the mapping is referenced (by any tensor over
    it), so that a peer can open it through ``/proc``. Tensors are made with
    :meth:`tensor`; each has a storage of its own."""

    def __init__(self, fd: int, size: int, mapping: mmap.mmap) -> None:
        import torch

        self.fd = fd
        self.size = size
        self.mapping = mapping
        info = os.fstat(fd)
        self._identity = (info.st_dev, info.st_ino)
        self.base = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()

    @classmethod
    def create(cls, size: int) -> Arena | None:
        """A new arena of ``size`` bytes; None where this OS has no ``memfd_create`` or
        it fails (the caller uses private memory)."""
        make = getattr(os, "memfd_create", None)
        if make is None or not hasattr(fcntl, "F_ADD_SEALS") or size <= 0:
            return None
        try:
            fd = make("cairn-snapshot", getattr(os, "MFD_CLOEXEC", 0)
                      | getattr(os, "MFD_ALLOW_SEALING", 0))
        except OSError:
            return None
        try:
            os.ftruncate(fd, size)
            # Its size can no longer change: a peer's reads never fault past its end.
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            mapping = mmap.mmap(fd, size)
        except (OSError, ValueError):
            os.close(fd)
            return None
        weakref.finalize(mapping, os.close, fd)
        return cls(fd, size, mapping)

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        count = _nbytes(shape, dtype)
        flat = torch.frombuffer(self.mapping, dtype=torch.uint8, count=count, offset=offset)
        return flat.view(dtype).view(shape)

    def offset_of(self, tensor: Any) -> int | None:
        """Where ``tensor``'s storage starts in this arena; None when it is not in it."""
        storage = tensor.untyped_storage()
        start, nbytes = int(storage.data_ptr()) - self.base, int(storage.nbytes())
        return start if 0 <= start and start + nbytes <= self.size and nbytes else None

    def wire(self) -> Wire:
        return (os.getpid(), self.fd, *self._identity, self.size)


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * int(dtype.itemsize)


def allocate(layout: list[tuple[tuple[int, ...], Any]]) -> tuple[Arena, list[Any]] | None:
    """One arena holding a contiguous CPU tensor of each ``(shape, dtype)`` of ``layout``
    (none empty), and those tensors; None when no arena can be made."""
    offsets, size = [], 0
    for shape, dtype in layout:
        offsets.append(size)
        size += -(-_nbytes(shape, dtype) // ALIGNMENT) * ALIGNMENT
    arena = Arena.create(size)
    if arena is None:
        return None
    tensors = [arena.tensor(offset, shape, dtype)
               for offset, (shape, dtype) in zip(offsets, layout, strict=True)]
    return arena, tensors


def mapping_like(value: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """``items`` in a mapping of ``value``'s type (a dict when that type cannot be made
    from one), with a copy of a state dict's ``_metadata``."""
    try:
        if isinstance(value, collections.defaultdict):  # its factory comes first
            result: Any = type(value)(value.default_factory, items)
        else:
            result = type(value)(items)  # type: ignore[call-arg]
    except TypeError:
        result = dict(items)
    metadata = getattr(value, "_metadata", None)
    if metadata is not None:
        result._metadata = copy.deepcopy(metadata)
    return result


def each_tensor(value: Any, replace: Callable[[Any], Any]) -> Any:
    """``value`` with each tensor ``t`` in it replaced by ``replace(t)``: dicts (their
    type and a state dict's ``_metadata`` kept), lists and tuples rebuilt, in order;
    anything else as it is. Both ends of a transfer walk a state with this, so the n-th
    tensor met is the same one on both."""
    import torch

    if isinstance(value, torch.Tensor):
        return replace(value)
    if isinstance(value, Mapping):
        return mapping_like(value, {key: each_tensor(item, replace)
                                    for key, item in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(each_tensor(v, replace) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(each_tensor(v, replace) for v in value)
    return value


def describe(value: Any, arena: Arena) -> tuple[bytes, list[Placed]] | None:
    """The sending side: ``value``'s skeleton (serialized, its arena tensors replaced by
    empty ones) and where those lie in ``arena``; None when the tensors outside the
    arena are more than :data:`INLINE_BYTES` (such a state goes the usual way)."""
    import torch

    placed: list[Placed] = []
    seen: dict[int, Any] = {}
    counter = itertools.count()
    inline = 0

    def replace(tensor: Any) -> Any:
        nonlocal inline
        if id(tensor) in seen:
            return seen[id(tensor)]
        index = next(counter)
        offset = (arena.offset_of(tensor)
                  if type(tensor) is torch.Tensor and tensor.device.type == "cpu" else None)
        if offset is None:
            if tensor.device.type != "meta":  # (a meta tensor has no data to carry)
                inline += tensor.numel() * tensor.element_size()
            seen[id(tensor)] = tensor
            return tensor
        placed.append((index, offset, tensor.untyped_storage().nbytes(),
                       str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape),
                       tuple(tensor.stride()), tensor.storage_offset()))
        seen[id(tensor)] = torch.empty(0, dtype=tensor.dtype, device="cpu")
        return seen[id(tensor)]

    skeleton = each_tensor(value, replace)
    if inline > INLINE_BYTES:
        return None
    buffer = io.BytesIO()
    serialize(skeleton, buffer)
    return buffer.getvalue(), placed


def load_bytes(data: bytes) -> Any:
    """A small file's state from its bytes (``torch.load``, tensor types only)."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")


def open_arena(wire: object, limit: int) -> mmap.mmap | None:
    """The receiving side: a peer's arena (``wire``, unchecked), mapped privately
    (copy-on-write: nothing written here reaches the peer), when it is a regular file of
    this user with the device and inode named, at least as large as named and sealed
    against shrinking (an arena), and the size named at most ``limit``; None (nothing
    opened) otherwise."""
    if not (isinstance(wire, tuple) and len(wire) == 5 and all(type(v) is int for v in wire)
            and hasattr(fcntl, "F_GET_SEALS")):
        return None
    pid, fd, device, inode, size = wire
    if not (0 < pid and 0 <= fd and 0 < size <= limit):
        return None
    path = f"/proc/{pid}/fd/{fd}"
    try:
        # Its type before it is opened (the link is followed): never a FIFO or a device.
        found = os.stat(path)
        if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != (device, inode):
            return None
        handle = os.open(path, os.O_RDONLY | _CLOEXEC | _NONBLOCK | _NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(handle)
        if not (stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == (device, inode)
                and info.st_uid == os.geteuid() and info.st_size >= size
                and fcntl.fcntl(handle, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK):
            return None
        return mmap.mmap(handle, size, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError):
        return None
    finally:
        os.close(handle)


def rebuild(skeleton: bytes, placed: object, mapping: mmap.mmap) -> Any:
    """The state a peer described (:func:`describe`), its arena tensors over
    ``mapping``. Raises ``ValueError`` (or what ``torch.load`` raises) when the
    description does not fit; the caller still checks what it gives against the
    manifest."""
    import torch

    value = torch.load(io.BytesIO(skeleton), weights_only=True, map_location="cpu")
    where: dict[int, Placed] = {}
    for entry in placed if isinstance(placed, list) else ():
        where[_checked(entry, len(mapping))[0]] = entry
    if not isinstance(placed, list) or len(where) != len(placed):
        raise ValueError("the peer's description of its tensors is malformed")
    made: dict[int, Any] = {}
    # Tensors placed over one storage (views of one snapshot buffer) share one again:
    # serialized, the storage is written once, as it was by the peer.
    storages: dict[tuple[int, int], Any] = {}
    counter = itertools.count()

    def replace(tensor: Any) -> Any:
        if id(tensor) in made:
            return made[id(tensor)]
        entry = where.pop(next(counter), None)
        if entry is None:
            made[id(tensor)] = tensor
            return tensor
        _, offset, nbytes, dtype_name, shape, stride, storage_offset = entry
        dtype = getattr(torch, dtype_name)
        if tensor.numel() or tensor.dtype != dtype:
            raise ValueError("the peer's skeleton does not match its tensors")
        storage = storages.get((offset, nbytes))
        if storage is None:
            storage = storages[offset, nbytes] = torch.frombuffer(
                mapping, dtype=torch.uint8, count=nbytes, offset=offset).untyped_storage()
        made[id(tensor)] = torch.empty(0, dtype=dtype, device="cpu").set_(
            storage, storage_offset, shape, stride)
        return made[id(tensor)]

    result = each_tensor(value, replace)
    if where:
        raise ValueError("the peer described tensors its skeleton does not have")
    return result


def _checked(entry: object, size: int) -> Placed:
    import torch

    if not (isinstance(entry, tuple) and len(entry) == 7):
        raise ValueError("the peer's description of a tensor is malformed")
    index, offset, nbytes, dtype_name, shape, stride, storage_offset = entry
    ints = (index, offset, nbytes, storage_offset)
    if not (all(type(v) is int and v >= 0 for v in ints) and 0 < nbytes
            and offset + nbytes <= size and isinstance(dtype_name, str)
            and isinstance(getattr(torch, dtype_name, None), torch.dtype)
            and isinstance(shape, tuple) and isinstance(stride, tuple)
            and len(shape) == len(stride) <= 64
            and all(type(v) is int and 0 <= v < 2**62 for v in (*shape, *stride))):
        raise ValueError("the peer's description of a tensor is malformed")
    return entry
