"""The error of a background upload whose source the train function removed first.

An ASYNC ``report()`` returns before its upload reads the directory. A directory deleted
right after the call (``with tempfile.TemporaryDirectory() as d: ... report(...)``) is
gone when the upload opens it: a mistake every restart would repeat, not a storage fault.
"""

from __future__ import annotations

import errno
import logging
import os
import traceback
from dataclasses import dataclass

import cloudpickle

from cairn._src.errors import KEEP_UNTIL_UPLOADED, ReportError
from cairn._src.wire.messages import ErrorMessage, UploadFailedMessage, VanishedFiles

logger = logging.getLogger(__name__)


def missing_file(error: BaseException) -> FileNotFoundError | None:
    """The file-not-found error ``error`` is or was raised from (a storage error wraps
    it), or None."""
    found = [e for e in (error, error.__cause__) if isinstance(e, FileNotFoundError)]
    return found[0] if found else None


def removed_source_error(directory: str, error: BaseException,
                         index: int) -> ReportError | None:
    """A :class:`ReportError` saying that ``directory`` (the local checkpoint of report
    ``index``), or a file in it, was removed before the background upload read it, when
    ``error`` (the upload's) is a file that is not there; else None."""
    missing = missing_file(error)
    if missing is None:
        return None
    if not os.path.isdir(directory):
        what = f"The checkpoint directory {directory!r} of report {index} (ASYNC) was removed"
    else:
        gone = getattr(missing, "filename", None) or "a file"
        what = (f"{gone!r} of the checkpoint directory {directory!r} of report {index} "
                "(ASYNC) was removed or renamed")
    return ReportError(f"{what} before the background upload read it. {KEEP_UNTIL_UPLOADED}")


def fatal_error_message(rank: int, error: BaseException) -> ErrorMessage:
    """The message that fails the attempt at once for ``error``, as a fatal error raised by
    the train function does: the run ends without a restart, which would repeat it."""
    try:
        pickled: bytes | None = cloudpickle.dumps(error)
    except Exception:
        pickled = None
    return ErrorMessage(rank=rank, error_type=type(error).__name__, message=str(error),
                        traceback="".join(traceback.format_exception(error)),
                        exception=pickled, fatal=True)


@dataclass(frozen=True)
class UploadFailure:
    """How a rank's upload of report ``failed.index`` fails: ``error`` raised to the train
    function, ``failed`` sent to the controller, after ``fatal`` when it is a mistake a
    restart would repeat."""

    error: BaseException
    failed: UploadFailedMessage
    fatal: ErrorMessage | None


def upload_failure(rank: int, index: int, directory: str, caught: BaseException, *,
                   removable: bool, policy: str) -> UploadFailure:
    """The failure of an upload of ``directory`` that raised ``caught``; ``removable``:
    the train function may have removed it first (an ASYNC upload of its own directory),
    which the ``"skip"`` policy skips and any other fails the run for at once."""
    removed = removed_source_error(directory, caught, index) if removable else None
    error = removed or caught
    fatal = (fatal_error_message(rank, removed)
             if removed is not None and policy != "skip" else None)
    return UploadFailure(error, UploadFailedMessage(rank, index,
                                                    f"{type(error).__name__}: {error}"), fatal)


def vanished_files(rank: int, index: int, directory: str, paths: list[str], *,
                   removable: bool, policy: str) -> VanishedFiles:
    """:class:`VanishedFiles` for ``paths`` of ``directory``, gone before the upload read
    them: the failure the upload had raised for the first."""
    gone = os.path.join(directory, *paths[0].split("/"))
    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), gone)
    failure = upload_failure(rank, index, directory, missing, removable=removable,
                             policy=policy)
    return VanishedFiles(tuple(paths), failure.failed, failure.fatal)
