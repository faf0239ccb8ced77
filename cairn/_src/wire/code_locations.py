"""Where a worker's failure happened: the user's file and line, from the driver to the
traceback, and the failing frame for the event log.

cloudpickle writes ``<dynamic-code>`` as the file name of every code object it pickles by
value (functions of ``__main__``, of a notebook, of ``exec``'d code), to make its output
deterministic; a worker's traceback then shows ``File "<dynamic-code>", line 17``. The
driver pickles the train function with :func:`dumps_with_locations` instead, which keeps
each code object's own file name (line numbers survive either way), and sends along the
source lines the driver's :mod:`linecache` holds for code that has no file (IPython
registers its cells there), so the worker's traceback shows them too.

:func:`failing_frame` names the innermost frame of a traceback in the user's code (not in
Cairn, the standard library or an installed package), which the controller records per
failed rank and ``cairn show`` prints.
"""

from __future__ import annotations

import io
import linecache
import logging
import os
import sys
import sysconfig
import traceback
import types
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

logger = logging.getLogger(__name__)

# What cloudpickle writes in place of a code object's file name.
_DYNAMIC_NAME = "<dynamic-code>"
# Source lines sent along for code without a file: enough for any cell, never a dump.
_SOURCE_LIMIT = 1 << 20
# What the event log keeps of a file name or a function name.
NAME_LIMIT = 1000


@dataclass(frozen=True)
class LocatedFunction:
    """The train function with the source lines of its file-less code (by file name)."""

    function: Callable[..., Any]
    sources: dict[str, list[str]] = field(default_factory=dict)

    def register_sources(self) -> None:
        """Put the sources in this process's :mod:`linecache`, as IPython does for its
        cells (no modification time: never evicted as stale)."""
        for name, lines in self.sources.items():
            if name not in linecache.cache or not os.path.isfile(name):
                linecache.cache[name] = (sum(map(len, lines)), None, list(lines), name)


class _Sources:
    """Stands for the sources of a :class:`LocatedFunction` while it is pickled: pickled
    after the function, it becomes the lines of the file-less code met by then."""


class _LocatingPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """A cloudpickle pickler that keeps the file names of the code it pickles by value."""

    def __init__(self, file: io.BytesIO) -> None:
        default = cloudpickle.Pickler.dispatch_table[types.CodeType]
        filenames: set[str] = set()

        def reduce_code(code: types.CodeType) -> Any:
            rebuild, args = default(code)
            filenames.add(code.co_filename)
            return rebuild, tuple(code.co_filename if arg == _DYNAMIC_NAME else arg
                                  for arg in args)

        def reduce_sources(_: _Sources) -> Any:
            return dict, (_sources_of(filenames),)

        # Read by the C pickler when it is initialized: set before.
        self.dispatch_table = ChainMap({types.CodeType: reduce_code, _Sources: reduce_sources},
                                       cloudpickle.Pickler.dispatch_table)
        super().__init__(file)


def _sources_of(filenames: set[str]) -> dict[str, list[str]]:
    """The driver's source lines of the code among ``filenames`` that has no file."""
    sources: dict[str, list[str]] = {}
    size = 0
    for name in sorted(filenames):
        if name not in linecache.cache or os.path.isfile(name):
            continue
        lines = linecache.getlines(name)
        size += sum(map(len, lines))
        if lines and size <= _SOURCE_LIMIT:
            sources[name] = list(lines)
    return sources


def dumps_with_locations(function: Callable[..., Any]) -> bytes:
    """``function`` pickled as a :class:`LocatedFunction` (read it back with
    :func:`loads_located`): its code keeps its file names, and the driver's source lines of
    file-less code go along."""
    buffer = io.BytesIO()
    # The sources come after the function in the pickle: its code has been met by then.
    _LocatingPickler(buffer).dump(LocatedFunction(function, _Sources()))  # type: ignore[arg-type]
    return buffer.getvalue()


def loads_located(payload: bytes) -> Callable[..., Any]:
    """The train function of a payload of :func:`dumps_with_locations` (or of a plain
    ``cloudpickle.dumps``), its sources registered in :mod:`linecache`."""
    loaded = cloudpickle.loads(payload)
    if isinstance(loaded, LocatedFunction):
        loaded.register_sources()
        return loaded.function
    function: Callable[..., Any] = loaded
    return function


# --- the failing frame ---------------------------------------------------------------------


def _library_folders() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(Cairn and the standard library, installed packages), as folder prefixes."""
    cairn_folder = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = sysconfig.get_paths()
    standard = {cairn_folder, paths.get("stdlib", ""), paths.get("platstdlib", "")}
    installed = {paths.get("purelib", ""), paths.get("platlib", "")}
    installed.update(p for p in sys.path if os.path.basename(p) in ("site-packages",
                                                                  "dist-packages"))

    def prefixes(folders: set[str]) -> tuple[str, ...]:
        return tuple(os.path.join(os.path.realpath(f), "") for f in folders if f)

    return prefixes(standard), prefixes(installed)


def _is_under(filename: str, prefixes: tuple[str, ...]) -> bool:
    if filename.startswith("<frozen "):
        return True
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    return path.startswith(prefixes)


def failing_frame(error: BaseException) -> dict[str, Any] | None:
    """``{"file", "line", "function"}`` of the innermost frame of ``error``'s traceback in
    the user's code; failing that, outside Cairn and the standard library; failing that,
    the innermost frame. None without a traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    standard, installed = _library_folders()
    users = [f for f in frames if not _is_under(f.filename, standard + installed)]
    outside = [f for f in frames if not _is_under(f.filename, standard)]
    frame = (users or outside or frames)[-1]
    return {"file": frame.filename[:NAME_LIMIT], "line": int(frame.lineno or 0),
            "function": frame.name[:NAME_LIMIT]}


def read_frame(value: object) -> dict[str, Any] | None:
    """A frame as read back from storage (untrusted): the dict when its types are right,
    else None (absent in runs written before frames were recorded)."""
    if not isinstance(value, Mapping):
        return None
    file, line, function = value.get("file"), value.get("line"), value.get("function")
    if (not isinstance(file, str) or not isinstance(function, str)
            or not isinstance(line, int) or isinstance(line, bool) or line < 0):
        return None
    return {"file": file[:NAME_LIMIT], "line": line, "function": function[:NAME_LIMIT]}


def describe_frame(frame: Mapping[str, Any]) -> str:
    """``"train.py:17, in train_func"``."""
    return f"{frame['file']}:{frame['line']}, in {frame['function']}"
