"""Every pool's bounded queue, with its long-request cap under length-aware scheduling.

One `PoolQueue` per (model, pool) and, where the model schedules by length, one
`LongCapPolicy` deciding how many of the pool's slots long requests may hold.
The ingress's capacity poll sets each pool's slots; a request's arrival may
re-decide the cap at once. No Ray, no HTTP.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from serve_app.config import AppConfig
from serve_app.scheduling.admission import AdmissionPolicy, PoolQueue, PoolStats
from serve_app.scheduling.long_cap import LongCapPolicy
from serve_app.scheduling.types import RequestRecord

PoolKey = tuple[str, str]
"""(model, pool)."""


class PoolQueues:
    def __init__(self, config: AppConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._models = config.model_by_name()
        policy = AdmissionPolicy(config.ingress.priorities.batch_queue_share)
        self.queues: dict[PoolKey, PoolQueue] = {}
        self.long_caps: dict[PoolKey, LongCapPolicy] = {}
        self._slots: dict[PoolKey, tuple[int, str | None]] = {}
        for model in config.models:
            scheduling = model.length_scheduling
            for pool in model.pools:
                aging = scheduling.aging_tokens_per_s if scheduling.enabled else None
                self.queues[(model.name, pool.name)] = PoolQueue(pool.queue_size, policy, 0, clock, aging)
                if scheduling.enabled:
                    self.long_caps[(model.name, pool.name)] = LongCapPolicy(scheduling, clock)

    def set_slots(self, model: str, pool: str, slots: int, down_reason: str | None = None) -> None:
        """Requests the pool may run at once (its running replicas' slots), and
        why it has none and none starting, if so."""
        self._slots[(model, pool)] = (slots, down_reason)
        long_cap = self.long_caps.get((model, pool))
        cap = long_cap.decide(slots).cap if long_cap is not None else None
        self.queues[(model, pool)].set_slots(slots, cap, down_reason)

    def note_arrival(self, model: str, pool: str, long: bool) -> None:
        """A request arrived: when short demand began, ended or changed the
        reserve with it, decide the long cap at once, not at the next capacity read."""
        long_cap = self.long_caps.get((model, pool))
        if long_cap is None:
            return
        if not long:
            long_cap.note_short(self.queues[(model, pool)].short_requests() + 1)
        if long_cap.stale():
            self.set_slots(model, pool, *self._slots.get((model, pool), (0, None)))

    def set_ingress_replicas(self, count: int) -> None:
        """Each of `count` ingress replicas queues its share of each pool's `queue_size`."""
        for (model, pool), queue in self.queues.items():
            queue.set_queue_size(math.ceil(self._models[model].pool(pool).queue_size / count))

    def has_slots(self, model: str) -> bool:
        """Whether any pool of the model has a slot (a running replica) now."""
        return any(queue.slots for (name, _), queue in self.queues.items() if name == model)

    def observe_finished(self, record: RequestRecord) -> None:
        """A short request's decode speed, for an adaptive long cap."""
        long_cap = self.long_caps.get((record.model, record.pool))
        if long_cap is not None and not record.long and record.ttft_s is not None and record.output_tokens > 1:
            long_cap.observe_short_tpot((record.latency_s - record.ttft_s) / (record.output_tokens - 1))

    def stats(self) -> dict[PoolKey, PoolStats]:
        return {key: queue.stats() for key, queue in self.queues.items()}
