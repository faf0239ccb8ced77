"""The whole training state in a checkpoint directory, rank-aware.

Layout (``format_version`` 1, in every file that Cairn writes here)::

    model.pt                  rank 0   the model's state dict (unwrapped from DDP)
    optimizer.pt              rank 0   when an optimizer is given
    scheduler.pt              rank 0   when an LR scheduler is given
    progress.pt               rank 0   step, epoch, extra, world size
    rank_<r>/rank_state.pt    rank r   RNG states and the data loader's position

State that data parallelism replicates (model, optimizer, scheduler, counters) is written
once, by rank 0; state that differs per rank is written by every rank under its own
``rank_<r>/`` prefix. So when every rank reports its directory, the files merge into one
checkpoint without collisions. ``save_training_state`` and ``report_snapshot`` write the
same layout, and ``load_training_state`` reads either.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.config.checks import directory_text
from cairn._src.errors import CheckpointNotFoundError, ConfigError, ManifestError
from cairn._src.storage.uris import public_uri, scheme_of
from cairn._src.torch.data_loader import resharded_position, samples_per_batch
from cairn._src.torch.placement import rank_and_world_size
from cairn._src.torch.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
PROGRESS_FILE = "progress.pt"
RANK_STATE_NAME = "rank_state.pt"


def rank_state_file(rank: int) -> str:
    return f"rank_{rank}/{RANK_STATE_NAME}"


@dataclass(frozen=True)
class TrainingState:
    """What :func:`load_training_state` read besides what it loaded into your objects.

    ``step`` and ``epoch`` are the values saved (by convention: the next step and epoch
    to run); ``extra`` is the saved ``extra`` dict; ``data_loader_position`` the position
    given to the data loader (None without one: this rank's saved position, or, when the
    world size changed or this rank saved none, rank 0's, as every rank then takes it);
    ``world_size`` the world size of the run that saved it; ``rank_state_restored`` is
    False when the checkpoint holds no state for this rank (a rank added since), so its
    RNGs were not restored.
    """

    step: int
    epoch: int
    extra: dict[str, Any] = field(default_factory=dict)
    data_loader_position: dict[str, Any] | None = None
    world_size: int = 1
    rank_state_restored: bool = True


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside the wrappers around ``model``: DistributedDataParallel,
    DataParallel and ``torch.compile``'s ``OptimizedModule``, nested in any order."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif _is_compiled(model):
            model = cast(nn.Module, model._orig_mod)
        else:
            return model


def _is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is what ``torch.compile(module)`` returns. Such a module exists only
    once ``torch._dynamo`` is imported: it is not imported here for the question."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    compiled = getattr(eval_frame, "OptimizedModule", None)
    return isinstance(compiled, type) and isinstance(model, compiled)


def _check_stateful(function: str, name: str, value: object) -> None:
    if value is not None and not (
        callable(getattr(value, "state_dict", None))
        and callable(getattr(value, "load_state_dict", None))
    ):
        raise ConfigError(
            f"{function}({name}={value!r}) must have state_dict() and load_state_dict() "
            "(a torch optimizer, LR scheduler or data loader), or be None."
        )


def _check_counter(function: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{function}({name}={value!r}) must be an integer >= 0.")


def _check_flag(function: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{function}({name}={value!r}) must be True or False.")


def _local_path(function: str, name: str, value: object, *, remote_hint: str) -> str:
    """``value``, the path of a local directory, as a ``str``; or :class:`ConfigError`
    naming ``function``'s ``name`` when it is not a non-empty ``str`` or ``os.PathLike``
    of one, or is a URI (``remote_hint`` says what to do instead)."""
    text = directory_text(value, shown=f"{function}({name}={value!r})")
    if scheme_of(text) is not None:
        raise ConfigError(
            f"{function}({name}={public_uri(text)!r}) is a URI, and {name} is a local "
            f"directory: {remote_hint}")
    return text


def _check_map_location(value: object) -> None:
    """:class:`ConfigError` for a ``map_location`` that ``torch.load`` does not take."""
    accepted = ("a device (such as 'cpu', 'cuda:0' or a torch.device), a dict of device "
                "names, a function, or None, as torch.load takes")
    if isinstance(value, str):
        try:
            torch.device(value)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"load_training_state(map_location={value!r}) is not a device; pass "
                f"{accepted}.") from exc
    elif not (value is None or isinstance(value, (torch.device, dict)) or callable(value)):
        raise ConfigError(f"load_training_state(map_location={value!r}) must be {accepted}.")


def check_state_arguments(
    function: str,
    *,
    model: object,
    optimizer: object = None,
    scheduler: object = None,
    data_loader: object = None,
    step: object = 0,
    epoch: object = 0,
    extra: object = None,
) -> None:
    """:class:`ConfigError` naming the first argument of ``function`` that is not accepted."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{function}(model={model!r}) must be a torch.nn.Module.")
    _check_stateful(function, "optimizer", optimizer)
    _check_stateful(function, "scheduler", scheduler)
    _check_stateful(function, "data_loader", data_loader)
    _check_counter(function, "step", step)
    _check_counter(function, "epoch", epoch)
    if extra is not None and not isinstance(extra, Mapping):
        raise ConfigError(f"{function}(extra={extra!r}) must be a dict or None.")


def collect_training_state(
    *,
    model: nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    data_loader: Any = None,
    step: int = 0,
    epoch: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The files this rank writes (relative name -> object for ``torch.save``).

    The objects still reference live tensors: copy or save them before training goes on.
    """
    rank, world_size = rank_and_world_size()
    files: dict[str, Any] = {}
    if rank == 0:
        files[MODEL_FILE] = unwrap_model(model).state_dict()
        if optimizer is not None:
            files[OPTIMIZER_FILE] = optimizer.state_dict()
        if scheduler is not None:
            files[SCHEDULER_FILE] = scheduler.state_dict()
        files[PROGRESS_FILE] = {"format_version": FORMAT_VERSION, "step": step, "epoch": epoch,
                                "extra": dict(extra or {}), "world_size": world_size}
    files[rank_state_file(rank)] = {
        "format_version": FORMAT_VERSION,
        "rank": rank,
        "rng": capture_rng_state(),
        "data_loader": None if data_loader is None else data_loader.state_dict(),
        # How to carry the position over to another world size (see resharded_position).
        "data_loader_samples_per_batch": samples_per_batch(data_loader),
    }
    return files


def write_files(directory: str, files: Mapping[str, Any]) -> None:
    """``torch.save`` every object of ``files`` under ``directory``."""
    for name, value in files.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(value, path)


def save_training_state(
    directory: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    data_loader: Any = None,
    step: int = 0,
    epoch: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> list[str]:
    """Write this rank's part of the training state into ``directory``; return its files.

    Rank 0 writes the model (unwrapped from DDP), optimizer, scheduler, ``step``,
    ``epoch`` and ``extra`` (a dict of anything ``torch.save`` takes; load it with
    ``weights_only=False`` if it holds more than tensors and plain values); every rank
    writes ``rank_<r>/rank_state.pt`` with its RNG states (Python, NumPy, torch CPU and
    CUDA) and its ``data_loader``'s position. Then ``cairn.report(...,
    checkpoint=Checkpoint.from_directory(directory))`` on every rank merges them. Assumes
    the model and optimizer are replicated (DDP), as they are after every step.

    Raises :class:`ConfigError` for an argument it does not take: a ``directory`` that is
    not the path of a local directory (a ``str`` or ``os.PathLike``; not a URI, not a file),
    or an ``extra`` that ``torch.save`` cannot pickle (its partial ``progress.pt`` removed).
    """
    path = _local_path(
        "save_training_state", "directory", directory,
        remote_hint="save into one (such as tempfile.mkdtemp()), then cairn.report(..., "
                    "checkpoint=cairn.Checkpoint.from_directory(directory)) uploads it to "
                    "the run's storage.")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(
            f"save_training_state(directory={path!r}) is a file, not a directory; pass a "
            "directory (it is created when missing).")
    check_state_arguments("save_training_state", model=model, optimizer=optimizer,
                          scheduler=scheduler, data_loader=data_loader, step=step, epoch=epoch,
                          extra=extra)
    files = collect_training_state(model=model, optimizer=optimizer, scheduler=scheduler,
                                   data_loader=data_loader, step=step, epoch=epoch, extra=extra)
    try:
        write_files(path, files)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        if not extra or _pickles(extra):
            raise
        with contextlib.suppress(OSError):  # what torch.save began of it
            os.remove(os.path.join(path, PROGRESS_FILE))
        raise ConfigError(
            f"save_training_state(extra=...) holds something torch.save cannot pickle "
            f"({type(exc).__name__}: {str(exc)[:200]}); pass tensors, plain values and "
            "objects of importable classes (not lambdas, local functions, open files or "
            "locks).") from exc
    return sorted(files)


def _pickles(value: object) -> bool:
    """Whether ``torch.save`` takes ``value``."""
    try:
        torch.save(value, io.BytesIO())
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _checked_checkpoint(checkpoint: object) -> Checkpoint | str:
    """``checkpoint`` itself when a :class:`Checkpoint`, else the local directory it names;
    :class:`ConfigError` when it is neither."""
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, (str, os.PathLike)):
        return _local_path("load_training_state", "checkpoint", checkpoint,
                           remote_hint="for a checkpoint on storage pass "
                                       "cairn.Checkpoint(uri) (or cairn.get_checkpoint()), "
                                       "which downloads it.")
    raise ConfigError(
        f"load_training_state(checkpoint={checkpoint!r}) must be a cairn.Checkpoint or the "
        "path of a local directory."
    )


@contextlib.contextmanager
def _local_directory(checkpoint: Checkpoint | str) -> Iterator[str]:
    if isinstance(checkpoint, Checkpoint):
        with checkpoint.as_directory() as directory:
            yield directory
    else:
        yield checkpoint


def _load(directory: str, name: str, map_location: Any, weights_only: bool) -> Any:
    path = os.path.join(directory, name)
    if name == MODEL_FILE:
        # Mapped, not read: load_state_dict copies each tensor into the module's own, so
        # reading the file into new memory first would copy the model twice.
        try:
            return torch.load(path, map_location=map_location, weights_only=weights_only,
                              mmap=True)
        except RuntimeError:
            pass  # a file torch cannot map (not its zip format): read as any other
    return torch.load(path, map_location=map_location, weights_only=weights_only)


def load_training_state(
    checkpoint: Checkpoint | str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: Any = None,
    scheduler: Any = None,
    data_loader: Any = None,
    restore_rng: bool = True,
    map_location: Any = "cpu",
    weights_only: bool = True,
) -> TrainingState:
    """Load a training state written by :func:`save_training_state` or ``report_snapshot``.

    ``checkpoint`` is a :class:`cairn.Checkpoint` (``cairn.get_checkpoint()``; downloaded
    and verified when remote) or a local directory. Loads the model (into the module inside
    a DDP wrapper, strictly), the optimizer and the scheduler when given, this rank's
    RNG states (unless ``restore_rng=False``) and the ``data_loader``'s position, and
    returns the :class:`TrainingState` with the step, the epoch and ``extra``. Call it
    after building the model, optimizer and data loader (building draws random numbers;
    restoring the RNGs comes last). Raises :class:`CheckpointNotFoundError` when the
    directory holds no training state, and :class:`ConfigError` for an argument it does
    not take (``restore_rng`` and ``weights_only`` are True or False).
    """
    source = _checked_checkpoint(checkpoint)
    check_state_arguments("load_training_state", model=model, optimizer=optimizer,
                          scheduler=scheduler, data_loader=data_loader)
    _check_flag("load_training_state", "restore_rng", restore_rng)
    _check_map_location(map_location)
    _check_flag("load_training_state", "weights_only", weights_only)
    rank, world_size = rank_and_world_size()
    names = [PROGRESS_FILE, MODEL_FILE, rank_state_file(rank)] + [
        name for name, target in ((OPTIMIZER_FILE, optimizer), (SCHEDULER_FILE, scheduler))
        if target is not None]
    held = (checkpoint._verified_objects(names, shared=(MODEL_FILE,))
            if isinstance(checkpoint, Checkpoint) and map_location in ("cpu", None) else None)
    if held is not None and _saved_world_size(held[PROGRESS_FILE]) != world_size:
        held = None  # the data position then comes from rank 0's file: read the checkpoint
    if held is not None:
        # A kept rank's own memory copy, verified against the manifest: no file is read,
        # and the held model tensors are copied straight into the module's own.
        return _restore(held.get, held.__contains__, str, checkpoint, model=model,
                        optimizer=optimizer, scheduler=scheduler, data_loader=data_loader,
                        restore_rng=restore_rng, shared_model=True)
    with _local_directory(source) as directory:
        return _restore(
            lambda name: _load(directory, name, "cpu" if name.endswith(RANK_STATE_NAME)
                               else map_location, weights_only),
            lambda name: os.path.isfile(os.path.join(directory, name)),
            lambda name: os.path.join(directory, name) if name else directory, checkpoint,
            model=model,
            optimizer=optimizer, scheduler=scheduler, data_loader=data_loader,
            restore_rng=restore_rng)


def _load_model(module: nn.Module, state: Mapping[str, Any], *, shared: bool) -> None:
    """``module.load_state_dict(state)``. With ``shared`` (``state`` holds a kept rank's
    memory copy, which must stay as it is: no deep copy was made) loaded again from a deep
    copy when the module kept any of those tensors instead of copying them into its own
    (a custom ``_load_from_state_dict``, a hook that assigns)."""
    module.load_state_dict(state)
    if not shared:
        return
    held = {t.untyped_storage().data_ptr() for t in state.values()
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes()}
    kept = itertools.chain(module.parameters(), module.buffers())
    if any(t.untyped_storage().data_ptr() in held for t in kept):
        logger.debug("The model kept tensors of the memory copy; loading a deep copy")
        module.load_state_dict(copy.deepcopy(state))


def _restore(load: Callable[[str], Any], has: Callable[[str], bool],
             where: Callable[[str], str], checkpoint: object, *, model: nn.Module,
             optimizer: Any, scheduler: Any, data_loader: Any,
             restore_rng: bool, shared_model: bool = False) -> TrainingState:
    rank, _ = rank_and_world_size()
    if not has(PROGRESS_FILE):
        raise CheckpointNotFoundError(
            f"load_training_state(checkpoint={checkpoint!r}): {where('')!r} holds no "
            f"{PROGRESS_FILE}, so it is not a training state written by "
            "save_training_state() or report_snapshot(model=...)."
        )
    progress = load(PROGRESS_FILE)
    if progress.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"{where(PROGRESS_FILE)!r} has format_version="
            f"{progress.get('format_version')!r}; this Cairn reads {FORMAT_VERSION}."
        )
    _load_model(unwrap_model(model), load(MODEL_FILE), shared=shared_model)
    for name, target in ((OPTIMIZER_FILE, optimizer), (SCHEDULER_FILE, scheduler)):
        if target is None:
            continue
        if not has(name):
            raise CheckpointNotFoundError(
                f"load_training_state(...) was given a {name.split('.')[0]}, but the "
                f"checkpoint has no {name}: it was saved without one."
            )
        target.load_state_dict(load(name))
    saved_world_size = _saved_world_size(progress)
    restored = has(rank_state_file(rank))
    rank_state = load(rank_state_file(rank)) if restored else None
    if not restored:
        logger.warning("The checkpoint holds no state for rank %d (saved by %d ranks): its "
                       "RNGs are not restored, its data loader takes rank 0's position", rank,
                       saved_world_size)
    position = _data_position(load, has, rank_state, data_loader,
                              saved_world_size=saved_world_size)
    if data_loader is not None and position is not None:
        data_loader.load_state_dict(position)
    if rank_state is not None and restore_rng:
        restore_rng_state(rank_state["rng"])
    return TrainingState(
        step=int(progress["step"]),
        epoch=int(progress["epoch"]),
        extra=dict(progress.get("extra") or {}),
        data_loader_position=position,
        world_size=saved_world_size,
        rank_state_restored=restored,
    )


def _saved_world_size(progress: Any) -> int:
    return int(progress.get("world_size", 1)) if isinstance(progress, Mapping) else 1


def _data_position(load: Callable[[str], Any], has: Callable[[str], bool],
                   rank_state: Any, data_loader: Any, *, saved_world_size: int) -> Any:
    """The data loader position this rank resumes from: its own saved one while the world
    size is the saved one; else rank 0's (in every checkpoint that holds a position, and
    readable by every rank), carried over to this world size, so that every rank steps
    through the same number of batches (see ``resharded_position``)."""
    rank, world_size = rank_and_world_size()
    if rank_state is not None and saved_world_size == world_size:
        return rank_state.get("data_loader")
    if rank_state is not None and rank == 0:
        state = rank_state
    elif has(rank_state_file(0)):
        state = load(rank_state_file(0))
    else:
        return None
    position = state.get("data_loader")
    if position is None or saved_world_size == world_size:
        return position
    return resharded_position(data_loader, position, saved_world_size=saved_world_size,
                              saved_samples_per_batch=state.get("data_loader_samples_per_batch"))
