"""Helpers for the custom-storage tests: driver processes, the guide's code, conformance.

``StorageConformance`` is re-exported from tests/storage/conformance.py. That folder is on
``sys.path`` only when pytest collects a test from it, so it is appended here, which lets
``pytest tests/storage/xyz`` run on its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from driver_process import finish, start_script, wait_for

_HERE = os.path.dirname(os.path.abspath(__file__))
_STORAGE_TESTS = os.path.normpath(os.path.join(_HERE, os.pardir))
if _STORAGE_TESTS not in sys.path:
    sys.path.append(_STORAGE_TESTS)

from conformance import StorageConformance  # noqa: E402

__all__ = ["StorageConformance", "finish", "guide_code", "start_driver", "wait_for"]

DRIVER = os.path.join(_HERE, "xyz_driver.py")
GUIDE = os.path.normpath(os.path.join(_HERE, os.pardir, os.pardir, os.pardir, "docs",
                                      "custom-storage.md"))
# Where the guide's code keeps its files; the tests put them under a temporary directory.
GUIDE_DIRECTORY = "/tmp/cairn-guide"


def guide_code(directory: str, *, first_block_only: bool = False) -> str:
    """The guide's fenced ``python`` blocks, in order, as one script writing under
    ``directory`` instead of :data:`GUIDE_DIRECTORY`."""
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks, f"no python blocks in {GUIDE}"
    if first_block_only:
        blocks = blocks[:1]
    code = "\n\n".join(blocks)
    assert first_block_only or GUIDE_DIRECTORY in code, (
        f"the guide's code no longer keeps its files under {GUIDE_DIRECTORY}")
    return code.replace(GUIDE_DIRECTORY, directory)


def start_driver(storage_path: str, scratch: str, *args: str) -> subprocess.Popen[bytes]:
    return start_script(DRIVER, storage_path, scratch, *args)
