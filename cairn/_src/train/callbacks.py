"""Driver-side callbacks: follow a run from the process that called ``fit()``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn._src.train.result import Result


class Callback:
    """Subclass and override what you need; pass instances in ``RunConfig(callbacks=[...])``.

    Hooks run on the driver's controller thread, in order: keep them quick (hand slow work,
    such as posting to a tracking server, to a thread of your own). An exception in a hook
    fails the run. Any object with some of these methods works too.
    """

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        """Rank 0 reported ``metrics`` as report ``report_index`` (not yet committed)."""

    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        """The checkpoint ``dir_name`` was committed."""

    def on_failure(self, error: BaseException) -> None:
        """An attempt failed (whether or not it will be retried)."""

    def on_run_end(self, result: Result) -> None:
        """``fit()`` is about to return or raise ``result.error``."""
