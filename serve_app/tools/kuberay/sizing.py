"""What the Serve replicas need against what the worker groups offer.

`replica_placements` reads each deployment's Serve options from the app's
`Topology` (the ones the builder passes to `Deployment.options`) and turns them
into per-node resource demands with label selectors. `node_types` reads what
each group's pods offer back from the RayService, as KubeRay starts Ray there.
`unplaceable` names demands no group can host, `group_sizes` bin-packs the
replicas at min and at max scale onto their groups, and `spot_drain_problems`
names Spot-capable deployments that need longer to stop than the Spot drain.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from serve_app.capacity import MARKET_TYPE_LABEL, SPOT
from serve_app.capacity.split import ReplicaBounds
from serve_app.config import AppConfig
from serve_app.tools.kuberay.spec import HEAD_GROUP
from serve_app.topology import INGRESS_DEPLOYMENT, Topology

NODE_GROUP_LABEL = "ray.io/node-group"
"""Ray default label: KubeRay sets RAY_NODE_TYPE_NAME to the group name."""
OBJECT_STORE_SHARE = 0.3
"""Share of a node's memory Ray keeps for its object store (not schedulable)."""
SERVE_REPLICA_NUM_CPUS = 1.0
"""`num_cpus` Serve gives a replica actor whose `ray_actor_options` set none
(Ray 2.60 `ReplicaConfig._validate_ray_actor_options`; no public constant)."""
SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
"""Serve's default `graceful_shutdown_timeout_s` (Ray 2.60
`DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S`; the public `DeploymentSchema` leaves it unset)."""


@dataclass(frozen=True)
class Demand:
    """Resources and label selector of one part of a replica that lands on one node."""

    resources: dict[str, float]
    selector: dict[str, str]


@dataclass(frozen=True)
class ReplicaPlacement:
    """How one deployment's replicas are placed, and how many there are."""

    app: str
    """Serve application name."""
    deployment: str
    demands: tuple[Demand, ...]
    """One per node a replica occupies: the actor alone, all bundles of a
    STRICT_PACK placement group together, or each bundle of another strategy."""
    fallbacks: tuple[dict[str, str], ...]
    """Alternative label selectors (`fallback_strategy`), tried in order."""
    min_replicas: int
    """Autoscaling `min_replicas`, or the fixed `num_replicas`."""
    max_replicas: int
    """Autoscaling `max_replicas`, or the fixed `num_replicas`."""
    graceful_shutdown_timeout_s: float
    """Time a stopping replica gets for in-flight requests."""


@dataclass(frozen=True)
class NodeType:
    """Ray resources and labels of one group's pods."""

    group: str
    resources: dict[str, float]
    labels: dict[str, str]


def replica_placements(config: AppConfig, app: str = "default") -> list[ReplicaPlacement]:
    """Every deployment of one application: its LLM pools, then the ingress."""
    topology = Topology(config)
    options = [(deployment.name, deployment.options) for deployment in topology.deployments]
    options.append((INGRESS_DEPLOYMENT, topology.ingress_options()))
    return [placement(app, name, deployment_options) for name, deployment_options in options]


def placement(app: str, deployment: str, options: dict[str, Any]) -> ReplicaPlacement:
    """The placement of a deployment from its `Deployment.options(...)` keywords."""
    bundles = options.get("placement_group_bundles")
    actor = options.get("ray_actor_options") or {}
    if bundles:
        strategy = options.get("placement_group_strategy") or "PACK"
        if strategy == "STRICT_SPREAD" or options.get("placement_group_fallback_strategy"):
            raise ValueError(f"{deployment}: STRICT_SPREAD and placement-group fallbacks are not sized here")
        selectors = options.get("placement_group_bundle_label_selector") or [{}]
        if len(selectors) == 1:
            selectors = selectors * len(bundles)  # Serve gives a single selector to every bundle
        demands = [Demand(_nonzero(b), dict(s)) for b, s in zip(bundles, selectors, strict=True)]
        if strategy == "STRICT_PACK":
            demands = [_together(demands)]
        fallbacks: list[dict[str, str]] = []
    else:
        demands = [Demand(_nonzero(actor_resources(actor)), dict(actor.get("label_selector") or {}))]
        fallbacks = [dict(entry.get("label_selector") or {}) for entry in actor.get("fallback_strategy") or []]
    bounds = ReplicaBounds.from_serve_options(options)
    graceful = options.get("graceful_shutdown_timeout_s", SERVE_GRACEFUL_SHUTDOWN_TIMEOUT_S)
    return ReplicaPlacement(app, deployment, tuple(demands), tuple(fallbacks), bounds.min_replicas,
                            bounds.max_replicas, float(graceful))


def actor_resources(actor: dict[str, Any]) -> dict[str, float]:
    """Ray resources of a replica actor, as Ray derives them from its options."""
    resources = {key: float(value) for key, value in (actor.get("resources") or {}).items()}
    num_cpus = actor.get("num_cpus")
    resources["CPU"] = float(SERVE_REPLICA_NUM_CPUS if num_cpus is None else num_cpus)
    resources["GPU"] = float(actor.get("num_gpus") or 0)
    resources["memory"] = float(actor.get("memory") or 0)
    if actor.get("accelerator_type"):
        resources[f"accelerator_type:{actor['accelerator_type']}"] = 0.001
    return resources


def node_types(rayservice: dict[str, Any]) -> list[NodeType]:
    """What each group of a RayService manifest offers to Ray, head first."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    groups = [(HEAD_GROUP, cluster["headGroupSpec"])]
    groups += [(group["groupName"], group) for group in cluster.get("workerGroupSpecs", [])]
    return [NodeType(name, _ray_resources(spec), {NODE_GROUP_LABEL: name, **spec.get("labels", {})})
            for name, spec in groups]


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Ray label-selector semantics: `value`, `!value`, `in(a,b)`, `!in(a,b)`."""
    for key, expression in selector.items():
        negated = expression.startswith("!")
        body = expression[1:] if negated else expression
        allowed = {v.strip() for v in body[3:-1].split(",")} if body.startswith("in(") else {body}
        if (labels.get(key) in allowed) == negated:
            return False
    return True


def hosts(demand: Demand, nodes: list[NodeType]) -> list[NodeType]:
    """The node types whose labels and resources can take this demand."""
    return [node for node in nodes if selector_matches(demand.selector, node.labels)
            and _fits(demand.resources, node.resources)]


def _options(placement: ReplicaPlacement, demand: Demand) -> list[tuple[str, Demand]]:
    """The demand at its own selector, then at each fallback's, with a note saying which."""
    return [("", demand)] + [(f" (fallback {fallback})", Demand(demand.resources, fallback))
                             for fallback in placement.fallbacks]


def hosting_groups(placement: ReplicaPlacement, nodes: list[NodeType]) -> set[str]:
    """Every group a replica of the deployment may land on, fallbacks included."""
    return {node.group for demand in placement.demands for _, option in _options(placement, demand)
            for node in hosts(option, nodes)}


def unplaceable(placements: list[ReplicaPlacement], nodes: list[NodeType]) -> list[str]:
    """One line per demand (primary or fallback) that no node type can host."""
    return [f"{placement.deployment}: no group offers {option.resources} with labels {option.selector}{note}"
            for placement in placements for demand in placement.demands
            for note, option in _options(placement, demand) if not hosts(option, nodes)]


def group_sizes(placements: list[ReplicaPlacement], nodes: list[NodeType]) -> dict[str, tuple[int, int]]:
    """(min, max) pods per group: the replicas counted there, first-fit packed.

    A demand is counted on its home: the host with the fewest GPUs, then the one
    listed first. Min counts each deployment's min replicas at their primary
    selector; max also counts its max replicas at each fallback's home.
    """
    at_min: dict[str, list[dict[str, float]]] = defaultdict(list)
    at_max: dict[str, list[dict[str, float]]] = defaultdict(list)
    for placement in placements:
        for demand in placement.demands:
            for note, option in _options(placement, demand):
                candidates = hosts(option, nodes)
                if not candidates:
                    continue  # reported by unplaceable()
                home = min(candidates, key=lambda node: (node.resources.get("GPU", 0), nodes.index(node)))
                if not note:  # the primary selector
                    at_min[home.group] += [option.resources] * placement.min_replicas
                at_max[home.group] += [option.resources] * placement.max_replicas
    return {node.group: (_pods(at_min[node.group], node.resources), _pods(at_max[node.group], node.resources))
            for node in nodes}


def spot_drain_problems(placements: list[ReplicaPlacement], nodes: list[NodeType], drain_s: float) -> list[str]:
    """Deployments that may run on Spot but need longer than the drain to shut down."""
    spot = [node for node in nodes if node.labels.get(MARKET_TYPE_LABEL) == SPOT]
    return [f"{p.deployment}: graceful_shutdown_timeout_s {p.graceful_shutdown_timeout_s:g} > Spot drain {drain_s:g} s"
            for p in placements
            if p.graceful_shutdown_timeout_s > drain_s and any(hosts(d, spot) for d in p.demands)]


def _nonzero(resources: dict[str, float]) -> dict[str, float]:
    return {key: float(value) for key, value in resources.items() if value}


def _together(demands: list[Demand]) -> Demand:
    total: dict[str, float] = defaultdict(float)
    selector: dict[str, str] = {}
    for demand in demands:
        for key, value in demand.resources.items():
            total[key] += value
        selector.update(demand.selector)
    return Demand(dict(total), selector)


def _fits(need: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(key, 0) >= value for key, value in need.items())


def _pods(items: list[dict[str, float]], capacity: dict[str, float]) -> int:
    bins: list[dict[str, float]] = []
    for item in sorted(items, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), reverse=True):
        room = next((b for b in bins if _fits(item, b)), None)
        if room is None:
            room = dict(capacity)
            bins.append(room)
        for key, value in item.items():
            room[key] = room.get(key, 0) - value
    return len(bins)


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _quantity(value: Any) -> float:
    number, suffix = _QUANTITY.match(str(value)).groups()  # type: ignore[union-attr]
    return float(number) * _SUFFIX[suffix]


def _ray_resources(group: dict[str, Any]) -> dict[str, float]:
    """As KubeRay starts Ray: container limits, then rayStartParams, then `resources`."""
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    resources = {
        "CPU": _quantity(limits.get("cpu", 0)),
        "GPU": _quantity(limits.get("nvidia.com/gpu", 0)),
        "memory": _quantity(limits.get("memory", 0)) * (1 - OBJECT_STORE_SHARE),
    }
    params = group.get("rayStartParams", {})
    for param, key in (("num-cpus", "CPU"), ("num-gpus", "GPU")):
        if param in params:
            resources[key] = float(params[param])
    resources.update({key: _quantity(value) for key, value in group.get("resources", {}).items()})
    return _nonzero(resources)
