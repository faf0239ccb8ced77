"""docs/storage.md's custom-store example runs as written, and the store it registers
holds Cairn's files."""

from __future__ import annotations

import re
from pathlib import Path

from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import resolve
from cairn._src.storage.registry import unregister_scheme
from cairn._src.storage.retry import RetryPolicy

DOC = Path(__file__).resolve().parents[2] / "docs" / "storage.md"


def custom_store_code() -> str:
    text = DOC.read_text()
    section = text[text.index("## Custom stores"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/storage.md's custom store section has no python block"
    return match.group(1)


def test_the_custom_store_example_is_complete_code_that_stores_files() -> None:
    namespace: dict[str, object] = {}
    exec(compile(custom_store_code(), str(DOC), "exec"), namespace)
    try:
        check_store(namespace)
    finally:
        unregister_scheme("kv")


def check_store(namespace: dict[str, object]) -> None:
    location = resolve("kv://bucket/run")
    retry = RetryPolicy()
    write_bytes_atomic(location.join("hello.txt"), b"hi", retry)
    assert read_bytes(location.join("hello.txt"), retry) == b"hi"
    client = namespace["client"]
    assert any(key.endswith("hello.txt") for key in client.objects)  # type: ignore[attr-defined]
