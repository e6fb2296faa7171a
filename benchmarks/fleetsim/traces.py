"""Production traces as simulator workloads.

`splitwise_requests` reads `../shared/traces/splitwise_conv.csv` (one hour of a
production conversational service: arrival, prompt and output tokens; see its
SOURCE.md). The trace carries no text, so a request's one user turn holds
about four characters per prompt token: the predictor sees the prompt's size
and nothing else, as it would an instruction it never met. Every request asks
the same `max_tokens` (at least the trace's longest output), so none reveals
its length; the trace's output count is how long the answer runs.
"""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.fleetsim.simulate import SimRequest

SPLITWISE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "splitwise_conv.csv"
CHARS_PER_TOKEN = 4


def splitwise_requests(path: Path = SPLITWISE, start_s: float = 0.0, duration_s: float | None = None,
                       max_tokens: int = 1024) -> list[SimRequest]:
    """The trace's requests arriving in [start_s, start_s + duration_s), arrivals from 0."""
    requests = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            at = float(row["arrived_at"])
            if at < start_s or (duration_s is not None and at >= start_s + duration_s):
                continue
            prompt = int(row["num_prefill_tokens"])
            requests.append(SimRequest(prompt, int(row["num_decode_tokens"]), max_tokens,
                                       (("user", "x" * (prompt * CHARS_PER_TOKEN)),), arrival_s=at - start_s))
    return requests
