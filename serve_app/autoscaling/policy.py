"""The queue-duration policy: one pool's snapshot in, a replica count with a reason out.

A pool follows the time its requests wait in the ingress's queue, with
hysteresis (up and down delays), step limits, scale from zero on queued or
diverted demand and to zero after idling; it holds when the stats are missing.
No Ray here: `ray_adapter` feeds it from Serve's autoscaling contexts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.capacity import ON_DEMAND
from serve_app.capacity.split import on_demand_count
from serve_app.config import QueueDurationAutoscaling


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool at one control-loop tick (a split pool: both sides together)."""

    now: float
    replicas: int
    """Replicas asked for (Serve's target)."""
    running: int
    """Replicas running now (fewer while some start)."""
    signal_s: float | None
    """The queue-wait signal; None when the ingress's stats are missing."""
    queued: int = 0
    in_flight: int = 0
    diverted: int = 0
    slots: int | None = None
    """Requests the running replicas take at once; None if unknown."""


@dataclass(frozen=True)
class ScalingState:
    """Since when each condition has held (None: it does not hold now)."""

    above_since: float | None = None
    below_since: float | None = None
    demand_since: float | None = None
    idle_since: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScalingState:
        return cls(**{key: data.get(key) for key in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    signal_s: float | None
    state: ScalingState = field(default_factory=ScalingState)


class QueueDurationPolicy:
    """Replica count of one pool from its queue-wait signal."""

    def __init__(self, config: QueueDurationAutoscaling) -> None:
        self.config = config

    def decide(self, snap: PoolSnapshot, state: ScalingState) -> Decision:
        cfg, n, now = self.config, snap.replicas, snap.now
        low, high = cfg.min_replicas, cfg.max_replicas if cfg.max_replicas is not None else math.inf
        signal = snap.signal_s
        if signal is None:
            return Decision(n, "hold: no queue metrics from the ingress", None)
        if n < low or n > high:
            target = int(min(max(n, low), high))
            return Decision(target, f"to bounds [{low}, {cfg.max_replicas}]", signal)
        demand = snap.queued + snap.diverted
        if n == 0:
            if demand == 0:
                return Decision(0, "idle at zero", signal)
            since = state.demand_since if state.demand_since is not None else now
            if now - since >= cfg.scale_from_zero_delay_s:
                return Decision(1, f"scale from zero: {demand} requests waiting for {now - since:.0f}s", signal)
            return Decision(0, f"hold at zero: demand for {now - since:.0f}s of {cfg.scale_from_zero_delay_s:.0f}s",
                            signal, ScalingState(demand_since=since))
        if snap.running < n:
            return Decision(n, f"hold: {n - snap.running} replicas starting", signal)

        wait = f"{cfg.percentile} wait {signal:.2f}s"
        if signal > cfg.target_queue_wait_s:
            since = state.above_since if state.above_since is not None else now
            if n >= high:
                return Decision(n, f"hold at max_replicas: {wait} > target", signal, ScalingState(above_since=since))
            if now - since < cfg.upscale_delay_s:
                return Decision(n, f"hold: {wait} > target for {now - since:.0f}s of {cfg.upscale_delay_s:.0f}s",
                                signal, ScalingState(above_since=since))
            wanted = math.ceil(n * signal / cfg.target_queue_wait_s)
            target = int(min(high, n + cfg.max_step_up, max(n + 1, wanted)))
            return Decision(target, f"scale up: {wait} > target {cfg.target_queue_wait_s}s "
                                    f"for {now - since:.0f}s", signal)

        load = snap.queued + snap.in_flight
        idle = load == 0 and snap.diverted == 0
        idle_since = (state.idle_since if state.idle_since is not None else now) if idle else None
        if idle and low == 0 and cfg.idle_to_zero_delay_s is not None and now - idle_since >= cfg.idle_to_zero_delay_s:
            # Serve goes to zero only from one replica, so larger pools pass through one.
            keep = ScalingState(idle_since=idle_since) if n > 1 else ScalingState()
            return Decision(min(n - 1, 1), f"scale to zero: idle for {now - idle_since:.0f}s", signal, keep)
        needed = n  # without the slot count only idling scales down
        if snap.slots:
            per_replica = snap.slots / snap.running * cfg.downscale_max_utilization
            needed = max(1, low, math.ceil(load / per_replica))
        if needed >= n:
            return Decision(n, f"steady: {wait} <= target, load {load} needs {n} replicas", signal,
                            ScalingState(idle_since=idle_since))
        since = state.below_since if state.below_since is not None else now
        if now - since < cfg.downscale_delay_s:
            return Decision(n, f"hold: load {load} fits {needed} replicas for {now - since:.0f}s "
                               f"of {cfg.downscale_delay_s:.0f}s", signal,
                            ScalingState(below_since=since, idle_since=idle_since))
        target = max(needed, n - cfg.max_step_down)
        return Decision(target, f"scale down: {wait} <= target, load {load} fits {needed} replicas "
                                f"for {now - since:.0f}s", signal, ScalingState(idle_since=idle_since))


def split_replicas(total: int, sides: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """A split pool's replica total over its sides, in proportion to each side's
    `max_replicas` (on-demand rounded up, as `CapacitySplit` does), each within its
    own (min, max) bounds; what a bounded side cannot take goes to the others."""
    capacity = sum(high for _, high in sides.values()) or 1
    order = sorted(sides, key=lambda side: side != ON_DEMAND)
    counts, left = {}, total
    for index, side in enumerate(order):
        low, high = sides[side]
        share = left if index == len(order) - 1 else on_demand_count(total, high / capacity)
        counts[side] = min(high, max(low, share, 0))
        left -= counts[side]
    for side in order:  # overflow of a capped side
        extra = min(left, sides[side][1] - counts[side])
        counts[side] += max(0, extra)
        left -= max(0, extra)
    return counts
