"""Characters a run name may hold, and storage paths with ``.``/``..`` on remote storage.

``RunConfig.name`` names the run's directory, and ``cairn ls`` prints it: whitespace-only
names showed blank, and control characters went to the terminal raw (as
``checkpoint_dir_name`` already refuses). On a custom scheme or an fsspec protocol a name
with ``?`` or ``#`` gave URIs of another run. An S3 ``storage_path`` with a ``..``
component had every ``fit()`` write over the run's metrics history and event log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import cairn
from cairn import ConfigError, RunConfig, ScalingConfig, Trainer

RULE = (r"; use printable characters \(no U\+0000-U\+001F, U\+007F-U\+009F\), at least one of "
        r"them not whitespace\.$")


@pytest.mark.parametrize("name", [" ", "   ", "\u3000", "\u00a0 "])
def test_a_whitespace_only_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^RunConfig\.name={re.escape(repr(name))} is only "
                                          r"whitespace, which `cairn ls` shows as a blank name"
                                          + RULE):
        RunConfig(name=name)


@pytest.mark.parametrize(("name", "shown"), [
    ("a\nb", r"'\n'"), ("x\x1b[31mRED", r"'\x1b'"), ("\t", r"'\t'"), ("a\rb", r"'\r'"),
    ("a\x7f", r"'\x7f'"), ("a\x85b", r"'\x85'"), ("run\n", r"'\n'"),
])
def test_a_control_character_in_the_name_is_refused(name: str, shown: str) -> None:
    with pytest.raises(ConfigError, match=rf"^RunConfig\.name={re.escape(repr(name))} holds "
                                          rf"the control character {re.escape(shown)}" + RULE):
        RunConfig(name=name)


def test_a_refused_name_leaves_no_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="control character"):
        Trainer(lambda: cairn.report({"x": 1}), scaling_config=ScalingConfig(num_workers=0),
                run_config=RunConfig(name="a\nb", storage_path=str(tmp_path))).fit()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", ["exp 1", "a#b", "a?b", "ünïcødé", "a\u00a0b", " lead"])
def test_printable_names_are_accepted_on_a_local_disk(name: str, tmp_path: Path) -> None:
    assert RunConfig(name=name, storage_path=str(tmp_path)).name == name


@pytest.mark.parametrize("storage", ["xyz://bucket/runs?db=/tmp/x.db", "memory://runs",
                                     "dictstore://bucket/runs", "az://container/runs",
                                     "local:///tmp/runs"])
@pytest.mark.parametrize(("name", "held"), [("a#b", "#"), ("a?b", "?"), ("a#b?c", "#")])
def test_a_name_no_uri_of_the_storage_carries_is_refused(
        storage: str, name: str, held: str) -> None:
    scheme = storage.partition(":")[0]
    with pytest.raises(ConfigError, match=(
            rf"^RunConfig\.name='{re.escape(name)}' holds '{re.escape(held)}', which ends the "
            rf"path of a {scheme}:// URI \(Cairn does not percent-encode paths of registered "
            r"schemes and fsspec protocols\): Result\.uri and Checkpoint\.uri would name "
            rf"another run\. Accepted with {scheme}:// storage: a name without '\?' and '#'\.$")):
        RunConfig(name=name, storage_path=storage)


@pytest.mark.parametrize("storage", ["s3://bucket/runs", "gs://bucket/runs", "/tmp/runs",
                                     "file:///tmp/runs"])
def test_a_name_with_a_hash_is_accepted_where_uris_are_percent_encoded(storage: str) -> None:
    assert RunConfig(name="a#b?c", storage_path=storage).name == "a#b?c"


def test_a_name_with_a_hash_is_accepted_with_a_storage_filesystem() -> None:
    # The run has no URI then: nothing names another run.
    config = RunConfig(name="a#b", storage_path="xyz://bucket/runs",
                       storage_filesystem=lambda: None)
    assert config.name == "a#b"


DOTS = (r" has the path component '{}': remote storage does not resolve it as a local disk "
        r"does, and each fit\(\) could write over the run's metrics history and event log\. "
        r"Accepted: a URI without '\.' and '\.\.' components, such as "
        r"'s3://bucket/team/runs'\.$")


@pytest.mark.parametrize(("storage", "component"), [
    ("s3://bucket/team/../runs", ".."), ("s3://bucket/./runs", "."),
    ("s3://bucket/runs/..?region=us-east-1", ".."), ("gs://bucket/a/./b", "."),
    ("xyz://bucket/../runs?db=/tmp/x.db", ".."), ("hdfs://host/a/../b", ".."),
])
def test_a_dot_component_in_a_remote_storage_path_is_refused(
        storage: str, component: str) -> None:
    with pytest.raises(ConfigError, match=rf"^RunConfig\.storage_path='{re.escape(storage)}'"
                                          + DOTS.format(re.escape(component))):
        RunConfig(name="exp", storage_path=storage)


def test_the_refusal_shows_no_credentials() -> None:
    storage = "s3://bucket/a/../b?access_key=AKIA&secret_key=hunter2&region=us-east-1"
    with pytest.raises(ConfigError) as raised:
        RunConfig(storage_path=storage)
    assert "hunter2" not in str(raised.value)
    assert "storage_path='s3://bucket/a/../b?region=us-east-1' has the path component '..'" \
        in str(raised.value)


@pytest.mark.parametrize("storage", ["/tmp/team/../runs", "file:///tmp/./runs", "./runs",
                                     "../runs", "local:///tmp/a/../runs",
                                     "s3://bucket/..runs/a.b/...", "s3://b/.x/"])
def test_dots_on_a_local_disk_and_in_names_are_accepted(storage: str) -> None:
    assert RunConfig(storage_path=storage).storage_path == storage

