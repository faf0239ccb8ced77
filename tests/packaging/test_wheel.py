"""The distribution ``cairn-train`` builds into a wheel that installs in a clean virtual
environment with only its core dependencies: ``import cairn`` works, the ``cairn``
command runs, and the optional parts say which extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "cairn-train"


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, check=False,
                          timeout=900, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def clean_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site-packages) with the built wheel and its dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work / "dist"),
         str(ROOT)])
    wheels = sorted((work / "dist").glob("cairn_train-*.whl"))
    assert len(wheels) == 1, sorted(p.name for p in (work / "dist").iterdir())
    env_dir = work / "env"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", str(wheels[0])])
    return env_dir


def in_clean_env(env_dir: Path, code: str) -> subprocess.CompletedProcess[str]:
    # Run outside the repository, so that the checkout's `cairn` is not importable.
    return subprocess.run([str(env_dir / "bin" / "python"), "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, check=False, timeout=300,
                          cwd=env_dir, env={**os.environ, "PYTHONPATH": ""})


@pytest.mark.slow
def test_the_wheel_installs_and_the_command_runs(clean_env: Path) -> None:
    version = run([str(clean_env / "bin" / "cairn"), "--version"], cwd=clean_env)
    assert "0.1.0" in version.stdout
    module = run([str(clean_env / "bin" / "python"), "-m", "cairn", "--help"], cwd=clean_env)
    assert "usage: cairn" in module.stdout
    done = in_clean_env(clean_env, """
        import importlib.metadata, cairn
        print(cairn.__file__)
        print(importlib.metadata.version("cairn-train"))
    """)
    assert done.returncode == 0, done.stderr
    assert str(clean_env) in done.stdout and "0.1.0" in done.stdout


@pytest.mark.slow
def test_optional_parts_name_their_extra(clean_env: Path) -> None:
    done = in_clean_env(clean_env, "import cairn.torch")
    assert done.returncode != 0
    assert "cairn.torch needs PyTorch: pip install 'cairn-train[torch]'" in done.stderr
    done = in_clean_env(clean_env, """
        import cairn, tempfile
        run = cairn.Result(metrics={}, checkpoint=None, error=None, path=tempfile.mkdtemp())
        run.metrics_dataframe
    """)
    assert done.returncode != 0
    assert "pip install 'cairn-train[pandas]'" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("module", "needs", "extra"), [
    ("huggingface", "Hugging Face Transformers and PyTorch", "huggingface"),
    ("lightning", "Lightning and PyTorch", "lightning"),
])
def test_framework_integrations_name_their_extra(
    clean_env: Path, module: str, needs: str, extra: str,
) -> None:
    done = in_clean_env(clean_env, f"import cairn.{module}")
    assert done.returncode != 0
    assert f"cairn.{module} needs {needs}: pip install 'cairn-train[{extra}]'" in done.stderr
