"""The pool's Serve request router skips replicas that serve nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field

from ray.serve._private.request_router.common import PendingRequest

from deployments.request_router import LeastLoadedRequestRouter
from tests.fakes import generation_request


@dataclass(frozen=True)
class _Id:
    unique_id: str

    def hex(self) -> str:
        return f"actor-{self.unique_id}"


@dataclass
class _Replica:
    name: str
    routing_stats: dict = field(default_factory=dict)

    @property
    def replica_id(self) -> _Id:
        return _Id(self.name)

    @property
    def actor_id(self) -> _Id:
        return _Id(self.name)


def router() -> LeastLoadedRequestRouter:
    instance = LeastLoadedRequestRouter.__new__(LeastLoadedRequestRouter)
    instance._replica_queue_len_cache = {}
    instance.initialize_state()
    return instance


def pending(avoid: tuple[str, ...] = ()) -> PendingRequest:
    request = generation_request(4, avoid_replicas=avoid)
    return PendingRequest(args=[request], kwargs={}, metadata=None)


async def test_a_draining_replica_is_never_chosen_even_when_idle():
    idle_draining = _Replica("a", {"in_flight_tokens": 0, "serving": 0})
    busy = _Replica("b", {"in_flight_tokens": 5000, "serving": 1})
    ranks = await router().choose_replicas([idle_draining, busy], pending())
    assert [[r.name for r in rank] for rank in ranks] == [["b"]]


async def test_a_retry_avoids_the_replicas_its_request_found_gone():
    a, b = _Replica("a", {"in_flight_tokens": 0}), _Replica("b", {"in_flight_tokens": 100})
    ranks = await router().choose_replicas([a, b], pending(avoid=("actor-a",)))
    assert [[r.name for r in rank] for rank in ranks] == [["b"]]
    ranks = await router().choose_replicas([a, b], None)  # no request at hand (a probe): both
    assert [[r.name for r in rank] for rank in ranks] == [["a", "b"]]
