"""A Serve `RequestRouter` for LLM pools that balances on in-flight tokens."""

from __future__ import annotations

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from deployments.ray_private import cached_queue_len
from serve_app.engine.base import GenerationRequest
from serve_app.scheduling.replica_choice import LeastLoadedPolicy, ReplicaLoad


def avoided_replicas(pending_request: PendingRequest | None) -> frozenset[str]:
    """Actor ids the request's earlier attempts found gone (`GenerationRequest.avoid_replicas`)."""
    args = pending_request.args if pending_request is not None else ()
    request = args[0] if args else None
    return frozenset(request.avoid_replicas) if isinstance(request, GenerationRequest) else frozenset()


class LeastLoadedRequestRouter(FIFOMixin, RequestRouter):
    """Serve's request router for LLM pools (`serve_app.topology.REQUEST_ROUTER_CONFIG`)."""

    def initialize_state(self, tokens_per_request: float = 128.0) -> None:
        self._policy = LeastLoadedPolicy(tokens_per_request)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        avoid = avoided_replicas(pending_request)
        loads = [
            ReplicaLoad(
                replica=replica_id,
                in_flight_tokens=replica.routing_stats.get("in_flight_tokens"),
                queue_len=cached_queue_len(self, replica.replica_id),
                serving=bool(replica.routing_stats.get("serving", 1)) and replica.actor_id.hex() not in avoid,
                reported_requests=replica.routing_stats.get("in_flight"),
            )
            for replica_id, replica in by_id.items()
        ]
        return [[by_id[replica_id] for replica_id in rank] for rank in self._policy.rank(loads)]
