"""Whether a process of this machine still runs, from a pid read back from storage or a
file name: untrusted, so a pid no process can have is an answer, never an error."""

from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """Whether a process with ``pid`` runs on this machine (in this PID namespace).

    False for a pid no process can have (0 or below, past the OS's range) and for one
    that is gone; True where it runs or the OS will not say (another user's process)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except OSError:
        return True
    return True
