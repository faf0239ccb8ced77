"""A URI mistyped with one slash or none after its colon (``s3:/KEY:SECRET@bucket``), or
without the colon (``s3//KEY:SECRET@bucket``), is a near-URI: it resolves nowhere, but
every message that quotes it masks its user info as a URI's, on each route that takes a
location (``resolve``, ``Result.from_path``, ``RunConfig.storage_path``). A user info
without a password is a token given as the user name: it is masked whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cairn
from cairn._src.errors import ConfigError
from cairn._src.storage.location import resolve
from cairn._src.storage.uris import public_uri, redact, redact_text, scrub

SECRET = "SUPERSECRET"

# (typed, shown with its user info masked, the URI meant, without credentials)
NEAR_URIS = [
    (f"s3:/AKIA:{SECRET}@bucket/runs", "s3:/AKIA:***@bucket/runs", "s3://bucket/runs"),
    (f"s3:AKIA:{SECRET}@bucket/runs", "s3:AKIA:***@bucket/runs", "s3://bucket/runs"),
    (f"S3:/AKIA:{SECRET}@bucket/runs", "S3:/AKIA:***@bucket/runs", "S3://bucket/runs"),
    (f"gs:/user:{SECRET}@bucket/runs", "gs:/user:***@bucket/runs", "gs://bucket/runs"),
    (f"s3//KEY:{SECRET}@bucket/runs", "s3//KEY:***@bucket/runs", "s3://bucket/runs"),
    (f"s3:/AKIA:{SECRET}/with/slashes@bucket/runs", "s3:/AKIA:***@bucket/runs",
     "s3://bucket/runs"),
    (f"s3:/{SECRET}@bucket/runs", "s3:/***@bucket/runs", "s3://***@bucket/runs"),  # a token
]


def _train() -> None:
    cairn.report({"x": 1})


@pytest.mark.parametrize(("typed", "shown", "meant"), NEAR_URIS)
def test_a_near_uri_is_masked_by_redact_public_uri_and_redact_text(
        typed: str, shown: str, meant: str) -> None:
    assert redact(typed) == shown
    assert SECRET not in public_uri(typed)
    assert redact_text(f"location='{typed}' is bad; see {typed}.") == (
        f"location='{shown}' is bad; see {shown}.")
    assert SECRET not in scrub(f"cannot parse {SECRET}", typed)


@pytest.mark.parametrize(("typed", "shown", "meant"), NEAR_URIS)
def test_resolve_refuses_a_near_uri_without_quoting_its_credentials(
        typed: str, shown: str, meant: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        resolve(typed)
    message = str(raised.value)
    assert SECRET not in message
    assert message.startswith(f"location={shown!r} is not a valid URI: a scheme is followed "
                              f"by '://'; did you mean {meant!r}?")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("typed", "shown", "meant"), NEAR_URIS)
def test_result_from_path_refuses_a_near_uri_without_quoting_its_credentials(
        typed: str, shown: str, meant: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as raised:
        cairn.Result.from_path(f"{typed}/my_run")
    assert SECRET not in str(raised.value)
    assert f"{shown}/my_run" in str(raised.value)


@pytest.mark.parametrize(("typed", "shown", "meant"), NEAR_URIS)
def test_a_near_uri_storage_path_is_refused_without_quoting_its_credentials(
        typed: str, shown: str, meant: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = cairn.RunConfig(name="r", storage_path=typed)
    assert SECRET not in repr(config)
    with pytest.raises(ConfigError) as raised:
        cairn.Trainer(_train, run_config=config)
    assert SECRET not in str(raised.value)
    assert str(raised.value).startswith(f"RunConfig.storage_path={shown!r} is not a valid URI")
    assert os.listdir(tmp_path) == []


def test_a_token_given_as_the_user_name_is_masked_whole() -> None:
    uri = f"https://ghp_{SECRET}@example.com/runs/r"
    assert redact(uri) == "https://***@example.com/runs/r"
    assert redact_text(f"{uri} is not a run") == "https://***@example.com/runs/r is not a run"
    assert SECRET not in scrub(f"401: bad credentials ghp_{SECRET}", uri)
    # A password's user stays shown, as before.
    assert redact(f"s3://AKIA:{SECRET}@bucket/x") == "s3://AKIA:***@bucket/x"


@pytest.mark.parametrize("text", [
    "/tmp/runs/alice@example.com",
    "runs/alice@example.com",
    "alice@example.com",
    "./team:alice@example.com",
    "/tmp/runs/team:alice@example.com/checkpoint_000001",
    "s3://bucket/runs/alice@example.com",
    "s3:/bucket/runs/alice@example.com",
    "run 'alice@example.com' finished: 3 checkpoints under /data/x:y@z",
    "notes:2024/x",
    "a password in its user info ('user:password@')",
])
def test_local_paths_and_email_like_run_names_are_not_mangled(text: str) -> None:
    assert redact_text(text) == text
    assert redact(text) == text
    assert public_uri(text) == text


def test_a_local_directory_named_like_a_scheme_is_reached_with_dot_slash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve("./s3//bucket/runs").path == str(tmp_path / "s3" / "bucket" / "runs")
    assert resolve("runs//today").path == str(tmp_path / "runs" / "today")


def test_long_words_without_a_uri_pass_through_the_text_filter_whole() -> None:
    # A worker's traceback goes through redact_text whole; words that cannot hold a URI
    # are not searched (the search of '=a:' * 100000 took minutes: it is quadratic).
    for text in ("lr:0.1,bs:32," * 20000, "=a:" * 100000, "a" * 100000):
        assert redact_text(f"{text} s3:/KEY:SECRET@bucket/x") == (
            f"{text} s3:/KEY:***@bucket/x")
