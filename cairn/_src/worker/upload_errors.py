"""The error of a background upload whose source the train function removed first.

An ASYNC ``report()`` returns before its upload reads the directory. A directory deleted
right after the call (``with tempfile.TemporaryDirectory() as d: ... report(...)``) is
gone when the upload opens it: a mistake every restart would repeat, not a storage fault.
"""

from __future__ import annotations

import logging
import os
import traceback

import cloudpickle

from cairn._src.errors import KEEP_UNTIL_UPLOADED, ReportError
from cairn._src.wire.messages import ErrorMessage

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
