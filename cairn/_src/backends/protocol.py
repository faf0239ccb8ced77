"""Backends start worker processes and tell the controller when one dies; nothing else.

Both backends run the same worker runtime (``worker.main.run_from_bootstrap``), which
connects back to the controller; the controller waits on each worker's ``exit_watcher``
(something with a ``fileno()`` that becomes readable when the worker is gone) together
with the connections, so a death is noticed at once, never by polling.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from cairn._src.wire.bootstrap import Bootstrap


class ExitWatcher(Protocol):
    def fileno(self) -> int: ...


class WorkerHandle(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def exit_watcher(self) -> ExitWatcher: ...

    @property
    def pid(self) -> int: ...

    @property
    def node_id(self) -> str:
        """Which machine the worker runs on (ranks on one node share local ranks)."""

    @property
    def preempted(self) -> bool:
        """Whether the worker was lost with a node its cluster says was preempted (the Ray
        backend); False where the backend cannot tell."""

    @property
    def last_message_may_trail(self) -> bool:
        """Whether the worker's last message (Done or its error) may still arrive well
        after its end was seen: a Ray actor task that returned (its return travels on
        Ray's own channel; the worker closed its connection after that message). False
        where the end closes the worker's sockets (a local process: what it sent is
        readable when its exit is), and for a worker killed or lost with its node."""

    def describe_exit(self) -> str:
        """How the worker ended, for error messages ("was killed by SIGKILL")."""

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to end; whether it has."""


class WorkerBackend(Protocol):
    name: str
    # Where the controller listens: loopback for local workers, every interface for a
    # cluster (``advertise_host`` is then the address workers connect to).
    bind_host: str

    def advertise_host(self) -> str: ...

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]: ...

    def shutdown(self, *, grace_s: float = 5.0) -> None: ...

    def kill(self) -> None: ...

    def prepare_standby(self) -> None:
        """Start spare workers for the next attempt, if the backend keeps any
        (``FailureConfig(warm_standby=True)``); called at an attempt's first report, so
        that their start-up does not slow that attempt's own. A backend without spares
        does nothing."""

    def stop_standby(self) -> None:
        """The run is over: stop the spare workers, if any."""


@runtime_checkable
class RankReplacer(Protocol):
    """A backend that can replace some ranks of a running group and keep the others'
    processes (``FailureConfig(keep_survivors=True)``): the local and Ray backends."""

    def replace_refusal(self) -> str | None:
        """Why this backend restarts the whole group for this run instead of replacing
        ranks (None: it replaces them); asked once, when the controller is built."""

    def kill_ranks(self, ranks: Collection[int]) -> None:
        """Kill the processes of ``ranks`` (and what they started); reap them."""

    def replace(self, ranks: Collection[int], bootstrap: Bootstrap, *,
                env: dict[str, str] | None = None) -> list[WorkerHandle]:
        """Start a new process for each of ``ranks`` (killed before) with ``bootstrap``;
        every rank's handle, the others' unchanged."""
