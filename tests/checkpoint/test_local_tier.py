"""CheckpointConfig(local_tier_bytes=...): a node's verified copy of the newest committed
checkpoint, from real runs on the moto S3 server with a SIGKILLed worker, and the tier's
refusals of what it cannot trust."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import tier_workloads

import cairn
from cairn._src.checkpoint.local_tier import LocalTier
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.storage.location import resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import upload_directory

RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.0, max_backoff_s=0.0)


def _fit(storage: str, scratch: str, tier_dir: str, *, damage: str, steps: int = 3,
         crash_step: int | None = 2, tier_bytes: int = 10 << 20) -> cairn.Result:
    config = {"steps": steps, "scratch": scratch, "crash_step": crash_step, "damage": damage,
              "run_uri": f"{storage.split('?')[0]}/run?{storage.split('?')[1]}",
              "tier_dir": tier_dir}
    return cairn.Trainer(
        tier_workloads.train, train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="run", storage_path=storage,
            failure_config=cairn.FailureConfig(max_failures=1),
            checkpoint_config=cairn.CheckpointConfig(local_tier_bytes=tier_bytes,
                                                     local_tier_dir=tier_dir)),
    ).fit()


def _restored(scratch: str) -> dict[str, object]:
    with open(os.path.join(scratch, "restored_1_0.json"), encoding="utf-8") as f:
        return dict(json.load(f))


@pytest.mark.slow
def test_a_killed_worker_restores_from_its_node_s_copy_without_storage(
    s3_uri_factory: Callable[[str], str], scratch: str, tmp_path: Path,
) -> None:
    # The stored copy is damaged after the commit: only a restore from the tier gives back
    # the committed bytes (from storage, the checksum fails and the run falls back).
    tier_dir = str(tmp_path / "tier")
    result = _fit(s3_uri_factory("tier"), scratch, tier_dir, damage="storage")
    assert result.error is None
    assert _restored(scratch) == {"step": 2, "intact": {"0": True, "1": True}}
    # Only the newest committed checkpoint stays on the node.
    kept = [os.path.basename(p) for p in glob.glob(os.path.join(tier_dir, "*", "*"))]
    assert len(kept) == 1 and kept[0].endswith("-step_3")


@pytest.mark.slow
def test_a_damaged_local_copy_is_dropped_and_the_restore_reads_storage(
    s3_uri_factory: Callable[[str], str], scratch: str, tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    result = _fit(s3_uri_factory("tier"), scratch, str(tmp_path / "tier"), damage="tier")
    assert result.error is None
    assert _restored(scratch) == {"step": 2, "intact": {"0": True, "1": True}}
    captured = capfd.readouterr()
    assert "The local tier's copy of checkpoint step_2 on this node is damaged" in (
        captured.out + captured.err)


@pytest.mark.slow
def test_a_checkpoint_larger_than_the_bound_is_not_copied(
    s3_uri_factory: Callable[[str], str], scratch: str, tmp_path: Path,
) -> None:
    tier_dir = str(tmp_path / "tier")
    result = _fit(s3_uri_factory("tier"), scratch, tier_dir, damage="none", tier_bytes=1024)
    assert result.error is None
    assert _restored(scratch) == {"step": 2, "intact": {"0": True, "1": True}}
    assert glob.glob(os.path.join(tier_dir, "*", "*")) == []


@pytest.fixture
def committed(s3_uri_factory: Callable[[str], str], tmp_path: Path) -> tuple[LocalTier, Manifest,
                                                                            Path]:
    """A tier holding report 1 (``step_1``) of a run on S3, committed there too."""
    run = resolve(s3_uri_factory("tier-unit"))
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(5000))
    (src / "sub" / "b.bin").write_bytes(os.urandom(700))
    entries = upload_directory(str(src), run.join("step_1"), retry=RETRY)
    manifest = Manifest(files=entries, report_index=1)
    write_manifest(run.join("step_1"), manifest)
    tier = LocalTier.for_run(run, str(tmp_path / "tier"), 1 << 20)
    assert tier is not None
    assert tier.add(1, "step_1", str(src), entries)
    return tier, manifest, src


def _copy_of(tier: LocalTier, rel: str) -> Path:
    return Path(tier.root) / "000000001-step_1" / rel


def test_a_restore_from_the_tier_is_verified_and_complete(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
) -> None:
    tier, manifest, src = committed
    run_dir = tier.run
    assert tier.restore(run_dir.join("step_1"), manifest, str(tmp_path / "out"), RETRY)
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == (src / "sub" / "b.bin"
                                                                 ).read_bytes()


@pytest.mark.parametrize("replace_with", ["symlink to /dev/zero", "fifo", "directory",
                                          "missing", "shorter"])
def test_a_tier_file_that_is_not_the_committed_regular_file_is_not_used(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path, replace_with: str,
) -> None:
    tier, manifest, _ = committed
    copy = _copy_of(tier, "a.bin")
    copy.unlink()
    if replace_with == "symlink to /dev/zero":
        copy.symlink_to("/dev/zero")
    elif replace_with == "fifo":
        os.mkfifo(copy)
    elif replace_with == "directory":
        copy.mkdir()
    elif replace_with == "shorter":
        copy.write_bytes(b"x")
    assert not tier.restore(tier.run.join("step_1"), manifest,
                            str(tmp_path / "out"), RETRY)


def test_same_size_other_bytes_are_caught_by_the_checksum_and_the_copy_dropped(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
) -> None:
    tier, manifest, _ = committed
    copy = _copy_of(tier, "sub/b.bin")
    copy.write_bytes(bytes(copy.stat().st_size))
    assert not tier.restore(tier.run.join("step_1"), manifest,
                            str(tmp_path / "out"), RETRY)
    assert not _copy_of(tier, "").exists()


def test_a_checkpoint_of_another_run_or_report_is_not_served(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
    s3_uri_factory: Callable[[str], str],
) -> None:
    tier, manifest, _ = committed
    other_run = resolve(s3_uri_factory("tier-other"))
    assert not tier.restore(other_run.join("step_1"), manifest, str(tmp_path / "o1"), RETRY)
    later = Manifest(files=manifest.files, report_index=2)
    assert not tier.restore(tier.run.join("step_1"), later,
                            str(tmp_path / "o2"), RETRY)


def test_a_commit_drops_older_copies_only(
    committed: tuple[LocalTier, Manifest, Path],
) -> None:
    tier, manifest, src = committed
    assert tier.add(2, "step_2", str(src), manifest.files)
    tier.committed(1)
    assert sorted(os.listdir(tier.root)) == ["000000001-step_1", "000000002-step_2"]
    tier.committed(2)
    assert os.listdir(tier.root) == ["000000002-step_2"]


def test_no_tier_for_local_storage_or_a_zero_bound(tmp_path: Path,
                                                   s3_uri_factory: Callable[[str], str]) -> None:
    assert LocalTier.for_run(resolve(str(tmp_path)), None, 1 << 30) is None
    assert LocalTier.for_run(resolve(s3_uri_factory("t")), None, 0) is None


def test_a_tier_parent_owned_by_someone_else_or_not_a_directory_is_not_used(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
    s3_uri_factory: Callable[[str], str], caplog: pytest.LogCaptureFixture,
) -> None:
    _, manifest, src = committed
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    tier = LocalTier.for_run(resolve(s3_uri_factory("t2")), str(blocker), 1 << 20)
    assert tier is not None
    assert not tier.add(1, "step_1", str(src), manifest.files)
    assert "Could not copy checkpoint step_1 into the local tier" in caplog.text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("local_tier_bytes", -1, "CheckpointConfig.local_tier_bytes=-1 must be an integer >= 0."),
    ("local_tier_bytes", "1G", "CheckpointConfig.local_tier_bytes='1G' must be an integer "
                               ">= 0."),
    ("local_tier_dir", "relative/dir", "CheckpointConfig.local_tier_dir='relative/dir' must "
                                       "be an absolute path (the same on every node) or None."),
])
def test_bad_local_tier_settings_are_refused_by_name(field: str, value: object,
                                                     message: str) -> None:
    with pytest.raises(cairn.ConfigError, match=f"^{re.escape(message)}$"):
        cairn.CheckpointConfig(**{field: value})  # type: ignore[arg-type]


def test_a_tier_directory_replaced_by_a_link_is_neither_read_nor_pruned(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
) -> None:
    tier, manifest, _ = committed
    # The run's tier directory becomes a link to someone else's directory that happens to
    # hold an entry of the same name: nothing there is restored from or deleted.
    elsewhere = tmp_path / "elsewhere"
    os.rename(tier.root, elsewhere)
    os.symlink(elsewhere, tier.root)
    assert not tier.restore(tier.run.join("step_1"), manifest, str(tmp_path / "out"), RETRY)
    tier.committed(5)
    assert (elsewhere / "000000001-step_1" / "a.bin").is_file()



def test_only_a_checkpoint_given_the_tier_in_its_storage_options_restores_from_it(
    committed: tuple[LocalTier, Manifest, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No process-wide "active tier": a Checkpoint made by hand reads storage, one handed
    # out by a worker's session (with the run's StorageOptions) reads this node's copy.
    tier, _, src = committed
    stored = cairn.Checkpoint.from_location(tier.run.join("step_1"))
    with caplog.at_level("INFO", logger="cairn._src.checkpoint.local_tier"):
        stored.to_directory(str(tmp_path / "plain"))
    assert "local tier" not in caplog.text
    with_tier = stored._with_options(StorageOptions(local_tier=tier, retry=RETRY))
    with caplog.at_level("INFO", logger="cairn._src.checkpoint.local_tier"):
        with_tier.to_directory(str(tmp_path / "tiered"))
    assert "from this node's local tier" in caplog.text
    assert (tmp_path / "tiered" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    # Pickled to another process, a checkpoint leaves this node's tier behind.
    import pickle

    assert pickle.loads(pickle.dumps(with_tier))._options.local_tier is None


def test_storage_options_refuse_what_they_cannot_use() -> None:
    with pytest.raises(cairn.ConfigError, match=r"StorageOptions.transfer=8 must be a "
                       r"cairn.storage.TransferConfig or None"):
        StorageOptions(transfer=8)  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match=r"StorageOptions.retry=None must be a "
                       r"cairn.storage.RetryPolicy; pass RetryPolicy\(\)"):
        StorageOptions(retry=None)  # type: ignore[arg-type]


def test_a_run_config_gives_its_storage_options() -> None:
    transfer = cairn.storage.TransferConfig(max_concurrency=3)
    options = cairn.RunConfig(storage_transfer=transfer,
                              storage_retry=RETRY).storage_options()
    assert options == StorageOptions(transfer=transfer, retry=RETRY)
    assert options.local_tier is None
