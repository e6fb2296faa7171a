"""Where each pool runs: (model, pool, capacity type) -> Serve deployment name, options, slots.

Built once from an `AppConfig`. The app builder makes one deployment per
`PoolDeployment`; the ingress routes to them and counts their slots; the
autoscaling policy, which runs in Serve's controller with only deployment
names to go on, maps a name back to its pool with `pool_of`; the KubeRay
generator sizes worker groups from the same options.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serve_app.capacity import ANY_CAPACITY, ON_DEMAND, SPOT
from serve_app.capacity.split import CapacitySplit
from serve_app.config import AppConfig, ModelConfig, PoolConfig

INGRESS_DEPLOYMENT = "OpenAIIngress"
"""Serve deployment name of the ingress."""

REQUEST_ROUTER_CONFIG = {
    "request_router_class": "deployments.request_router:LeastLoadedRequestRouter",
    "request_routing_stats_period_s": 1.0,
}
"""`request_router_config` of pools that set none: replicas chosen by load."""

SERVE_HEADROOM = 0.25
"""Serve's own `max_ongoing_requests` on a pool replica is its slots plus this
share: the ingress already admits no more than the slots, and at stream
boundaries Serve may still count a finished stream, so a limit equal to the
slots made it reject and back off (25-500 ms) requests the ingress had admitted."""

VLLM_ENV = {"VLLM_CONFIGURE_LOGGING": "0"}
"""Environment of every deployment that loads vLLM (the ingress runs its OpenAI
layer, the replicas its engine) unless a config sets it: vLLM's own logging
setup (`dictConfig`) closes every handler in the process, Serve's replica log
among them, which then stayed empty. Unconfigured, vLLM logs through the
worker's root logger instead."""
REPLICA_ENV = {"RAY_worker_niceness": "0", **VLLM_ENV}
"""Environment of LLM replicas unless a config sets these: Ray nices its workers
to 15, and the engine processes a replica starts inherit it; `vllm serve` runs
at 0, so a replica competing with Ray's own processes for CPU ran slower."""

_SUFFIX = {ANY_CAPACITY: "", SPOT: "-spot", ON_DEMAND: "-ondemand"}


def deployment_name(model: str, pool: str, capacity_type: str = ANY_CAPACITY) -> str:
    """The Serve deployment running one pool of a model on one capacity type."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in model)
    return f"LLMServer-{safe}-{pool}{_SUFFIX[capacity_type]}"


def pool_of(name: str) -> tuple[str, str]:
    """(queue name, capacity type) of a pool deployment's name: the queue is the
    name without its capacity suffix (`deployment_name(model, pool)`)."""
    for capacity_type, suffix in _SUFFIX.items():
        if suffix and name.endswith(suffix):
            return name[: -len(suffix)], capacity_type
    return name, ANY_CAPACITY


def pool_autoscaling_config(min_replicas: int, max_replicas: int, initial_replicas: int | None = None) -> dict:
    """Serve `autoscaling_config` of a pool run by the queue-duration policy: Ray's
    own delays are zero, since Ray would apply them on top of the policy's."""
    config = {"min_replicas": min_replicas, "max_replicas": max_replicas, "upscale_delay_s": 0.0,
              "downscale_delay_s": 0.0, "downscale_to_zero_delay_s": 0.0}
    return config if initial_replicas is None else {**config, "initial_replicas": initial_replicas}


def ingress_autoscaling_config(num_replicas: int, report_interval_s: float = 2.0) -> dict:
    """Serve `autoscaling_config` of the ingress under the queue-duration policy:
    a fixed count (Serve calls `record_autoscaling_stats` only on autoscaling
    deployments), reporting every `report_interval_s`."""
    return {"min_replicas": num_replicas, "max_replicas": num_replicas,
            "metrics_interval_s": report_interval_s, "look_back_period_s": 5 * report_interval_s}


@dataclass(frozen=True)
class PoolDeployment:
    """One Serve deployment of a pool."""

    model: str
    pool: str
    capacity_type: str
    name: str
    options: dict[str, Any]
    """Keyword arguments for `Deployment.options(...)` (name excluded)."""
    slots_per_replica: int
    """Requests one replica runs at once (the ingress's admission unit): its
    `max_ongoing_requests`, at most the engine's `max_num_seqs`."""


class Topology:
    """Every pool deployment of an app, built once from its config."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config
        self.deployments = [
            deployment
            for model in config.models
            for pool in model.pools
            for deployment in self._pool_deployments(model, pool)
        ]
        self._by_pool: dict[tuple[str, str], dict[str, PoolDeployment]] = {}
        for deployment in self.deployments:
            self._by_pool.setdefault((deployment.model, deployment.pool), {})[deployment.capacity_type] = deployment

    def pool(self, model: str, pool: str) -> dict[str, PoolDeployment]:
        """A pool's deployments by capacity type."""
        return self._by_pool[(model, pool)]

    def pools(self) -> list[tuple[str, str]]:
        return list(self._by_pool)

    def ingress_options(self) -> dict[str, Any]:
        """Serve options of the ingress deployment."""
        options = self.config.ingress.deployment.serve_options()
        actor = options["ray_actor_options"] = dict(options.get("ray_actor_options") or {})
        runtime_env = actor["runtime_env"] = dict(actor.get("runtime_env") or {})
        runtime_env["env_vars"] = {**VLLM_ENV, **(runtime_env.get("env_vars") or {})}
        if self.config.queue_autoscaling and "num_replicas" in options:
            options["autoscaling_config"] = ingress_autoscaling_config(options.pop("num_replicas"))
        return options

    def _pool_deployments(self, model: ModelConfig, pool: PoolConfig) -> list[PoolDeployment]:
        deployment = model.pool_deployment(pool)
        # More slots than the engine runs at once would queue requests inside it,
        # where the ingress cannot see or order them and their wait runs the attempt's clock.
        slots = min(deployment.max_ongoing_requests, model.pool_engine(pool).max_num_seqs)
        options = {"request_router_config": REQUEST_ROUTER_CONFIG, **deployment.serve_options()}
        options["max_ongoing_requests"] = math.ceil(slots * (1 + SERVE_HEADROOM))
        actor = options["ray_actor_options"] = dict(options.get("ray_actor_options") or {})
        runtime_env = actor["runtime_env"] = dict(actor.get("runtime_env") or {})
        runtime_env["env_vars"] = {**REPLICA_ENV, **(runtime_env.get("env_vars") or {})}
        scaling = options.get("autoscaling_config")
        if self.config.queue_autoscaling and scaling is not None:
            options["autoscaling_config"] = pool_autoscaling_config(
                scaling.get("min_replicas", 1), scaling.get("max_replicas", 1), scaling.get("initial_replicas")
            )
        if pool.spot_share is None:
            sides = {ANY_CAPACITY: options}
        else:
            sides = CapacitySplit(pool.spot_share).serve_options(options)
            if SPOT in sides:
                # Serve stops a replica on a draining node this long before the
                # deadline, then lets it finish: give it the whole notice window.
                preemption = self.config.preemption
                sides[SPOT]["graceful_shutdown_timeout_s"] = preemption.notice_window_s - preemption.drain_margin_s
        return [
            PoolDeployment(model.name, pool.name, side, deployment_name(model.name, pool.name, side), side_options,
                           slots)
            for side, side_options in sides.items()
        ]
