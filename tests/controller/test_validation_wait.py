"""fit() waits at its end for the run's validations (as Ray Train does); while it waits it
says, now and then, which checkpoints' validations it waits for."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from cairn import ValidationConfig
from cairn._src.controller import validations
from cairn._src.controller.validations import PendingValidations, ValidationRunner


def test_the_wait_for_a_long_validation_names_it_until_it_ends(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(validations, "WAIT_NOTE_S", 0.05)
    pending = PendingValidations()
    pending.jobs["checkpoint_000003"] = validations._Job("checkpoint_000003", 3, {})
    unused: Any = None
    runner = ValidationRunner(ValidationConfig(lambda checkpoint: {}), unused, unused,
                              submit=unused, wake=unused, options=unused, pending=pending)

    def finish() -> None:
        with pending.idle:
            pending.jobs.clear()
            pending.idle.notify_all()

    timer = threading.Timer(0.5, finish)
    timer.start()
    with caplog.at_level(logging.WARNING, logger="cairn"):
        runner.wait_idle()
    timer.join()
    notes = [r.getMessage() for r in caplog.records]
    assert notes, "no word while waiting"
    assert all("for the validation of checkpoint_000003" in n for n in notes), notes
    assert "ValidationConfig(timeout_s=...)" in notes[0]
