"""The controller's state machine: one enum, one transition function, every change logged."""

from __future__ import annotations

import enum
import logging

logger = logging.getLogger(__name__)


class ControllerState(enum.Enum):
    INITIALIZING = "INITIALIZING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    FINISHING = "FINISHING"
    FINISHED = "FINISHED"
    ERRORED = "ERRORED"


_ALLOWED: dict[ControllerState, frozenset[ControllerState]] = {
    ControllerState.INITIALIZING: frozenset({ControllerState.STARTING, ControllerState.ERRORED}),
    ControllerState.STARTING: frozenset(
        {ControllerState.RUNNING, ControllerState.RESTARTING, ControllerState.ERRORED}
    ),
    ControllerState.RUNNING: frozenset(
        {ControllerState.FINISHING, ControllerState.RESTARTING, ControllerState.ERRORED}
    ),
    ControllerState.RESTARTING: frozenset({ControllerState.STARTING, ControllerState.ERRORED}),
    ControllerState.FINISHING: frozenset({ControllerState.FINISHED, ControllerState.ERRORED}),
    ControllerState.FINISHED: frozenset(),
    ControllerState.ERRORED: frozenset(),
}


class StateMachine:
    def __init__(self) -> None:
        self.state = ControllerState.INITIALIZING

    def transition(self, new: ControllerState, reason: str) -> None:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"Illegal controller transition {self.state.value} -> {new.value}")
        logger.info("Controller %s -> %s: %s", self.state.value, new.value, reason)
        self.state = new
