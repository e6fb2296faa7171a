"""Queue-duration autoscaling: the router's queue stats, the policy, and its Ray adapter.

The router (ingress) holds one queue per pool and reports, through Serve's
`record_autoscaling_stats()`, how long requests wait there (`autoscaling_stats`
writes the keys: `<metric>:<queue>`, the queue named by the pool's deployment
name without a capacity suffix). `QueueDurationPolicy` turns one pool's
snapshot into a replica count, with hysteresis, step limits, scale from zero on
queued demand and to zero after idling; it holds when the stats are missing.

`QueueDurationAppPolicy` (entered through `RayAppPolicy`) runs it as Ray's
*application-level* policy (Serve config `applications[].autoscaling_policy`):
the queue lives in the router, a different deployment from the pools it scales,
and a pool at zero replicas has no replica to report anything, so only a policy
that sees every deployment's context can read the router's stats and decide
for the pools. Ray (2.60) calls it every control-loop tick (0.1 s) with
`{DeploymentID: AutoscalingContext}` of the app's autoscaling deployments and
takes back `({DeploymentID: replicas}, {DeploymentID: state dict})`; a
deployment left out of the first dict keeps its target, the second comes back
as each context's `policy_state` next tick. The router's stats arrive as
`ctx.raw_metrics[key][replica]`, the series its replica recorded over its
`look_back_period_s` (pushed every `metrics_interval_s`); the policy reads each
router replica's newest point and does its own smoothing (the delays).
Ray applies each deployment's own `upscale_delay_s` / `downscale_delay_s` on top
of the decision, so pools governed here set those to 0
(`pool_autoscaling_config`); and it calls `record_autoscaling_stats` only on
deployments with an `autoscaling_config`, so the router needs one too
(`router_autoscaling_config`).
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

logger = logging.getLogger("ray.serve")

APP_POLICY = "serve_app.autoscaling:RayAppPolicy"
"""`policy_function` of the Serve config's `autoscaling_policy`."""

QUEUED = "queued"
IN_FLIGHT = "in_flight"
DIVERTED = "diverted"
SLOTS = "slots"
OLDEST_WAIT = "oldest_wait_s"
WAIT_PERCENTILE = {"p50": "queue_wait_p50_s", "p90": "queue_wait_p90_s"}
CONTRACT_METRICS = (QUEUED, IN_FLIGHT, DIVERTED, SLOTS, OLDEST_WAIT, *WAIT_PERCENTILE.values())
"""Metric names the router reports per queue, as `<metric>:<queue>`."""

CAPACITY_SUFFIXES = {"-spot": "spot", "-ondemand": "on-demand"}
"""Deployment-name suffixes of a split pool's sides; the queue is the name
without them (mirrors `serve_app.config.pool_deployment_name`)."""


def metric_key(metric: str, queue: str) -> str:
    return f"{metric}:{queue}"


@dataclass(frozen=True)
class PoolQueueStats:
    """What the router knows about one pool's queue right now."""

    queued: int
    """Requests waiting in the router for this pool."""
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
    """The router's `record_autoscaling_stats()` result: queue name -> stats as flat keys."""
    stats: dict[str, float] = {}
    for queue, pool in per_pool.items():
        values = {QUEUED: pool.queued, IN_FLIGHT: pool.in_flight, DIVERTED: pool.diverted,
                  SLOTS: pool.slots, OLDEST_WAIT: pool.oldest_wait_s,
                  WAIT_PERCENTILE["p50"]: pool.wait_p50_s, WAIT_PERCENTILE["p90"]: pool.wait_p90_s}
        stats.update({metric_key(name, queue): float(v) for name, v in values.items() if v is not None})
    return stats


def queue_of(deployment_name: str) -> tuple[str, str]:
    """(queue name, capacity type) of a pool deployment; `any` for an unsplit pool."""
    for suffix, capacity_type in CAPACITY_SUFFIXES.items():
        if deployment_name.endswith(suffix):
            return deployment_name[: -len(suffix)], capacity_type
    return deployment_name, "any"


class QueueDurationAutoscaling(BaseModel):
    """How one pool follows the time its requests wait in the router's queue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_queue_wait_s: float = Field(default=2.0, gt=0)
    """Queue wait the pool is sized for; sustained waits above it add replicas."""
    percentile: Literal["p50", "p90"] = "p90"
    """Which percentile of recent waits is the signal (raised to the oldest
    waiting request's age when that is longer)."""
    upscale_delay_s: float = Field(default=30.0, ge=0)
    """The signal must stay above target this long before replicas are added,
    so a one-sample spike never scales."""
    downscale_delay_s: float = Field(default=300.0, ge=0)
    """The signal must stay at or below target, with the load fitting in fewer
    replicas, this long before replicas are removed."""
    max_step_up: int = Field(default=2, gt=0)
    """Most replicas added by one decision."""
    max_step_down: int = Field(default=1, gt=0)
    """Most replicas removed by one decision (idle-to-zero excepted)."""
    downscale_max_utilization: float = Field(default=0.8, gt=0, le=1)
    """Replicas are removed only down to a count whose slots the current load
    (queued + in flight) fills at most this much, so the smaller pool is not
    full at once."""
    min_replicas: int = Field(default=0, ge=0)
    """Fewest replicas (the deployment's own `min_replicas` also applies)."""
    max_replicas: int | None = Field(default=None, gt=0)
    """Most replicas; None: the deployment's `max_replicas` alone."""
    scale_from_zero_delay_s: float = Field(default=10.0, ge=0)
    """At zero replicas, demand (queued or diverted requests) must last this long
    before one replica starts; brief blips stay with the fallback model."""
    idle_to_zero_delay_s: float | None = Field(default=600.0, ge=0)
    """With nothing queued, in flight or diverted for this long the pool goes to
    zero (if `min_replicas` is 0). None: never to zero."""

    @model_validator(mode="after")
    def _bounds(self) -> QueueDurationAutoscaling:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        return self


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool at one control-loop tick (a split pool: both sides together)."""

    now: float
    replicas: int
    """Replicas asked for (Serve's target)."""
    running: int
    """Replicas running now (fewer while some start)."""
    signal_s: float | None
    """The queue-wait signal; None when the router's stats are missing."""
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
            return Decision(n, "hold: no queue metrics from the router", None)
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
    order = sorted(sides, key=lambda side: side != "on-demand")
    counts, left = {}, total
    for index, side in enumerate(order):
        low, high = sides[side]
        share = left if index == len(order) - 1 else math.ceil(round(total * high / capacity, 9))
        counts[side] = min(high, max(low, share, 0))
        left -= counts[side]
    for side in order:  # overflow of a capped side
        extra = min(left, sides[side][1] - counts[side])
        counts[side] += max(0, extra)
        left -= max(0, extra)
    return counts


class QueueDurationAppPolicyConfig(BaseModel):
    """`policy_kwargs` of the application-level policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: QueueDurationAutoscaling = Field(default_factory=QueueDurationAutoscaling)
    """Settings of every pool."""
    pools: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Overrides of `default` by queue name (the pool's deployment name without
    a capacity suffix), e.g. a longer target wait for a batch-heavy pool."""
    stale_after_s: float = Field(default=60.0, gt=0)
    """A router replica whose newest report is older than this is ignored; with
    none left the pools hold (their metrics are missing)."""

    @model_validator(mode="after")
    def _overrides_valid(self) -> QueueDurationAppPolicyConfig:
        for queue in self.pools:
            self.for_queue(queue)
        return self

    def for_queue(self, queue: str) -> QueueDurationAutoscaling:
        return QueueDurationAutoscaling.model_validate({**self.default.model_dump(), **self.pools.get(queue, {})})


def pool_autoscaling_config(min_replicas: int, max_replicas: int, initial_replicas: int | None = None) -> dict:
    """Serve `autoscaling_config` of a pool run by `QueueDurationAppPolicy`: Ray's
    own delays are zero, since Ray would apply them on top of the policy's."""
    config = {"min_replicas": min_replicas, "max_replicas": max_replicas, "upscale_delay_s": 0.0,
              "downscale_delay_s": 0.0, "downscale_to_zero_delay_s": 0.0}
    return config if initial_replicas is None else {**config, "initial_replicas": initial_replicas}


def router_autoscaling_config(num_replicas: int, report_interval_s: float = 2.0) -> dict:
    """Serve `autoscaling_config` of the router: a fixed count (Serve calls
    `record_autoscaling_stats` only on autoscaling deployments), reporting every
    `report_interval_s`."""
    return {"min_replicas": num_replicas, "max_replicas": num_replicas,
            "metrics_interval_s": report_interval_s, "look_back_period_s": 5 * report_interval_s}


class DecisionExporter:
    """Logs decisions when they change and sets the two autoscaling gauges (made
    on first use, in the controller's process)."""

    def __init__(self) -> None:
        self._gauges = None

    def export(self, deployment: str, decision: Decision, changed: bool) -> None:
        if changed:
            logger.info("autoscaling %s -> %d replicas (%s)", deployment, decision.replicas, decision.reason)
        if self._gauges is None:
            from ray.util.metrics import Gauge

            self._gauges = (
                Gauge("serve_app_autoscaling_decision_replicas", "Replicas the queue-duration policy asks for.",
                      tag_keys=("deployment",)),
                Gauge("serve_app_autoscaling_signal_seconds", "Queue-wait signal behind the decision.",
                      tag_keys=("deployment",)),
            )
        replicas, signal = self._gauges
        replicas.set(decision.replicas, tags={"deployment": deployment})
        if decision.signal_s is not None:
            signal.set(decision.signal_s, tags={"deployment": deployment})


def router_reports(contexts: Mapping[Any, Any], now: float, stale_after_s: float) -> dict[str, dict[str, float]]:
    """The contract metrics of every fresh router replica, summed per queue
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
                elif metric.endswith("_s"):  # waits: the worst router replica
                    merged[metric] = max(merged[metric], value)
                else:  # counts: each router replica has its own queue
                    merged[metric] += value
    return totals


class QueueDurationAppPolicy:
    """Ray application-level autoscaling policy over every pool of the app.

    Serve config: `autoscaling_policy: {policy_function: APP_POLICY (its shim `RayAppPolicy`),
    policy_kwargs: <QueueDurationAppPolicyConfig>}`. Ray makes one instance per
    application (in the controller) and calls it every control-loop tick.
    """

    def __init__(self, exporter: DecisionExporter | None = None, **policy_kwargs: Any) -> None:
        self.config = QueueDurationAppPolicyConfig.model_validate(policy_kwargs)
        self._exporter = exporter or DecisionExporter()

    def __call__(self, contexts: Mapping[Any, Any]) -> tuple[dict[Any, int], dict[Any, dict]]:
        now = max(ctx.current_time for ctx in contexts.values()) if contexts else 0.0
        reports = router_reports(contexts, now, self.config.stale_after_s)
        routers = {dep for dep, ctx in contexts.items() if any(
            key.partition(":")[0] in CONTRACT_METRICS for key in (ctx.raw_metrics or {}))}
        groups: dict[str, dict[str, Any]] = {}
        for dep, ctx in contexts.items():
            if dep not in routers:
                queue, capacity_type = queue_of(ctx.deployment_name)
                groups.setdefault(queue, {})[capacity_type] = dep
        decisions: dict[Any, int] = {}
        states: dict[Any, dict] = {dep: dict(contexts[dep].policy_state) for dep in routers}
        for queue, members in groups.items():
            decisions_for, state = self._decide_pool(queue, members, contexts, reports.get(queue), now)
            decisions.update(decisions_for)
            states.update({dep: state for dep in members.values()})
        return decisions, states

    def _decide_pool(self, queue: str, members: dict[str, Any], contexts: Mapping[Any, Any],
                     report: dict[str, float] | None, now: float) -> tuple[dict[Any, int], dict]:
        ctxs = {side: contexts[dep] for side, dep in members.items()}
        cfg = self.config.for_queue(queue)
        ray_min = sum(ctx.capacity_adjusted_min_replicas for ctx in ctxs.values())
        ray_max = sum(ctx.capacity_adjusted_max_replicas for ctx in ctxs.values())
        cfg = cfg.model_copy(update={"min_replicas": max(cfg.min_replicas, ray_min),
                                     "max_replicas": min(cfg.max_replicas or ray_max, ray_max)})
        previous = next(iter(ctxs.values())).policy_state
        snapshot = PoolSnapshot(
            now=now,
            replicas=sum(ctx.target_num_replicas for ctx in ctxs.values()),
            running=sum(ctx.current_num_replicas for ctx in ctxs.values()),
            signal_s=None if report is None else max(
                report.get(WAIT_PERCENTILE[cfg.percentile], 0.0), report.get(OLDEST_WAIT, 0.0)),
            queued=int((report or {}).get(QUEUED, 0)),
            in_flight=int((report or {}).get(IN_FLIGHT, 0)),
            diverted=int((report or {}).get(DIVERTED, 0)),
            slots=int(report[SLOTS]) if report and SLOTS in report else None,
        )
        decision = QueueDurationPolicy(cfg).decide(snapshot, ScalingState.from_dict(previous))
        if report is None:  # hold: no decision, so Ray keeps each target as it is
            targets = {side: ctx.target_num_replicas for side, ctx in ctxs.items()}
        elif len(ctxs) == 1:
            targets = {side: decision.replicas for side in ctxs}
        else:
            bounds = {side: (ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas)
                      for side, ctx in ctxs.items()}
            targets = split_replicas(decision.replicas, bounds)
        kind = decision.reason.split(":")[0]
        for side, ctx in ctxs.items():
            changed = targets[side] != ctx.target_num_replicas or kind != previous.get("reason")
            self._exporter.export(ctx.deployment_name, replace(decision, replicas=targets[side]), changed)
        state = {**asdict(decision.state), "reason": kind}
        if report is None:
            return {}, state
        return {members[side]: count for side, count in targets.items()}, state


class RayAppPolicy:
    """The class the Serve config names (`APP_POLICY`), a shim over `QueueDurationAppPolicy`.

    Serve cloudpickles the module of `policy_function` by value, and pydantic
    models rebuilt that way fail in the controller (Ray 2.60, pydantic 2:
    `SchemaError` on unpickling). So this class refers to nothing else in the
    module and imports the policy by name when the controller instantiates it.
    """

    def __init__(self, **policy_kwargs: Any) -> None:
        module = importlib.import_module("serve_app.autoscaling")
        self._policy = module.QueueDurationAppPolicy(**policy_kwargs)

    def __call__(self, contexts):
        return self._policy(contexts)
