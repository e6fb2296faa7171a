"""Which replica of a pool takes the next request: the least loaded ones.

Replicas report their load (`LLMServer.record_routing_stats`: running requests
and the output tokens those may still produce) every second; Serve's request
router (`deployments.request_router`) also knows each replica's queue length
from its own probes. A report is up to a second old while the router sends many
requests within one, so the policy counts requests by the queue length and lets
the report only weigh them: each at the mean debt per request its replica last
reported (a replica of long answers is busier per request). Ranking on the
report's tokens instead sent every request of a second to the replicas that
were lightest at the last report (the fleet simulator: worse than Serve's
random pair). It offers the lightest two first, so Serve's probe picks between
two good candidates instead of two random ones. A replica that serves nothing
more (draining for a preemption, its engine lost: it says so in its stats) or
that an earlier attempt of the request found gone is never offered; with none
left, nothing is, and Serve's router waits for a replica to start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    in_flight_tokens: float | None
    """From the replica's last routing stats; None before its first report."""
    queue_len: int | None
    """Serve's request router's cached queue length of the replica; None if never probed."""
    serving: bool = True
    """False once the replica takes no new work, or the request must avoid it."""
    reported_requests: int | None = None
    """The requests `in_flight_tokens` was over (the same report); None before its first."""


class LeastLoadedPolicy:
    def __init__(self, tokens_per_request: float = 128.0, first_rank_size: int = 2) -> None:
        self._tokens_per_request = tokens_per_request
        """A request's weight, in tokens, on a replica whose report holds none to average."""
        self._first_rank_size = first_rank_size

    def score(self, load: ReplicaLoad) -> float:
        """Tokens the replica's requests may still produce: its current queue length
        times the mean per request of its last report; the report alone where the
        queue length is unknown."""
        if load.queue_len is None:
            return load.in_flight_tokens or 0.0
        reported = load.in_flight_tokens is not None and load.reported_requests
        per_request = load.in_flight_tokens / load.reported_requests if reported else self._tokens_per_request
        return load.queue_len * per_request

    def rank(self, loads: list[ReplicaLoad]) -> list[list[str]]:
        """Replica ids, most preferred rank first."""
        ordered = [load.replica for load in sorted(loads, key=self.score) if load.serving]
        first, rest = ordered[: self._first_rank_size], ordered[self._first_rank_size :]
        return [first, rest] if rest else [first] if first else []
