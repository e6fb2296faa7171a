"""Length-aware scheduling inside a pool: who gets the next slot, and how many
slots long requests may hold."""

from __future__ import annotations

from pydantic import Field, model_validator

from serve_app.config.base import StrictModel


class LengthSchedulingConfig(StrictModel):
    """Shortest predicted output first, with aging, a cap on long requests and the
    length class in the engine's priority. Off: first come first served (realtime
    before batch either way)."""

    enabled: bool = True
    """Order and cap by predicted length. Off: the baseline without length awareness."""
    long_tokens: int = Field(default=128, gt=0)
    """Predicted output tokens from which a request counts as long (capped, and
    behind short ones in the engine's queue)."""
    aging_tokens_per_s: float = Field(default=8.0, ge=0)
    """A waiting request's predicted length counts this many tokens shorter per
    second it has waited, so long requests are never starved by short ones."""
    long_slot_share: float = Field(default=1.0, gt=0, le=1)
    """Most of a pool's slots long requests may hold while short requests are
    about (the ceiling when the share adapts, `short_tpot_target_s`)."""
    short_reserve_quantile: float | None = Field(default=0.95, gt=0, le=1)
    """Slots long requests leave to short ones while short requests are about:
    this quantile of how many short requests were in flight or waiting when
    each recent short one arrived, itself included (their measured concurrency),
    so short requests do not wait for a slot behind long ones. None: no
    measured reserve, only `long_slot_share`."""
    min_long_slot_share: float = Field(default=0.25, gt=0, le=1)
    """Floor of the long requests' share, whatever the reserve or the TPOT say."""
    short_tpot_target_s: float | None = Field(default=None, gt=0)
    """Time per output token short requests should see. Set: the long share
    adapts between `min_long_slot_share` and `long_slot_share`, shrinking while
    short requests' recent TPOT p90 is above the target and growing while it is
    below. None: the long share stays at `long_slot_share`."""

    @property
    def long_edge(self) -> int | None:
        """Output tokens from which a request counts as long; None with length awareness off."""
        return self.long_tokens if self.enabled else None

    @model_validator(mode="after")
    def _shares_ordered(self) -> LengthSchedulingConfig:
        if self.min_long_slot_share > self.long_slot_share:
            raise ValueError("min_long_slot_share must not exceed long_slot_share")
        return self
