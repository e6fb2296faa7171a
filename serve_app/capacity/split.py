"""Splitting a pool into an on-demand and a Spot deployment, pinned by node label.

Replicas are pinned with `ray_actor_options.label_selector`; Spot
replicas fall back to on-demand nodes through `fallback_strategy` (a list of
option dicts, of which Ray 2.60 honours `label_selector`). Deployments with
`placement_group_bundles` are pinned per bundle instead; Serve 2.60 offers no
option or config field for a placement-group fallback (`ReplicaConfig` has one
internally, unset), so there the on-demand deployment of the pool is the fallback.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND, SPOT, CapacityType


def on_demand_count(count: int, on_demand_share: float) -> int:
    """On-demand replicas of `count` at `on_demand_share`: rounded up, so the
    baseline never falls below its share (the one rounding rule of a split)."""
    # round() first: 1 - 0.7 is 0.30000000000000004, and 10 of those must stay 3.
    return math.ceil(round(on_demand_share * count, 9))


def pin_options(capacity_type: CapacityType, options: dict[str, Any]) -> dict[str, Any]:
    """Serve deployment options pinned to `capacity_type` nodes (a copy)."""
    pinned = copy.deepcopy(options)
    if pinned.get("placement_group_bundles"):
        selectors = pinned.get("placement_group_bundle_label_selector") or [{}]
        pinned["placement_group_bundle_label_selector"] = [
            {**selector, MARKET_TYPE_LABEL: capacity_type} for selector in selectors
        ]
        return pinned
    actor = pinned.setdefault("ray_actor_options", {})
    selector = actor.get("label_selector") or {}
    actor["label_selector"] = {**selector, MARKET_TYPE_LABEL: capacity_type}
    if capacity_type == SPOT:
        actor["fallback_strategy"] = [{"label_selector": {**selector, MARKET_TYPE_LABEL: ON_DEMAND}}]
    return pinned


@dataclass(frozen=True)
class ReplicaBounds:
    """Replica count of one deployment: fixed (`autoscaling` False) or a range."""

    min_replicas: int
    max_replicas: int
    initial_replicas: int | None = None
    autoscaling: bool = False

    @classmethod
    def from_serve_options(cls, options: dict[str, Any]) -> ReplicaBounds:
        scaling = options.get("autoscaling_config")
        if scaling is None:
            count = options.get("num_replicas", 1)
            return cls(count, count)
        # Serve's AutoscalingConfig defaults: min 1, max 1, no initial count.
        return cls(scaling.get("min_replicas", 1), scaling.get("max_replicas", 1),
                   scaling.get("initial_replicas"), autoscaling=True)

    def to_serve_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """`options` with this replica count in place of theirs (a copy)."""
        updated = copy.deepcopy(options)
        if not self.autoscaling:
            updated["num_replicas"] = self.max_replicas
            return updated
        scaling = updated["autoscaling_config"]
        scaling.update(min_replicas=self.min_replicas, max_replicas=self.max_replicas)
        if self.initial_replicas is not None:
            scaling["initial_replicas"] = self.initial_replicas
        return updated


class CapacitySplit:
    """Splits a pool's replica bounds into an on-demand baseline and a Spot share.

    Each bound (min, max, initial) is split alone: on-demand gets
    `ceil((1 - spot_share) * n)`, so the baseline never falls below its share,
    and Spot the rest. A side whose max is 0 gets no deployment.
    """

    def __init__(self, spot_share: float) -> None:
        if not 0 <= spot_share <= 1:
            raise ValueError(f"spot_share must be within [0, 1], got {spot_share}")
        self._on_demand_share = 1 - spot_share

    def _on_demand(self, count: int) -> int:
        return on_demand_count(count, self._on_demand_share)

    def split(self, bounds: ReplicaBounds) -> dict[CapacityType, ReplicaBounds]:
        def share(count: int | None, on_demand: bool) -> int | None:
            if count is None:
                return None
            return self._on_demand(count) if on_demand else count - self._on_demand(count)

        sides: dict[CapacityType, ReplicaBounds] = {}
        for capacity_type, on_demand in ((ON_DEMAND, True), (SPOT, False)):
            side = ReplicaBounds(share(bounds.min_replicas, on_demand), share(bounds.max_replicas, on_demand),
                                 share(bounds.initial_replicas, on_demand), bounds.autoscaling)
            if side.max_replicas > 0:
                sides[capacity_type] = side
        return sides or {ON_DEMAND: bounds}

    def serve_options(self, options: dict[str, Any]) -> dict[CapacityType, dict[str, Any]]:
        """One pool's Serve options -> the options of its deployment per capacity type."""
        bounds = ReplicaBounds.from_serve_options(options)
        return {
            capacity_type: pin_options(capacity_type, side.to_serve_options(options))
            for capacity_type, side in self.split(bounds).items()
        }
