"""Prices and the cost meter: replica uptime by capacity type, attributed to requests by tokens.

`PriceTable` says what one replica of a pool costs per hour on each capacity
type (its instance's price times the replica's share of the instance).
`CostMeter` is fed replica counts and finished requests and reports totals, cost
per 1k requests and per 1M output tokens, by model, pool and capacity type.

Attribution: between two samples each replica group (model, pool, capacity type)
costs `replicas x hourly price x seconds / 3600`. That interval's cost goes to
the requests the group finished in it, split by the tokens each processed
(prompt tokens weighted by `prompt_token_weight`); an interval in which the
group finished nothing is idle cost, reported on its own line, never spread
silently over later requests. `cost_per_1k_requests_usd` is all-in (idle included).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

SPOT = "spot"
"""The one capacity type priced at the Spot rate; `on-demand` and `any`
(unpinned pools) are priced on-demand."""

ReplicaGroup = tuple[str, str, str]
"""(model, pool, capacity type)."""


class InstancePrice(BaseModel):
    """Hourly prices and size of one instance type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_demand_hourly_usd: float = Field(gt=0)
    """On-demand price per instance-hour."""
    spot_hourly_usd: float = Field(gt=0)
    """Spot price per instance-hour (it moves; the planner adds preemption overhead)."""
    gpus: int = Field(ge=0)
    """GPUs per instance (0: a CPU instance)."""
    vcpus: int = Field(gt=0)
    """vCPUs per instance."""


# us-east-1 Linux list prices, written down by hand (2025-2026, p5 after AWS's
# June 2025 price cut), NOT fetched: update them. Spot prices move daily; these
# are indicative snapshots.
DEFAULT_INSTANCES: dict[str, InstancePrice] = {
    "g5.2xlarge": InstancePrice(on_demand_hourly_usd=1.212, spot_hourly_usd=0.485, gpus=1, vcpus=8),  # 1x A10G
    "g6e.xlarge": InstancePrice(on_demand_hourly_usd=1.861, spot_hourly_usd=0.82, gpus=1, vcpus=4),  # 1x L40S
    "p5.48xlarge": InstancePrice(on_demand_hourly_usd=55.04, spot_hourly_usd=26.0, gpus=8, vcpus=192),  # 8x H100
    "m7i.2xlarge": InstancePrice(on_demand_hourly_usd=0.4032, spot_hourly_usd=0.17, gpus=0, vcpus=8),  # tiny tier, head
}


class ReplicaShape(BaseModel):
    """What one replica of a pool occupies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_type: str
    """Instance type the replica runs on (a key of `PriceTable.instances`)."""
    gpus_per_replica: float | None = Field(default=None, gt=0)
    """GPUs one replica uses (its `num_gpus` x tensor-parallel size): a fraction
    for replicas sharing a GPU, more than the instance has for multi-node ones.
    None: by `vcpus_per_replica`, else the whole instance."""
    vcpus_per_replica: float | None = Field(default=None, gt=0)
    """vCPUs one CPU replica uses (its `num_cpus`), when `gpus_per_replica` is None."""


class PriceTable(BaseModel):
    """Instance prices and the instance share of each model's (or pool's) replicas."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instances: dict[str, InstancePrice] = Field(default_factory=lambda: dict(DEFAULT_INSTANCES))
    """Instance types by name."""
    replicas: dict[str, ReplicaShape] = Field(default_factory=dict)
    """Replica shape by `model/pool`, or by `model` for all its pools."""

    @model_validator(mode="after")
    def _shapes_fit(self) -> PriceTable:
        for key, shape in self.replicas.items():
            instance = self.instances.get(shape.instance_type)
            if instance is None:
                raise ValueError(f"replicas.{key}: unknown instance type {shape.instance_type!r}")
            if shape.gpus_per_replica is not None and instance.gpus == 0:
                raise ValueError(f"replicas.{key}: {shape.instance_type} has no GPU")
        return self

    def shape(self, model: str, pool: str) -> ReplicaShape:
        shape = self.replicas.get(f"{model}/{pool}") or self.replicas.get(model)
        if shape is None:
            raise KeyError(f"no price for {model}/{pool}: add replicas.{model} to the price table")
        return shape

    def instance_share(self, shape: ReplicaShape) -> float:
        """Instances one replica occupies (a fraction when replicas share one)."""
        instance = self.instances[shape.instance_type]
        if shape.gpus_per_replica is not None:
            return shape.gpus_per_replica / instance.gpus
        if shape.vcpus_per_replica is not None:
            return shape.vcpus_per_replica / instance.vcpus
        return 1.0

    def instance_hourly_usd(self, instance_type: str, capacity_type: str) -> float:
        instance = self.instances[instance_type]
        return instance.spot_hourly_usd if capacity_type == SPOT else instance.on_demand_hourly_usd

    def replica_hourly_usd(self, model: str, pool: str, capacity_type: str) -> float:
        shape = self.shape(model, pool)
        return self.instance_share(shape) * self.instance_hourly_usd(shape.instance_type, capacity_type)


@dataclass
class _Tally:
    replica_seconds: float = 0.0
    cost_usd: float = 0.0
    idle_usd: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: _Tally) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        per_1k = 1000 * self.cost_usd / self.requests if self.requests else None
        per_1m = 1e6 * self.cost_usd / self.output_tokens if self.output_tokens else None
        return {
            "replica_hours": round(self.replica_seconds / 3600, 6),
            "cost_usd": round(self.cost_usd, 6),
            "attributed_usd": round(self.cost_usd - self.idle_usd, 6),
            "idle_usd": round(self.idle_usd, 6),
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cost_per_1k_requests_usd": None if per_1k is None else round(per_1k, 6),
            "cost_per_1m_output_tokens_usd": None if per_1m is None else round(per_1m, 6),
        }


class CostMeter:
    """Meters replica uptime and attributes it to requests. Time comes in with
    each call (`now`, seconds), so it runs the same under a simulated clock."""

    def __init__(self, prices: PriceTable, start: float, prompt_token_weight: float = 1.0) -> None:
        self._prices = prices
        self._prompt_weight = prompt_token_weight
        self._start = self._last = start
        self._replicas: dict[ReplicaGroup, int] = {}
        self._tallies: dict[ReplicaGroup, _Tally] = defaultdict(_Tally)
        self._open_tokens: dict[ReplicaGroup, float] = defaultdict(float)
        self._token_rate: dict[ReplicaGroup, float] = {}

    def sample(self, now: float, replicas: Mapping[ReplicaGroup, int]) -> None:
        """Replicas per group from `now` on (groups left out: none); charges the
        interval since the last sample at the previous counts."""
        elapsed = max(0.0, now - self._last)
        for group in set(self._replicas) | set(self._open_tokens):
            count = self._replicas.get(group, 0)
            cost = count * self._prices.replica_hourly_usd(*group) * elapsed / 3600 if count else 0.0
            tally = self._tallies[group]
            tally.replica_seconds += count * elapsed
            tally.cost_usd += cost
            tokens = self._open_tokens.pop(group, 0.0)
            if tokens:
                self._token_rate[group] = cost / tokens
            else:
                tally.idle_usd += cost
        self._replicas = {group: count for group, count in replicas.items() if count > 0}
        self._last = max(self._last, now)

    def record(self, model: str, pool: str, capacity_type: str, prompt_tokens: int, output_tokens: int,
               requests: int = 1) -> None:
        """Finished request(s) served by that group (several at once: totals)."""
        group = (model, pool, capacity_type)
        tally = self._tallies[group]
        tally.requests += requests
        tally.prompt_tokens += prompt_tokens
        tally.output_tokens += output_tokens
        self._open_tokens[group] += self._prompt_weight * prompt_tokens + output_tokens

    def request_cost_usd(self, model: str, pool: str, capacity_type: str, prompt_tokens: int,
                         output_tokens: int) -> float | None:
        """One request's cost at its group's last closed interval's rate (None before one)."""
        rate = self._token_rate.get((model, pool, capacity_type))
        return None if rate is None else rate * (self._prompt_weight * prompt_tokens + output_tokens)

    def report(self, now: float) -> dict[str, Any]:
        """Totals and breakdowns since `start` (what `/v1/cost` returns); charges
        up to `now` first, keeping the current replica counts."""
        self.sample(now, self._replicas)
        rollups: dict[str, dict[str, _Tally]] = {"model": {}, "pool": {}, "capacity_type": {}}
        total = _Tally()
        for (model, pool, capacity_type), tally in sorted(self._tallies.items()):
            total.add(tally)
            for name, key in (("model", model), ("pool", f"{model}/{pool}"), ("capacity_type", capacity_type)):
                rollups[name].setdefault(key, _Tally()).add(tally)
        return {
            "window_s": round(now - self._start, 3),
            **total.as_dict(),
            "replica_hours_by_capacity_type": {
                key: round(tally.replica_seconds / 3600, 6) for key, tally in rollups["capacity_type"].items()
            },
            **{f"by_{name}": {key: tally.as_dict() for key, tally in tallies.items()}
               for name, tallies in rollups.items()},
            "groups": [{"model": model, "pool": pool, "capacity_type": capacity_type, **tally.as_dict()}
                       for (model, pool, capacity_type), tally in sorted(self._tallies.items())],
            "attribution": "interval cost split over the tokens each replica group finished in it; "
                           "intervals with none are idle",
        }
