"""Without its framework, cairn.huggingface / cairn.lightning fail to import with an
ImportError naming the extra to install, also through the lazy ``cairn.<name>`` attribute."""

from __future__ import annotations

import importlib
import sys

import pytest

import cairn

BLOCKED = {
    "huggingface": ("transformers", "transformers.trainer_utils"),
    "lightning": ("lightning", "lightning.pytorch", "lightning.pytorch.plugins.environments",
                  "pytorch_lightning", "pytorch_lightning.plugins.environments"),
}


def _without(monkeypatch: pytest.MonkeyPatch, submodule: str,
             blocked: tuple[str, ...] | None = None) -> None:
    for name in BLOCKED[submodule] if blocked is None else blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    for name in list(sys.modules):
        if name == f"cairn.{submodule}" or name.startswith("cairn._src.integrations."):
            monkeypatch.delitem(sys.modules, name)
    if submodule in vars(cairn):  # (hasattr would import it, through cairn.__getattr__)
        monkeypatch.delattr(cairn, submodule)


@pytest.mark.parametrize("submodule", ["huggingface", "lightning"])
def test_import_without_the_framework_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, submodule: str) -> None:
    _without(monkeypatch, submodule)
    hint = rf"cairn.{submodule} needs .*: pip install 'cairn-train\[{submodule}\]'"
    with pytest.raises(ImportError, match=hint):
        importlib.import_module(f"cairn.{submodule}")
    with pytest.raises(ImportError, match=hint):
        getattr(cairn, submodule)


def test_lightning_falls_back_on_the_standalone_distribution(
        monkeypatch: pytest.MonkeyPatch) -> None:
    standalone = pytest.importorskip("pytorch_lightning")
    _without(monkeypatch, "lightning", blocked=tuple(
        name for name in BLOCKED["lightning"] if name.startswith("lightning")))
    module = importlib.import_module("cairn.lightning")
    assert issubclass(module.RayDDPStrategy, standalone.strategies.DDPStrategy)
    assert issubclass(module.RayTrainReportCallback, standalone.Callback)
