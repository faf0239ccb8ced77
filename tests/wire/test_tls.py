"""TLS on the control channel: real sockets, real worker processes."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from multiprocessing.connection import Client

import pytest
from channel_support import EVENT_TIMEOUT_S, connect_worker, report_and_checkpoint

import cairn
from cairn import ScalingConfig, Trainer
from cairn._src.controller import connections
from cairn._src.controller.connections import WorkerChannels
from cairn._src.wire.channel_security import tls_enabled
from cairn._src.wire.tls import make_run_certificate

RunConfigFactory = Callable[..., cairn.RunConfig]


def crash_after_a_sync_report(config: dict[str, int]) -> int:
    import json
    import tempfile

    context = cairn.get_context()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f) + 1
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank_{context.get_world_rank()}.json"), "w") as f:
                json.dump(step, f)
            cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(d))
        if step == 1 and context.get_attempt() == 0 and context.get_world_rank() == 1:
            os._exit(1)
    return start


@pytest.fixture
def tls_channels() -> WorkerChannels:
    channels = WorkerChannels("127.0.0.1", tls=True)
    channels.start()
    yield channels
    channels.stop_accepting()
    channels.close()


def test_a_run_over_tls_commits_and_returns(run_config: RunConfigFactory) -> None:
    result = Trainer(report_and_checkpoint, train_loop_config={"steps": 3},
                     scaling_config=ScalingConfig(num_workers=2, tls=True),
                     run_config=run_config()).fit()
    assert result.error is None
    assert result.return_value == 2
    assert result.metrics == {"step": 2}
    assert result.checkpoint is not None
    result.checkpoint.verify()
    assert sorted(result.checkpoint.get_manifest().files) == ["rank_0.json", "rank_1.json"]


def test_a_worker_killed_over_tls_restarts_from_its_last_sync_report(
    run_config: RunConfigFactory,
) -> None:
    result = Trainer(crash_after_a_sync_report, train_loop_config={"steps": 4},
                     scaling_config=ScalingConfig(num_workers=2, tls=True),
                     run_config=run_config(failure_config=cairn.FailureConfig(max_failures=1))
                     ).fit()
    assert result.error is None
    assert result.return_value == 2  # resumed after step 1, whose SYNC report returned
    assert result.goodput.failures == 1
    assert result.metrics == {"step": 3}


def test_the_environment_variable_turns_tls_on(
    run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAIRN_TLS", "1")
    assert tls_enabled(None) is True
    assert tls_enabled(False) is False
    result = Trainer(report_and_checkpoint, train_loop_config={"steps": 1},
                     run_config=run_config()).fit()
    assert result.return_value == 1


def test_a_bad_environment_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_TLS", "maybe")
    with pytest.raises(cairn.ConfigError,
                       match=r"CAIRN_TLS='maybe' is not one of '1', 'true'.*unset means off"):
        tls_enabled(None)


def test_a_bad_config_value_is_refused() -> None:
    with pytest.raises(cairn.ConfigError,
                       match=r"ScalingConfig.tls='yes' must be True .*False, or None"):
        ScalingConfig(tls="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("generator", ["cryptography", "openssl"])
def test_both_certificate_generators_make_a_working_channel(generator: str) -> None:
    if generator == "cryptography":
        pytest.importorskip("cryptography")
    elif shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    certificate = make_run_certificate("127.0.0.1", generator=generator)
    assert certificate.certificate_pem.startswith("-----BEGIN CERTIFICATE-----")
    channels = WorkerChannels("127.0.0.1", certificate=certificate)
    channels.start()
    try:
        worker, controller = connect_worker(channels)
        worker.send({"ping": 1})
        assert controller.recv() == {"ping": 1}
        controller.send("pong")
        assert worker.recv() == "pong"
    finally:
        channels.stop_accepting()
        channels.close()


def test_a_worker_trusts_only_the_runs_certificate(tls_channels: WorkerChannels) -> None:
    other = make_run_certificate("127.0.0.1").certificate_pem
    with pytest.raises(OSError, match="certificate verify failed"):
        connect_worker(tls_channels, certificate=other)


def test_a_plain_client_cannot_talk_to_a_tls_channel(
    tls_channels: WorkerChannels, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The plain client waits for a challenge, the channel for a TLS hello: the channel's
    # handshake deadline ends it (1 s here instead of 10).
    monkeypatch.setattr(connections, "_HANDSHAKE_TIMEOUT_S", 1.0)
    with pytest.raises((OSError, EOFError)):
        Client(("127.0.0.1", tls_channels.port), authkey=tls_channels.authkey)
    assert tls_channels.refusals.wait_for(1, EVENT_TIMEOUT_S)
    assert tls_channels.refusals.counts() == {"127.0.0.1": 1}


def test_large_messages_cross_both_ways_at_once(tls_channels: WorkerChannels) -> None:
    # Both directions fill their buffers together: neither may wait on the other.
    worker, controller = connect_worker(tls_channels)
    blob = os.urandom(6 << 20)
    received: dict[str, bytes] = {}

    def read(name: str, connection: object) -> None:
        received[name] = connection.recv_bytes()  # type: ignore[attr-defined]

    readers = [threading.Thread(target=read, args=("worker", worker)),
               threading.Thread(target=read, args=("controller", controller))]
    for reader in readers:
        reader.start()
    senders = [threading.Thread(target=worker.send_bytes, args=(blob,)),
               threading.Thread(target=controller.send_bytes, args=(blob[::-1],))]
    for sender in senders:
        sender.start()
    for thread in [*senders, *readers]:
        thread.join(EVENT_TIMEOUT_S)
        assert not thread.is_alive()
    assert received["controller"] == blob
    assert received["worker"] == blob[::-1]


def test_a_closed_end_reads_as_the_end_of_the_stream(tls_channels: WorkerChannels) -> None:
    worker, controller = connect_worker(tls_channels)
    worker.send("last words")
    worker.close()
    assert controller.recv() == "last words"
    with pytest.raises(EOFError):
        controller.recv()
