"""Which capacity type (Spot or on-demand deployment of a pool) a request tries first."""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.capacity import ON_DEMAND, SPOT
from serve_app.config import Priority


@dataclass(frozen=True)
class CapacityState:
    """One capacity type of a pool, as the ingress sees it now."""

    healthy: int
    """Replicas taking requests."""
    free_slots: int
    """Requests those replicas can still take before Serve queues."""


class CapacityChooser:
    """The capacity types a request should try, best first.

    Types with free slots come first, then full ones (the request queues there),
    then empty ones (a handle queues until a replica starts). Within a rank,
    batch prefers Spot and realtime prefers the most free slots (on-demand on a
    tie). A request that might not finish inside a Spot notice window (its
    output budget over the Spot cap, or unbounded) never goes to Spot when the
    pool has an on-demand side.
    """

    def choose(self, snapshot: dict[str, CapacityState], priority: Priority, budget_tokens: int | None,
               spot_cap_tokens: int) -> list[str]:
        def key(capacity_type: str) -> tuple:
            state = snapshot[capacity_type]
            rank = 0 if state.healthy and state.free_slots > 0 else 1 if state.healthy else 2
            if priority == "batch":
                preference = (capacity_type != SPOT, -state.free_slots)
            else:
                preference = (-state.free_slots, capacity_type != ON_DEMAND)
            return (rank, *preference)

        order = sorted(snapshot, key=key)
        if ON_DEMAND in snapshot and (budget_tokens is None or budget_tokens > spot_cap_tokens):
            order = [side for side in order if side != SPOT]
        return order
