"""docs/ray-compat.md gives every public name of Ray Train v2 a verdict, and lists every
ported Ray Train test that does not pass.

The names are enumerated from the installed Ray Train (skipped where Ray is not installed):
``ray.train``, ``ray.train.collective``, ``ray.train.torch``,
``ray.train.huggingface.transformers`` and ``ray.train.lightning`` (``__all__``; the last
two where their framework is installed), Ray's
``DataParallelTrainer``, and for each class its constructor arguments, enum members and
public methods and properties; for each function its arguments. Each needs a table row
``| `name` | *same* / *stricter* / *not supported* | ... |`` in the document.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "ray-compat.md"
VERDICTS = ("same", "stricter", "not supported")
ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| \*(?P<verdict>[^*]+)\* \|(?P<note>.*)\|$")


def doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            rows[match["key"]] = (match["verdict"], match["note"].strip())
    return rows


def _parameters(obj: Any) -> list[str]:
    try:
        names = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return []
    return [name for name in names if name not in ("self", "args", "kwargs")
            and not name.startswith("_")]


def _methods(cls: type, own_only: bool = False) -> list[tuple[str, bool]]:
    if issubclass(cls, enum.Enum):
        return []
    found = []
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") or (own_only and name not in vars(cls)):
            continue
        if issubclass(cls, BaseException) and name in ("add_note", "with_traceback", "args"):
            continue
        static = inspect.getattr_static(cls, name, None)
        if inspect.isfunction(value) or inspect.ismethod(value) or isinstance(
                static, (property, classmethod, staticmethod)):
            found.append((name, callable(value)))
    return found


def ray_train_names() -> list[str]:
    """Every Ray Train v2 name the document must have a row for."""
    ray_train = pytest.importorskip("ray.train")
    import ray.train.collective
    import ray.train.torch
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    modules: list[tuple[types.ModuleType, str]] = [
        (ray_train, ""), (ray.train.collective, "collective."), (ray.train.torch, "torch.")]
    for name, prefix in (("ray.train.huggingface.transformers", "huggingface.transformers."),
                         ("ray.train.lightning", "lightning.")):
        try:  # needs the framework installed (the huggingface and lightning extras)
            modules.append((importlib.import_module(name), prefix))
        except ImportError:
            pass
    keys = []
    for module, prefix in modules:
        # A framework class's inherited methods are the framework's (Lightning's Strategy,
        # Transformers' TrainerCallback): only what Ray's class defines itself gets a row.
        own_only = prefix.startswith(("huggingface.", "lightning."))
        names = [name for name in module.__all__
                 if not isinstance(getattr(module, name), types.ModuleType)]
        objects = [(name, getattr(module, name)) for name in names]
        if prefix == "":
            objects.append(("DataParallelTrainer", DataParallelTrainer))
        for name, obj in objects:
            qualified = prefix + name
            if inspect.isclass(obj):
                keys.append(qualified)
                if issubclass(obj, enum.Enum):
                    keys += [f"{qualified}.{member}" for member in obj.__members__]
                    continue
                keys += [f"{qualified}.{parameter}" for parameter in _parameters(obj)]
                keys += [f"{qualified}.{method}()" if is_callable else f"{qualified}.{method}"
                         for method, is_callable in _methods(obj, own_only)]
            elif callable(obj):
                keys.append(f"{qualified}()")
                keys += [f"{qualified}({parameter}=)" for parameter in _parameters(obj)]
            else:
                keys.append(qualified)
    return keys


def test_every_ray_train_name_has_a_verdict() -> None:
    rows = doc_rows()
    missing = [key for key in ray_train_names() if key not in rows]
    assert not missing, f"docs/ray-compat.md has no row for: {missing}"


def test_every_row_has_a_verdict_and_a_reason_where_it_differs() -> None:
    rows = doc_rows()
    assert len(rows) > 200
    for key, (verdict, note) in rows.items():
        assert verdict in VERDICTS, (key, verdict)
        if verdict != "same":
            assert note, f"{key} is *{verdict}* without saying what the user meets"


def test_every_ported_test_that_does_not_pass_is_listed() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "compat"))
    try:
        from ray_suite import port_status
    finally:
        sys.path.remove(str(ROOT / "tests" / "compat"))
    section = DOC.read_text().split("## Ported Ray Train tests that do not pass", 1)[1]
    for table in (port_status.SKIP, port_status.STRICT_XFAIL, port_status.XFAIL):
        for key, reason in table.items():
            assert f"`{key}`" in section, key
            assert reason.replace("|", "\\|") in section, key


def test_the_verdict_counts_are_the_table_s() -> None:
    rows = doc_rows()
    counts = {verdict: sum(1 for v, _ in rows.values() if v == verdict) for verdict in VERDICTS}
    line = (f"Verdicts today: {len(rows)} names: {counts['same']} *same*, "
            f"{counts['stricter']} *stricter*, {counts['not supported']} *not supported*.")
    assert line in DOC.read_text()


def test_every_name_marked_same_is_cairn_s_with_ray_s_value_for_a_constant() -> None:
    """A top-level name marked *same* exists in ``cairn`` (under the name its row gives); a constant
    (a str, int or float in Ray) has Ray's value, so scripts that pass it keep working."""
    ray_train = pytest.importorskip("ray.train")
    import cairn

    wrong = []
    for key, (verdict, note) in doc_rows().items():
        if verdict != "same" or not re.fullmatch(r"[A-Za-z_]\w*", key):
            continue
        # A row may name Cairn's own name for it (`cairn.Trainer` for DataParallelTrainer).
        renamed = re.match(r"`cairn\.(\w+)`", note)
        name = renamed.group(1) if renamed else key
        if not hasattr(cairn, name):
            wrong.append(f"{key}: cairn has no {name}")
            continue
        ours, theirs = getattr(cairn, name), getattr(ray_train, key, None)
        if isinstance(theirs, (str, int, float)) and ours != theirs:
            wrong.append(f"{key}: {ours!r}, Ray's is {theirs!r}")
    assert not wrong, wrong
