"""``prepare_data_loader``: shard a DataLoader across ranks, reseed it every epoch, and
remember where it is, so a restored run reads exactly the batches it would have read.

Data order is a pure function of ``(seed, epoch, rank, world size)``: the sampler is a
:class:`~torch.utils.data.DistributedSampler` reseeded with the epoch at the start of every
pass (with the seed, shuffle, drop_last and ranks of a DistributedSampler the user passed
in, else ``seed`` over the run's ranks), and the loader's own generator (which seeds
DataLoader worker processes) is reseeded from ``(seed, epoch, rank)``, so iterating never
draws from the global torch RNG. A loader kept as it is (``add_dist_sampler=False``) that
has no generator is given one, reseeded the same way. The position (epoch, batches handed
out) is saved with the training state, and a restored loader skips the batches already
seen at the sampler, without loading them.

The epoch of a pass is the one after the pass before, unless the user picked it: an
explicit ``set_epoch(epoch)`` on the loader, on ``loader.sampler`` (Ray Train's idiom) or
on a DistributedSampler the user passed in makes the next pass that epoch.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import operator
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from cairn._src.errors import ConfigError
from cairn._src.torch.placement import get_device, move_to_device, rank_and_world_size
from cairn._src.torch.reproducibility import reproducibility_seed

logger = logging.getLogger(__name__)

POSITION_KEYS = ("epoch", "batch")


MAX_SEED = 2**63 - 1
"""The largest seed and the largest epoch: a DistributedSampler seeds torch's generator
with ``seed + epoch``, which torch takes below ``2**64``."""


def _checked_epoch(epoch: object) -> int:
    """``epoch`` as an int, for ``set_epoch(epoch)``: an integer (also a NumPy one) from 0
    to :data:`MAX_SEED`."""
    try:
        value = -1 if isinstance(epoch, bool) else operator.index(epoch)  # type: ignore[arg-type]
    except TypeError:
        value = -1
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(
            f"set_epoch(epoch={epoch!r}) must be an integer from 0 to 2**63 - 1.")
    return value


def _checked_seed(seed: object) -> int:
    """``prepare_data_loader``'s seed: ``seed`` when given (an integer from 0 to
    :data:`MAX_SEED`), else :func:`enable_reproducibility`'s of this attempt modulo
    ``2**63``, else 0."""
    if seed is None:
        inherited = reproducibility_seed()
        return 0 if inherited is None else inherited % (MAX_SEED + 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(
            f"prepare_data_loader(seed={seed!r}) must be an integer from 0 to 2**63 - 1 "
            "(torch seeds the sampler with seed + epoch, which must stay below 2**64), or "
            "None for the seed of enable_reproducibility() (else 0)."
        )
    return seed


class _ResumableSampler(DistributedSampler):  # type: ignore[type-arg]
    """A DistributedSampler that can start a pass part-way (``start`` indices in).

    Its ``set_epoch(epoch)`` (Ray Train's ``loader.sampler.set_epoch(epoch)``) is the
    user's choice of the next pass's epoch: it is kept in ``requested_epoch``, which the
    :class:`PreparedDataLoader` takes as its own ``set_epoch(epoch)`` before its next use.
    The loader sets each pass's epoch with :meth:`begin_pass`.
    """

    def __init__(self, dataset: Sized, *, num_replicas: int, rank: int, shuffle: bool,
                 seed: int, drop_last: bool) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank,  # type: ignore[arg-type]
                         shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.start = 0
        self.requested_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        self.requested_epoch = _checked_epoch(epoch)
        super().set_epoch(self.requested_epoch)

    def begin_pass(self, epoch: int, start: int) -> None:
        """The pass that starts now is ``epoch``, from ``start`` indices in."""
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(super().__iter__(), self.start, None)

    def __len__(self) -> int:
        return int(self.num_samples) - self.start


def _pass_seed(seed: int, epoch: int, rank: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{epoch}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class PreparedDataLoader:
    """A DataLoader that shards across ranks, reseeds every epoch and can resume mid-epoch.

    Iterate it like the DataLoader it wraps; other attributes (``dataset``,
    ``batch_size`` ...) are the wrapped loader's. Every ``iter()`` is one pass over this
    rank's shard: the first is epoch 0 (or the restored epoch), each completed pass moves
    to the next epoch, and so does a pass abandoned part-way: as soon as its iterator is
    closed (a ``for`` loop left by ``break`` releases it; so does dropping the last
    reference to an explicit ``iter(loader)``), or else when the next ``iter()`` starts.
    An iterator still held is a pass in progress. ``set_epoch(n)`` makes the next pass
    epoch ``n``, and so does ``loader.sampler.set_epoch(n)`` (Ray Train's idiom), or
    ``set_epoch(n)`` on a DistributedSampler passed to :func:`prepare_data_loader` (seen
    when it changes that sampler's epoch); the passes after it count on from ``n``.

    ``state_dict()`` is the position (``{"epoch": e, "batch": b}``: ``b`` batches of epoch
    ``e`` handed out); ``load_state_dict()`` makes the next pass continue from there.
    Batches are moved to :func:`get_device` when it is not the CPU. Not thread-safe.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        *,
        sampler: _ResumableSampler | None,
        users_sampler: DistributedSampler | None,  # type: ignore[type-arg]
        generator: torch.Generator | None,
        seed: int,
        rank: int,
        move_to_device: bool,
    ) -> None:
        self._loader = loader
        self._sampler = sampler
        # The user's own DistributedSampler: a set_epoch on it shows as a new epoch.
        self._users_sampler = users_sampler
        self._users_epoch = 0
        self._generator = generator
        self._seed = seed
        self._rank = rank
        self._move = move_to_device
        self._epoch = 0
        self._batch = 0
        self._active = False
        self._pass = 0

    @property
    def data_loader(self) -> DataLoader[Any]:
        """The DataLoader this wraps (with the distributed sampler, when one was added)."""
        return self._loader

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress, or of the next pass."""
        self._take_requested_epoch()
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (a pass in progress counts as done).

        A restored mid-epoch position is kept when ``epoch`` is its epoch, so calling
        ``set_epoch(epoch)`` before every pass (the DistributedSampler habit) is harmless.
        """
        epoch = _checked_epoch(epoch)
        self._take_requested_epoch()
        self._set_epoch(epoch)

    def _set_epoch(self, epoch: int) -> None:
        if self._active:
            self._pass += 1  # the held iterator no longer moves the position
        if self._active or epoch != self._epoch:
            self._batch = 0
        self._active = False
        self._epoch = epoch

    def _take_requested_epoch(self) -> None:
        """Apply, as :meth:`set_epoch`, an epoch the user set on a sampler since the last
        look: on ``loader.sampler`` (it keeps the request), or on their own
        DistributedSampler (its ``epoch`` changed)."""
        requested: object = None
        users = self._users_sampler
        if users is not None and users.epoch != self._users_epoch:
            requested = self._users_epoch = users.epoch
        if self._sampler is not None and self._sampler.requested_epoch is not None:
            requested, self._sampler.requested_epoch = self._sampler.requested_epoch, None
        if requested is not None:
            self._set_epoch(_checked_epoch(requested))

    def state_dict(self) -> dict[str, int]:
        """Where this loader is: ``{"epoch": e, "batch": b}`` (``b`` batches handed out)."""
        self._take_requested_epoch()
        return {"epoch": self._epoch, "batch": self._batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position :meth:`state_dict` returned: the next pass is epoch
        ``state["epoch"]`` without its first ``state["batch"]`` batches."""
        if not isinstance(state, dict) or set(state) != set(POSITION_KEYS) or any(
            isinstance(state[k], bool) or not isinstance(state[k], int) or state[k] < 0
            for k in POSITION_KEYS
        ) or state["epoch"] > MAX_SEED:
            raise ConfigError(
                f"load_state_dict(state={state!r}) must be {{'epoch': int from 0 to "
                "2**63 - 1, 'batch': int >= 0}, as state_dict() returns."
            )
        self._take_requested_epoch()
        self._set_epoch(state["epoch"])
        self._batch = state["batch"]

    def __len__(self) -> int:
        """Batches per pass on this rank (a full epoch, whatever the position)."""
        if self._sampler is None:
            return len(self._loader)
        samples = int(self._sampler.num_samples)
        size = self._loader.batch_size
        if size is None:
            return samples
        return samples // size if self._loader.drop_last else -(-samples // size)

    def __iter__(self) -> Iterator[Any]:
        self._take_requested_epoch()
        if self._active:
            # The previous pass was abandoned part-way: it counts as done.
            self._epoch, self._batch = self._epoch + 1, 0
        self._pass += 1
        self._active = True
        skip = self._batch
        if self._generator is not None:
            self._generator.manual_seed(_pass_seed(self._seed, self._epoch, self._rank))
        if self._sampler is not None:
            self._sampler.begin_pass(self._epoch, skip * (self._loader.batch_size or 1))
            iterator = iter(self._loader)
        else:
            set_epoch = getattr(self._loader.sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self._epoch)
                if self._users_sampler is not None:
                    self._users_epoch = self._users_sampler.epoch
            iterator = iter(self._loader)
            for _ in range(skip):  # no sampler of ours: skip by reading
                if next(iterator, _END) is _END:
                    break
        return self._run(self._pass, iterator)

    def _run(self, token: int, iterator: Iterator[Any]) -> Iterator[Any]:
        device = get_device()
        move = self._move and device.type != "cpu"
        non_blocking = bool(self._loader.pin_memory)
        try:
            for batch in iterator:
                if token == self._pass:
                    self._batch += 1
                yield move_to_device(batch, device, non_blocking=non_blocking) if move else batch
        except GeneratorExit:
            # Closed part-way (a ``break`` out of the loop): the pass is over now, as the
            # next ``iter()`` would count it, so a state saved before that ``iter()`` resumes
            # where this loader goes on, at the next epoch, and not in the rest of this one.
            pass
        if token == self._pass:
            self._epoch, self._batch, self._active = self._epoch + 1, 0, False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        self._take_requested_epoch()
        return (f"PreparedDataLoader(epoch={self._epoch}, batch={self._batch}, "
                f"batches_per_epoch={len(self)})")


_END = object()


def samples_per_batch(loader: object) -> int | None:
    """The samples in each batch of ``loader`` when it is a :class:`PreparedDataLoader`
    with its distributed sampler (the only order whose resharding is known), else None."""
    if not isinstance(loader, PreparedDataLoader) or loader._sampler is None:
        return None
    return int(loader._loader.batch_size or 1)


def resharded_position(loader: object, position: Any, *, saved_world_size: int,
                       saved_samples_per_batch: int | None) -> Any:
    """``position``, saved by a rank of a ``saved_world_size`` world, as a position of
    ``loader`` in this world, the same on every rank of it.

    Within an epoch, the ranks of a world of ``W`` that each handed out ``b`` batches of
    ``s`` samples have together consumed the first ``b * s * W`` indices of the epoch's
    order (a function of the seed and the epoch only; rank ``r`` takes every ``W``-th from
    ``r``). In a world of ``W'`` ranks with batches of ``s'`` the position is therefore
    ``floor(b * s * W / (s' * W'))`` batches: the rest of the epoch's order, starting up to
    one global batch early (a few samples seen twice, none skipped); a position past the
    end of the saved shard is the end of this one. Other loaders and positions are returned
    unchanged."""
    if (not isinstance(loader, PreparedDataLoader) or loader._sampler is None
            or not isinstance(position, dict) or set(position) != set(POSITION_KEYS)
            or not all(isinstance(position[k], int) for k in POSITION_KEYS)):
        return position
    sampler = loader._sampler
    size = int(loader._loader.batch_size or 1)
    saved_size = saved_samples_per_batch or size
    per_rank = -(-len(sampler.dataset) // saved_world_size)  # type: ignore[arg-type]
    if position["batch"] * saved_size >= per_rank:  # the saved ranks had read all their shard
        return {"epoch": position["epoch"], "batch": len(loader)}
    consumed = position["batch"] * saved_size * saved_world_size
    return {"epoch": position["epoch"],
            "batch": consumed // (size * int(sampler.num_replicas))}


def _shuffle_of(sampler: object) -> bool:
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            raise ConfigError(
                "prepare_data_loader(data_loader=...) samples with replacement or a custom "
                "num_samples (RandomSampler(replacement=True/num_samples=...)), which a "
                "DistributedSampler cannot shard; pass add_dist_sampler=False and shard it "
                "yourself."
            )
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    raise ConfigError(
        f"prepare_data_loader(data_loader=...) uses the sampler {type(sampler).__name__}; "
        "add_dist_sampler=True replaces only RandomSampler (shuffle=True) and "
        "SequentialSampler (shuffle=False), and takes over the settings of a "
        "DistributedSampler (not of a subclass). Pass add_dist_sampler=False to keep yours."
    )


def _sampler_settings(sampler: object, *, seed: int, rank: int,
                      world_size: int) -> dict[str, Any]:
    """The DistributedSampler settings that stand for ``sampler``: those of a
    DistributedSampler (as Ray Train keeps one the user added), else ``seed`` over the
    run's ranks with the shuffle of a RandomSampler or SequentialSampler."""
    if isinstance(sampler, DistributedSampler) and type(sampler) in (DistributedSampler,
                                                                    _ResumableSampler):
        if sampler.shuffle and not -(MAX_SEED + 1) <= int(sampler.seed) <= MAX_SEED:
            raise ConfigError(
                f"prepare_data_loader(data_loader=...) has a DistributedSampler with "
                f"seed={sampler.seed!r}, which torch cannot take with the epoch added "
                "(seed + epoch must stay below 2**64); give it a seed from 0 to 2**63 - 1."
            )
        return {"num_replicas": int(sampler.num_replicas), "rank": int(sampler.rank),
                "shuffle": bool(sampler.shuffle), "seed": int(sampler.seed),
                "drop_last": bool(sampler.drop_last)}
    return {"num_replicas": world_size, "rank": rank, "shuffle": _shuffle_of(sampler),
            "seed": seed, "drop_last": False}


def _kept_loaders_generator(loader: DataLoader[Any]) -> torch.Generator | None:
    """A generator for a loader kept as it is, when it has none: it is set as the loader's
    (the seed of its worker processes, drawn at every ``iter()``) and as that of its
    random sampler without one, so that a pass draws from it, reseeded from ``(seed,
    epoch, rank)``, and not from the global torch RNG, which the resume restores as of
    the checkpoint and not as of the start of the pass. A loader prepared again keeps the
    generator set the first time (it is Cairn's, not the user's)."""
    ours = getattr(loader, "_cairn_generator", None)
    if loader.generator is not None:
        return ours if loader.generator is ours else None
    generator = torch.Generator()
    loader.generator = generator
    loader._cairn_generator = generator
    batch_sampler = loader.batch_sampler
    for sampler in (loader.sampler, getattr(batch_sampler, "sampler", None)):
        if (isinstance(sampler, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler))
                and sampler.generator is None):
            sampler.generator = generator
    return generator


def prepare_data_loader(
    data_loader: DataLoader[Any],
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    *,
    seed: int | None = None,
) -> PreparedDataLoader:
    """``data_loader`` sharded across the run's ranks, reseeded every epoch, resumable.

    With ``add_dist_sampler`` (the default) the loader is rebuilt with the same settings
    and a :class:`~torch.utils.data.DistributedSampler` over this rank's shard (also with
    one worker: the order then comes from ``seed`` and the epoch alone); its shuffle is the
    original loader's (``shuffle=True`` stays shuffled). A DistributedSampler of the
    user's is kept in effect: its ``num_replicas``, ``rank``, ``shuffle``, ``seed`` and
    ``drop_last`` carry over (its seed, not ``seed``, fixes the order), and a
    ``set_epoch`` on it picks the next pass's epoch. ``seed`` fixes the order of every
    epoch; the loader's ``generator`` is replaced by one seeded from ``(seed, epoch,
    rank)``. ``seed`` is an integer from 0 to ``2**63 - 1`` (the sampler seeds torch with
    ``seed + epoch``, which must stay below ``2**64``); without it, the seed given to
    :func:`enable_reproducibility` earlier in this attempt of the train function (modulo
    ``2**63``), else 0. The first three arguments may be passed by position, in Ray
    Train's order; ``seed`` is keyword-only. With ``move_to_device``, batches (tensors
    nested in tuples, lists, dicts) are moved to :func:`get_device`. With
    ``add_dist_sampler=False`` the loader is kept as is (the sampler's ``set_epoch`` is
    still called every pass, when it has one), but for a loader without a generator: it
    is given one (also its ``RandomSampler``, ``SubsetRandomSampler`` or
    ``WeightedRandomSampler`` without one), reseeded every pass from ``(seed, epoch,
    rank)``, so that a restored position reads the same batches.

    A ``batch_sampler=BatchSampler(sampler, batch_size, drop_last)`` is read as the
    ``batch_size``, ``drop_last`` and shuffle (a ``RandomSampler``) or order (a
    ``SequentialSampler``) it stands for. Raises :class:`ConfigError` for loaders the
    sampler cannot replace (an iterable dataset, a custom sampler or batch sampler, a
    subclass of DistributedSampler) unless ``add_dist_sampler=False``, and for arguments
    of the wrong type.
    """
    if not isinstance(data_loader, DataLoader):
        raise ConfigError(
            f"prepare_data_loader(data_loader={data_loader!r}) must be a "
            "torch.utils.data.DataLoader."
        )
    for name, flag in (("add_dist_sampler", add_dist_sampler),
                       ("move_to_device", move_to_device)):
        if not isinstance(flag, bool):
            raise ConfigError(f"prepare_data_loader({name}={flag!r}) must be True or False.")
    seed = _checked_seed(seed)
    rank, world_size = rank_and_world_size()
    if data_loader.persistent_workers and data_loader.num_workers > 0:
        logger.warning(
            "prepare_data_loader: persistent_workers=True keeps the same %d worker processes "
            "for every epoch, so random draws in them (augmentation) continue from the "
            "epoch before and are not reproduced after a restart; pass "
            "persistent_workers=False for an exact resume", data_loader.num_workers)
    if not add_dist_sampler:
        kept_sampler = data_loader.sampler
        return PreparedDataLoader(
            data_loader, sampler=None,
            users_sampler=kept_sampler if type(kept_sampler) is DistributedSampler else None,
            generator=_kept_loaders_generator(data_loader), seed=seed, rank=rank,
            move_to_device=move_to_device)
    if isinstance(data_loader.dataset, IterableDataset):
        raise ConfigError(
            "prepare_data_loader(data_loader=...) reads an IterableDataset, which has no "
            "sampler to shard; shard it in the dataset and pass add_dist_sampler=False."
        )
    batch_sampler = data_loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        raise ConfigError(
            f"prepare_data_loader(data_loader=...) uses the batch sampler "
            f"{type(batch_sampler).__name__}, which cannot be sharded; pass "
            "add_dist_sampler=False and shard it yourself."
        )
    # A plain BatchSampler, the DataLoader's own (batch_size=) or one passed as
    # batch_sampler= (the loader then says batch_size=None and a SequentialSampler), is all
    # in its sampler, batch size and drop_last.
    source, batch_size, drop_last = (
        (data_loader.sampler, data_loader.batch_size, data_loader.drop_last)
        if batch_sampler is None
        else (batch_sampler.sampler, batch_sampler.batch_size, batch_sampler.drop_last))
    sampler = _ResumableSampler(
        data_loader.dataset,  # type: ignore[arg-type]
        **_sampler_settings(source, seed=seed, rank=rank, world_size=world_size),
    )
    generator = torch.Generator()
    rebuilt: DataLoader[Any] = DataLoader(
        data_loader.dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=data_loader.num_workers,
        collate_fn=data_loader.collate_fn,
        pin_memory=data_loader.pin_memory,
        drop_last=drop_last,
        timeout=data_loader.timeout,
        worker_init_fn=data_loader.worker_init_fn,
        multiprocessing_context=data_loader.multiprocessing_context,
        generator=generator,
        prefetch_factor=data_loader.prefetch_factor,
        persistent_workers=data_loader.persistent_workers,
        pin_memory_device=data_loader.pin_memory_device,
        in_order=getattr(data_loader, "in_order", True),
    )
    return PreparedDataLoader(
        rebuilt, sampler=sampler,
        users_sampler=source if type(source) is DistributedSampler else None,
        generator=generator, seed=seed, rank=rank, move_to_device=move_to_device)
