"""The queue-duration policy as Ray Serve's application-level autoscaling policy.

The queue lives in the ingress, a different deployment from the pools it
scales, and a pool at zero replicas has no replica to report anything, so only
a policy that sees every deployment's context can read the ingress's stats and
decide for the pools. Ray (2.60) calls it every control-loop tick (0.1 s) with
`{DeploymentID: AutoscalingContext}` of the app's autoscaling deployments and
takes back `({DeploymentID: replicas}, {DeploymentID: state dict})`; a
deployment left out of the first dict keeps its target, the second comes back
as each context's `policy_state` next tick. The ingress's stats arrive as
`ctx.raw_metrics[key][replica]`, the series its replica recorded over its
`look_back_period_s`; the policy reads each ingress replica's newest point and
does its own smoothing (the delays). Ray applies each deployment's own delays
on top of the decision, so governed pools set those to 0, and it calls
`record_autoscaling_stats` only on deployments with an `autoscaling_config`, so
the ingress has one too (both in `serve_app.topology`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

from serve_app.autoscaling.contract import (
    CONTRACT_METRICS,
    DIVERTED,
    IN_FLIGHT,
    OLDEST_WAIT,
    QUEUED,
    SLOTS,
    WAIT_PERCENTILE,
    ingress_reports,
)
from serve_app.autoscaling.policy import Decision, PoolSnapshot, QueueDurationPolicy, ScalingState, split_replicas
from serve_app.config import QueueDurationAppPolicyConfig
from serve_app.logs import logger_for
from serve_app.topology import pool_of

logger = logger_for(__name__)


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
        reports = ingress_reports(contexts, now, self.config.stale_after_s)
        ingresses = {dep for dep, ctx in contexts.items() if any(
            key.partition(":")[0] in CONTRACT_METRICS for key in (ctx.raw_metrics or {}))}
        groups: dict[str, dict[str, Any]] = {}
        for dep, ctx in contexts.items():
            if dep not in ingresses:
                queue, capacity_type = pool_of(ctx.deployment_name)
                groups.setdefault(queue, {})[capacity_type] = dep
        decisions: dict[Any, int] = {}
        states: dict[Any, dict] = {dep: dict(contexts[dep].policy_state) for dep in ingresses}
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
