"""A Serve `RequestRouter` for LLM pools that balances on in-flight tokens."""

from __future__ import annotations

from typing import List, Optional

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from serve_app.routing import LeastLoadedPolicy, ReplicaLoad

ROUTER_CONFIG = {
    "request_router_class": "deployments.request_router:LeastLoadedRouter",
    "request_routing_stats_period_s": 1.0,
}
"""The `request_router_config` the builder gives LLM pools that set none."""


class LeastLoadedRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, tokens_per_request: float = 128.0) -> None:
        self._policy = LeastLoadedPolicy(tokens_per_request)

    async def choose_replicas(
        self, candidate_replicas: List[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> List[List[RunningReplica]]:
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        loads = [
            ReplicaLoad(
                replica=replica_id,
                in_flight_tokens=replica.routing_stats.get("in_flight_tokens"),
                queue_len=self._replica_queue_len_cache.get(replica.replica_id),
            )
            for replica_id, replica in by_id.items()
        ]
        return [[by_id[replica_id] for replica_id in rank] for rank in self._policy.rank(loads)]
