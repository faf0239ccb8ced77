"""How large files move to and from remote storage: part size and requests in flight.

A :class:`TransferConfig` applies to object stores and other remote file systems (S3, GCS,
Azure, HDFS, fsspec); local copies are planned by the machine's cores and ignore it.

* Downloads and verifications read a file of at least ``multipart_threshold`` bytes as
  ranged requests of ``part_size`` bytes, up to ``max_concurrency`` of them in flight
  across the whole transfer, and hash them in order as they arrive. Smaller files stream
  whole, ``max_concurrency`` files at a time.
* Uploads write ``part_size`` bytes at a time to pyarrow's output stream, which sends
  the multipart upload's parts in the background on its I/O threads (raised to
  ``max_concurrency`` when fewer); a file's upload waits for them whenever its share of
  ``max_concurrency * part_size`` bytes is on its way. pyarrow cuts the S3 parts itself,
  10 MiB each in pyarrow 26 whatever the writes' size, so ``part_size`` sets how much an
  upload sends between waits, not the size of its S3 parts.

A download holds at most ``max_concurrency * part_size`` bytes of parts (128 MiB by
default) plus a 1 MiB copy buffer per file. An upload shares as much among the files it
copies at once (up to ``max_concurrency``), for their copy buffers and the bytes on their
way, plus the part pyarrow fills for each (10 MiB). Either way, whatever the files' sizes.
The defaults come from ``bench/s3_transfer.py`` (a 256 MiB file on a moto server on
loopback, 2 cores): 16 MiB parts downloaded in 2.2 s where 8 MiB parts took 4.3 s, and 16
parts in flight were no faster than 8; one stream per file took 2.8-3.0 s.

A run's setting travels in its :class:`~cairn._src.storage.options.StorageOptions`: a
worker's session passes it to every transfer it makes and to the checkpoints it hands
out, and never changes this module's; so does the driver, from
``RunConfig.storage_options()``. What :func:`current` returns (used where a caller passes
no setting) is the process's own, ``TransferConfig()`` unless :func:`set_transfer_config`
changed it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa

from cairn._src.errors import ConfigError

MiB = 1 << 20
# S3 refuses a part under 5 MiB (except the last) and over 5 GiB.
MIN_PART_BYTES = 5 * MiB
MAX_PART_BYTES = 5 << 30
_MAX_CONCURRENCY = 1024


@dataclass(frozen=True)
class TransferConfig:
    """Part size and parallelism of transfers with remote storage (see the module doc).

    ``part_size``: bytes per ranged read and per upload window step, 5 MiB to 5 GiB.
    ``max_concurrency``: requests (parts, or whole small files) in flight at once, 1 to
    1024; 1 transfers one file at a time, each in one stream. ``multipart_threshold``:
    files of at least this many bytes are read in parallel parts; at least ``part_size``,
    and by default the larger of 32 MiB and ``part_size``.
    """

    part_size: int = 16 * MiB
    max_concurrency: int = 8
    multipart_threshold: int = None  # type: ignore[assignment]  # Set in __post_init__.

    def __post_init__(self) -> None:
        _check_int("part_size", self.part_size, MIN_PART_BYTES, MAX_PART_BYTES,
                   "between 5 MiB (5242880, S3's smallest part) and 5 GiB (5368709120)")
        _check_int("max_concurrency", self.max_concurrency, 1, _MAX_CONCURRENCY,
                   f"between 1 and {_MAX_CONCURRENCY}")
        if self.multipart_threshold is None:
            object.__setattr__(self, "multipart_threshold", max(32 * MiB, self.part_size))
        _check_int("multipart_threshold", self.multipart_threshold, self.part_size, None,
                   f"at least part_size ({self.part_size})")

    def reads_in_parts(self, size: int) -> bool:
        """Whether a remote file of ``size`` bytes is read as parallel ranged requests."""
        return self.max_concurrency > 1 and size >= self.multipart_threshold

    @property
    def memory_bytes(self) -> int:
        """About the most file data one transfer holds in memory."""
        return self.part_size * self.max_concurrency


def _check_int(name: str, value: object, low: int, high: int | None, accepted: str) -> None:
    if (isinstance(value, bool) or not isinstance(value, int) or value < low
            or (high is not None and value > high)):
        raise ConfigError(f"TransferConfig.{name}={value!r} must be an integer {accepted}.")


_lock = threading.Lock()
_current = TransferConfig()


def current() -> TransferConfig:
    """This process's own transfer settings (used where a caller passes none)."""
    return _current


def set_transfer_config(config: TransferConfig | None) -> TransferConfig:
    """Make ``config`` (``None``: the defaults) this process's transfer settings.

    Returns the settings it replaces, so that a caller can put them back. Transfers
    already running keep the settings they started with, and a run with
    ``RunConfig(storage_transfer=...)`` keeps its own.
    """
    global _current
    if config is None:
        config = TransferConfig()
    if not isinstance(config, TransferConfig):
        raise ConfigError(
            f"set_transfer_config(config={config!r}): config must be a "
            "cairn.storage.TransferConfig or None (the defaults)."
        )
    with _lock:
        previous, _current = _current, config
    return previous


def ensure_io_threads(config: TransferConfig) -> None:
    """Let pyarrow's background part uploads run ``max_concurrency`` at a time.

    pyarrow's I/O thread pool is per process; it is only ever raised here, never lowered.
    """
    with _lock:
        if pa.io_thread_count() < config.max_concurrency:
            pa.set_io_thread_count(config.max_concurrency)
