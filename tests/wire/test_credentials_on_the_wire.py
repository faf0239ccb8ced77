"""Without TLS, storage credentials never cross to another machine: real sockets."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator

import pytest
from channel_support import any_local_store, connect_worker

from cairn._src.controller.connections import WorkerChannels
from cairn._src.storage.location import StorageLocation, resolve
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
