"""Capacity types: Spot and on-demand nodes, and what the app does about each.

A node's capacity type is its Ray label `ray.io/market-type`. `split` divides a
pool into an on-demand and a Spot deployment, `chooser` picks which one a
request tries, `decode_speed` measures how much one stream decodes in a Spot
notice window, and `preemption` hears the notices.
"""

from typing import Literal

MARKET_TYPE_LABEL = "ray.io/market-type"
"""Ray node label carrying the capacity type (KubeRay worker groups set it)."""
SPOT = "spot"
ON_DEMAND = "on-demand"
ANY_CAPACITY = "any"
"""Capacity type of an unpinned pool (runs wherever Ray places it); priced on-demand."""
CapacityType = Literal["spot", "on-demand", "any"]
