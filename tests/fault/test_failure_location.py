"""A failed rank's traceback names the user's file and line, and the run's event log keeps
the failing frame that ``cairn show`` prints: for a train function in a module, in the
``__main__`` of a driver script, and in ``exec``'d code (as in a notebook). Real runs of
the local backend."""

from __future__ import annotations

import inspect
import json
import linecache
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import location_workloads
import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.cli.main import main as cli_main
from cairn._src.wire.code_locations import failing_frame, read_frame


def _line_of(function: Callable[..., Any], text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _show(run_dir: str, capsys: pytest.CaptureFixture[str], *json_flag: str) -> str:
    capsys.readouterr()
    assert cli_main(["show", run_dir, *json_flag]) == 0
    return capsys.readouterr().out


def _fit(function: Callable[..., Any], run_config: Callable[..., cairn.RunConfig],
         workers: int = 1) -> str:
    with pytest.raises(TrainingFailedError) as caught:
        Trainer(function, scaling_config=ScalingConfig(num_workers=workers),
                run_config=run_config(progress=0,
                                      failure_config=FailureConfig(max_failures=0))).fit()
    return str(caught.value)


def test_a_function_in_a_module(run_config: Callable[..., cairn.RunConfig], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    line = _line_of(location_workloads._helper, "raise ValueError")
    text = _fit(location_workloads.fails_in_a_helper, run_config, workers=2)
    path = location_workloads.__file__
    assert f'File "{path}", line {line}, in _helper' in text, text
    assert "<dynamic-code>" not in text
    doc = json.loads(_show(str(tmp_path / "storage" / "run"), capsys, "--json"))
    errors = doc["failures"][0]["errors"]
    # Both ranks raise; the one whose error arrives first fails the attempt, and the other
    # may be stopped before its own error is sent (on a loaded machine, either order).
    assert errors and {e["ranks"][0] for e in errors} <= {0, 1}
    for error in errors:
        assert error["frame"] == {"file": path, "line": line, "function": "_helper"}
    human = _show(str(tmp_path / "storage" / "run"), capsys)
    assert f"failed at {path}:{line}, in _helper" in human or (
        f"(at {path}:{line}, in _helper)" in human), human


def test_exec_code_keeps_its_line_numbers_and_a_registered_source(
        run_config: Callable[..., cairn.RunConfig], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    source = textwrap.dedent("""\
        import cairn

        def train_func():
            cairn.report({"step": 0})
            x = 1
            raise KeyError("exec'd code failed")
        """)
    namespace: dict[str, Any] = {}
    exec(compile(source, "<string>", "exec"), namespace)
    text = _fit(namespace["train_func"], run_config)
    # Python's own name for code without a file, and the line in it.
    assert 'File "<string>", line 6, in train_func' in text, text
    doc = json.loads(_show(str(tmp_path / "storage" / "run"), capsys, "--json"))
    assert doc["failures"][0]["errors"][0]["frame"] == {
        "file": "<string>", "line": 6, "function": "train_func"}

    # A cell whose source the driver's linecache holds (as IPython registers its cells):
    # the worker's traceback shows the line's text too.
    cell = "<ipython-input-7-cafe>"
    namespace = {}
    exec(compile(source, cell, "exec"), namespace)
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)
    try:
        text = _fit(namespace["train_func"], lambda **o: run_config(name="cell", **o))
    finally:
        del linecache.cache[cell]
    assert f'File "{cell}", line 6, in train_func\n    raise KeyError' in text, text


DRIVER = '''\
import sys

import cairn


def train_func():
    cairn.report({{"step": 0}})
    raise RuntimeError("failed in the driver's script")


if __name__ == "__main__":
    try:
        cairn.Trainer(train_func, run_config=cairn.RunConfig(
            name="run", storage_path={storage!r}, progress=0)).fit()
    except cairn.TrainingFailedError as exc:
        print(exc)
        sys.exit(3)
'''


def test_a_function_in_the_main_script(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train_script.py"
    script.write_text(DRIVER.format(storage=str(tmp_path / "storage")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert f'File "{script}", line 8, in train_func' in done.stdout, done.stdout
    assert 'raise RuntimeError("failed in the driver\'s script")' in done.stdout
    assert "<dynamic-code>" not in done.stdout
    doc = json.loads(_show(str(tmp_path / "storage" / "run"), capsys, "--json"))
    assert doc["failures"][0]["errors"][0]["frame"] == {
        "file": str(script), "line": 8, "function": "train_func"}
    assert f"{script}:8, in train_func" in _show(str(tmp_path / "storage" / "run"), capsys)


# --- pure parts ---------------------------------------------------------------------------


def _raise_through(function: Callable[[], None]) -> BaseException:
    try:
        function()
    except Exception as exc:
        return exc
    raise AssertionError("did not raise")


def test_the_failing_frame_is_the_innermost_in_user_code() -> None:
    def user_code() -> None:
        json.loads("{not json")  # raises inside the standard library

    frame = failing_frame(_raise_through(user_code))
    assert frame == {"file": __file__, "line": _line_of(user_code, "json.loads("),
                     "function": "user_code"}


def test_the_failing_frame_without_a_traceback() -> None:
    assert failing_frame(ValueError("never raised")) is None


@pytest.mark.parametrize("value", [
    None, "x", 3, [], {"file": 1, "line": 2, "function": "f"},
    {"file": "f.py", "line": True, "function": "f"}, {"file": "f.py", "line": -1,
                                                      "function": "f"},
    {"file": "f.py", "line": "7", "function": "f"}, {"file": "f.py", "line": 7},
])
def test_a_frame_read_back_from_storage_is_checked(value: object) -> None:
    assert read_frame(value) is None


def test_a_frame_read_back_is_bounded() -> None:
    frame = read_frame({"file": "x" * 5000, "line": 7, "function": "f" * 5000})
    assert frame is not None and len(frame["file"]) == 1000 and len(frame["function"]) == 1000
