"""Worker lifecycles with real processes: a rank that dies halfway through sending a
message while a process it forked still holds its socket, and the process groups the
local backend signals."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.backends import local
from cairn._src.backends.local import LocalBackend
from cairn._src.controller import connections
from cairn._src.worker.session import get_session

RunConfigFactory = Callable[..., cairn.RunConfig]


def die_mid_message(config: dict[str, Any]) -> str:
    """Attempt 0: send the 4-byte header of a 1 MiB message and no more, fork a child that
    keeps the socket open, and die. Attempt 1: return."""
    if cairn.get_context().get_attempt() > 0:
        return "attempt 1"
    session = get_session("test")
    with session._send_lock:  # no other message between the header and the death
        os.write(session._connection.fileno(), struct.pack("!i", 1 << 20))
        child = os.fork()
        if child == 0:
            time.sleep(config["child_sleep_s"])
            os._exit(0)
        Path(config["child_pid_file"]).write_text(str(child))
        os._exit(1)


def test_a_rank_dead_mid_message_with_a_forked_child_holding_its_socket_is_lost(
        run_config: RunConfigFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The controller runs in this process: its read of the rest of the message gives up
    # after 2 s (the child sleeps 120 s, the join below waits 60 s).
    monkeypatch.setattr(connections, "RECEIVE_TIMEOUT_S", 2.0, raising=False)
    pid_file = tmp_path / "child.pid"
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = Trainer(
                die_mid_message,
                train_loop_config={"child_sleep_s": 120, "child_pid_file": str(pid_file)},
                scaling_config=ScalingConfig(num_workers=1),
                run_config=run_config(failure_config=FailureConfig(max_failures=1))).fit()
        except BaseException as exc:  # reported by the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="test-fit")
    thread.start()
    try:
        thread.join(60)
        assert not thread.is_alive(), "the controller is stuck reading the broken message"
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].return_value == "attempt 1"


def two_ranks(config: dict[str, Any]) -> int:
    """Rank 1 raises on the attempts ``config["fail_until"]`` says; both report once."""
    context = cairn.get_context()
    cairn.report({"attempt": context.get_attempt()})
    if context.get_world_rank() == 1 and context.get_attempt() < config["fail_until"]:
        raise ValueError("rank 1 is broken")
    return context.get_world_rank()


def _is_unreaped_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


@pytest.mark.parametrize("case", ["success", "restart", "failure"])
def test_each_worker_group_is_signalled_once_per_signal_while_its_leader_is_unreaped(
        run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    signalled: list[tuple[int, int, bool]] = []
    real_killpg = os.killpg

    def recording_killpg(pgid: int, sig: int) -> None:
        signalled.append((pgid, sig, _is_unreaped_child(pgid)))
        real_killpg(pgid, sig)

    monkeypatch.setattr(local.os, "killpg", recording_killpg)
    fail_until = {"success": 0, "restart": 1, "failure": 99}[case]
    trainer = Trainer(two_ranks, train_loop_config={"fail_until": fail_until},
                      scaling_config=ScalingConfig(num_workers=2),
                      run_config=run_config(failure_config=FailureConfig(
                          max_failures=1 if case == "restart" else 0)))
    if case == "failure":
        with pytest.raises(TrainingFailedError, match="rank 1 is broken"):
            trainer.fit()
    else:
        assert trainer.fit().return_value == 0
    monkeypatch.undo()
    pairs = [(pgid, sig) for pgid, sig, _ in signalled]
    assert signalled, "no worker group was signalled"
    assert len(set(pairs)) == len(pairs), f"a group was sent a signal twice: {pairs}"
    assert all(unreaped for _, _, unreaped in signalled), (
        f"a group was signalled after its leader was reaped: {signalled}")
    # Each group's last signal is the SIGKILL for what its worker left behind; a SIGTERM
    # before it only where the worker had not exited yet.
    last = {pgid: sig for pgid, sig in pairs}
    assert set(last.values()) == {signal.SIGKILL}
    assert len(last) == {"success": 2, "restart": 4, "failure": 2}[case]


class _Bootstrap:
    """What LocalBackend.start and replace read of a bootstrap."""

    attempt = 0

    def for_rank(self, rank: int, env: dict[str, str]) -> bytes:
        return b"bootstrap"


def test_a_kept_rank_killed_after_another_ranks_oom_is_not_called_out_of_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    oom_kills = {"count": 0}
    monkeypatch.setattr(local, "oom_kill_count", lambda: oom_kills["count"])
    backend = LocalBackend(forward_output=False)

    def sleeper(rank: int, num_workers: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(120)"],
            stdin=subprocess.PIPE, start_new_session=True)

    monkeypatch.setattr(backend, "_spawn", sleeper)
    try:
        backend.start(2, _Bootstrap())  # type: ignore[arg-type]
        # The OOM killer takes rank 0; keep_survivors replaces it and keeps rank 1.
        oom_kills["count"] = 1
        backend.kill_ranks({0})
        workers = backend.replace({0}, _Bootstrap())  # type: ignore[arg-type]
        kept, replacement = workers[1], workers[0]
        # Then a user kills the kept rank: no OOM kill since this attempt began.
        os.kill(kept.pid, signal.SIGKILL)
        assert kept.wait_exit(60)
        description = kept.describe_exit()
        assert description.startswith("was killed by SIGKILL")
        assert "out of memory" not in description
        # An OOM kill during the attempt is still named.
        oom_kills["count"] = 2
        os.kill(replacement.pid, signal.SIGKILL)
        assert replacement.wait_exit(60)
        assert "out of memory" in replacement.describe_exit()
    finally:
        backend.kill()
