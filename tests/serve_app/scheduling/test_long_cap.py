from serve_app.config import LengthSchedulingConfig
from serve_app.scheduling.long_cap import DEMAND_WINDOW, SHORT_DEMAND_WINDOW_S, LongCapPolicy
from tests.fakes import ManualClock

FIXED_SHARE = {"short_reserve_quantile": None}
"""The share alone, without the measured reserve."""


def with_shorts(config: LengthSchedulingConfig, *demands: int) -> LongCapPolicy:
    policy = LongCapPolicy(config, ManualClock(1000.0))
    for demand in demands or (1,):
        policy.note_short(demand)
    return policy


def test_fixed_share_without_a_target_and_at_least_one_slot():
    policy = with_shorts(LengthSchedulingConfig(long_slot_share=0.5, **FIXED_SHARE))
    assert policy.decide(10).cap == 5 and policy.decide(1).cap == 1 and policy.decide(0).cap == 0


def test_the_reserve_is_the_quantile_of_the_demand_short_arrivals_found():
    policy = with_shorts(LengthSchedulingConfig(short_reserve_quantile=0.9), *range(1, 11))  # found 1..10
    decision = policy.decide(32)
    assert decision.reserve == 10 and decision.cap == 22  # ceil(9.1)
    policy = with_shorts(LengthSchedulingConfig(), *[1] * 50, 2)  # one short request at a time, once two
    assert policy.decide(32).cap == 31


def test_the_reserve_follows_recent_demand_only():
    policy = with_shorts(LengthSchedulingConfig(), *[12] * DEMAND_WINDOW)
    assert policy.decide(32).cap == 20
    for _ in range(DEMAND_WINDOW):
        policy.note_short(2)
    assert policy.decide(32).cap == 30


def test_the_reserve_never_takes_the_long_floor_or_the_share_ceiling():
    policy = with_shorts(LengthSchedulingConfig(min_long_slot_share=0.25), 100)
    assert policy.decide(32).cap == 8  # demand over the slots: the floor
    policy = with_shorts(LengthSchedulingConfig(long_slot_share=0.5), 2)
    assert policy.decide(32).cap == 16  # a small reserve: the share


def test_without_short_requests_lately_long_ones_may_take_every_slot():
    clock = ManualClock(1000.0)
    policy = LongCapPolicy(LengthSchedulingConfig(long_slot_share=0.5), clock)
    assert policy.decide(10).cap == 10  # no short request yet
    policy.note_short(1)
    assert policy.decide(10).cap == 5
    clock.now += SHORT_DEMAND_WINDOW_S + 1
    decision = policy.decide(10)
    assert decision.cap == 10 and "no short" in decision.reason


def test_the_share_shrinks_over_target_down_to_its_floor_and_grows_back_under_it():
    config = LengthSchedulingConfig(long_slot_share=0.8, min_long_slot_share=0.3, short_tpot_target_s=0.1)
    policy = with_shorts(config)
    for _ in range(20):
        policy.observe_short_tpot(0.5)
    shares = [policy.decide(100).share for _ in range(10)]
    assert shares[0] < 0.8 and shares == sorted(shares, reverse=True) and shares[-1] == 0.3
    for _ in range(100):
        policy.observe_short_tpot(0.01)  # the window now holds only fast ones
    decision = policy.decide(100)
    assert decision.share > 0.3 and "under" in decision.reason
    for _ in range(20):
        decision = policy.decide(100)
    assert decision.share == 0.8 and decision.cap == 80


def test_near_the_target_the_share_holds():
    policy = with_shorts(LengthSchedulingConfig(long_slot_share=0.6, short_tpot_target_s=0.1))
    for _ in range(10):
        policy.observe_short_tpot(0.09)
    assert policy.decide(10).share == 0.6 and "near" in policy.decide(10).reason


def test_a_decision_goes_stale_when_short_demand_begins_ends_or_moves_the_reserve():
    clock = ManualClock(1000.0)
    policy = LongCapPolicy(LengthSchedulingConfig(), clock)
    policy.decide(8)
    assert not policy.stale()
    policy.note_short(1)
    assert policy.stale() and policy.decide(8).cap == 7 and not policy.stale()
    policy.note_short(1)
    assert not policy.stale()  # the same reserve
    for _ in range(10):
        policy.note_short(3)
    assert policy.stale() and policy.decide(8).cap == 5 and not policy.stale()
    clock.now += SHORT_DEMAND_WINDOW_S + 1
    assert policy.stale() and policy.decide(8).cap == 8 and not policy.stale()
