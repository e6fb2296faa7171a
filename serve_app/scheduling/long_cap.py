"""How many of a pool's slots long requests may hold while short requests are
about: every slot but a reserve sized from the short requests' own measured
demand, within a share that can adapt to the time per output token they see."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.config import LengthSchedulingConfig
from serve_app.quantile import quantile

TPOT_WINDOW = 64
"""Recent short requests whose TPOT the share adapts to."""
DEMAND_WINDOW = 256
"""Recent short arrivals whose demand the reserve follows."""
SHRINK = 0.8
"""Multiplier on the share while short TPOT is over target."""
GROW = 0.05
"""Added to the share while short TPOT is under `RELAX` x target."""
RELAX = 0.8
SHORT_DEMAND_WINDOW_S = 10.0
"""Without a short request for this long, long ones may hold every slot: a
reserve nobody uses would only cost throughput."""


@dataclass(frozen=True)
class LongCapDecision:
    share: float
    """The long share in force (`long_slot_share`, or where it adapted to)."""
    reserve: int
    """Slots kept for short requests, from their measured demand."""
    cap: int
    reason: str


class LongCapPolicy:
    """Per pool: short-request arrivals (with the demand each found) and TPOTs
    in, the long requests' slot cap out.

    While no short request has arrived for `SHORT_DEMAND_WINDOW_S` the cap is
    every slot. Otherwise the cap keeps a reserve for short requests: the
    `short_reserve_quantile` of how many short requests were in flight or
    waiting when each recent one arrived, itself included. Poisson arrivals see
    the time average, so this is that quantile of the short requests' own
    concurrency (Little's law, measured): it grows with their rate and latency
    and costs long requests nothing when they are few. The cap also stays
    within a share of the slots: `long_slot_share` without a TPOT target; with
    one the share shrinks multiplicatively while the recent short TPOT p90 is
    over target and grows additively while it is well under. Never below
    `min_long_slot_share` of the slots, and at least one slot while the pool
    has any, so long requests always progress."""

    def __init__(self, config: LengthSchedulingConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._share = config.long_slot_share
        self._tpots: deque[float] = deque(maxlen=TPOT_WINDOW)
        self._demand: deque[int] = deque(maxlen=DEMAND_WINDOW)
        self._demand_reserve = 0
        """The reserve the recent demand asks for, computed once per short arrival."""
        self._last_short: float | None = None
        self._reserve_in_force: int | None = None
        """The measured reserve of the last decision; None: no short requests were about."""

    def note_short(self, demand: int) -> None:
        """A short request arrived and found `demand` short requests in flight or
        waiting, itself included."""
        self._last_short = self._clock()
        self._demand.append(demand)
        if self._config.short_reserve_quantile is not None:
            self._demand_reserve = math.ceil(quantile(self._demand, self._config.short_reserve_quantile))

    def short_demand(self) -> bool:
        """A short request arrived within `SHORT_DEMAND_WINDOW_S`."""
        return self._last_short is not None and self._clock() - self._last_short <= SHORT_DEMAND_WINDOW_S

    def stale(self) -> bool:
        """Short demand began, ended or changed the reserve since the last
        decision: decide again now rather than at the next capacity read."""
        return self._measured_reserve() != self._reserve_in_force

    def observe_short_tpot(self, tpot_s: float) -> None:
        self._tpots.append(tpot_s)

    def _measured_reserve(self) -> int | None:
        return self._demand_reserve if self.short_demand() else None

    def decide(self, slots: int) -> LongCapDecision:
        config, target = self._config, self._config.short_tpot_target_s
        reserve = self._reserve_in_force = self._measured_reserve()
        if reserve is None:
            return LongCapDecision(1.0, 0, slots, "no short requests lately: no reserve")
        reason = f"{reserve} slots kept for short requests"
        if target is not None and self._tpots:
            p90 = quantile(self._tpots, 0.9)
            if p90 > target:
                self._share = max(config.min_long_slot_share, self._share * SHRINK)
                reason += f"; short TPOT p90 {p90:.3f}s over {target}s"
            elif p90 < RELAX * target:
                self._share = min(config.long_slot_share, self._share + GROW)
                reason += f"; short TPOT p90 {p90:.3f}s under {target}s"
            else:
                reason += f"; short TPOT p90 {p90:.3f}s near {target}s"
        floor = max(1, math.floor(config.min_long_slot_share * slots))
        cap = min(slots, max(floor, min(math.floor(self._share * slots), slots - reserve))) if slots else 0
        return LongCapDecision(self._share, reserve, cap, reason)
