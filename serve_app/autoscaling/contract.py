"""The metric contract between the ingress and the autoscaling policy.

The ingress holds one queue per pool and reports, through Serve's
`record_autoscaling_stats()`, how long requests wait there: flat keys
`<metric>:<queue>`, the queue named by the pool's deployment name without a
capacity suffix (`serve_app.topology.pool_of`). The policy, in Serve's
controller, reads them back from each autoscaling context's `raw_metrics`
(`ingress_reports`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QUEUED = "queued"
IN_FLIGHT = "in_flight"
DIVERTED = "diverted"
SLOTS = "slots"
OLDEST_WAIT = "oldest_wait_s"
WAIT_PERCENTILE = {"p50": "queue_wait_p50_s", "p90": "queue_wait_p90_s"}
CONTRACT_METRICS = (QUEUED, IN_FLIGHT, DIVERTED, SLOTS, OLDEST_WAIT, *WAIT_PERCENTILE.values())
"""Metric names the ingress reports per queue, as `<metric>:<queue>`."""

def metric_key(metric: str, queue: str) -> str:
    return f"{metric}:{queue}"


@dataclass(frozen=True)
class PoolQueueStats:
    """What the ingress knows about one pool's queue right now."""

    queued: int
    """Requests waiting in the ingress for this pool."""
    in_flight: int
    """Requests dispatched to the pool and not finished."""
    wait_p50_s: float | None = None
    wait_p90_s: float | None = None
    """Percentiles of the waits of requests dispatched recently; None if none were."""
    oldest_wait_s: float | None = None
    """Age of the oldest request still waiting (the waits above miss requests
    that never got a slot, e.g. at zero replicas)."""
    diverted: int = 0
    """Requests recently sent to the fallback model because the pool had no replica."""
    slots: int | None = None
    """Requests the pool's running replicas take at once (replicas x `max_ongoing_requests`)."""


def autoscaling_stats(per_pool: Mapping[str, PoolQueueStats]) -> dict[str, float]:
    """The ingress's `record_autoscaling_stats()` result: queue name -> stats as flat keys."""
    stats: dict[str, float] = {}
    for queue, pool in per_pool.items():
        values = {QUEUED: pool.queued, IN_FLIGHT: pool.in_flight, DIVERTED: pool.diverted,
                  SLOTS: pool.slots, OLDEST_WAIT: pool.oldest_wait_s,
                  WAIT_PERCENTILE["p50"]: pool.wait_p50_s, WAIT_PERCENTILE["p90"]: pool.wait_p90_s}
        stats.update({metric_key(name, queue): float(v) for name, v in values.items() if v is not None})
    return stats


def ingress_reports(contexts: Mapping[Any, Any], now: float, stale_after_s: float) -> dict[str, dict[str, float]]:
    """The contract metrics of every fresh ingress replica, summed per queue
    (counts) or maxed (waits), as {queue: {metric: value}}."""
    totals: dict[str, dict[str, float]] = {}
    for ctx in contexts.values():
        raw = ctx.raw_metrics or {}
        per_replica: dict[Any, dict[tuple[str, str], tuple[float, float]]] = {}
        for key, series_by_replica in raw.items():
            metric, _, queue = key.partition(":")
            if metric not in CONTRACT_METRICS or not queue:
                continue
            for replica, series in series_by_replica.items():
                if series:
                    per_replica.setdefault(replica, {})[metric, queue] = (series[-1].timestamp, series[-1].value)
        for points in per_replica.values():
            if now - max(ts for ts, _ in points.values()) > stale_after_s:
                continue
            for (metric, queue), (_, value) in points.items():
                merged = totals.setdefault(queue, {})
                if metric not in merged:
                    merged[metric] = value
                elif metric.endswith("_s"):  # waits: the worst ingress replica
                    merged[metric] = max(merged[metric], value)
                else:  # counts: each ingress replica has its own queue
                    merged[metric] += value
    return totals
