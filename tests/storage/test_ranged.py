"""Parallel ranged reads and multipart writes with remote storage (TransferConfig).

The reader's ordering, bounds and budget are pure logic, tested on an in-memory file;
the transfers run against the moto S3 server on loopback.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import ChecksumMismatchError, ConfigError
from cairn._src.storage import ranged, transfer
from cairn._src.storage.ranged import Fetcher
from cairn.storage import TransferConfig, resolve, set_transfer_config, transfer_config
from tests.storage.test_transfer import FAST

MiB = 1 << 20
SMALL = TransferConfig(part_size=5 * MiB, max_concurrency=3, multipart_threshold=5 * MiB)


class _MemoryFile:
    """``read_at`` over bytes, recording the ranges asked, each read slowed a little."""

    def __init__(self, data: bytes, delay: float = 0.0) -> None:
        self.data = data
        self.delay = delay
        self.asked: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0

    def read_at(self, nbytes: int, offset: int) -> bytes:
        with self._lock:
            self.asked.append((offset, nbytes))
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay)
        with self._lock:
            self.in_flight -= 1
        return self.data[offset:offset + nbytes]


def _read_all(reader: ranged.RangedReader, chunk: int) -> bytes:
    out = bytearray()
    buffer = bytearray(chunk)
    while True:
        count = reader.readinto(buffer)
        if not count:
            return bytes(out)
        out += buffer[:count]


@pytest.mark.parametrize("size", [0, 1, 5 * MiB - 1, 5 * MiB, 5 * MiB + 1, 17 * MiB + 3])
@pytest.mark.parametrize("chunk", [4096, 3 * MiB, 8 * MiB])
def test_the_parts_come_back_in_order_whatever_the_sizes(size: int, chunk: int) -> None:
    data = os.urandom(size)
    file = _MemoryFile(data)
    with Fetcher(SMALL) as fetcher, fetcher.stream(file, size) as reader:
        assert _read_all(reader, chunk) == data
    # Consecutive ranges from 0; the last asks one byte past the end (growth shows).
    offsets = sorted(file.asked)
    assert offsets[0][0] == 0
    assert sum(n for _, n in offsets) == size + 1
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(offsets))


def test_an_object_that_grew_reads_longer_and_one_that_shrank_reads_shorter() -> None:
    data = os.urandom(11 * MiB)
    with Fetcher(SMALL) as fetcher:
        with fetcher.stream(_MemoryFile(data + b"x" * 100), len(data)) as reader:
            assert len(_read_all(reader, MiB)) == len(data) + 1
        with fetcher.stream(_MemoryFile(data[:6 * MiB]), len(data)) as reader:
            assert _read_all(reader, MiB) == data[:6 * MiB]


def test_readers_sharing_a_budget_never_hold_more_parts_than_it_allows() -> None:
    files = [_MemoryFile(os.urandom(23 * MiB), delay=0.01) for _ in range(4)]
    results: dict[int, bytes] = {}
    with Fetcher(SMALL) as fetcher:
        def read(i: int) -> None:
            with fetcher.stream(files[i], len(files[i].data)) as reader:
                results[i] = _read_all(reader, MiB)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(files))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "readers deadlocked"
        # Every reader gave back all it took: the whole budget is free again.
        budget = fetcher._budget
        assert all(budget.acquire(blocking=False) for _ in range(SMALL.max_concurrency))
        assert not budget.acquire(blocking=False)
        for _ in range(SMALL.max_concurrency):
            budget.release()
    assert all(results[i] == files[i].data for i in range(len(files)))
    assert sum(f.most_in_flight for f in files) <= 4 * SMALL.max_concurrency
    assert max(f.most_in_flight for f in files) <= SMALL.max_concurrency


def test_a_reader_closed_early_gives_its_budget_back() -> None:
    file = _MemoryFile(os.urandom(30 * MiB), delay=0.01)
    with Fetcher(SMALL) as fetcher:
        with fetcher.stream(file, len(file.data)) as reader:
            reader.readinto(bytearray(MiB))
        # Every part is consumed or released: a new reader can use the whole budget.
        with fetcher.stream(file, len(file.data)) as reader:
            assert _read_all(reader, 4 * MiB) == file.data


def test_a_failed_part_raises_from_the_read_and_releases_the_budget() -> None:
    class Failing(_MemoryFile):
        def read_at(self, nbytes: int, offset: int) -> bytes:
            if offset >= 10 * MiB:
                raise ConnectionError("reset by peer")
            return super().read_at(nbytes, offset)

    data = os.urandom(20 * MiB)
    with Fetcher(SMALL) as fetcher:
        with pytest.raises(ConnectionError, match="reset by peer"):
            with fetcher.stream(Failing(data), len(data)) as reader:
                _read_all(reader, MiB)
        with fetcher.stream(_MemoryFile(data), len(data)) as reader:
            assert _read_all(reader, MiB) == data


def test_a_part_that_times_out_once_is_asked_again_alone() -> None:
    class Flaky(_MemoryFile):
        failed = False

        def read_at(self, nbytes: int, offset: int) -> bytes:
            if offset == 5 * MiB and not self.failed:
                self.failed = True
                raise TimeoutError("Operation too slow")
            return super().read_at(nbytes, offset)

    data = os.urandom(12 * MiB)
    file = Flaky(data)
    with Fetcher(SMALL, FAST) as fetcher, fetcher.stream(file, len(data)) as reader:
        assert _read_all(reader, MiB) == data
    # Three ranges, the second asked twice (the failed try is not recorded): no restart.
    assert sorted(file.asked) == [(0, 5 * MiB), (5 * MiB, 5 * MiB), (10 * MiB, 2 * MiB + 1)]


def test_closing_a_reader_waits_for_its_reads_and_starts_no_more() -> None:
    class Watched(_MemoryFile):
        closed = False
        after_close = 0

        def read_at(self, nbytes: int, offset: int) -> bytes:
            if self.closed:
                self.after_close += 1
            if offset == 5 * MiB:
                raise ConnectionError("reset by peer")
            return super().read_at(nbytes, offset)

    file = Watched(os.urandom(40 * MiB), delay=0.05)
    with Fetcher(SMALL, FAST) as fetcher:
        with pytest.raises(ConnectionError), fetcher.stream(file, len(file.data)) as reader:
            _read_all(reader, MiB)
        # As the caller now closes the file: nothing of this reader reads any more.
        assert file.in_flight == 0
        file.closed = True
        time.sleep(0.2)
        assert file.after_close == 0


def test_a_part_longer_than_asked_is_an_error_not_data() -> None:
    class Generous(_MemoryFile):
        def read_at(self, nbytes: int, offset: int) -> bytes:
            return super().read_at(nbytes + 10, offset)

    data = os.urandom(12 * MiB)
    with Fetcher(SMALL, FAST) as fetcher, fetcher.stream(Generous(data), len(data)) as reader:
        with pytest.raises(OSError, match=r"asked for 5242880 bytes at offset 0, the store "
                                          r"returned 5242890"):
            _read_all(reader, MiB)


def test_the_multipart_threshold_follows_a_larger_part_size() -> None:
    assert TransferConfig().multipart_threshold == 32 * MiB
    assert TransferConfig(part_size=64 * MiB).multipart_threshold == 64 * MiB
    assert TransferConfig(part_size=8 * MiB, multipart_threshold=8 * MiB).multipart_threshold \
        == 8 * MiB


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"part_size": 1 * MiB}, r"TransferConfig.part_size=1048576 must be an integer between "
                             r"5 MiB \(5242880, S3's smallest part\) and 5 GiB "
                             r"\(5368709120\)"),
    ({"part_size": "8MiB"}, r"TransferConfig.part_size='8MiB' must be an integer"),
    ({"max_concurrency": 0}, r"TransferConfig.max_concurrency=0 must be an integer between "
                             r"1 and 1024"),
    ({"max_concurrency": True}, r"TransferConfig.max_concurrency=True must be an integer"),
    ({"part_size": 16 * MiB, "multipart_threshold": 8 * MiB},
     r"TransferConfig.multipart_threshold=8388608 must be an integer at least part_size "
     r"\(16777216\)"),
])
def test_bad_settings_name_the_field_the_value_and_what_is_accepted(
    kwargs: dict[str, object], message: str,
) -> None:
    with pytest.raises(ConfigError, match=message):
        TransferConfig(**kwargs)  # type: ignore[arg-type]


def test_the_run_config_and_the_setter_refuse_what_is_not_a_transfer_config() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig.storage_transfer=\{'part_size': 8\} "
                                          r"must be a cairn.storage.TransferConfig or None"):
        cairn.RunConfig(storage_transfer={"part_size": 8})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"set_transfer_config\(config=8\): config must be "
                                          r"a cairn.storage.TransferConfig or None"):
        set_transfer_config(8)  # type: ignore[arg-type]
    assert transfer_config() == TransferConfig()


def test_two_runs_in_one_driver_each_see_only_their_own_transfer_settings(
    tmp_path: Path,
) -> None:
    # Two fit() calls one after the other, with different RunConfig(storage_transfer=...):
    # each run's workers, its callbacks' checkpoints and its validations' checkpoints get
    # that run's settings in their StorageOptions; the driver's own never change.
    seen: list[tuple[str, object, object]] = []

    class Observe(cairn.UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                         checkpoint: cairn.Checkpoint | None) -> None:
            assert checkpoint is not None
            seen.append(("callback", checkpoint._options.transfer, transfer_config()))

    def validate(checkpoint: cairn.Checkpoint) -> dict[str, Any]:
        seen.append(("validation", checkpoint._options.transfer, transfer_config()))
        return {}

    def train_fn() -> None:
        from cairn._src.worker.session import get_session

        seen_here = get_session("report").storage_options.transfer
        assert seen_here is not None
        cairn.report({"concurrency": seen_here.max_concurrency},
                     checkpoint=cairn.Checkpoint.from_directory(tempfile.mkdtemp()),
                     validation=True)

    for name, config in [("first", TransferConfig(max_concurrency=2)),
                         ("second", TransferConfig(max_concurrency=3))]:
        seen.clear()
        result = cairn.Trainer(
            train_fn, scaling_config=cairn.ScalingConfig(num_workers=1),
            run_config=cairn.RunConfig(storage_path=str(tmp_path), name=name,
                                       storage_transfer=config, callbacks=[Observe()]),
            validation_config=cairn.ValidationConfig(validate),
        ).fit()
        assert result.error is None
        assert result.metrics["concurrency"] == config.max_concurrency
        assert sorted(seen, key=lambda s: s[0]) == [
            ("callback", config, TransferConfig()), ("validation", config, TransferConfig())]
    assert transfer_config() == TransferConfig()


def _counting_fetches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    fetch = ranged.RangedReader._fetch

    def counted(self: ranged.RangedReader, offset: int, length: int) -> bytes:
        data = fetch(self, offset, length)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(ranged.RangedReader, "_fetch", counted)
    return sizes


def test_a_large_s3_file_goes_up_in_parts_and_comes_back_in_parallel_ranges(
    tmp_path: Path, s3_uri_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(16 * MiB + 123)
    (src / "big").write_bytes(big)
    (src / "small").write_bytes(b"tiny")
    location = resolve(s3_uri_factory("ranged"))
    entries = transfer.upload_directory(str(src), location, retry=FAST, transfer=SMALL)
    fetched = _counting_fetches(monkeypatch)
    transfer.download_directory(location, str(tmp_path / "out"), files=entries, retry=FAST,
                                transfer=SMALL)
    assert (tmp_path / "out" / "big").read_bytes() == big
    assert (tmp_path / "out" / "small").read_bytes() == b"tiny"
    # Four ranges of the large file (three of 5 MiB, the rest); the small one streamed.
    assert sorted(fetched) == [MiB + 123, 5 * MiB, 5 * MiB, 5 * MiB]
    fetched.clear()
    transfer.verify_directory(location, entries, retry=FAST, transfer=SMALL)
    assert len(fetched) == 4


def test_a_flipped_byte_in_a_ranged_download_fails_the_checksum_and_leaves_no_file(
    tmp_path: Path, s3_uri_factory: Callable[[str], str],
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    data = bytearray(os.urandom(12 * MiB))
    (src / "big").write_bytes(data)
    location = resolve(s3_uri_factory("flipped"))
    entries = transfer.upload_directory(str(src), location, retry=FAST, transfer=SMALL)
    data[7 * MiB] ^= 0x01
    with location.filesystem.open_output_stream(location.join("big").path) as out:
        out.write(bytes(data))
    out_dir = tmp_path / "out"
    with pytest.raises(ChecksumMismatchError, match=r"File 'big' .* is corrupt: expected "
                                                    r"xxh3_128 checksum"):
        transfer.download_directory(location, str(out_dir), files=entries, retry=FAST,
                                    transfer=SMALL)
    assert os.listdir(out_dir) == []
    with pytest.raises(ChecksumMismatchError, match="corrupt"):
        transfer.verify_directory(location, entries, retry=FAST, transfer=SMALL)


def test_an_upload_waits_for_its_parts_once_its_share_of_the_budget_is_on_its_way(
    tmp_path: Path, s3_uri_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One file, 2 x 5 MiB of budget: a 5 MiB copy buffer, and a flush (a wait for the
    # background parts) after every 5 MiB written.
    from cairn._src.storage import checksum

    flushes: list[int] = []
    copy = checksum.stream_copy

    def recorded(*args: object, **kwargs: object) -> int:
        if "flush_every" in kwargs:  # An upload's copy.
            flushes.append(kwargs["flush_every"])  # type: ignore[arg-type]
        return copy(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(transfer, "stream_copy", recorded)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(os.urandom(11 * MiB))
    location = resolve(s3_uri_factory("window"))
    config = TransferConfig(part_size=5 * MiB, max_concurrency=2)
    entries = transfer.upload_directory(str(src), location, retry=FAST, transfer=config)
    assert flushes == [5 * MiB]
    transfer.download_directory(location, str(tmp_path / "out"), files=entries, retry=FAST)
    assert (tmp_path / "out" / "a").read_bytes() == (src / "a").read_bytes()


def test_run_config_storage_transfer_reaches_every_worker_in_its_storage_options(
    tmp_path: Path,
) -> None:
    # The setting travels in the session's StorageOptions; no process-wide setting of the
    # worker (or the driver) changes, so two runs in one process cannot see each other's.
    config = TransferConfig(part_size=6 * MiB, max_concurrency=3)

    def train_fn() -> None:
        from cairn._src.worker.session import get_session

        seen = get_session("report").storage_options.transfer
        assert seen is not None
        own = cairn.storage.transfer_config()
        checkpoint_dir = tempfile.mkdtemp()
        cairn.report({"part_size": seen.part_size, "concurrency": seen.max_concurrency,
                      "own_part_size": own.part_size},
                     checkpoint=cairn.Checkpoint.from_directory(checkpoint_dir))
        restored = cairn.get_checkpoint()
        assert restored is not None
        assert restored._options.transfer == seen

    result = cairn.Trainer(
        train_fn, scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(storage_path=str(tmp_path), name="tuned",
                                   storage_transfer=config),
    ).fit()
    assert result.error is None
    assert result.metrics["part_size"] == 6 * MiB
    assert result.metrics["concurrency"] == 3
    assert result.metrics["own_part_size"] == TransferConfig().part_size
    assert transfer_config() == TransferConfig()


def test_a_file_whose_ranges_keep_timing_out_is_read_again_as_one_stream(
    tmp_path: Path, s3_uri_factory: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that serves ranges slowly (moto reads a whole object per range) makes
    # parallel ranges time out where one stream would not.
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(11 * MiB)
    (src / "big").write_bytes(data)
    location = resolve(s3_uri_factory("timeouts"))
    entries = transfer.upload_directory(str(src), location, retry=FAST, transfer=SMALL)
    tries: list[int] = []

    def timing_out(self: ranged.RangedReader, offset: int, length: int) -> bytes:
        tries.append(offset)
        raise TimeoutError("Operation too slow. Less than 1 bytes/sec transferred")

    monkeypatch.setattr(ranged.RangedReader, "_fetch", timing_out)
    transfer.download_directory(location, str(tmp_path / "out"), files=entries, retry=FAST,
                                transfer=SMALL)
    assert (tmp_path / "out" / "big").read_bytes() == data
    transfer.verify_directory(location, entries, retry=FAST, transfer=SMALL)
    assert tries, "the first try used ranged parts"
