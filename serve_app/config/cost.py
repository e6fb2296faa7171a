"""Prices per instance type and what share of an instance each model's replicas take."""

from __future__ import annotations

from pydantic import Field, model_validator

from serve_app.config.base import StrictModel


class InstancePrice(StrictModel):
    """Hourly prices and size of one instance type."""

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


class ReplicaShape(StrictModel):
    """What one replica of a pool occupies."""

    instance_type: str
    """Instance type the replica runs on (a key of `PriceTable.instances`)."""
    gpus_per_replica: float | None = Field(default=None, gt=0)
    """GPUs one replica uses (its `num_gpus` x tensor-parallel size): a fraction
    for replicas sharing a GPU, more than the instance has for multi-node ones.
    None: by `vcpus_per_replica`, else the whole instance."""
    vcpus_per_replica: float | None = Field(default=None, gt=0)
    """vCPUs one CPU replica uses (its `num_cpus`), when `gpus_per_replica` is None."""


class PriceTable(StrictModel):
    """Instance prices and the instance share of each model's (or pool's) replicas."""

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

    def instance_hourly_usd(self, instance_type: str, spot: bool) -> float:
        instance = self.instances[instance_type]
        return instance.spot_hourly_usd if spot else instance.on_demand_hourly_usd

    def replica_hourly_usd(self, model: str, pool: str, spot: bool) -> float:
        shape = self.shape(model, pool)
        return self.instance_share(shape) * self.instance_hourly_usd(shape.instance_type, spot)
