"""The cost meter: replica uptime by capacity type, attributed to requests by tokens.

A `PriceTable` (`serve_app.config.cost`), laid over the built-in price book
(`serve_app.cost.prices`), says what one replica of a pool costs per hour on
each capacity type. `CostMeter` is fed replica counts and finished requests and
reports totals, cost per 1k requests and per 1M output tokens, by model, pool
and capacity type, with the date and source of every price it used.

Attribution: between two samples each replica group (model, pool, capacity type)
costs `replicas x hourly price x seconds / 3600`. That interval's cost goes to
the requests the group finished in it, split by the tokens each processed
(prompt tokens weighted by `prompt_token_weight`); an interval in which the
group finished nothing is idle cost, reported on its own line, never spread
silently over later requests. `cost_per_1k_requests_usd` is all-in (idle included).
`report(now)` only reads: the interval since the last sample is shown
provisionally (at the current counts, idle unless the group finished requests
in it) and charged for real by the next `sample`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from serve_app.capacity import SPOT
from serve_app.config.cost import PriceTable
from serve_app.cost.prices import Prices

ReplicaGroup = tuple[str, str, str]
"""(model, pool, capacity type)."""


@dataclass
class _Tally:
    replica_seconds: float = 0.0
    cost_usd: float = 0.0
    idle_usd: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0

    def charge(self, replica_seconds: float, cost_usd: float, idle: bool) -> None:
        self.replica_seconds += replica_seconds
        self.cost_usd += cost_usd
        if idle:
            self.idle_usd += cost_usd

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
        self._prices = Prices.resolve(prices)
        self._prompt_weight = prompt_token_weight
        self._start = self._last = start
        self._replicas: dict[ReplicaGroup, int] = {}
        self._tallies: dict[ReplicaGroup, _Tally] = defaultdict(_Tally)
        self._open_tokens: dict[ReplicaGroup, float] = defaultdict(float)
        self._token_rate: dict[ReplicaGroup, float] = {}

    def _open_interval(self, now: float) -> Iterator[tuple[ReplicaGroup, float, float]]:
        """(group, replica-seconds, cost) of each group since the last sample, at its current count."""
        elapsed = max(0.0, now - self._last)
        for group in set(self._replicas) | set(self._open_tokens):
            count = self._replicas.get(group, 0)
            model, pool, capacity_type = group
            hourly = self._prices.replica_hourly_usd(model, pool, capacity_type == SPOT)
            yield group, count * elapsed, count * hourly * elapsed / 3600

    def sample(self, now: float, replicas: Mapping[ReplicaGroup, int]) -> None:
        """Replicas per group from `now` on (groups left out: none); charges the
        interval since the last sample at the previous counts."""
        for group, replica_seconds, cost in list(self._open_interval(now)):
            tokens = self._open_tokens.pop(group, 0.0)
            self._tallies[group].charge(replica_seconds, cost, idle=not tokens)
            if tokens:
                self._token_rate[group] = cost / tokens
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
        """Totals and breakdowns since `start` (what `/v1/cost` returns), the open
        interval up to `now` included provisionally; changes nothing."""
        current = {group: replace(tally) for group, tally in self._tallies.items()}
        for group, replica_seconds, cost in self._open_interval(now):
            current.setdefault(group, _Tally()).charge(replica_seconds, cost, idle=not self._open_tokens.get(group))
        rollups: dict[str, dict[str, _Tally]] = {"model": {}, "pool": {}, "capacity_type": {}}
        total = _Tally()
        for (model, pool, capacity_type), tally in sorted(current.items()):
            total.add(tally)
            for name, key in (("model", model), ("pool", f"{model}/{pool}"), ("capacity_type", capacity_type)):
                rollups[name].setdefault(key, _Tally()).add(tally)
        return {
            "window_s": round(now - self._start, 3),
            "provisional_s": round(max(0.0, now - self._last), 3),
            **total.as_dict(),
            "replica_hours_by_capacity_type": {
                key: round(tally.replica_seconds / 3600, 6) for key, tally in rollups["capacity_type"].items()
            },
            **{f"by_{name}": {key: tally.as_dict() for key, tally in tallies.items()}
               for name, tallies in rollups.items()},
            "groups": [{"model": model, "pool": pool, "capacity_type": capacity_type, **tally.as_dict()}
                       for (model, pool, capacity_type), tally in sorted(current.items())],
            "attribution": "interval cost split over the tokens each replica group finished in it; "
                           "intervals with none are idle; the last `provisional_s` seconds are not closed yet",
            "prices": self._prices.provenance(
                (self._prices.table.shape(model, pool).instance_type, capacity_type == SPOT)
                for model, pool, capacity_type in current),
        }
