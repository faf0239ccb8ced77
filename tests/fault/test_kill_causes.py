"""What a worker killed by a signal is blamed on: SIGKILL is "out of memory" only when the
OOM killer's count went up while it ran, else another process or the OOM killer."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.backends.local import describe_signal, oom_kill_count


def test_sigkill_without_an_oom_kill_names_both_senders() -> None:
    assert describe_signal(signal.SIGKILL, "SIGKILL", 3, 3) == (
        "was killed by SIGKILL, sent by another process or the kernel's OOM killer")


@pytest.mark.parametrize("before, after", [(None, 4), (4, None), (None, None)])
def test_sigkill_with_an_unknown_count_is_not_blamed_on_memory(
        before: int | None, after: int | None) -> None:
    assert "out of memory" not in describe_signal(signal.SIGKILL, "SIGKILL", before, after)


def test_sigkill_after_the_oom_count_went_up_is_out_of_memory() -> None:
    assert describe_signal(signal.SIGKILL, "SIGKILL", 3, 4) == (
        "was killed by SIGKILL: out of memory (the OOM killer; its count went from 3 to 4 "
        "while the worker ran)")


def test_other_signals_are_named_alone() -> None:
    assert describe_signal(signal.SIGTERM, "SIGTERM", 3, 4) == "was killed by SIGTERM"


def _tree(root: Path, files: dict[str, str]) -> tuple[str, str]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root / "proc"), str(root / "cgroup")


def test_the_count_comes_from_cgroup_v2(tmp_path: Path) -> None:
    proc, cgroup = _tree(tmp_path, {
        "proc/self/cgroup": "0::/user.slice/job\n",
        "cgroup/user.slice/job/memory.events": "low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\n",
        "proc/vmstat": "nr_free_pages 1\noom_kill 9\n"})
    assert oom_kill_count(proc, cgroup) == 2


def test_the_count_comes_from_cgroup_v1(tmp_path: Path) -> None:
    proc, cgroup = _tree(tmp_path, {
        "proc/self/cgroup": "5:cpu,cpuacct:/\n4:memory:/job/7\n0::/\n",
        "cgroup/memory/job/7/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"
                                                  "oom_kill 5\n",
        "proc/vmstat": "oom_kill 9\n"})
    assert oom_kill_count(proc, cgroup) == 5


def test_the_kernel_count_when_the_cgroup_does_not_say(tmp_path: Path) -> None:
    proc, cgroup = _tree(tmp_path, {"proc/self/cgroup": "0::/gone\n",
                                    "proc/vmstat": "pgfault 10\noom_kill 9\n"})
    assert oom_kill_count(proc, cgroup) == 9


@pytest.mark.parametrize("files", [{}, {"proc/self/cgroup": "garbage", "proc/vmstat": "x"},
                                   {"proc/vmstat": "oom_kill many\n"}])
def test_no_count_where_none_can_be_read(tmp_path: Path, files: dict[str, str]) -> None:
    proc, cgroup = _tree(tmp_path, files)
    assert oom_kill_count(proc, cgroup) is None


def _killed_by_sigkill() -> None:
    cairn.report({"step": 0})
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_real_kill_9_names_another_process_or_the_oom_killer(
        run_config: Callable[..., cairn.RunConfig]) -> None:
    with pytest.raises(TrainingFailedError,
                       match=r"\[rank 0\] Worker rank 0 \(pid \d+\) was killed by SIGKILL, sent "
                             r"by another process or the kernel's OOM killer"):
        Trainer(_killed_by_sigkill, scaling_config=ScalingConfig(num_workers=1),
                run_config=run_config(progress=0,
                                      failure_config=FailureConfig(max_failures=0))).fit()
