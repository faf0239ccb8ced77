"""Errors a script ported from Ray Train catches with Ray's exception types: calling
``get_context()``, ``get_checkpoint()`` or ``report()`` outside a worker is a
``RuntimeError`` (and still Cairn's ``ReportError``); metadata that JSON cannot encode is a
``TypeError`` (and still Cairn's ``ConfigError``). The messages are Cairn's.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

import cairn
from cairn import Checkpoint, ConfigError, ReportError
from cairn._src.errors import MetadataTypeError, OutsideWorkerError

OUTSIDE: dict[str, Callable[[], object]] = {
    "get_context": cairn.get_context,
    "get_checkpoint": cairn.get_checkpoint,
    "report": lambda: cairn.report({"a": 1}),
}


@pytest.mark.parametrize("name", sorted(OUTSIDE))
@pytest.mark.parametrize("caught", [RuntimeError, ReportError, ValueError])
def test_a_call_outside_a_worker_is_caught_as_ray_and_cairn_catch_it(
        name: str, caught: type[Exception]) -> None:
    try:
        OUTSIDE[name]()
    except caught as exc:  # an except clause that misses it lets it fail the test
        error: BaseException = exc
    else:
        pytest.fail(f"cairn.{name}() outside a worker did not raise")
    assert isinstance(error, OutsideWorkerError)
    assert f"cairn.{name}() was called outside a Cairn worker" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is OutsideWorkerError and str(again) == str(error)


@pytest.mark.parametrize("method", ["set_metadata", "update_metadata"])
@pytest.mark.parametrize("caught", [TypeError, ConfigError, ValueError])
def test_metadata_json_cannot_encode_is_caught_as_ray_and_cairn_catch_it(
        tmp_path: Path, method: str, caught: type[Exception]) -> None:
    checkpoint = Checkpoint.from_directory(tmp_path)
    call = getattr(checkpoint, method)
    try:
        call({"x": object()})
    except caught as exc:
        assert isinstance(exc, MetadataTypeError)
        assert "metadata must be JSON-serializable" in str(exc)
    else:
        pytest.fail(f"{method} did not raise")
    with pytest.raises(caught, match=r"metadata=\[1, 2\] must be a dict with str keys"):
        call([1, 2])
    assert checkpoint.get_metadata() == {}
