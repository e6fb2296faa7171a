"""How many of a pool's slots long requests may hold: a share that applies while
short requests are about and adapts to the time per output token they see."""

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
    cap: int
    reason: str


class LongCapPolicy:
    """Per pool: short-request arrivals and TPOTs in, the long requests' slot cap out.

    While no short request has arrived for `SHORT_DEMAND_WINDOW_S` the cap is
    every slot. Otherwise, without a TPOT target the share is `long_slot_share`. With one it
    shrinks multiplicatively while the recent short TPOT p90 is over target
    (never below `min_long_slot_share`) and grows additively while it is well
    under (never above `long_slot_share`). The cap is at least one slot while
    the pool has any, so long requests always progress."""

    def __init__(self, config: LengthSchedulingConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._share = config.long_slot_share
        self._tpots: deque[float] = deque(maxlen=TPOT_WINDOW)
        self._last_short: float | None = None
        self._reserve_in_force = False
        """Whether the last decision kept a reserve (short requests were about)."""

    def note_short(self) -> None:
        """A short request arrived: the reserve applies."""
        self._last_short = self._clock()

    def short_demand(self) -> bool:
        """A short request arrived within `SHORT_DEMAND_WINDOW_S`."""
        return self._last_short is not None and self._clock() - self._last_short <= SHORT_DEMAND_WINDOW_S

    def stale(self) -> bool:
        """Short demand began or ended since the last decision: decide again now
        rather than at the next capacity read."""
        return self.short_demand() != self._reserve_in_force

    def observe_short_tpot(self, tpot_s: float) -> None:
        self._tpots.append(tpot_s)

    def decide(self, slots: int) -> LongCapDecision:
        config, target = self._config, self._config.short_tpot_target_s
        self._reserve_in_force = self.short_demand()
        if not self._reserve_in_force:
            return LongCapDecision(1.0, slots, "no short requests lately: no reserve")
        reason = "fixed share"
        if target is not None and self._tpots:
            p90 = quantile(self._tpots, 0.9)
            if p90 > target:
                self._share = max(config.min_long_slot_share, self._share * SHRINK)
                reason = f"short TPOT p90 {p90:.3f}s over {target}s"
            elif p90 < RELAX * target:
                self._share = min(config.long_slot_share, self._share + GROW)
                reason = f"short TPOT p90 {p90:.3f}s under {target}s"
            else:
                reason = f"short TPOT p90 {p90:.3f}s near {target}s"
        cap = min(slots, max(1, math.floor(self._share * slots))) if slots else 0
        return LongCapDecision(self._share, cap, reason)
