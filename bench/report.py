"""How long ``report()`` blocks the training loop, and how long ``fit()`` takes to start it.

Usage::

    python bench/report.py [--quick] [--no-ray]

Four Cairn measurements, each a run of two local workers on local storage in a temporary
directory, timed inside the workers (``time.perf_counter`` around the call, rank 0 unless
said otherwise) or, across processes, with ``time.time``:

1. **metric-only** ``report()`` latency: 10,000 back-to-back reports on both ranks (2,000
   with ``--quick``), all samples pooled, median and p99 (target: at most 1 ms median).
2. **checkpoint report blocking** by upload mode, 256 MiB in 8 files: rank 0 reports a
   fresh directory, the other rank ``None``. ``SYNC`` is set against a plain
   ``pyarrow.fs.copy_files`` of the same directory to the same file system in the same
   worker (target: at most 1.5x, Cairn's checksums included), once with a commit that
   drops only a tiny checkpoint and once with one that drops a 256 MiB checkpoint
   (``num_to_keep=1``); ``ASYNC`` blocking (target: at most 5 ms); ``NO_UPLOAD`` of a
   directory already on storage. Median of 5 (2) after one untimed round; before each
   timed call the previous checkpoint is committed and ``os.sync()`` has flushed dirty
   pages; SYNC and the copy alternate in going first. See
   :func:`_train_checkpoint_modes`.
3. **fit() to the first line** of the train function, last rank, median of 5 fits (3)
   (target: at most 1.5 s).
4. **commit cost over a long run**: 1,000 SYNC checkpoints of 1 KiB (200) with
   ``num_to_keep=2``; the median blocking of reports 991-1000 over that of reports 1-10
   (flat: about 1x), and the controller's commit time from the event log, commits
   901-1000 over 11-110.

Then, unless ``--no-ray``, the Ray Train 2.60 figures of the same things
(``_ray_reference``, cached, so ``run_all`` does not measure them again) fill the
reference column. ``run(args)`` returns the rows for ``bench/run_all.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _harness  # noqa: E402
import _module  # noqa: E402
import _ray_reference as ray_ref  # noqa: E402

import cairn  # noqa: E402

Row = _harness.Row

RAY_REFERENCE_GROUPS = ("report", "transfer", "startup")
"""The Ray reference groups this module fills its rows from (``run_all`` prefetches them)."""

SIZE_MIB = 256.0
NUM_FILES = 8
TINY_CHECKPOINT_BYTES = 1024
COPY_FILES = "pyarrow.fs.copy_files"

logger = logging.getLogger("bench.report")


@dataclass(frozen=True)
class Settings:
    metric_reports: int
    checkpoint_repeats: int
    fit_repeats: int
    commit_checkpoints: int


FULL = Settings(metric_reports=10_000, checkpoint_repeats=5, fit_repeats=5, commit_checkpoints=1000)
QUICK = Settings(metric_reports=2_000, checkpoint_repeats=2, fit_repeats=3, commit_checkpoints=200)


def _fit(
    train_fn: Any,
    config: dict[str, Any],
    storage: Path,
    name: str,
    checkpoint_config: cairn.CheckpointConfig | None = None,
) -> cairn.Result:
    trainer = cairn.Trainer(
        train_fn,
        train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name=name,
            storage_path=str(storage),
            checkpoint_config=checkpoint_config or cairn.CheckpointConfig(),
        ),
    )
    return trainer.fit()


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# Train functions (run in Cairn's worker processes)
# --------------------------------------------------------------------------------------


def _train_metric_reports(config: dict[str, Any]) -> None:
    rank = cairn.get_context().get_world_rank()
    clock = time.perf_counter
    samples = [0.0] * int(config["num_reports"])
    loop_started = clock()
    for step in range(len(samples)):
        started = clock()
        cairn.report({"step": step, "loss": 1.0 / (step + 1)})
        samples[step] = clock() - started
    loop_s = clock() - loop_started
    out = Path(config["out"], f"metric_rank{rank}.json")
    _write_json(out, {"samples": samples, "loop_s": loop_s})


def _train_checkpoint_modes(config: dict[str, Any]) -> dict[str, list[float]]:
    """Rank 0 times copy_files and each upload mode; every rank reports in step.

    Runs with ``num_to_keep=1``, so each commit deletes the checkpoint before it (which
    also keeps the memory the page cache uses from growing run after run: on this VM,
    first-touched memory makes any copy several times slower). A round is:

    1. a tiny SYNC checkpoint (untimed), so that the next commit only drops that;
    2. a plain copy and a SYNC report of one fresh directory, in alternating order
       (``SYNC``: its commit drops the tiny checkpoint, as when nothing is deleted);
    3. a SYNC report of another fresh directory (``SYNC_dropping``: its commit drops the
       256 MiB checkpoint of step 2, the steady state of a run with ``num_to_keep``);
    4. an ASYNC report (blocking, then the time to its commit);
    5. a NO_UPLOAD report of a directory written straight to storage.
    """
    import pyarrow.fs as pafs

    rank = cairn.get_context().get_world_rank()
    scratch, external = Path(config["scratch"]), Path(config["external"])
    size_mib, num_files = float(config["size_mib"]), int(config["num_files"])
    local = pafs.LocalFileSystem()
    samples: dict[str, list[float]] = {}
    warming_up = True
    sync, upload_async = cairn.CheckpointUploadMode.SYNC, cairn.CheckpointUploadMode.ASYNC
    no_upload = cairn.CheckpointUploadMode.NO_UPLOAD

    def record(key: str, seconds: float) -> None:
        if rank == 0 and not warming_up:
            samples.setdefault(key, []).append(seconds)

    def fresh(parent: Path, name: str, mib: float = size_mib) -> Path | None:
        if rank != 0:
            return None  # the other ranks report None
        directory = parent / name
        _harness.make_checkpoint_dir(directory, mib, num_files if mib >= 1 else 1)
        return directory

    def timed_report(
        key: str | None, mode: cairn.CheckpointUploadMode, directory: Path | None
    ) -> None:
        checkpoint = None
        if directory is not None:
            checkpoint = cairn.Checkpoint.from_directory(str(directory))
            os.sync()
        started = time.perf_counter()
        handle = cairn.report({"key": key}, checkpoint=checkpoint, checkpoint_upload_mode=mode)
        blocked = time.perf_counter() - started
        handle.wait()
        if key is not None:
            record(key, blocked)
            if mode is not sync:
                record(f"{key}_commit", time.perf_counter() - started)

    def timed_copy(source: Path | None, number: int) -> None:
        if source is None:
            return
        destination = Path(config["storage"], f"copy_files_{number}")
        destination.mkdir()  # copy_files does not create the destination directory
        os.sync()
        started = time.perf_counter()
        pafs.copy_files(
            str(source), str(destination), source_filesystem=local, destination_filesystem=local
        )
        record("copy_files", time.perf_counter() - started)
        shutil.rmtree(destination)

    def remove(directory: Path | None) -> None:
        if directory is not None:
            shutil.rmtree(directory)

    # One untimed round first, so that no figure pays for first-touch costs.
    for number in range(int(config["repeats"]) + 1):
        warming_up = number == 0
        directory = fresh(scratch, f"tiny_{number}", 1 / 1024)
        timed_report(None, sync, directory)
        remove(directory)
        directory = fresh(scratch, f"sync_{number}")
        copy_first = number % 2 == 0
        if copy_first:
            timed_copy(directory, number)
        timed_report("SYNC", sync, directory)
        if not copy_first:
            timed_copy(directory, number)
        remove(directory)
        directory = fresh(scratch, f"sync_dropping_{number}")
        timed_report("SYNC_dropping", sync, directory)
        remove(directory)
        # ASYNC deletes its local directory once uploaded (the default, as in Ray).
        timed_report("ASYNC", upload_async, fresh(scratch, f"async_{number}"))
        timed_report("NO_UPLOAD", no_upload, fresh(external, f"no_upload_{number}"))
    return samples


def _train_first_line(config: dict[str, Any]) -> None:
    first_line = time.time()
    rank = cairn.get_context().get_world_rank()
    _write_json(Path(config["out"], f"first_{config['tag']}_rank{rank}.json"), {"t": first_line})


def _train_many_checkpoints(config: dict[str, Any]) -> list[float]:
    """Rank 0 reports ``num_checkpoints`` tiny SYNC checkpoints; returns each blocking time."""
    rank = cairn.get_context().get_world_rank()
    scratch = Path(config["scratch"])
    payload = os.urandom(TINY_CHECKPOINT_BYTES)
    samples: list[float] = []
    for step in range(int(config["num_checkpoints"])):
        checkpoint = None
        directory = scratch / f"step_{step}"
        if rank == 0:
            directory.mkdir()
            (directory / "state.bin").write_bytes(payload)
            checkpoint = cairn.Checkpoint.from_directory(str(directory))
        started = time.perf_counter()
        cairn.report({"step": step}, checkpoint=checkpoint)
        samples.append(time.perf_counter() - started)
        if rank == 0:
            shutil.rmtree(directory)
    return samples


# --------------------------------------------------------------------------------------
# Measurements (driver side)
# --------------------------------------------------------------------------------------


def measure_metric_latency(work: Path, num_reports: int) -> dict[str, Any]:
    out = work / "out"
    out.mkdir()
    started = time.perf_counter()
    _fit(_train_metric_reports, {"num_reports": num_reports, "out": str(out)}, work, "metric")
    fit_s = time.perf_counter() - started
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("metric_rank*.json"))]
    samples = [s for r in ranks for s in r["samples"]]
    return {
        "median": _harness.median(samples),
        "p99": _harness.p99(samples),
        "max": max(samples),
        "count": len(samples),
        "loop_s": max(r["loop_s"] for r in ranks),
        "fit_s": fit_s,
    }


def measure_checkpoint_modes(
    work: Path, repeats: int, num_to_keep: int | None = 1
) -> dict[str, list[float]]:
    scratch, external = work / "scratch", work / "external"
    scratch.mkdir()
    external.mkdir()
    config = {
        "scratch": str(scratch),
        "external": str(external),
        "storage": str(work),
        "size_mib": SIZE_MIB,
        "num_files": NUM_FILES,
        "repeats": repeats,
    }
    # NO_UPLOAD checkpoints live outside the run directory: retention deletes them too.
    keep = cairn.CheckpointConfig(num_to_keep=num_to_keep, delete_unmanaged_checkpoints=True)
    result = _fit(_train_checkpoint_modes, config, work, "modes", keep)
    samples: dict[str, list[float]] = result.return_value
    return samples


def measure_fit_to_first_line(work: Path, repeats: int) -> dict[str, Any]:
    out = work / "out"
    out.mkdir()
    starts: list[float] = []
    totals: list[float] = []
    for repeat in range(repeats):
        tag = f"fit{repeat}"
        trainer = cairn.Trainer(
            _train_first_line,
            train_loop_config={"out": str(out), "tag": tag},
            scaling_config=cairn.ScalingConfig(num_workers=2),
            run_config=cairn.RunConfig(name=tag, storage_path=str(work)),
        )
        fit_wall = time.time()
        started = time.perf_counter()
        trainer.fit()
        totals.append(time.perf_counter() - started)
        firsts = [json.loads(p.read_text())["t"] for p in out.glob(f"first_{tag}_rank*.json")]
        if len(firsts) != 2:
            raise RuntimeError(f"fit {tag}: {len(firsts)} ranks wrote their first-line time")
        starts.append(max(firsts) - fit_wall)
    return {
        "median": _harness.median(starts),
        "first": starts[0],
        "min": min(starts),
        "max": max(starts),
        "fit_total": _harness.median(totals),
    }


def measure_commit_cost(work: Path, num_checkpoints: int) -> dict[str, Any]:
    scratch = work / "scratch"
    scratch.mkdir()
    started = time.perf_counter()
    result = _fit(
        _train_many_checkpoints,
        {"scratch": str(scratch), "num_checkpoints": num_checkpoints},
        work,
        "commits",
        cairn.CheckpointConfig(num_to_keep=2),
    )
    fit_s = time.perf_counter() - started
    blocked: list[float] = result.return_value
    commits = [e for e in _harness.read_run_events(result.path) if e.get("type") == "commit"]
    commits.sort(key=lambda e: int(e["index"]))
    commit_s = [float(e["seconds"]) for e in commits]
    kept = sorted(p.name for p in Path(result.path).iterdir() if p.name.startswith("checkpoint_"))
    window = max(10, len(commit_s) // 10)
    return {
        "first10": _harness.median(blocked[:10]),
        "last10": _harness.median(blocked[-10:]),
        "median": _harness.median(blocked),
        # Wider windows for the controller's figure: a commit's deletion of the dropped
        # checkpoint varies by milliseconds with the file system (ext4 with ``discard``
        # here), and the first ten commits are slower (first touches).
        "commit_window": window,
        "commit_early": _harness.median(commit_s[10 : 10 + window]),
        "commit_late": _harness.median(commit_s[-window:]),
        "commits": len(commit_s),
        "fit_s": fit_s,
        "kept_dirs": len(kept),
    }


# --------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------


def _settings(args: Any) -> Settings:
    return QUICK if getattr(args, "quick", False) else FULL


def cairn_rows(args: Any) -> list[Row]:
    settings = _settings(args)
    rows: list[Row] = []
    with _harness.quiet_logger("cairn"), tempfile.TemporaryDirectory(
        prefix="cairn-bench-report-"
    ) as tmp:
        root = Path(tmp)
        for name in ("metric", "modes", "startup", "commits"):
            (root / name).mkdir()

        logger.info("metric-only reports: %d per rank", settings.metric_reports)
        m = measure_metric_latency(root / "metric", settings.metric_reports)
        n = settings.metric_reports
        pooled = f"{m['count']:,} samples ({n:,} back-to-back reports x 2 ranks)"
        rows += [
            Row(benchmark="report", metric=ray_ref.METRIC_REPORT_MEDIAN, cairn=m["median"],
                note=f"target <= 1 ms; {pooled}"),
            Row(benchmark="report", metric=ray_ref.METRIC_REPORT_P99, cairn=m["p99"],
                note=f"max {m['max'] * 1e3:.2f} ms; {n:,} reports took {m['loop_s']:.2f} s"),
            Row(benchmark="report", metric=ray_ref.METRIC_REPORT_FAST_MEDIAN, cairn=m["median"],
                note="same Cairn samples (Cairn has no poll interval)"),
            Row(benchmark="report", metric=ray_ref.METRIC_REPORT_FAST_P99, cairn=m["p99"],
                note="same Cairn samples"),
        ]

        logger.info("checkpoint reports: %g MiB, %d repeats", SIZE_MIB,
                    settings.checkpoint_repeats)
        c = measure_checkpoint_modes(root / "modes", settings.checkpoint_repeats)
        sync, copy = _harness.median(c["SYNC"]), _harness.median(c["copy_files"])
        dropping = _harness.median(c["SYNC_dropping"])
        size = f"{SIZE_MIB:g} MiB, {NUM_FILES} files"
        count = f"median of {len(c['SYNC'])}"
        rows += [
            Row(benchmark="transfer", metric=f"SYNC report() {SIZE_MIB:g} MiB vs copy_files",
                cairn=sync, reference=copy, reference_name=f"{COPY_FILES}, same run",
                note=f"target <= 1.5x; {size}, xxh3-128 checksums included; {count}, "
                     f"page cache flushed before each; the commit deletes only a 1 KiB "
                     f"checkpoint"),
            Row(benchmark="transfer",
                metric=f"SYNC report() {SIZE_MIB:g} MiB, num_to_keep=1, vs copy_files",
                cairn=dropping, reference=copy, reference_name=f"{COPY_FILES}, same run",
                note=f"its commit deletes the previous {SIZE_MIB:g} MiB checkpoint before "
                     f"report() returns (steady state of num_to_keep); {count}"),
            Row(benchmark="transfer", metric=ray_ref.METRIC_SYNC_REPORT, cairn=sync,
                note=f"{size}, {count}; Ray keeps every checkpoint"),
            Row(benchmark="transfer", metric=ray_ref.METRIC_ASYNC_REPORT,
                cairn=_harness.median(c["ASYNC"]),
                note=f"target <= 5 ms; max {max(c['ASYNC']) * 1e3:.2f} ms; committed "
                     f"{_harness.median(c['ASYNC_commit']):.2f} s after the call ({count})"),
            Row(benchmark="transfer", metric=f"NO_UPLOAD report() blocking {SIZE_MIB:g} MiB",
                cairn=_harness.median(c["NO_UPLOAD"]), reference_name="",
                note=f"already on storage; committed (checksummed by the controller) "
                     f"{_harness.median(c['NO_UPLOAD_commit']):.2f} s after the call ({count})"),
        ]

        logger.info("fit() to first line: %d fits", settings.fit_repeats)
        f = measure_fit_to_first_line(root / "startup", settings.fit_repeats)
        spread = (f"median of {settings.fit_repeats} (first {f['first']:.2f} s, "
                  f"range {f['min']:.2f}-{f['max']:.2f} s); fit() returned after "
                  f"{f['fit_total']:.2f} s")
        rows += [
            Row(benchmark="startup", metric=ray_ref.METRIC_FIT_TO_FIRST_LINE, cairn=f["median"],
                note=f"target <= 1.5 s; cairn.Trainer, local backend, last rank; {spread}"),
        ]
        if not getattr(args, "quick", False):
            rows.append(
                Row(benchmark="startup", metric=ray_ref.METRIC_FIT_TO_FIRST_LINE_PLAIN,
                    cairn=f["median"], note="same Cairn fits")
            )

        k = settings.commit_checkpoints
        logger.info("commit cost: %d SYNC checkpoints", k)
        cc = measure_commit_cost(root / "commits", k)
        w = cc["commit_window"]
        rows += [
            Row(benchmark="report",
                metric=f"SYNC report() 1 KiB ckpt, reports {k - 9}-{k} vs 1-10",
                cairn=cc["last10"], reference=cc["first10"],
                reference_name="same run, reports 1-10",
                note=f"flat is 1x; {k:,} SYNC checkpoints, num_to_keep=2 ({cc['kept_dirs']} "
                     f"left on disk); medians; all {k:,}: {cc['median'] * 1e3:.2f} ms, "
                     f"run {cc['fit_s']:.1f} s"),
            Row(benchmark="report",
                metric=f"commit time, commits {k - w + 1}-{k} vs 11-{10 + w}",
                cairn=cc["commit_late"], reference=cc["commit_early"],
                reference_name=f"same run, commits 11-{10 + w}",
                note=f"flat is 1x; the controller's commit (manifest, history flush, index, "
                     f"deleting the dropped checkpoint) from the event log; medians of {w}"),
        ]
    return rows


def run(args: Any = None) -> list[Row]:
    """Cairn's rows, with Ray Train 2.60's figures as references unless ``args.no_ray``."""
    args = args if args is not None else _module.parse_args(__doc__)
    return _module.with_references(cairn_rows(args), args, RAY_REFERENCE_GROUPS)


def main(argv: list[str] | None = None) -> int:
    return _module.module_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
