"""Credentials never reach storage or logs (issue 10 item 5).

``storage_path`` may carry them (they stay in memory); everything Cairn writes, logs or
shows uses a credential-free form, and a URI Cairn must persist with credentials in it is
refused at ``report()``. A real run on the moto S3 server, credentials in the URI.
"""

from __future__ import annotations

import logging
import os
import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn._src.checkpoint.references import check_persisted_uri
from cairn._src.errors import ReportError
from cairn._src.storage.location import resolve
from cairn._src.storage.uris import credentials_in, public_uri

SECRET = "SeCrEtVaLuE42xyz"
KEY_ID = "AKIDCAIRNTEST"


def _with_credentials(uri: str) -> str:
    return uri.replace("s3://", f"s3://{KEY_ID}:{SECRET}@", 1)


def _train(config: dict[str, Any]) -> None:
    storage = cairn.get_context().get_storage()
    for step in range(3):
        directory = os.path.join(config["scratch"], f"{cairn.get_context().get_world_rank()}_"
                                 f"{step}")
        os.makedirs(directory)
        with open(os.path.join(directory, f"r{cairn.get_context().get_world_rank()}.bin"),
                  "wb") as f:
            f.write(b"data %d" % step)
        checkpoint = Checkpoint.from_directory(directory)
        checkpoint.set_metadata({"step": step})
        mode = CheckpointUploadMode.ASYNC if step == 1 else CheckpointUploadMode.SYNC
        cairn.report({"step": step}, checkpoint, checkpoint_upload_mode=mode)
    # A reference on the run's filesystem, given as a path on it: no URI, nothing to leak.
    name = "by_reference"
    fs = storage.storage_filesystem
    target = storage.build_checkpoint_path_from_name(name)
    with fs.open_output_stream(f"{target}/ref.bin") as out:
        out.write(b"reference")
    cairn.report({"step": 3}, Checkpoint(target, filesystem=fs), checkpoint_dir_name=name,
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD).wait()
    print("worker sees", storage.run.display(), repr(storage.run))


def test_a_run_with_credentials_in_storage_path_writes_and_logs_none(
    s3_uri_factory: Callable[[str], str], s3_endpoint: str, scratch: str,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:
    base = s3_uri_factory("secrets")
    storage = _with_credentials(base)
    with caplog.at_level(logging.DEBUG, logger="cairn"):
        result = cairn.Trainer(
            _train, train_loop_config={"scratch": scratch},
            scaling_config=cairn.ScalingConfig(num_workers=2),
            run_config=cairn.RunConfig(name="run", storage_path=storage,
                                       checkpoint_config=cairn.CheckpointConfig(num_to_keep=2)),
        ).fit()
        shown = [repr(result), str(result.path), str(result.uri), repr(result.checkpoint),
                 str(result.checkpoint), repr(result.checkpoint.location) if result.checkpoint
                 else "", result.metrics_dataframe.to_string()]
    captured = capfd.readouterr()
    assert "worker sees" in captured.out + captured.err
    texts = {"logs": caplog.text, "stdout": captured.out, "stderr": captured.err,
             "shown": "\n".join(shown)}
    s3 = boto3.client("s3", endpoint_url=f"http://{s3_endpoint}", region_name="us-east-1")
    prefix = base.split("?")[0][len("s3://cairn-test/"):]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="cairn-test", Prefix=prefix)["Contents"]]
    # Every file the run wrote: index, manifests, lease, events, metrics, data.
    assert any(k.endswith("cairn_run.json") for k in keys)
    assert any("/metrics/" in k for k in keys) and any("/events/" in k for k in keys)
    assert any(k.endswith("by_reference/_cairn_manifest.json") for k in keys)
    for key in keys:
        texts[key] = s3.get_object(Bucket="cairn-test", Key=key)["Body"].read().decode(
            "utf-8", "replace")
    for where, text in texts.items():
        assert SECRET not in text, where
        if where in keys:
            # Storage holds not even the key id (messages may show it, masked: 'ID:***@').
            assert KEY_ID not in text, where


def test_a_persisted_uri_with_credentials_is_refused_at_report(
    s3_uri_factory: Callable[[str], str], scratch: str, tmp_path: Path,
) -> None:
    reference = _with_credentials(s3_uri_factory("refs"))

    def train(config: dict[str, str]) -> None:
        cairn.report({}, Checkpoint(config["ref"]),
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)

    with pytest.raises(cairn.TrainingFailedError) as info:
        cairn.Trainer(train, train_loop_config={"ref": reference},
                      run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    message = str(info.value)
    assert ("ReportError: report(checkpoint=Checkpoint(filesystem=s3, path=cairn-test/refs-"
            in message)
    assert f"uri='s3://{KEY_ID}:***@cairn-test/refs-" in message
    assert ("the checkpoint's URI is 's3://cairn-test/refs-" in message
            and "with a password in its user info ('user:password@')" in message)
    assert ("give the credentials through the environment (for S3: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY), a credential chain" in message)
    assert "registered with cairn.storage.register_scheme() whose factory reads them" in message
    assert SECRET not in message and SECRET not in "".join(
        traceback.format_exception(info.value))


@pytest.mark.parametrize("parameter", ["secret_key", "access_key", "token", "session_token",
                                       "password", "X-Amz-Security-Token"])
def test_secret_query_parameters_are_refused_and_removed(parameter: str) -> None:
    uri = f"xyz://bucket/ckpt?db=/data/x.db&{parameter}={SECRET}"
    assert credentials_in(uri) == [f"the query parameter {parameter!r}"]
    assert public_uri(uri) == "xyz://bucket/ckpt?db=/data/x.db"
    with pytest.raises(ReportError, match=rf"the URI is 'xyz://bucket/ckpt\?db=/data/x.db' "
                                          rf"with the query parameter '{parameter}'\. Cairn "
                                          r"writes this URI to the run's storage, and "
                                          r"credentials never reach storage") as info:
        check_persisted_uri(uri, what="the URI")
    assert SECRET not in str(info.value)


def test_public_uri_removes_every_credential() -> None:
    assert public_uri(f"s3://{KEY_ID}:{SECRET}@bkt/x?region=us-east-1") == (
        "s3://bkt/x?region=us-east-1")
    assert public_uri(f"s3://bkt/x?token={SECRET}") == "s3://bkt/x"
    assert public_uri("hdfs://user@namenode:8020/x") == "hdfs://user@namenode:8020/x"
    assert public_uri("/local/path") == "/local/path"
    assert credentials_in("s3://bkt/x?region=us-east-1") == []
    check_persisted_uri("s3://bkt/x?region=us-east-1&endpoint_override=h:1", what="u")


def test_reprs_never_show_a_secret() -> None:
    uri = (f"s3://{KEY_ID}:{SECRET}@bkt/run?endpoint_override=127.0.0.1:1&scheme=http"
           "&region=us-east-1")
    location = resolve(uri)
    checkpoint = Checkpoint(uri)
    for text in (repr(location), str(location), location.display(), repr(checkpoint),
                 str(checkpoint), repr(location.join("a")), str(location.public_uri)):
        assert SECRET not in text
    assert location.public_uri == ("s3://bkt/run?endpoint_override=127.0.0.1:1&scheme=http"
                                   "&region=us-east-1")
    # The credentials stay in memory, for the process that uses them.
    assert pickle.loads(pickle.dumps(location)).uri == uri


def test_a_malformed_uri_error_is_not_chained_with_the_raw_text() -> None:
    with pytest.raises(cairn.ConfigError) as info:
        resolve(f"s3://{KEY_ID}:{SECRET}@bkt/x?unknown_option=1")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "Unexpected query parameter in S3 URI" in str(info.value)
    assert SECRET not in "".join(traceback.format_exception(info.value))


def test_an_upload_fn_returning_a_uri_with_credentials_fails_the_run(
    s3_uri_factory: Callable[[str], str], scratch: str, tmp_path: Path,
) -> None:
    target = s3_uri_factory("uploaded")

    def upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        destination = resolve(target).join(dir_name)
        with destination.filesystem.open_output_stream(f"{destination.path}/m.bin") as out:
            out.write(b"m")
        return Checkpoint(_with_credentials(destination.uri or ""))

    def train(config: dict[str, str]) -> None:
        directory = os.path.join(config["scratch"], "c")
        os.makedirs(directory)
        cairn.report({}, Checkpoint.from_directory(directory), checkpoint_upload_fn=upload)

    with pytest.raises(cairn.TrainingFailedError) as info:
        cairn.Trainer(train, train_loop_config={"scratch": scratch},
                      run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    text = "".join(traceback.format_exception(info.value))
    assert "The checkpoint_upload_fn of report 1 returned Checkpoint(filesystem=s3" in text
    assert "the checkpoint's URI is 's3://cairn-test/uploaded-" in text
    assert "with a password in its user info" in text and SECRET not in text
    for directory, _, names in os.walk(tmp_path / "r"):
        for name in names:
            assert SECRET not in (Path(directory) / name).read_text(errors="replace")


def _raise_with_credentials(config: dict[str, Any]) -> None:
    # The user's own error quotes a URI with credentials (a data loader's, say).
    raise ValueError(f"cannot open s3://{KEY_ID}:{SECRET}@bucket/data?secret_key={SECRET}")


def test_a_failure_quoting_credentials_is_masked_in_the_event_log_and_cairn_show(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    from cairn._src.cli.main import main

    with caplog.at_level(logging.INFO, logger="cairn"), pytest.raises(
            cairn.TrainingFailedError, match=r"s3://AKIDCAIRNTEST:\*\*\*@bucket"):
        cairn.Trainer(_raise_with_credentials, run_config=cairn.RunConfig(
            name="run", storage_path=str(tmp_path), progress=0)).fit()
    assert SECRET not in caplog.text
    events = "".join(p.read_text() for p in (tmp_path / "run" / "events").iterdir())
    assert "cannot open s3://" in events and SECRET not in events
    capsys.readouterr()
    for command in (["show", str(tmp_path / "run")], ["show", str(tmp_path / "run"), "--json"]):
        main(command)
        out = capsys.readouterr().out
        assert "cannot open s3://" in out and SECRET not in out, command


def test_cairn_show_masks_credentials_in_a_failure_a_log_recorded(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 ) -> None:
    # A log written before the driver masked reasons, or forged: show masks them itself.
    import json

    from cairn._src.cli.main import main

    cairn.Trainer(lambda: None, run_config=cairn.RunConfig(
        name="run", storage_path=str(tmp_path), progress=0)).fit()
    quoted = f"ValueError: s3://{KEY_ID}:{SECRET}@bucket/x"
    segment = next((tmp_path / "run" / "events").iterdir())
    with segment.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"type": "failure", "t": 1.0e9, "attempt": 0, "ranks": [0],
                              "reason": f"[rank 0] {quoted}", "errors": [
                                  {"type": "ValueError", "ranks": [0], "message": quoted}]})
                  + "\n")
    capsys.readouterr()
    main(["show", str(tmp_path / "run"), "--json"])
    out = capsys.readouterr().out
    assert "s3://" in out and SECRET not in out
