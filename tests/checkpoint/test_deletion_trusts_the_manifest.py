"""Retention deletes only what the manifest on storage agrees is Cairn's: an index edited
to call a reference's directory managed does not make the user's data in it deletable."""

from __future__ import annotations

import json
from pathlib import Path

from cairn import CheckpointConfig
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.run.layout import INDEX_NAME, default_checkpoint_dir_name
from cairn._src.storage.location import resolve
from cairn._src.storage.written import entries_of
from tests.checkpoint.test_nested_reference import manager_for, upload_fn_result


def test_an_index_that_hides_a_nested_reference_does_not_delete_its_data(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = resolve(str(run_dir))
    config = CheckpointConfig(num_to_keep=1)
    manager = manager_for(run, config)
    # A checkpoint_upload_fn wrote into build_checkpoint_path_from_name(name)/dcp.
    upload_fn_result(run_dir, 1, {})
    manager.commit(ReadyCheckpoint(
        index=1, dir_name=default_checkpoint_dir_name(1), metrics={}, entries={},
        ranks=(0,), reference=run.join(default_checkpoint_dir_name(1), "dcp"), metadata={},
        bytes_uploaded=0), attempt=0)
    # Someone with write access to the bucket edits the index: the reference's record
    # now claims a managed checkpoint (its data in its directory).
    body = json.loads((run_dir / INDEX_NAME).read_text())
    body["checkpoints"][0].update(target_path=None, target_uri=None, managed=True)
    (run_dir / INDEX_NAME).write_text(json.dumps(body))
    manager = manager_for(run, config)
    (run_dir / "checkpoint_000002").mkdir()
    (run_dir / "checkpoint_000002" / "w").write_bytes(b"w")
    entries = entries_of(run.join("checkpoint_000002"), ["w"], {}, retry=manager.retry)
    outcome = manager.commit(ReadyCheckpoint(
        index=2, dir_name="checkpoint_000002", metrics={}, entries=entries, ranks=(0,),
        reference=None, metadata={}, bytes_uploaded=1), attempt=1)
    assert [r.dir_name for r in outcome.dropped] == ["checkpoint_000001"]
    manager.delete_dropped(outcome.dropped)
    dcp = run_dir / "checkpoint_000001" / "dcp"
    assert (dcp / "__0_0.distcp").read_bytes() == b"shard 1"
    assert not (run_dir / "checkpoint_000001" / "_cairn_manifest.json").exists()
