"""Prices with their provenance, and what share of an instance each model's replicas take.

`PriceBook` is the schema of the price data file: every on-demand and Spot
price carries its region, date and source. The built-in book is
`serve_app/cost/prices.yaml`; the cost package loads it and lays a config's own
`PriceTable.instances` over it (`serve_app.cost.prices.Prices.resolve`), so
nothing here reads files or imports the rest of the project.
"""

from __future__ import annotations

import datetime
from typing import Annotated

from pydantic import BeforeValidator, Field

from serve_app.config.base import StrictModel

AsOf = Annotated[
    str,
    BeforeValidator(lambda value: value.isoformat() if isinstance(value, datetime.date) else value),
    Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$"),
]
"""A price's date: YYYY-MM-DD when read from an API, YYYY-MM when written down by
hand (a YAML date is taken as its ISO text)."""


class PriceQuote(StrictModel):
    """One hourly price and where it came from."""

    hourly_usd: float = Field(gt=0)
    """Price per instance-hour, USD."""
    region: str = Field(min_length=1)
    """AWS region the price holds in (e.g. us-east-1)."""
    as_of: AsOf
    """When it was read (YYYY-MM-DD) or written down by hand (YYYY-MM)."""
    source: str = Field(min_length=1)
    """Where it came from: the API call that returned it, or "hand-written list price, not fetched"."""


class InstancePrice(StrictModel):
    """One instance type: its size and its on-demand and Spot prices."""

    gpus: int = Field(ge=0)
    """GPUs per instance (0: a CPU instance)."""
    vcpus: int = Field(gt=0)
    """vCPUs per instance."""
    on_demand: PriceQuote
    """On-demand price."""
    spot: PriceQuote
    """Spot price (it moves; the planner adds preemption overhead)."""


class HostedModelPrice(StrictModel):
    """A hosted model API's list price, to set self-hosted cost per token beside."""

    usd_per_1m_output_tokens: float = Field(gt=0)
    """Price per million output tokens, USD."""
    usd_per_1m_input_tokens: float = Field(gt=0)
    """Price per million input (prompt) tokens, USD."""
    as_of: AsOf
    """When the price was read or written down."""
    source: str = Field(min_length=1)
    """Where it came from."""


class PriceBook(StrictModel):
    """The price data file: instance prices and hosted-model prices by name."""

    instances: dict[str, InstancePrice]
    """Instance types by name."""
    hosted_models: dict[str, HostedModelPrice] = Field(default_factory=dict)
    """Hosted model APIs by name, for comparison only."""


class ReplicaShape(StrictModel):
    """What one replica of a pool occupies."""

    instance_type: str
    """Instance type the replica runs on (in the price book or `PriceTable.instances`)."""
    gpus_per_replica: float | None = Field(default=None, gt=0)
    """GPUs one replica uses (its `num_gpus` x tensor-parallel size): a fraction
    for replicas sharing a GPU, more than the instance has for multi-node ones.
    None: by `vcpus_per_replica`, else the whole instance."""
    vcpus_per_replica: float | None = Field(default=None, gt=0)
    """vCPUs one CPU replica uses (its `num_cpus`), when `gpus_per_replica` is None."""


class PriceTable(StrictModel):
    """A config's cost section: each model's (or pool's) replica shape, and
    instance prices that add to or replace the built-in price book's."""

    instances: dict[str, InstancePrice] = Field(default_factory=dict)
    """Instance types laid over the built-in price book (same name: this one wins)."""
    replicas: dict[str, ReplicaShape] = Field(default_factory=dict)
    """Replica shape by `model/pool`, or by `model` for all its pools."""

    def shape(self, model: str, pool: str) -> ReplicaShape:
        """The shape of `model/pool`'s replicas: its pool entry, else its model's."""
        shape = self.replicas.get(f"{model}/{pool}") or self.replicas.get(model)
        if shape is None:
            raise KeyError(f"no price for {model}/{pool}: add replicas.{model} to the price table")
        return shape
