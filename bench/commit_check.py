"""Cost of the listing that checks a checkpoint is stored before its manifest commits.

python bench/commit_check.py [--s3 HOST:PORT]

For 1, 100 and 1,000 files of 1 KiB: the median time of the check (one recursive listing
compared with the sizes written) and of the rest of a commit (writing the manifest), on
local storage, a custom ObjectStore over a dict, and S3 when an endpoint is given.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import uuid

from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.checkpoint.recheck import check_stored
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.fileio import write_bytes_atomic
from cairn._src.storage.location import StorageLocation, resolve
from cairn.storage import ObjectInfo, register_scheme

RETRY = __import__("cairn").RetryPolicy()


class DictStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def open_read(self, key: str) -> io.BytesIO:
        return io.BytesIO(self.objects[key])

    def write(self, key: str, stream: io.BytesIO) -> None:
        self.objects[key] = stream.read()

    def list(self, prefix: str) -> list[ObjectInfo]:
        return [ObjectInfo(k, len(v)) for k, v in sorted(self.objects.items())
                if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def stat(self, key: str) -> ObjectInfo | None:
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(key, len(data))


STORE = DictStore()


def measure(base: StorageLocation, files: int, repeat: int) -> tuple[float, float]:
    checks, commits = [], []
    for _ in range(repeat):
        directory = base.join(f"ckpt-{uuid.uuid4().hex[:8]}")
        entries = {}
        for i in range(files):
            write_bytes_atomic(directory.join(f"f{i}.bin"), b"x" * 1024, RETRY)
            entries[f"f{i}.bin"] = FileEntry(size=1024, checksum="0" * 32)
        started = time.perf_counter()
        check_stored(directory, entries, RETRY)
        checks.append(time.perf_counter() - started)
        started = time.perf_counter()
        write_manifest(directory, Manifest(files=entries, report_index=1), RETRY)
        commits.append(time.perf_counter() - started)
    return statistics.median(checks), statistics.median(commits)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--s3", help="host:port of an S3-protocol server with bucket cairn-test")
    args = parser.parse_args()
    register_scheme("benchdict", lambda uri: STORE, overwrite=True)
    import tempfile
    stores = {"local": resolve(tempfile.mkdtemp()),
              "custom (dict)": resolve(f"benchdict://b/{uuid.uuid4().hex[:8]}")}
    if args.s3:
        stores["s3 (moto)"] = resolve(
            f"s3://cairn-test/bench-{uuid.uuid4().hex[:8]}?endpoint_override={args.s3}"
            "&scheme=http&region=us-east-1")
    print("| store | files | check (ms) | manifest write (ms) | check / manifest write |")
    print("|---|---:|---:|---:|---:|")
    for name, base in stores.items():
        for files in (1, 100, 1000):
            check, commit = measure(base, files, 5 if files < 1000 else 3)
            print(f"| {name} | {files} | {check * 1e3:.2f} | {commit * 1e3:.2f} | "
                  f"{check / commit:.2f}x |")


if __name__ == "__main__":
    main()
