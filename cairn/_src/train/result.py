"""The outcome of a run: ``Trainer.fit()`` returns it; ``Result.from_path`` reloads it."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_or_rebuild_index
from cairn._src.checkpoint.manager import checkpoint_view
from cairn._src.checkpoint.retention import ray_order
from cairn._src.checkpoint.views import ReferencedCheckpoint, checkpoint_from_view
from cairn._src.config.run import CheckpointConfig
from cairn._src.errors import (
    ConfigDeprecationError,
    ConfigError,
    ResultLookupError,
    RunFailedError,
    RunNotFoundError,
)
from cairn._src.goodput.summary import GoodputSummary, summarize
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.report_checks import rankable, score_value
from cairn._src.run.segment_log import read_log
from cairn._src.run.status import run_history
from cairn._src.storage.fileio import is_dir
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.uris import public_uri

if TYPE_CHECKING:
    import pandas

logger = logging.getLogger(__name__)

_INDEX_FILE = "cairn_run.json"

_CONFIG_DEPRECATED = (
    "The `config` property for a `Result` is deprecated, since it is only relevant in the "
    "context of Ray Tune (Ray Train v2 raises the same). The train_loop_config you passed to "
    "the Trainer is the run's config; read it from there."
)


class Result:
    """What a run produced, with Ray Train's fields and Cairn's.

    * ``metrics``: the last metrics rank 0 reported, with the validation metrics of that
      report's checkpoint (``report(validation=...)``) merged in, as Ray Train gives them;
    * ``checkpoint``: the latest committed checkpoint;
    * ``error``: why the run failed (a :class:`~cairn.TrainingFailedError`), or None;
    * ``path``: the run directory as a path inside :attr:`filesystem`, as Ray Train gives
      it: on S3 ``"bucket/runs/name"``, so ``checkpoint.path.startswith(result.path)``
      holds for the run's own checkpoints; :attr:`uri` is the same place as a URI
      (credentials removed);
    * ``best_checkpoints``: ``(checkpoint, metrics)`` of every kept checkpoint, in Ray
      Train's order: worst to best by ``CheckpointConfig.checkpoint_score_attribute``
      (ties: the earlier report first), or in report order without one;
    * ``metrics_dataframe``: the whole metrics history (every rank-0 report, every
      attempt), read from storage when first asked for, unless given;
    * ``return_value``: what rank 0's train function returned;
    * ``goodput``: the run's goodput summary.

    ``Result(metrics=..., checkpoint=..., error=..., path=...)`` builds one by hand, as in
    Ray Train; such a result has no run to read a history or goodput from.
    """

    def __init__(
        self,
        metrics: dict[str, Any] | None,
        checkpoint: Checkpoint | None,
        error: BaseException | None,
        path: str,
        metrics_dataframe: pandas.DataFrame | None = None,
        best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] | None = None,
        _storage_filesystem: pafs.FileSystem | None = None,
        return_value: Any = None,
        *,
        uri: str | None = None,
        _run: StorageLocation | None = None,
        _retry: RetryPolicy | None = None,
    ) -> None:
        self.metrics = metrics
        self.checkpoint = checkpoint
        self.error = error
        self.path = path
        self.best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = list(
            best_checkpoints or [])
        self.return_value = return_value
        self.uri = uri
        self._metrics_dataframe = metrics_dataframe
        self._storage_filesystem = _storage_filesystem
        self._run = _run
        self._retry = _retry or RetryPolicy()

    def __repr__(self) -> str:
        shown: dict[str, Any] = {"metrics": self.metrics, "path": self.path,
                                 "filesystem": self.filesystem.type_name,
                                 "checkpoint": self.checkpoint}
        if self.error is not None:
            shown = {"error": type(self.error).__name__, **shown}
        return "Result(\n" + ",\n".join(f"  {k}={v!r}" for k, v in shown.items()) + "\n)"

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem :attr:`path` lies in (the local one for a result built by hand)."""
        if self._storage_filesystem is not None:
            return self._storage_filesystem
        if self._run is not None:
            return self._run.filesystem
        return pafs.LocalFileSystem()

    @property
    def config(self) -> dict[str, Any] | None:
        """Refused as Ray Train v2 refuses it (a ``DeprecationWarning``)."""
        raise ConfigDeprecationError(_CONFIG_DEPRECATED)

    @property
    def metrics_dataframe(self) -> pandas.DataFrame:
        """Every rank-0 report of every attempt, one row each (nested keys joined by ``/``)."""
        if self._metrics_dataframe is not None:
            return self._metrics_dataframe
        try:
            import pandas
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: "
                              "pip install 'cairn-train[pandas]'") from exc

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
        return summarize(read_events(self._run.join(EVENTS_DIR), self._retry))

    def get_best_checkpoint(self, metric: str, mode: str) -> Checkpoint | None:
        """The kept checkpoint whose ``metric`` is the highest (``mode="max"``) or lowest
        (``"min"``); on a tie, the first in :attr:`best_checkpoints`.

        ``metric`` may name a nested value with ``/`` (``"val/loss"``). Checkpoints whose
        metrics lack it are ignored. As in Ray Train, raises a ``RuntimeError``
        (:class:`ResultLookupError`) without checkpoints or when no checkpoint has the
        metric, and a ``ValueError`` (:class:`ConfigError`) for a bad ``mode`` or a
        ``metric`` that is not a str. Values that retention does not rank (NaN, strings,
        booleans) are skipped, as are checkpoints without the metric;
        :class:`ResultLookupError` when no value is left.
        """
        if not self.best_checkpoints:
            raise ResultLookupError("No checkpoint exists in the trial directory!")
        if mode not in ("max", "min"):
            raise ConfigError(
                f'Unsupported mode: {mode}. Please choose from ["min", "max"]! '
                f"(get_best_checkpoint(mode={mode!r}))"
            )
        if not isinstance(metric, str):
            raise ConfigError(
                f"get_best_checkpoint(metric={metric!r}) must be a str: the name of a "
                "reported metric, with '/' between nested keys ('val/loss')."
            )
        scored = [(checkpoint, value) for checkpoint, metrics in self.best_checkpoints
                  if (value := score_value(metrics, metric)) is not None]
        if not scored:
            known = sorted((self.metrics or {}).keys())
            raise ResultLookupError(
                f"Invalid metric name {metric}! You may choose from the following metrics: "
                f"{known}."
            )
        # As retention ranks: numbers only; NaN, strings and booleans are never the best.
        ranked = [(checkpoint, number) for checkpoint, value in scored
                  if (number := rankable(value)) is not None]
        if not ranked:
            raise ResultLookupError(
                f"No checkpoint has a number for the metric {metric!r} to rank by (NaN, "
                f"strings and booleans are not ranked); its values: "
                f"{[value for _, value in scored]!r}."
            )
        pick = max if mode == "max" else min
        return pick(ranked, key=lambda pair: pair[1])[0]

    @classmethod
    def from_path(
        cls,
        path: str | os.PathLike[str],
        storage_filesystem: Any = None,
        *,
        checkpoint_config: CheckpointConfig | None = None,
    ) -> Result:
        """Load the result of a run from its directory (finished, failed or running).

        ``path`` is a path or URI; with ``storage_filesystem``, a path inside that
        filesystem (as Ray Train takes it). ``checkpoint_config`` orders
        :attr:`best_checkpoints` by its score attribute (report order without one).
        Raises :class:`RunNotFoundError` (a ``RuntimeError`` and a ``FileNotFoundError``)
        when the directory does not exist or is not a Cairn run, and :class:`ConfigError`
        when ``path`` is no str or path object or ``checkpoint_config`` no
        :class:`CheckpointConfig`. A checkpoint registered by reference to a URI (a
        NO_UPLOAD report) resolves it when first used, not here: one on a scheme this
        process has not registered raises :class:`~cairn.UnknownSchemeError` then, and the
        rest of the run reads.

        Only reads: nothing under the run is written and no lease is taken, so it is safe
        while a driver runs the run. A damaged run index (not JSON, a field of the wrong
        type, a record that contradicts itself) does not stop it: as ``fit()`` does, it
        rebuilds the index from the checkpoint manifests, here in memory only, and logs a
        warning that names the file and what is wrong with it. The run's retention
        settings were in that index, so :attr:`best_checkpoints` are then in report order
        unless ``checkpoint_config`` is given.
        """
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        if not isinstance(text, str):
            raise ConfigError(
                f"Result.from_path(path={path!r}) needs the run directory as a str or a "
                "path object (pathlib.Path): a local path such as '/tmp/runs/my_run', or a "
                "URI such as 's3://bucket/runs/my_run'."
            )
        if checkpoint_config is not None and not isinstance(checkpoint_config,
                                                            CheckpointConfig):
            raise ConfigError(
                f"Result.from_path(checkpoint_config={checkpoint_config!r}) must be a "
                "cairn.CheckpointConfig or None."
            )
        stripped = text.rstrip("/") or text
        run = resolve(stripped, storage_filesystem)
        retry = RetryPolicy()
        if not _exists(run, retry):
            raise RunNotFoundError(f"Experiment folder {run.display()} doesn't exist!")
        index = _read_or_rebuild_index(run, retry, ranked=checkpoint_config is not None)
        if index is None:
            raise RunNotFoundError(
                f"Failed to restore the Result object: {_INDEX_FILE} doesn't exist in the "
                "experiment folder. Make sure that this is an output directory created by a "
                "Ray Train run, here a Cairn run: the directory RunConfig(storage_path=..., "
                f"name=...) points to. {run.display()} is not one."
            )
        history = read_log(run.join(METRICS_DIR), retry)
        metrics = history[-1].get("metrics") if history else None
        report_index = history[-1].get("report_index") if history else None
        if checkpoint_config is None:
            # As fit() ordered them: by the retention settings the run was started with.
            kept = index.retention
            checkpoint_config = CheckpointConfig() if kept is None else CheckpointConfig(
                checkpoint_score_attribute=kept.score_attribute,
                checkpoint_score_order="min" if kept.score_order == "min" else "max")
        # A failed run reads back with its error, as fit() returned it.
        past = run_history(read_events(run.join(EVENTS_DIR), retry))
        error = RunFailedError.from_info(past.error, run.display()) if past.error else None
        return build_result(run, index, checkpoint_config, metrics=metrics, error=error,
                            retry=retry, report_index=report_index)


def _read_or_rebuild_index(run: StorageLocation, retry: RetryPolicy, *,
                           ranked: bool) -> RunIndex | None:
    """The run's index (None when it has none), rebuilt as ``fit()`` rebuilds it when it is
    damaged or lost (:func:`read_or_rebuild_index`), never written back: another driver
    may be running the run, and a reader must not change it."""
    index, rebuilt = read_or_rebuild_index(run, retry,
                                           lambda: read_events(run.join(EVENTS_DIR), retry))
    if rebuilt:
        order = ("" if ranked else " The run's retention settings were in that index, so "
                 "best_checkpoints are in report order (pass checkpoint_config to rank them).")
        logger.warning("%s. Reading the run from its checkpoint manifests instead, in memory "
                       "(Result.from_path writes nothing).%s", rebuilt, order)
    return index


def _exists(run: StorageLocation, retry: RetryPolicy) -> bool:
    # Retried like every other read: a transient error must not look like a missing run.
    return is_dir(run, retry)


def build_result(
    run: StorageLocation,
    index: RunIndex,
    config: CheckpointConfig,
    *,
    metrics: dict[str, Any] | None,
    error: BaseException | None = None,
    return_value: Any = None,
    retry: RetryPolicy | None = None,
    report_index: object = None,
) -> Result:
    """The result of the run at ``run``; ``metrics`` are those of report ``report_index``,
    to which the validation metrics of its checkpoint, when the index keeps it, are added."""
    checkpoint_of_report = next((r for r in index.checkpoints
                                 if r.report_index == report_index), None)
    if checkpoint_of_report is not None:
        metrics = {**(metrics or {}), **checkpoint_of_report.metrics} or None
    latest = index.latest
    ordered = ray_order(list(index.checkpoints), config.checkpoint_score_attribute,
                        config.checkpoint_score_order)
    return Result(
        metrics=metrics,
        checkpoint=_committed_checkpoint(run, latest) if latest else None,
        error=error,
        path=run.path,
        best_checkpoints=[(_committed_checkpoint(run, r), dict(r.metrics))
                          for r in ordered],
        _storage_filesystem=run.filesystem,
        return_value=return_value,
        uri=public_uri(run.uri) if run.uri is not None else None,
        _run=run,
        _retry=retry,
    )


def _committed_checkpoint(run: StorageLocation, record: CheckpointRecord) -> Checkpoint:
    """The checkpoint ``record`` names. One registered by reference to a URI resolves it
    when first used (:class:`ReferencedCheckpoint`): a run opens, its metrics, history and
    goodput read, where its references do not resolve."""
    if record.target_uri is not None:
        return ReferencedCheckpoint(record.target_uri, run.join(record.dir_name))
    return checkpoint_from_view(checkpoint_view(run, record))
