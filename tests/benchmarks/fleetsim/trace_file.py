"""A small Splitwise-shaped trace for the projections' end-to-end tests (no `../shared` needed)."""

from __future__ import annotations

import random
from pathlib import Path


def write_trace(path: Path, count: int, every_s: float, outputs: list[int], seed: int = 0) -> Path:
    """`count` requests `every_s` apart, prompts of 50-1500 tokens, answers drawn from `outputs`."""
    rng = random.Random(seed)
    rows = [f"{i * every_s:.3f},{rng.randint(50, 1500)},{rng.choice(outputs)}" for i in range(count)]
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    return path
