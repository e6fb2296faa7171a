import asyncio

import pytest

from serve_app.scheduling.admission import AdmissionPolicy, PoolQueue, QueueSnapshot
from serve_app.scheduling.errors import Overloaded, Unavailable
from tests.fakes import ManualClock


def test_policy_refuses_a_full_queue_and_batch_past_its_share():
    policy = AdmissionPolicy(batch_queue_share=0.5)
    assert policy.decide(QueueSnapshot(waiting=1, queue_size=4), "batch").accepted
    assert not policy.decide(QueueSnapshot(waiting=2, queue_size=4), "batch").accepted
    assert policy.decide(QueueSnapshot(waiting=3, queue_size=4), "realtime").accepted
    assert not policy.decide(QueueSnapshot(waiting=4, queue_size=4), "realtime").accepted


async def test_slots_go_to_continuations_then_realtime_then_batch():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=1, clock=ManualClock(100.0))
    held = await queue.acquire("batch")
    assert held.waited_s == 0
    order = []

    async def wait(priority):
        slot = await queue.acquire(priority)
        order.append(priority)
        slot.release()

    tasks = [asyncio.create_task(wait(p)) for p in ("batch", "realtime", "continuation")]
    await asyncio.sleep(0)
    assert queue.stats().waiting == 3
    held.release()
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
    clock = ManualClock(100.0)
    queue = PoolQueue(1, AdmissionPolicy(1.0), slots=1, clock=clock)
    held = await queue.acquire("realtime")  # waited 0
    for wait in (4.2, 6.0):
        waiter = asyncio.create_task(queue.acquire("realtime"))
        await asyncio.sleep(0)
        clock.now += wait
        held.release()
        held = await waiter
        assert held.waited_s == pytest.approx(wait)
    asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        await queue.acquire("realtime")
    assert refused.value.retry_after_s == 5  # ceil of the median wait, 4.2 s
    assert queue.stats().queue_wait_p50_s == pytest.approx(4.2)


async def test_a_waiter_cancelled_as_a_slot_frees_in_the_same_iteration_neither_breaks_nor_leaks():
    """The race of the 504 timeout, a client disconnect or the capacity poll: the
    waiter's future is cancelled, and before its task runs another request
    releases its slot. The release must not raise, and the slot must not leak."""
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=1)
    holder = await queue.acquire("realtime")
    waiter = asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    waiter.cancel()
    holder.release()  # same loop iteration: the cancelled waiter is still in the heap
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert queue.stats().in_flight == 0 and queue.stats().waiting == 0
    late = await asyncio.wait_for(queue.acquire("realtime"), timeout=1)  # the slot is free again
    late.release()
    late.release()  # a second release changes nothing
    assert queue.stats().in_flight == 0


async def test_shortest_predicted_first_with_aging_so_long_ones_are_not_starved():
    clock = ManualClock(100.0)
    queue = PoolQueue(16, AdmissionPolicy(1.0), slots=1, clock=clock, aging_tokens_per_s=10)
    held = await queue.acquire("realtime", 5)
    order = []

    async def wait(name, tokens):
        slot = await queue.acquire("realtime", tokens)
        order.append(name)
        slot.release()

    tasks = [asyncio.create_task(wait("old-long", 300))]
    await asyncio.sleep(0)
    clock.now += 30  # the long one has aged 300 tokens' worth
    tasks += [asyncio.create_task(wait(name, tokens)) for name, tokens in (("mid", 100), ("short", 10), ("late-long", 250))]
    await asyncio.sleep(0)
    held.release()
    await asyncio.gather(*tasks)
    assert order == ["old-long", "short", "mid", "late-long"]


async def test_long_requests_hold_at_most_their_cap_and_short_ones_take_the_reserve():
    queue = PoolQueue(16, AdmissionPolicy(1.0), slots=3, aging_tokens_per_s=0)
    queue.set_slots(3, long_cap=1)
    first_long = await queue.acquire("realtime", 300, long=True)
    second_long = asyncio.create_task(queue.acquire("realtime", 300, long=True))
    await asyncio.sleep(0)
    assert not second_long.done()  # over the long cap, although slots are free
    shorts = [await asyncio.wait_for(queue.acquire("realtime", 10), timeout=1) for _ in range(2)]
    assert queue.stats().in_flight == 3 and queue.stats().long_in_flight == 1
    first_long.release()
    assert (await second_long).long
    for slot in shorts:
        slot.release()


async def test_short_requests_counts_short_ones_in_flight_and_waiting_not_long_ones():
    queue = PoolQueue(16, AdmissionPolicy(1.0), slots=2, aging_tokens_per_s=0)
    held = [await queue.acquire("realtime", 300, long=True), await queue.acquire("realtime", 10)]
    waiting = [asyncio.create_task(queue.acquire("realtime", tokens, long=tokens > 100)) for tokens in (10, 10, 300)]
    await asyncio.sleep(0)
    assert queue.short_requests() == 3  # one in flight, two waiting
    for slot in held:
        slot.release()
    for task in waiting:
        (await task).release()
    assert queue.short_requests() == 0


async def test_a_pool_that_is_down_refuses_at_once_and_releases_its_waiters():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=0)
    waiting = asyncio.create_task(queue.acquire("realtime"))
    await asyncio.sleep(0)
    queue.set_slots(0, down_reason="LLMServer-m-long: replica failed to start (engine refused the config)")
    with pytest.raises(Unavailable, match="failed to start"):
        await waiting
    with pytest.raises(Unavailable, match="failed to start"):
        await queue.acquire("realtime")
    queue.set_slots(2)  # back up
    (await queue.acquire("realtime")).release()


async def test_no_slot_within_the_queue_timeout_is_overloaded_with_retry_after():
    queue = PoolQueue(8, AdmissionPolicy(1.0), slots=0)
    with pytest.raises(Overloaded, match="no slot within 0.05s") as refused:
        await queue.acquire("realtime", timeout_s=0.05)
    assert refused.value.retry_after_s >= 1 and queue.stats().waiting == 0
