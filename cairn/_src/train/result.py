"""The outcome of a run: ``Trainer.fit()`` returns it; ``Result.from_path`` reloads it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.index import RunIndex, read_index
from cairn._src.checkpoint.manager import checkpoint_view
from cairn._src.checkpoint.retention import best_first
from cairn._src.config import CheckpointConfig
from cairn._src.errors import CheckpointNotFoundError
from cairn._src.execution.views import checkpoint_from_view
from cairn._src.goodput.summary import GoodputSummary, summarize
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

if TYPE_CHECKING:
    import pandas


@dataclass
class Result:
    """What a run produced.

    * ``metrics``: the last metrics rank 0 reported;
    * ``checkpoint``: the latest committed checkpoint;
    * ``best_checkpoints``: ``(checkpoint, metrics)`` of every kept checkpoint, best first
      by the run's score attribute (latest first without one);
    * ``metrics_dataframe``: the whole metrics history (every rank-0 report, every attempt);
    * ``path``: the run directory; ``error``: why the run failed, or None;
    * ``return_value``: what rank 0's train function returned;
    * ``goodput``: the run's goodput summary.
    """

    metrics: dict[str, Any] | None
    checkpoint: Checkpoint | None
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]]
    path: str
    error: BaseException | None = None
    return_value: Any = None
    filesystem: Any = None
    _run: StorageLocation | None = field(default=None, repr=False)
    _retry: RetryPolicy = field(default_factory=RetryPolicy, repr=False)

    @property
    def metrics_dataframe(self) -> pandas.DataFrame:
        import pandas

        records = read_log(self._run.join(METRICS_DIR), self._retry) if self._run else []
        rows = []
        for record in records:
            row = dict(record.get("metrics") or {})
            row.setdefault("report_index", record.get("report_index"))
            row.setdefault("attempt", record.get("attempt"))
            row.setdefault("timestamp", record.get("time"))
            if record.get("checkpoint_dir_name"):
                row.setdefault("checkpoint_dir_name", record["checkpoint_dir_name"])
            rows.append(row)
        frame: pandas.DataFrame = (
            pandas.json_normalize(rows, sep="/") if rows else pandas.DataFrame()
        )
        return frame

    @property
    def goodput(self) -> GoodputSummary:
        if self._run is None:
            return summarize([])
        return summarize(read_log(self._run.join(EVENTS_DIR), self._retry))

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str],
        storage_filesystem: Any = None,
        *,
        checkpoint_config: CheckpointConfig | None = None,
    ) -> Result:
        """Load the result of a run from its directory (finished, failed or running)."""
        run = resolve(path, storage_filesystem)
        retry = RetryPolicy()
        index = read_index(run, retry)
        if index is None:
            raise CheckpointNotFoundError(
                f"{run.display()} is not a Cairn run directory (it has no run index). Pass "
                "the directory RunConfig(storage_path=..., name=...) points to."
            )
        history = read_log(run.join(METRICS_DIR), retry)
        metrics = history[-1].get("metrics") if history else None
        return build_result(run, index, checkpoint_config or CheckpointConfig(),
                            metrics=metrics, retry=retry)


def build_result(
    run: StorageLocation,
    index: RunIndex,
    config: CheckpointConfig,
    *,
    metrics: dict[str, Any] | None,
    error: BaseException | None = None,
    return_value: Any = None,
    retry: RetryPolicy | None = None,
) -> Result:
    retry = retry or RetryPolicy()
    latest = index.latest
    ordered = best_first(list(index.checkpoints), config.checkpoint_score_attribute,
                         config.checkpoint_score_order)
    return Result(
        metrics=metrics,
        checkpoint=checkpoint_from_view(checkpoint_view(run, latest)) if latest else None,
        best_checkpoints=[(checkpoint_from_view(checkpoint_view(run, r)), dict(r.metrics))
                          for r in ordered],
        path=run.uri or run.path,
        error=error,
        return_value=return_value,
        filesystem=run.filesystem,
        _run=run,
        _retry=retry,
    )
