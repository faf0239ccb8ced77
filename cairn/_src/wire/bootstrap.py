"""What a worker process needs to join its attempt: how the driver hands it over."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Bootstrap:
    address: tuple[str, int]
    # The run's secret: never in a repr (a log line, a traceback that shows locals).
    authkey: bytes = field(repr=False)
    attempt: int
    # The run's TLS certificate (PEM) when the control channel is encrypted.
    tls_certificate: str | None = None

    def body(self, rank: int) -> dict[str, Any]:
        body: dict[str, Any] = {"address": list(self.address), "authkey": self.authkey.hex(),
                                "rank": rank, "attempt": self.attempt}
        if self.tls_certificate is not None:
            body["tls_certificate"] = self.tls_certificate
        return body

    def for_rank(self, rank: int, *, env: dict[str, str] | None = None) -> bytes:
        """The bootstrap line of ``rank``; ``env``: variables the worker sets before it
        connects (an attempt's own, e.g. the torch rendezvous port, for a process started
        before that attempt)."""
        body = self.body(rank)
        if env:
            body["env"] = dict(env)
        return json.dumps(body).encode() + b"\n"


# The worker runtime sets it to its address toward the driver: where peers on other
# machines reach this worker (cairn.torch's rendezvous at rank 0 on a cluster).
NODE_ADDRESS_ENV = "CAIRN_NODE_ADDRESS"

# Variables an attempt sets afresh (cairn.torch's rendezvous address), which a standby
# process started during the previous attempt receives in its bootstrap instead.
ATTEMPT_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
