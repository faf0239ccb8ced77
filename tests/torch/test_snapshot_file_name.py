"""``report_snapshot(file_name=...)`` refuses the names of Cairn's own files in a
checkpoint directory at the call, before anything is copied or reported."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cairn import ReportError
from cairn._src.torch.snapshot import _state_dict_files, report_snapshot
from cairn._src.worker import session as session_module


class RankZero:
    def get_world_rank(self) -> int:
        return 0


@pytest.mark.parametrize("name", ["_cairn_manifest.json", "_CAIRN_Manifest.JSON",
                                  ".metadata.json", "state.pt.cairn-tmp-0123abcd",
                                  ".CAIRN-TMP-state.pt"])
@pytest.mark.parametrize("per_rank", [False, True])
def test_a_reserved_file_name_is_refused_at_the_call(
        name: str, per_rank: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # A session that can do nothing else: the call must stop before it needs one.
    monkeypatch.setattr(session_module, "_session", SimpleNamespace(context=RankZero()))
    with pytest.raises(ReportError) as raised:
        report_snapshot({"step": 1}, {"w": torch.ones(3)}, file_name=name, per_rank=per_rank)
    message = str(raised.value)
    assert message.startswith(f"report_snapshot(file_name={name!r}) names one of Cairn's own "
                              "files in a checkpoint directory")
    for accepted in ("such as 'state.pt'", "'_cairn_manifest.json', the manifest",
                     "'.metadata.json', the checkpoint's metadata",
                     "any name containing '.cairn-tmp-', in any letter case"):
        assert accepted in message


def test_other_file_names_are_accepted() -> None:
    state = {"w": torch.ones(3)}
    for name in ("state.pt", "manifest.json", "metadata.json", "_cairn_manifest.json.pt"):
        assert _state_dict_files(state, name, False, 0) == {name: state}
        assert _state_dict_files(state, name, True, 2) == {f"rank_2/{name}": state}
