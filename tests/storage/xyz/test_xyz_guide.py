"""docs/custom-storage.md runs as written.

Its fenced ``python`` blocks are executed: the store of the first block passes the storage
conformance suite, and all the blocks together, run as a script (twice: the second run is
a new driver continuing the run), train on that store by reference and by upload.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import types
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from xyz_support import StorageConformance, guide_code

from cairn.storage import unregister_scheme


@pytest.fixture(scope="module")
def guide_store_module() -> Iterator[types.ModuleType]:
    """The guide's first block (the store and its registration), run in this process."""
    module = types.ModuleType("custom_storage_guide")
    sys.modules[module.__name__] = module
    try:
        exec(compile(guide_code("", first_block_only=True), "custom-storage.md", "exec"),
             module.__dict__)
        yield module
    finally:
        unregister_scheme("blobs")
        del sys.modules[module.__name__]


class TestGuideStoreConformance(StorageConformance):
    @pytest.fixture
    def base_uri(self, guide_store_module: types.ModuleType, tmp_path: Path) -> str:
        db = urllib.parse.quote(str(tmp_path / "blobs.db"), safe="/")
        return f"blobs://bucket/{uuid.uuid4().hex[:8]}?db={db}"


def _run_guide(script: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=script.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [line for line in done.stdout.splitlines()
            if line.startswith(("latest:", "kept:", "best:", "files:", "uploaded:"))]


def test_the_guides_code_trains_on_its_store_and_a_new_driver_continues(
    tmp_path: Path,
) -> None:
    script = tmp_path / "guide.py"
    script.write_text(guide_code(str(tmp_path)))
    db = tmp_path / "blobs.db"

    def uri(key: str) -> str:
        return f"blobs://{key}?db={db}"

    first = _run_guide(script)
    assert first == [
        f"latest: {uri('ckpts/run-1/step_0004')}",
        f"kept: {[uri('ckpts/run-1/step_0003'), uri('ckpts/run-1/step_0004')]}",
        f"best: {uri('ckpts/run-1/step_0004')}",
        "files: ['rank_0.json', 'rank_1.json']",
        f"uploaded: {uri('runs/uploaded/checkpoint_000003')}",
    ]
    with sqlite3.connect(db) as raw:
        keys = [key for (key,) in raw.execute("SELECT key FROM o ORDER BY key")]
    # Retention forgot the older references; the user's checkpoints stay in the store.
    assert sorted({k.split("/")[2] for k in keys if k.startswith("ckpts/run-1/")}) == [
        f"step_{step:04d}" for step in range(5)]
    # The uploaded run lives in the store; retention deleted its older checkpoints there.
    uploaded = {k.split("/")[2] for k in keys if k.startswith("runs/uploaded/")}
    assert {n for n in uploaded if n.startswith("checkpoint_")} == {"checkpoint_000003"}
    assert "cairn_run.json" in uploaded

    # A new driver process: it registers the scheme again, resumes run-1 from the manifest's
    # blobs:// URI (every rank starts after step 4: nothing left to train) and continues the
    # uploaded run's report numbering.
    second = _run_guide(script)
    assert second[:4] == first[:4]
    assert second[4] == f"uploaded: {uri('runs/uploaded/checkpoint_000006')}"
