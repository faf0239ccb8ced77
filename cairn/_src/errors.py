"""Cairn's exception hierarchy.

Every error Cairn raises derives from :class:`CairnError`; where a builtin exception fits,
the subclass also derives from it so that ``except FileNotFoundError`` keeps working.
Errors cross process boundaries (worker -> controller -> driver), so every class here must
pickle: they keep their constructor arguments in ``self.args``.
"""

from __future__ import annotations


class CairnError(Exception):
    """Root of every error raised by Cairn."""


class ConfigError(CairnError, ValueError):
    """A configuration or argument value is not accepted."""


class StorageError(CairnError, OSError):
    """A storage operation failed (after retries, where the error was transient)."""


class UnknownSchemeError(StorageError, ValueError):
    """A URI uses a scheme that no registered or installed storage backend handles."""


class CheckpointNotFoundError(StorageError, FileNotFoundError):
    """A checkpoint, or a file it names, does not exist."""


class NotADirectoryCheckpointError(StorageError, NotADirectoryError):
    """A path that must be a directory is a file."""


class UnsafePathError(CairnError, ValueError):
    """A relative path inside a checkpoint would escape it (``..``, absolute, symlink)."""


class CheckpointDamagedError(StorageError):
    """What storage holds is not what Cairn committed there: the data is damaged.

    The root of every damage error that verification, restore and the readers of Cairn's
    own files raise. Resume treats each subclass as damage (the checkpoint is skipped and
    the previous one used); any other :class:`StorageError` is an outage, not damage.
    """


class ChecksumMismatchError(CheckpointDamagedError):
    """Data read back from storage does not match the size or checksum recorded at commit."""


class NotARegularFileError(ChecksumMismatchError):
    """A file a manifest lists is a symbolic link, a directory, a FIFO, a socket or a device.

    Cairn reads regular files only, so that a read can neither block nor follow a link
    out of the checkpoint.
    """


class MissingCheckpointFileError(CheckpointDamagedError, CheckpointNotFoundError):
    """A file that a committed checkpoint's manifest lists does not exist on storage."""


class ManifestError(CheckpointDamagedError):
    """A file Cairn reads back (a checkpoint manifest, the run index, a log record, the
    lease) is not valid JSON, has the wrong shape or an unknown version."""


class ReportError(CairnError, ValueError):
    """A ``report()`` call was made with arguments Cairn cannot accept."""


class CheckpointCollisionError(CairnError):
    """Two ranks tried to write the same relative path into one checkpoint."""


class CheckpointSkippedError(CairnError):
    """A checkpoint was dropped after its upload failed (``upload_failure_policy="skip"``)."""


class RunLeaseError(CairnError):
    """Another live driver holds the lease on this run."""


class CollectiveTimeoutError(CairnError, TimeoutError):
    """Ranks did not all reach the same report within the collective timeout."""


class WorkerGroupError(CairnError):
    """One or more workers failed; the message groups ranks with their tracebacks."""


class TrainingFailedError(CairnError):
    """The run failed for good: the failure budget is spent or the failure is fatal."""
