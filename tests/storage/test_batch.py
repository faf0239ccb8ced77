"""The small-file fast path (a directory at a time) finishes only the expected case, and
hands every other file to the per-file path, which judges it as before."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from cairn._src.errors import ChecksumMismatchError, NotARegularFileError
from cairn._src.storage import batch
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import (
    compute_entries,
    download_directory,
    upload_directory,
    verify_directory,
)

pytestmark = pytest.mark.skipif(not batch.available(), reason="needs directory descriptors")


def tree(root: str, count: int = 30) -> dict[str, bytes]:
    """``count`` small files over three directories, one nested, and one large file."""
    contents: dict[str, bytes] = {}
    for i in range(count):
        rel = f"{['a', 'b', 'b/c'][i % 3]}/f{i:03d}.bin" if i else "top.bin"
        contents[rel] = os.urandom(i * 7)  # 0 bytes too
    contents["big.bin"] = os.urandom(batch.SMALL_FILE_BYTES + 1)
    for rel, data in contents.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return contents


def stored_checkpoint(tmp_path: str) -> tuple[str, dict[str, bytes], dict[str, FileEntry]]:
    src = os.path.join(tmp_path, "src")
    contents = tree(src)
    stored = os.path.join(tmp_path, "stored")
    entries = upload_directory(src, resolve(stored))
    return stored, contents, entries


def read_tree(root: str) -> dict[str, bytes]:
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
    return found


def test_upload_verify_restore_round_trip(tmp_path: str) -> None:
    stored, contents, entries = stored_checkpoint(str(tmp_path))
    assert set(entries) == set(contents)
    assert read_tree(stored) == contents
    assert {rel: e.size for rel, e in entries.items()} == {
        rel: len(data) for rel, data in contents.items()}
    # The fast path and the per-file path compute the same entries.
    assert compute_entries(resolve(stored), list(contents)) == entries
    verify_directory(resolve(stored), entries)
    restored = os.path.join(str(tmp_path), "restored")
    sent: list[int] = []
    download_directory(resolve(stored), restored, files=entries, progress=sent.append)
    assert read_tree(restored) == contents  # No temporary file left either.
    assert sum(sent) == sum(len(data) for data in contents.values())


def test_download_leaves_every_unexpected_file_to_the_per_file_path(tmp_path: str) -> None:
    stored, contents, entries = stored_checkpoint(str(tmp_path))
    outside = os.path.join(str(tmp_path), "secret")
    with open(outside, "wb") as f:
        f.write(contents["a/f003.bin"])
    os.remove(os.path.join(stored, "a", "f003.bin"))
    os.symlink(outside, os.path.join(stored, "a", "f003.bin"))  # same size, a link
    os.remove(os.path.join(stored, "b", "f004.bin"))
    os.mkfifo(os.path.join(stored, "b", "f004.bin"))  # would block a plain open
    with open(os.path.join(stored, "b", "f001.bin"), "r+b") as f:
        f.write(bytes([f.read(1)[0] ^ 1]))  # one bit flipped, same size
    with open(os.path.join(stored, "a", "f006.bin"), "ab") as f:
        f.write(b"x")  # grown
    os.rename(os.path.join(stored, "b", "c"), os.path.join(str(tmp_path), "elsewhere"))
    os.symlink(os.path.join(str(tmp_path), "elsewhere"), os.path.join(stored, "b", "c"))
    target = os.path.join(str(tmp_path), "restored")
    small = {rel: e for rel, e in entries.items() if e.size <= batch.SMALL_FILE_BYTES}
    for rel in small:
        os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
    left = batch.run(batch.Job("download", stored, target, verify=True), small)[1]
    bad = {"a/f003.bin", "b/f004.bin", "b/f001.bin", "a/f006.bin"}
    assert left == bad | {rel for rel in small if rel.startswith("b/c/")}
    copied = read_tree(target)
    assert copied == {rel: contents[rel] for rel in small if rel not in left}
    # Without verification the flipped bit is not looked for: it is copied.
    again = os.path.join(str(tmp_path), "unverified")
    for rel in small:
        os.makedirs(os.path.dirname(os.path.join(again, rel)), exist_ok=True)
    left = batch.run(batch.Job("download", stored, again, verify=False), small)[1]
    assert "b/f001.bin" not in left and "a/f003.bin" in left


def test_damage_is_reported_by_the_per_file_path(tmp_path: str) -> None:
    stored, _, entries = stored_checkpoint(str(tmp_path))
    with open(os.path.join(stored, "b", "f001.bin"), "r+b") as f:
        f.write(bytes([f.read(1)[0] ^ 1]))
    with pytest.raises(ChecksumMismatchError, match=r"1 of 31 files .* 'b/f001.bin'"):
        verify_directory(resolve(stored), entries)
    with pytest.raises(ChecksumMismatchError, match=r"'b/f001.bin' .* expected xxh3_128"):
        download_directory(resolve(stored), os.path.join(str(tmp_path), "r"), files=entries)
    assert not os.path.exists(os.path.join(str(tmp_path), "r", "b", "f001.bin"))
    os.remove(os.path.join(stored, "b", "f001.bin"))
    os.mkfifo(os.path.join(stored, "b", "f001.bin"))
    with pytest.raises(NotARegularFileError, match=r"file 'b/f001.bin' is a FIFO"):
        download_directory(resolve(stored), os.path.join(str(tmp_path), "r2"), files=entries)


def test_upload_follows_links_it_listed_and_leaves_a_fifo(tmp_path: str) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    os.symlink("f001.bin", os.path.join(src, "b", "alias.bin"))  # a link inside: followed
    dest = os.path.join(str(tmp_path), "dest")
    for directory in ("a", "b/c"):
        os.makedirs(os.path.join(dest, directory))
    os.makedirs(os.path.join(dest, "b"), exist_ok=True)
    names = [*contents, "b/alias.bin"]
    entries, left = batch.run(batch.Job("upload", src, dest), dict.fromkeys(names))
    assert left == {"big.bin"}  # larger than the fast path reads whole
    assert read_tree(dest)["b/alias.bin"] == contents["b/f001.bin"]
    assert entries["b/alias.bin"] == entries["b/f001.bin"]
    os.mkfifo(os.path.join(src, "a", "pipe"))
    entries, left = batch.run(batch.Job("upload", src, dest), dict.fromkeys(["a/pipe", "top.bin"]))
    assert left == {"a/pipe"} and set(entries) == {"top.bin"}


def test_hash_files_does_not_follow_a_link_unless_asked(tmp_path: str) -> None:
    stored, _, entries = stored_checkpoint(str(tmp_path))
    os.symlink("f001.bin", os.path.join(stored, "b", "alias.bin"))
    found, left = batch.run(batch.Job("hash", stored), {"b/alias.bin": None, "top.bin": None})
    assert left == {"b/alias.bin"} and found == {"top.bin": entries["top.bin"]}
    found, left = batch.run(batch.Job("hash", stored, follow_links=True), {"b/alias.bin": None})
    assert not left and found == {"b/alias.bin": entries["b/f001.bin"]}


def test_check_sizes_stats_only_and_leaves_what_differs(tmp_path: str) -> None:
    stored, _, entries = stored_checkpoint(str(tmp_path))
    os.remove(os.path.join(stored, "a", "f003.bin"))
    os.mkfifo(os.path.join(stored, "a", "f003.bin"))
    os.remove(os.path.join(stored, "top.bin"))
    sizes = {rel: e.size for rel, e in entries.items()}
    sizes["b/f001.bin"] += 1
    sizes["missing/x.bin"] = 3
    assert batch.run(batch.Job("sizes", stored), sizes)[1] == {
        "a/f003.bin", "top.bin", "b/f001.bin", "missing/x.bin"}


def test_a_background_upload_moves_larger_chunks_with_the_same_result(tmp_path: str) -> None:
    from cairn._src.storage.checksum import BACKGROUND_CHUNK_BYTES

    src = os.path.join(str(tmp_path), "src")
    os.makedirs(src)
    data = os.urandom(BACKGROUND_CHUNK_BYTES + 12345)  # two chunks, the second partial
    with open(os.path.join(src, "weights.bin"), "wb") as f:
        f.write(data)
    entries = {}
    for background in (False, True):
        dest = os.path.join(str(tmp_path), f"dest-{background}")
        entries[background] = upload_directory(src, resolve(dest), background=background)
        assert read_tree(dest) == {"weights.bin": data}
    assert entries[True] == entries[False]


def test_upload_hands_back_what_changed_since_the_listing_without_blocking(
        tmp_path: str) -> None:
    # Listed as regular files, then replaced: a link to a FIFO (the link is examined
    # before anything is opened), a FIFO (opened non-blocking, then refused), a directory,
    # and a file grown past what the fast path reads whole. None blocks; all go back to
    # the per-file path, which refuses or streams them.
    src = os.path.join(str(tmp_path), "src")
    dest = os.path.join(str(tmp_path), "dest")
    os.makedirs(src)
    os.makedirs(dest)
    names = ["fifo-link", "fifo", "dir", "grown", "kept"]
    for name in names:
        with open(os.path.join(src, name), "wb") as f:
            f.write(b"x")
    os.mkfifo(os.path.join(str(tmp_path), "outside-fifo"))
    os.remove(os.path.join(src, "fifo-link"))
    os.symlink(os.path.join(str(tmp_path), "outside-fifo"), os.path.join(src, "fifo-link"))
    os.remove(os.path.join(src, "fifo"))
    os.mkfifo(os.path.join(src, "fifo"))
    os.remove(os.path.join(src, "dir"))
    os.mkdir(os.path.join(src, "dir"))
    with open(os.path.join(src, "grown"), "wb") as f:
        f.write(b"y" * (batch.SMALL_FILE_BYTES + 1))
    entries, left = batch.run(batch.Job("upload", src, dest), dict.fromkeys(names))
    assert left == {"fifo-link", "fifo", "dir", "grown"} and set(entries) == {"kept"}
    assert sorted(os.listdir(dest)) == ["kept"]


# Many files: shares copied by copy processes (real child processes, with the threshold
# lowered so that the tree above is "many").

def test_shares_have_equal_counts_and_split_a_large_directory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "MIN_SHARE_FILES", 3)
    monkeypatch.setattr(batch, "_cores", lambda: 8)
    groups = [("a", list("0123456")), ("b", ["x"]), ("", ["y", "z"])]
    shares = batch._shares(groups, 3)
    assert [sum(len(items) for _, items in share) for share in shares] == [4, 4, 2]
    assert shares[0] == [("a", list("0123"))]
    assert shares[1] == [("a", list("456")), ("b", ["x"])]
    assert shares[2] == [("", ["y", "z"])]
    # Never more shares than MIN_SHARE_FILES a share allows, nor than asked for.
    assert len(batch._shares(groups, 8)) == 3
    assert len(batch._shares(groups, 1)) == 1
    monkeypatch.setattr(batch, "MIN_SHARE_FILES", 6)
    assert len(batch._shares(groups, 3)) == 1


def test_processes_follow_the_cores_max_workers_and_the_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "_cores", lambda: 96)
    assert batch.processes(None) == batch.MAX_PROCESSES
    assert batch.processes(3) == 3
    monkeypatch.setattr(batch, "_cores", lambda: 2)
    assert batch.processes(None) == 2 and batch.processes(1) == 1 and batch.processes(5) == 2


def test_copy_processes_give_what_one_process_gives(
        tmp_path: str, few_files_a_share: list[int]) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    small = sorted(rel for rel, data in contents.items() if len(data) <= batch.SMALL_FILE_BYTES)
    for processes in (1, 3):
        dest = os.path.join(str(tmp_path), f"dest{processes}")
        for directory in ("a", "b", "b/c"):
            os.makedirs(os.path.join(dest, directory))
        progress: list[int] = []
        entries, left = batch.run(batch.Job("upload", src, dest, max_workers=processes,
                                                progress=progress.append), dict.fromkeys(small))
        assert not left and set(entries) == set(small)
        assert sum(progress) == sum(len(contents[rel]) for rel in small)
        assert read_tree(dest) == {rel: contents[rel] for rel in small}
        if processes == 1:
            expected = entries
        assert entries == expected
        restored = os.path.join(str(tmp_path), f"restored{processes}")
        for directory in ("a", "b", "b/c"):
            os.makedirs(os.path.join(restored, directory))
        progress.clear()
        _, left = batch.run(batch.Job("download", dest, restored, max_workers=processes,
                                       progress=progress.append), entries)
        assert not left and read_tree(restored) == read_tree(dest)
        assert sum(progress) == sum(len(contents[rel]) for rel in small)
        hashed, left = batch.run(batch.Job("hash", restored, max_workers=processes), entries)
        assert not left and hashed == entries
    assert len(few_files_a_share) == 3 * 2  # two copy processes for each of the three calls


def test_a_background_upload_leaves_every_share_to_copy_processes(
        tmp_path: str, few_files_a_share: list[int]) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    entries = upload_directory(src, resolve(os.path.join(str(tmp_path), "dest")),
                               background=True, max_workers=2)
    assert len(few_files_a_share) == 2
    assert read_tree(os.path.join(str(tmp_path), "dest")) == contents
    assert entries == compute_entries(resolve(src), list(contents))


def test_a_background_upload_of_few_files_or_one_worker_starts_no_copy_process(
        tmp_path: str, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    upload_directory(src, resolve(os.path.join(str(tmp_path), "one")), background=True,
                     max_workers=1)
    monkeypatch.setattr(batch, "MIN_SHARE_FILES", len(contents) + 1)
    upload_directory(src, resolve(os.path.join(str(tmp_path), "few")), background=True,
                     max_workers=2)
    assert few_files_a_share == []
    assert read_tree(os.path.join(str(tmp_path), "few")) == contents


def test_transfers_share_files_with_copy_processes(
        tmp_path: str, few_files_a_share: list[int]) -> None:
    stored, contents, entries = stored_checkpoint(str(tmp_path))
    assert len(few_files_a_share) == 3  # the upload: four shares on four cores
    restored = os.path.join(str(tmp_path), "restored")
    download_directory(resolve(stored), restored, files=entries, max_workers=2)
    verify_directory(resolve(stored), entries, max_workers=2)
    assert read_tree(restored) == contents
    assert len(few_files_a_share) == 5  # and one each for the download and verification
    # max_workers=1 keeps every file in the calling process.
    download_directory(resolve(stored), os.path.join(str(tmp_path), "again"), files=entries,
                       max_workers=1)
    assert len(few_files_a_share) == 5


def _copy_process_runs(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    monkeypatch.setattr(batch, "_BOOTSTRAP", code)


def test_a_copy_process_that_fails_leaves_its_share_to_this_process_whole(
        tmp_path: str, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    stored, contents, entries = stored_checkpoint(str(tmp_path))
    # The copy process half-writes the first file of each directory of its share (in the
    # staging directory, under the file's name), then dies. A user's files with the
    # temporary mark in the target are not its own.
    _copy_process_runs(monkeypatch, (
        "import marshal, os, sys\n"
        "op, starter, src, dest, groups = marshal.loads(sys.stdin.buffer.read())\n"
        "for directory, items in groups:\n"
        "    with open(os.path.join(dest, directory, items[0][0]), 'wb') as f:\n"
        "        f.write(b'half')\n"
        "sys.stderr.write('copy failed on purpose\\n' + 'x' * 5000 + 'the end')\n"
        "sys.exit(3)\n"))
    restored = os.path.join(str(tmp_path), "restored")
    theirs = {"b/.cairn-tmp-0123456789ab": b"another transfer's", "b/.cairn-tmp-": b"mine"}
    for rel, data in theirs.items():
        os.makedirs(os.path.join(restored, "b"), exist_ok=True)
        with open(os.path.join(restored, *rel.split("/")), "wb") as f:
            f.write(data)
    before = len(few_files_a_share)
    with caplog.at_level("WARNING", logger=batch.__name__):
        download_directory(resolve(stored), restored, files=entries, max_workers=2)
    assert read_tree(restored) == {**contents, **theirs}  # nothing half-written left
    assert len(few_files_a_share) == before + 1
    assert "exited with status 3" in caplog.text and "the end" in caplog.text
    assert "copy failed on purpose" not in caplog.text  # only the end of its output
    assert "\n" not in caplog.records[-1].getMessage()  # its output cannot forge log lines
    # Copy processes are not tried again in this process, and say so only once.
    caplog.clear()
    with caplog.at_level("WARNING", logger=batch.__name__):
        download_directory(resolve(stored), os.path.join(str(tmp_path), "again"),
                           files=entries, max_workers=2)
    assert len(few_files_a_share) == before + 1 and not caplog.records


@pytest.mark.parametrize("answer, reason", [
    # Names a file it was not asked for.
    ("marshal.dumps(({'../outside': (1, 'ab')}, [], 1))", "other files than"),
    # Accounts for no file at all: every file must be either finished or left.
    ("marshal.dumps(({}, [], 0))", "other files than"),
    ("b'not marshal'", "unreadable answer"),
    ("marshal.dumps(({}, [], -1))", "other files than"),
])
def test_an_answer_that_does_not_account_for_each_file_once_is_not_taken(
        tmp_path: str, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, answer: str, reason: str) -> None:
    stored, contents, entries = stored_checkpoint(str(tmp_path))
    _copy_process_runs(monkeypatch, f"import marshal, sys; sys.stdout.buffer.write({answer})")
    restored = os.path.join(str(tmp_path), "restored")
    with caplog.at_level("WARNING", logger=batch.__name__):
        download_directory(resolve(stored), restored, files=entries, max_workers=2)
    assert read_tree(restored) == contents
    assert reason in caplog.text


def test_a_copy_process_whose_starter_is_gone_answers_nothing(tmp_path: str) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    names = [rel for rel in contents if rel.startswith("a/")]
    dest = os.path.join(str(tmp_path), "dest")
    os.makedirs(os.path.join(dest, "a"))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # A process that has ended (and been reaped): its pid names no process.
    copier = batch._CopyProcess(
        ("upload", gone.pid, src, dest, [("a", [rel.split("/", 1)[1] for rel in names])]),
        names)
    copier.start(sys.executable)
    assert copier.result() is None
    assert os.listdir(os.path.join(dest, "a")) == []


def test_a_copy_process_stops_when_its_starter_is_killed(tmp_path: str) -> None:
    # A starter that starts a copy process of 20,000 files, says its pid and waits; kill -9
    # it, and the copy process stops within _CHECK_EVERY files of noticing.
    src = os.path.join(str(tmp_path), "src")
    dest = os.path.join(str(tmp_path), "dest")
    os.makedirs(src)
    os.makedirs(dest)
    names = [f"f{i:05d}" for i in range(20_000)]
    for name in names:
        with open(os.path.join(src, name), "wb") as f:
            f.write(b"x")
    script = os.path.join(str(tmp_path), "starter.py")
    with open(script, "w") as f:
        f.write(
            "import os, sys, time\n"
            "from cairn._src.storage import batch\n"
            f"names = sorted(os.listdir({src!r}))\n"
            f"copier = batch._CopyProcess(('upload', os.getpid(), {src!r}, {dest!r}, "
            "[('', names)]), names)\n"
            "copier.start(sys.executable)\n"
            "print(copier._process.pid, flush=True)\n"
            "time.sleep(600)\n")
    starter = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE)
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    starter.kill()
    starter.wait()
    while _exists(child):
        time.sleep(0.05)
    assert len(os.listdir(dest)) < len(names)


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_no_copy_process_without_a_python_interpreter_to_run(
        tmp_path: str, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    for executable in (None, "", "/usr/bin/my-app"):
        monkeypatch.setattr(sys, "executable", executable)
        dest = os.path.join(str(tmp_path), f"dest-{executable and len(executable)}")
        upload_directory(src, resolve(dest), max_workers=2)
        assert read_tree(dest) == contents
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", sys.__dict__.get("_base_executable", "python"))
    upload_directory(src, resolve(os.path.join(str(tmp_path), "frozen")), max_workers=2)
    assert few_files_a_share == []


def test_a_copy_process_finds_xxhash_where_this_process_does(
        tmp_path: str, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # With PYTHONSAFEPATH its first path entry is not the working directory, and a
    # working directory holding a module of xxhash's name is not imported from.
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    monkeypatch.chdir(str(tmp_path))
    with open(os.path.join(str(tmp_path), "xxhash.py"), "w") as f:
        f.write("raise SystemExit('the working directory was imported from')\n")
    src = os.path.join(str(tmp_path), "src")
    contents = tree(src)
    with caplog.at_level("WARNING", logger=batch.__name__):
        upload_directory(src, resolve(os.path.join(str(tmp_path), "dest")), max_workers=2)
    assert few_files_a_share == [1] and not caplog.records
    assert read_tree(os.path.join(str(tmp_path), "dest")) == contents


def test_the_cores_of_this_process_are_at_least_one() -> None:
    assert 1 <= batch._cores() <= (os.cpu_count() or 1)


def test_few_files_do_not_look_up_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lookup() -> int:
        raise AssertionError("the cores were looked up for a transfer of few files")

    monkeypatch.setattr(batch, "_cores", no_lookup)
    groups = [("a", [f"f{i}" for i in range(2 * batch.MIN_SHARE_FILES - 1)])]
    assert batch._shares(groups, None) == [groups]


def test_a_background_upload_to_local_storage_copies_on_one_thread(
        tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Files too large for the small-file path: each is hashed on the thread that copies
    # it. In the foreground they spread over the cores; in the background one thread
    # copies them all, so the train loop hands the GIL to one copy thread, not several.
    from cairn._src.storage import transfer
    from cairn._src.storage.checksum import new_hasher

    src = os.path.join(str(tmp_path), "src")
    os.makedirs(src)
    contents = {f"shard_{i}.bin": os.urandom((1 << 20) + i) for i in range(4)}
    for name, data in contents.items():
        with open(os.path.join(src, name), "wb") as f:
            f.write(data)
    copiers: dict[bool, set[int]] = {False: set(), True: set()}
    background = False
    started = threading.Barrier(2, timeout=5)

    def recording_hasher() -> Any:
        copiers[background].add(threading.get_ident())
        if not background:
            # Two files at once prove the foreground runs threads side by side.
            try:
                started.wait()
            except threading.BrokenBarrierError:
                pass
        return new_hasher()

    monkeypatch.setattr(transfer, "new_hasher", recording_hasher)
    entries = {}
    for background in (False, True):
        dest = os.path.join(str(tmp_path), f"dest-{background}")
        entries[background] = upload_directory(src, resolve(dest), background=background,
                                               max_workers=None if background else 2)
        assert read_tree(dest) == contents
    assert entries[True] == entries[False]
    assert len(copiers[False]) == 2
    assert len(copiers[True]) == 1


def test_the_small_file_path_is_called_from_one_place() -> None:
    # One seam: only storage/transfer.py imports the small-file path, and there only
    # _small_first calls it; every transfer goes through that function.
    import ast
    from pathlib import Path

    import cairn

    package = Path(cairn.__file__).parent
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and (
                    node.module.endswith("storage.batch") or (
                        node.module.endswith("storage")
                        and any(alias.name == "batch" for alias in node.names))):
                importers.add(path.relative_to(package).as_posix())
    assert importers == {"_src/storage/transfer.py"}
    tree = ast.parse((package / "_src" / "storage" / "transfer.py").read_text())
    callers = {function.name for function in ast.walk(tree)
               if isinstance(function, ast.FunctionDef)
               for node in ast.walk(function)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and isinstance(node.func.value, ast.Name) and node.func.value.id == "batch"
               and node.func.attr == "run"}
    assert callers == {"_small_first"}
    offering = {function.name for function in ast.walk(tree)
                if isinstance(function, ast.FunctionDef)
                for node in ast.walk(function)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "_small_first"}
    assert offering == {"upload_directory", "_download_into", "compute_entries",
                        "check_directory_sizes", "verify_directory"}
