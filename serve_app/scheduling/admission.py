"""Bounded priority queues in front of each replica pool, and who gets in.

`AdmissionPolicy` decides from a snapshot whether a request may wait for a pool;
`PoolQueue` acts on it: it hands the pool's slots (running replicas x slots per
replica) to waiting requests realtime first, then batch, first come first
served within a class, and measures how long each waited (the autoscaling
signal).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from serve_app.config import Priority
from serve_app.quantile import quantile
from serve_app.scheduling.errors import Overloaded

_RANK = {"continuation": 0, "realtime": 1, "batch": 2}
WAIT_WINDOW_S = 60.0
"""Queue waits older than this drop out of the percentiles."""


@dataclass(frozen=True)
class QueueSnapshot:
    waiting: int
    queue_size: int


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str = ""


class AdmissionPolicy:
    """Full queue: refuse. Batch is admitted only while the queue is below its
    share, so under load batch is refused while realtime still gets in."""

    def __init__(self, batch_queue_share: float) -> None:
        self._batch_share = batch_queue_share

    def decide(self, snapshot: QueueSnapshot, priority: Priority) -> Admission:
        if snapshot.waiting >= snapshot.queue_size:
            return Admission(False, f"queue full ({snapshot.waiting} waiting)")
        batch_limit = max(1, math.floor(self._batch_share * snapshot.queue_size))
        if priority == "batch" and snapshot.waiting >= batch_limit:
            return Admission(False, f"queue past the batch share ({snapshot.waiting} of {batch_limit} waiting)")
        return Admission(True)


@dataclass(frozen=True)
class PoolStats:
    waiting: int
    in_flight: int
    slots: int
    """Requests the pool's running replicas take at once."""
    queue_wait_p50_s: float | None
    queue_wait_p90_s: float | None
    """None when nothing was dispatched in the last `WAIT_WINDOW_S`."""
    oldest_wait_s: float | None = None
    """How long the oldest request still waiting has waited (None: none waits);
    the percentiles above miss requests that never got a slot."""
    diverted: int = 0
    """Requests sent to the model's fallback in the last `WAIT_WINDOW_S` because
    this pool had no replica: demand that should bring it up."""


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future = field(compare=False)
    since: float = field(default=0.0, compare=False)


class PoolQueue:
    def __init__(
        self,
        queue_size: int,
        policy: AdmissionPolicy,
        slots: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queue_size = queue_size
        self._policy = policy
        self._slots = slots
        self._clock = clock
        self._in_flight = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._waits: deque[tuple[float, float]] = deque()
        self._diverted: deque[float] = deque()

    @property
    def slots(self) -> int:
        return self._slots

    def set_slots(self, slots: int) -> None:
        self._slots = max(0, slots)
        self._grant()

    def note_diverted(self) -> None:
        """A request that would have waited here went to the fallback model."""
        self._diverted.append(self._clock())

    async def acquire(self, priority: Priority | Literal["continuation"]) -> float:
        """Wait for a slot; return the seconds waited. A `continuation` (a request
        already admitted elsewhere, moving on) skips admission and goes first.
        Raises `Overloaded` when refused."""
        if priority != "continuation":
            decision = self._policy.decide(self._snapshot(), priority)
            if not decision.accepted:
                raise Overloaded(decision.reason, self.retry_after_s())
        start = self._clock()
        if not self._waiters and self._in_flight < self._slots:
            self._in_flight += 1
        else:
            waiter = _Waiter(_RANK[priority], next(self._seq), asyncio.get_running_loop().create_future(), start)
            heapq.heappush(self._waiters, waiter)
            try:
                await waiter.future
            except asyncio.CancelledError:
                if waiter.future.done() and not waiter.future.cancelled():
                    self.release()  # the slot arrived as we were cancelled
                else:
                    self._waiters.remove(waiter)
                    heapq.heapify(self._waiters)
                raise
        waited = self._clock() - start
        self._waits.append((self._clock(), waited))
        return waited

    def release(self) -> None:
        self._in_flight -= 1
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._in_flight < self._slots:
            waiter = heapq.heappop(self._waiters)
            self._in_flight += 1
            waiter.future.set_result(None)

    def _snapshot(self) -> QueueSnapshot:
        return QueueSnapshot(len(self._waiters), self._queue_size)

    def _recent_waits(self) -> list[float]:
        horizon = self._clock() - WAIT_WINDOW_S
        while self._waits and self._waits[0][0] < horizon:
            self._waits.popleft()
        return [wait for _, wait in self._waits]

    def retry_after_s(self) -> int:
        """A client told to come back should find room: about one median wait."""
        waits = self._recent_waits()
        median = quantile(waits, 0.5) if waits else 1.0
        return min(60, max(1, math.ceil(median)))

    def stats(self) -> PoolStats:
        horizon = self._clock() - WAIT_WINDOW_S
        while self._diverted and self._diverted[0] < horizon:
            self._diverted.popleft()
        waits = self._recent_waits()
        return PoolStats(
            waiting=len(self._waiters),
            in_flight=self._in_flight,
            slots=self._slots,
            queue_wait_p50_s=quantile(waits, 0.5) if waits else None,
            queue_wait_p90_s=quantile(waits, 0.9) if waits else None,
            oldest_wait_s=self._clock() - min(w.since for w in self._waiters) if self._waiters else None,
            diverted=len(self._diverted),
        )
