"""The controller's state machine: one enum, one transition function, every change logged."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Transition:
    """One change of the controller's state, and why."""

    old: ControllerState
    new: ControllerState
    reason: str


def allowed_transitions(state: ControllerState) -> frozenset[ControllerState]:
    """The states ``state`` may change to (none: FINISHED and ERRORED end the run)."""
    return _ALLOWED[state]


class StateMachine:
    def __init__(self) -> None:
        self.state = ControllerState.INITIALIZING

    def transition(self, new: ControllerState, reason: str) -> Transition:
        if new not in _ALLOWED[self.state]:
            raise RuntimeError(f"Illegal controller transition {self.state.value} -> {new.value}")
        logger.info("Controller %s -> %s: %s", self.state.value, new.value, reason)
        change = Transition(self.state, new, reason)
        self.state = new
        return change
