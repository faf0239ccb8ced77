"""Without TLS, storage credentials never cross to another machine: real sockets."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator

import fsspec
import pyarrow.fs as pafs
import pytest
from channel_support import any_local_store, connect_worker

from cairn._src.controller.connections import WorkerChannels
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.wire.channel_security import filesystem_secrets
from cairn.storage import register_scheme, unregister_scheme

S3_URI = ("s3://AKIDEXAMPLE:hunter2@bucket/run?endpoint_override=127.0.0.1:9&scheme=http"
          "&region=us-east-1")
S3_PUBLIC = "s3://bucket/run?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
CUSTOM_URI = "credstore://bucket/run?secret_key=s3cr3t&zone=a"
CUSTOM_PUBLIC = "credstore://bucket/run?zone=a"


@pytest.fixture(autouse=True)
def credstore() -> Iterator[None]:
    register_scheme("credstore", any_local_store, overwrite=True)
    yield
    unregister_scheme("credstore")


def _channels(*, remote: bool, tls: bool = False) -> WorkerChannels:
    # Every peer here is on loopback: ``same_host`` says which ones to treat as another
    # machine, as a worker on another node of a cluster would be.
    channels = WorkerChannels("127.0.0.1", tls=tls, same_host=lambda peer, bind: not remote)
    channels.start()
    return channels


def _send_and_receive(channels: WorkerChannels, message: object) -> tuple[bytes, object]:
    worker, controller = connect_worker(channels)
    controller.send(message)
    raw = worker.recv_bytes()
    return raw, pickle.loads(raw)


@pytest.mark.parametrize(("uri", "public"), [(S3_URI, S3_PUBLIC), (CUSTOM_URI, CUSTOM_PUBLIC)])
def test_a_worker_on_another_machine_gets_the_uri_without_credentials(
    uri: str, public: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    channels = _channels(remote=True)
    try:
        run = resolve(uri)
        raw, received = _send_and_receive(channels, {"run": run, "checkpoint": run.join("c1")})
        for secret in (b"hunter2", b"s3cr3t", b"AKIDEXAMPLE"):
            assert secret not in raw
        assert isinstance(received, dict)
        assert isinstance(received["run"], StorageLocation)
        assert received["run"].uri == public
        assert received["run"].path == run.path
        assert received["checkpoint"].path == run.join("c1").path
        warnings = [r.getMessage() for r in caplog.records if "not encrypted" in r.getMessage()]
        assert len(warnings) == 1
        assert "credentials in the storage URI are not sent" in warnings[0]
        assert "ScalingConfig(tls=True) or CAIRN_TLS=1" in warnings[0]
        assert "hunter2" not in warnings[0] and "s3cr3t" not in warnings[0]
    finally:
        channels.stop_accepting()
        channels.close()


@pytest.mark.parametrize(("remote", "tls"), [(False, False), (True, True)])
def test_the_driver_machine_and_tls_peers_get_the_uri_as_given(remote: bool, tls: bool) -> None:
    channels = _channels(remote=remote, tls=tls)
    try:
        _, received = _send_and_receive(channels, resolve(CUSTOM_URI))
        assert isinstance(received, StorageLocation)
        assert received.uri == CUSTOM_URI
    finally:
        channels.stop_accepting()
        channels.close()


def test_a_uri_without_credentials_is_sent_unchanged_and_unflagged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    channels = _channels(remote=True)
    try:
        _, received = _send_and_receive(channels, resolve(CUSTOM_PUBLIC))
        assert isinstance(received, StorageLocation) and received.uri == CUSTOM_PUBLIC
        assert not [r for r in caplog.records if "not encrypted" in r.getMessage()]
    finally:
        channels.stop_accepting()
        channels.close()


def _s3(**keys: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(region="us-east-1", endpoint_override="127.0.0.1:9",
                             scheme="http", **keys)


@pytest.mark.parametrize(("remote", "tls", "warned"),
                         [(True, False, True), (False, False, False), (True, True, False)])
def test_a_filesystem_object_with_explicit_keys_sent_in_clear_to_another_machine_is_flagged(
    remote: bool, tls: bool, warned: bool, caplog: pytest.LogCaptureFixture,
) -> None:
    # It travels as given (its keys cannot be taken out of it, as Ray sends it too): the
    # driver says so once per host.
    caplog.set_level(logging.WARNING, logger="cairn")
    channels = _channels(remote=remote, tls=tls)
    try:
        run = resolve("bucket/run", filesystem=_s3(access_key="AKIDEXAMPLE",
                                                   secret_key="hunter2"))
        for _ in range(2):
            _, received = _send_and_receive(channels, {"run": run, "c": run.join("c1")})
            assert isinstance(received, dict) and received["run"].path == run.path
        warnings = [r.getMessage() for r in caplog.records if "in clear" in r.getMessage()]
        assert len(warnings) == (1 if warned else 0)
        if warned:
            assert "a pyarrow._s3fs.S3FileSystem, holds explicit credentials (secret_key)" \
                in warnings[0]
            assert "zero-argument factory" in warnings[0] and "tls=True" in warnings[0]
            assert "hunter2" not in warnings[0]
    finally:
        channels.stop_accepting()
        channels.close()


def test_which_filesystem_objects_hold_explicit_secrets() -> None:
    assert filesystem_secrets(_s3(access_key="AK", secret_key="SK")) == ["secret_key"]
    assert filesystem_secrets(_s3(access_key="AK", secret_key="SK",
                                  session_token="T")) == ["secret_key", "session_token"]
    assert filesystem_secrets(_s3()) == []  # the environment's credential chain
    assert filesystem_secrets(pafs.LocalFileSystem()) == []

    class Spec:  # an fsspec filesystem, as s3fs keeps its options
        storage_options = {"key": "AK", "secret": "SK", "client_kwargs": {}}

    assert filesystem_secrets(Spec()) == ["secret"]
    wrapped = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    assert filesystem_secrets(wrapped) == []
    wrapped.handler.fs.storage_options = {"token": "T"}
    assert filesystem_secrets(wrapped) == ["token"]
