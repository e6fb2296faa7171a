"""Bounded priority queues in front of each replica pool, and who gets in.

`AdmissionPolicy` decides from a snapshot whether a request may wait for a pool;
`PoolQueue` acts on it: it hands the pool's slots (running replicas x slots per
replica) to waiting requests, continuations first, then realtime, then batch.
Within a class the order is by `Waiter.order_key`: the predicted length plus
aging (shortest first, long ones never starved) under length-aware scheduling,
arrival otherwise. Long requests hold at most `long_cap` slots; the rest is a
reserve only short ones take. It measures how long each request waited (the
autoscaling signal).
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
from serve_app.scheduling.errors import Overloaded, Unavailable

Rank = Priority | Literal["continuation"]
_RANK: dict[str, int] = {"continuation": 0, "realtime": 1, "batch": 2}
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
    long_in_flight: int
    slots: int
    """Requests the pool's running replicas take at once."""
    long_cap: int
    """Of those, most that long requests may hold."""
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
    order_key: float
    seq: int
    future: asyncio.Future = field(compare=False)
    since: float = field(default=0.0, compare=False)
    long: bool = field(default=False, compare=False)


class Slot:
    """One granted slot; `release()` once (later calls do nothing)."""

    def __init__(self, queue: PoolQueue, long: bool, waited_s: float) -> None:
        self._queue, self.long, self.waited_s = queue, long, waited_s
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue._free(self.long)

    def count_as_long(self) -> bool:
        """The request was admitted as short and ran past the long edge: from now on
        it holds one of the long requests' capped slots, so the cap and the short
        requests' measured demand see it as what it is. Returns `long` (True)."""
        if not self.long and not self._released:
            self.long = True
            self._queue._long_in_flight += 1
        return self.long


class PoolQueue:
    def __init__(
        self,
        queue_size: int,
        policy: AdmissionPolicy,
        slots: int = 1,
        clock: Callable[[], float] = time.monotonic,
        aging_tokens_per_s: float | None = None,
    ) -> None:
        self._queue_size = queue_size
        self._policy = policy
        self._slots = slots
        self._long_cap = slots
        self._clock = clock
        self._aging = aging_tokens_per_s
        """None: first come first served within a class."""
        self._down_reason: str | None = None
        self._in_flight = 0
        self._long_in_flight = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        self._waits: deque[tuple[float, float]] = deque()
        self._diverted: deque[float] = deque()

    @property
    def slots(self) -> int:
        return self._slots

    def set_slots(self, slots: int, long_cap: int | None = None, down_reason: str | None = None) -> None:
        """The pool's slots now, how many long requests may hold (default: all),
        and, with no slot, why no replica is running or starting (None: one is
        starting, or may start on demand); while down, new requests are refused."""
        self._slots = max(0, slots)
        self._long_cap = self._slots if long_cap is None else max(0, min(long_cap, self._slots))
        self._down_reason = down_reason if self._slots == 0 else None
        if self._down_reason is not None:
            down = Unavailable(self._down_reason, retry_after_s=self.retry_after_s())
            for waiter in self._waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(down)
            self._waiters.clear()
        self._grant()

    def set_queue_size(self, queue_size: int) -> None:
        self._queue_size = max(1, queue_size)

    def note_diverted(self) -> None:
        """A request that would have waited here went to the fallback model."""
        self._diverted.append(self._clock())

    async def acquire(self, rank: Rank, predicted_tokens: int = 0, long: bool = False,
                      timeout_s: float | None = None) -> Slot:
        """Wait for a slot. A `continuation` (a request already admitted elsewhere,
        moving on) skips admission and goes first. Raises `Overloaded` when
        refused or when no slot came within `timeout_s`, `Unavailable` when the
        pool is down."""
        if self._down_reason is not None:
            raise Unavailable(self._down_reason, retry_after_s=self.retry_after_s())
        if rank != "continuation":
            decision = self._policy.decide(QueueSnapshot(len(self._waiters), self._queue_size), rank)
            if not decision.accepted:
                raise Overloaded(decision.reason, self.retry_after_s())
        start = self._clock()
        if not self._waiters and self._fits(long):
            self._take(long)
        else:
            key = seq = next(self._seq)
            if self._aging is not None:
                key = predicted_tokens + self._aging * start
            waiter = _Waiter(_RANK[rank], key, seq, asyncio.get_running_loop().create_future(), start, long)
            heapq.heappush(self._waiters, waiter)
            self._grant()  # a slot may be free that only long waiters ahead could not take
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter.future
            except (asyncio.CancelledError, TimeoutError) as exc:
                if waiter.future.done() and not waiter.future.cancelled():
                    self._free(long)  # the slot arrived as we gave up
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                    heapq.heapify(self._waiters)
                if isinstance(exc, TimeoutError):
                    raise Overloaded(f"no slot within {timeout_s:g}s", self.retry_after_s()) from None
                raise
        waited = self._clock() - start
        self._waits.append((self._clock(), waited))
        return Slot(self, long, waited)

    def short_requests(self) -> int:
        """Short requests in flight or waiting for a slot."""
        waiting = sum(1 for w in self._waiters if not w.long and not w.future.done())
        return self._in_flight - self._long_in_flight + waiting

    def _fits(self, long: bool) -> bool:
        return self._in_flight < self._slots and (not long or self._long_in_flight < self._long_cap)

    def _take(self, long: bool) -> None:
        self._in_flight += 1
        self._long_in_flight += long

    def _free(self, long: bool) -> None:
        self._in_flight -= 1
        self._long_in_flight -= long
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiters in order; long ones over the cap wait while
        short ones behind them go. A waiter that gave up this same loop
        iteration (its future cancelled, not yet out of the heap) is dropped."""
        held_back = []
        while self._waiters and self._in_flight < self._slots:
            waiter = heapq.heappop(self._waiters)
            if waiter.future.done():
                continue
            if not self._fits(waiter.long):
                held_back.append(waiter)
                continue
            self._take(waiter.long)
            waiter.future.set_result(None)
        for waiter in held_back:
            heapq.heappush(self._waiters, waiter)

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
        waiting = [w for w in self._waiters if not w.future.done()]
        return PoolStats(
            waiting=len(waiting),
            in_flight=self._in_flight,
            long_in_flight=self._long_in_flight,
            slots=self._slots,
            long_cap=self._long_cap,
            queue_wait_p50_s=quantile(waits, 0.5) if waits else None,
            queue_wait_p90_s=quantile(waits, 0.9) if waits else None,
            oldest_wait_s=self._clock() - min(w.since for w in waiting) if waiting else None,
            diverted=len(self._diverted),
        )
