"""Local ``as_directory()`` verifies a committed checkpoint before handing out its files,
once per process while nothing changed (issue 10, item 12)."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import CheckpointNotFoundError, ChecksumMismatchError, ScalingConfig, Trainer
from cairn._src.checkpoint import checkpoint as checkpoint_module
from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.checkpoint.verified import VERIFIED
from cairn._src.storage import scratch
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import upload_directory

ONE_HOUR_AGO = time.time() - 3600


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    VERIFIED.clear()


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the full verifications as_directory() runs (the real one still runs)."""
    calls: list[str] = []
    real = checkpoint_module.verify_directory

    def counting(location: Any, files: Any, **kwargs: Any) -> None:
        calls.append(location.path)
        real(location, files, **kwargs)

    monkeypatch.setattr(checkpoint_module, "verify_directory", counting)
    return calls


def committed(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "model").mkdir(parents=True)
    (src / "model" / "weights.pt").write_bytes(b"w" * 1000)
    (src / "step.txt").write_bytes(b"42")
    where = tmp_path / "ckpt"
    location = resolve(str(where))
    write_manifest(location, Manifest(files=upload_directory(str(src), location)))
    for name in ("model/weights.pt", "step.txt"):
        # Written long ago, as checkpoints one resumes from are.
        os.utime(where / name, (ONE_HOUR_AGO, ONE_HOUR_AGO))
    return where


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    with open(path, "r+b") as f:  # In place: same size, same inode.
        f.write(data)


def test_a_byte_flipped_local_checkpoint_is_not_served(tmp_path: Path) -> None:
    where = committed(tmp_path)
    flip_a_byte(where / "model" / "weights.pt")
    with pytest.raises(ChecksumMismatchError,
                       match=r"File 'model/weights\.pt' of .*ckpt is corrupt: expected xxh3_128 "
                             r"checksum"):
        with Checkpoint(str(where)).as_directory():
            pytest.fail("the block must not run on a damaged checkpoint")


def test_verified_once_then_again_only_after_a_change(
    tmp_path: Path, verifications: list[str]
) -> None:
    where = committed(tmp_path)
    checkpoint = Checkpoint(str(where))
    for _ in range(3):
        with checkpoint.as_directory() as directory:
            assert directory == str(where)
    with Checkpoint(str(where)).as_directory():  # Another object, the same checkpoint.
        pass
    assert len(verifications) == 1
    flip_a_byte(where / "step.txt")
    with pytest.raises(ChecksumMismatchError, match=r"File 'step\.txt' .* is corrupt"):
        with checkpoint.as_directory():
            pass
    assert len(verifications) == 2
    # A damaged checkpoint is not remembered: it is checked (and refused) every time.
    with pytest.raises(ChecksumMismatchError):
        with checkpoint.as_directory():
            pass
    assert len(verifications) == 3


def test_a_replaced_file_or_a_rewritten_manifest_is_verified_again(
    tmp_path: Path, verifications: list[str]
) -> None:
    where = committed(tmp_path)
    checkpoint = Checkpoint(str(where))
    with checkpoint.as_directory():
        pass
    # Same bytes under a new inode: re-verified (and accepted).
    copy = where / "step.copy"
    copy.write_bytes((where / "step.txt").read_bytes())
    os.replace(copy, where / "step.txt")
    with checkpoint.as_directory():
        pass
    assert len(verifications) == 2
    checkpoint.update_metadata({"note": "rewrites the manifest"})
    with checkpoint.as_directory():
        pass
    assert len(verifications) == 3


def test_an_uncommitted_directory_is_served_unverified(
    tmp_path: Path, verifications: list[str]
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a").write_bytes(b"a")
    with Checkpoint.from_directory(tmp_path / "plain").as_directory() as directory:
        assert os.listdir(directory) == ["a"]
    assert verifications == []


def test_concurrent_as_directory_calls_are_safe(tmp_path: Path, verifications: list[str]) -> None:
    where = committed(tmp_path)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def use() -> None:
        start.wait()
        try:
            for _ in range(5):
                with Checkpoint(str(where)).as_directory() as directory:
                    assert os.path.isdir(directory)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert 1 <= len(verifications) <= 8


RunConfigFactory = Callable[..., cairn.RunConfig]


def write_step(config: dict[str, Any]) -> None:
    directory = config["dir"] + f"/{cairn.get_context().get_world_rank()}"
    os.makedirs(directory)
    with open(os.path.join(directory, f"rank_{cairn.get_context().get_world_rank()}"), "w") as f:
        f.write("state" * 100)
    cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory))


def test_result_checkpoint_of_a_real_run_is_verified(
    run_config: RunConfigFactory, tmp_path: Path
) -> None:
    result = Trainer(write_step, train_loop_config={"dir": str(tmp_path / "written")},
                     scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        names = sorted(os.listdir(directory))
    assert "rank_0" in names and "rank_1" in names
    flip_a_byte(Path(result.checkpoint.path) / "rank_1")
    os.utime(Path(result.checkpoint.path) / "rank_1", (ONE_HOUR_AGO, ONE_HOUR_AGO))
    with pytest.raises(ChecksumMismatchError, match=r"File 'rank_1' of .* is corrupt"):
        with result.checkpoint.as_directory():
            pass


def _handed_out(where: Path) -> Checkpoint:
    """``where`` as Cairn hands a committed checkpoint out (get_checkpoint, Result)."""
    location = resolve(str(where))
    return Checkpoint._from_committed(location, manifest_location=location)


def test_a_committed_checkpoint_whose_manifest_is_gone_is_never_served_in_part(
        tmp_path: Path) -> None:
    # Retention deletes the manifest first, then the data: a deletion that stopped half
    # way leaves part of the files.
    where = committed(tmp_path)
    checkpoint = pickle.loads(pickle.dumps(_handed_out(where)))  # as a worker receives it
    (where / MANIFEST_NAME).unlink()
    (where / "model" / "weights.pt").unlink()
    for restore in (checkpoint.to_directory, lambda: checkpoint.as_directory().__enter__()):
        with pytest.raises(CheckpointNotFoundError,
                           match=r"manifest of checkpoint .* is gone, though it was committed"):
            restore()
    # The same directory named by the user is a directory like any other.
    assert os.listdir(Checkpoint(str(where)).to_directory()) == ["step.txt"]


def test_a_remote_checkpoint_is_downloaded_into_a_directory_named_after_its_process(
        tmp_path: Path) -> None:
    # A process killed inside the block leaves it to the sweep of stale restore
    # directories (scratch.py), which knows it by that name.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "step.txt").write_bytes(b"42")
    store = resolve("memory://bucket/ckpt")
    write_manifest(store, Manifest(files=upload_directory(str(tmp_path / "src"), store)))
    with Checkpoint._from_committed(store, manifest_location=store).as_directory() as d:
        assert os.path.basename(d).startswith(f"{scratch.PREFIX}{scratch._namespace()}-"
                                              f"{os.getpid()}-")
        assert os.listdir(d) == ["step.txt"]
    assert not os.path.exists(d)
