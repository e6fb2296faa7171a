import asyncio

import pytest

from serve_app.scheduling.admission import AdmissionPolicy, PoolQueue, QueueSnapshot
from serve_app.scheduling.errors import Overloaded as QueueFull


def test_policy_refuses_a_full_queue_and_batch_past_its_share():
    policy = AdmissionPolicy(batch_queue_share=0.5)
    assert policy.decide(QueueSnapshot(waiting=1, queue_size=4), "batch").accepted
    assert not policy.decide(QueueSnapshot(waiting=2, queue_size=4), "batch").accepted
    assert policy.decide(QueueSnapshot(waiting=3, queue_size=4), "realtime").accepted
    assert not policy.decide(QueueSnapshot(waiting=4, queue_size=4), "realtime").accepted


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_slots_go_to_continuations_then_realtime_then_batch():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=1, clock=Clock())
    assert await queue.acquire("batch") == 0
    order = []

    async def wait(priority):
        await queue.acquire(priority)
        order.append(priority)
        queue.release()

    tasks = [asyncio.create_task(wait(p)) for p in ("batch", "realtime", "continuation")]
    await asyncio.sleep(0)
    assert queue.stats().waiting == 3
    queue.release()
    await asyncio.gather(*tasks)
    assert order == ["continuation", "realtime", "batch"]


async def test_zero_capacity_holds_requests_until_replicas_arrive():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=0)
    waiter = asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    assert not waiter.done() and queue.stats().waiting == 1
    queue.set_slots(2)
    await waiter
    assert queue.stats().in_flight == 1


async def test_a_cancelled_waiter_leaves_the_queue_and_frees_nothing_it_did_not_get():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=1)
    await queue.acquire("realtime")
    waiter = asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert queue.stats().waiting == 0 and queue.stats().in_flight == 1


async def test_refusals_carry_retry_after_from_recent_waits():
    clock = Clock()
    queue = PoolQueue(1, AdmissionPolicy(1.0), slots=1, clock=clock)
    await queue.acquire("realtime")  # waited 0
    for wait in (4.2, 6.0):
        waiter = asyncio.create_task(queue.acquire("realtime"))
        await asyncio.sleep(0)
        clock.now += wait
        queue.release()
        assert await waiter == pytest.approx(wait)
    asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as refused:
        await queue.acquire("realtime")
    assert refused.value.retry_after_s == 5  # ceil of the median wait, 4.2 s
    assert queue.stats().queue_wait_p50_s == pytest.approx(4.2)
