"""``Result.from_path`` opens a run whose checkpoints are references on a scheme the
training script registered in code, in a process that did not register it: the run reads,
and a checkpoint resolves its URI when first used (the error then names the scheme)."""

from __future__ import annotations

import os

from driver_process import finish, start_script

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "registered_scheme_driver.py")


def test_a_run_on_an_unregistered_scheme_opens_and_its_checkpoints_resolve_when_used(
    tmp_path: str,
) -> None:
    storage = os.path.join(str(tmp_path), "runs")
    store = os.path.join(str(tmp_path), "store")
    trained = finish(start_script(SCRIPT, "train", storage, store))
    assert trained["checkpoint"] == "refstore://ck2"

    read = finish(start_script(SCRIPT, "read", os.path.join(storage, "run"), store))
    assert read["metrics"] == {"epoch": 2}
    assert read["history"] == 3
    assert read["goodput_attempts"] == 1
    assert read["best"] == ["refstore://ck0", "refstore://ck1", "refstore://ck2"]
    assert "checkpoint=Checkpoint(uri='refstore://ck2')" in str(read["repr"])
    unresolved = str(read["unresolved"])
    assert "refstore://ck2" in unresolved and "unknown scheme 'refstore'" in unresolved
    assert "register_scheme" in unresolved
    assert read["data_after_registering"] == "epoch 2"
