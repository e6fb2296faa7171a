"""The queue-duration policy against scripted wait traces, and its Ray adapter
against hand-built `AutoscalingContext`s."""

from __future__ import annotations

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID, TimeStampedValue
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from serve_app.autoscaling.contract import PoolQueueStats, autoscaling_stats
from serve_app.autoscaling.policy import Decision, PoolSnapshot, QueueDurationPolicy, ScalingState, split_replicas
from serve_app.autoscaling.ray_adapter import QueueDurationAppPolicy
from serve_app.config import APP_POLICY, PriceTable, QueueDurationAutoscaling
from serve_app.topology import deployment_name, ingress_autoscaling_config, pool_autoscaling_config, pool_of

CONFIG = QueueDurationAutoscaling(
    target_queue_wait_s=1.0, upscale_delay_s=10, downscale_delay_s=30, max_step_up=2, max_step_down=1,
    min_replicas=0, max_replicas=8, scale_from_zero_delay_s=5, idle_to_zero_delay_s=60,
    downscale_max_utilization=1.0,
)


def run(trace, replicas=2, config=CONFIG, slots_per_replica=10, apply=True):
    """Feed (t, signal, queued, in_flight) samples one second apart; the pool follows
    each decision at once when `apply`. Returns the decisions."""
    policy, state, decisions = QueueDurationPolicy(config), ScalingState(), []
    for now, signal, queued, in_flight in trace:
        snap = PoolSnapshot(now=now, replicas=replicas, running=replicas, signal_s=signal, queued=queued,
                            in_flight=in_flight, slots=replicas * slots_per_replica)
        decision = policy.decide(snap, state)
        decisions.append(decision)
        state = decision.state
        if apply:
            replicas = decision.replicas
    return decisions


def steady(seconds, signal, queued=0, in_flight=5, start=0):
    return [(start + t, signal, queued, in_flight) for t in range(seconds)]


def test_sustained_wait_scales_up_after_the_delay_only():
    decisions = run(steady(12, signal=3.0))
    assert [d.replicas for d in decisions[:10]] == [2] * 10
    assert decisions[10].replicas == 4  # ceil(2 * 3.0 / 1.0) = 6, step-limited to +2
    assert decisions[10].reason.startswith("scale up") and decisions[10].signal_s == 3.0


def test_a_single_spike_does_not_scale():
    trace = steady(5, 0.5) + [(5, 30.0, 20, 20)] + steady(20, 0.5, start=6)
    assert {d.replicas for d in run(trace)} == {2}


def test_spikes_that_do_not_last_reset_the_upscale_clock():
    trace = [(t, 3.0 if t % 8 < 6 else 0.2, 0, 15) for t in range(40)]
    assert {d.replicas for d in run(trace)} == {2}


def test_scale_down_after_the_delay_when_the_load_fits():
    decisions = run(steady(40, signal=0.1, in_flight=12), replicas=4)  # 12 requests fit 2 replicas of 10
    assert [d.replicas for d in decisions[:30]] == [4] * 30
    assert decisions[30].replicas == 3 and decisions[30].reason.startswith("scale down")
    # the next step down waits another full delay
    assert [d.replicas for d in decisions[31:40]] == [3] * 9


def test_no_scale_down_while_the_load_needs_every_replica():
    decisions = run(steady(100, signal=0.1, in_flight=38), replicas=4)
    assert {d.replicas for d in decisions} == {4}
    assert decisions[-1].reason.startswith("steady")


def test_utilization_headroom_keeps_a_replica_the_load_would_just_fill():
    config = CONFIG.model_copy(update={"downscale_max_utilization": 0.8})
    decisions = run(steady(100, signal=0.1, in_flight=30), replicas=4, config=config)  # 30 > 0.8 * 3 * 10
    assert {d.replicas for d in decisions} == {4}


def test_missing_metrics_hold_and_say_so():
    trace = steady(15, 3.0)[:8] + [(8 + t, None, 0, 0) for t in range(5)] + steady(5, 3.0, start=13)
    decisions = run(trace)
    assert {d.replicas for d in decisions} == {2}  # the gap restarted the upscale clock
    assert decisions[9].reason == "hold: no queue metrics from the ingress" and decisions[9].signal_s is None


def test_step_limits_apply_both_ways():
    up = run(steady(11, signal=50.0), replicas=1)
    assert up[10].replicas == 3  # wanted 50, at most +2
    config = CONFIG.model_copy(update={"max_step_down": 2})
    down = run(steady(31, signal=0.0, in_flight=1), replicas=6, config=config)
    assert down[30].replicas == 4


def test_max_replicas_caps_the_step_and_then_holds():
    decisions = run(steady(40, signal=5.0), replicas=7)
    assert decisions[10].replicas == 8
    assert all(d.replicas == 8 for d in decisions[11:]) and decisions[-1].reason.startswith("hold at max_replicas")


def test_scale_from_zero_on_sustained_queued_demand():
    decisions = run([(t, 0.0, 3, 0) for t in range(7)], replicas=0)
    assert [d.replicas for d in decisions[:5]] == [0] * 5
    assert decisions[5].replicas == 1 and decisions[5].reason.startswith("scale from zero")


def test_diverted_requests_count_as_demand_at_zero():
    policy = QueueDurationPolicy(CONFIG)
    state, replicas = ScalingState(), []
    for now in range(6):
        decision = policy.decide(PoolSnapshot(now=now, replicas=0, running=0, signal_s=0.0, diverted=2), state)
        state = decision.state
        replicas.append(decision.replicas)
    assert replicas == [0, 0, 0, 0, 0, 1]


def test_zero_stays_zero_without_demand():
    decisions = run([(t, 0.0, 0, 0) for t in range(100)], replicas=0)
    assert {d.replicas for d in decisions} == {0} and decisions[-1].reason == "idle at zero"


def test_to_zero_only_after_idling_for_the_delay():
    busy = steady(20, 0.0, in_flight=3)
    idle = [(20 + t, 0.0, 0, 0) for t in range(61)]
    decisions = run(busy + idle, replicas=1)
    assert all(d.replicas == 1 for d in decisions[:80])
    assert decisions[80].replicas == 0 and decisions[80].reason.startswith("scale to zero")


def test_idle_pool_of_several_replicas_passes_through_one_to_zero():
    config = CONFIG.model_copy(update={"downscale_delay_s": 1000})
    decisions = run([(t, 0.0, 0, 0) for t in range(62)], replicas=4, config=config)
    assert [d.replicas for d in decisions[59:62]] == [4, 1, 0]
    assert all(d.reason.startswith("scale to zero") for d in decisions[60:62])


def test_min_replicas_blocks_zero_and_out_of_bounds_counts_are_corrected():
    config = CONFIG.model_copy(update={"min_replicas": 1})
    decisions = run([(t, 0.0, 0, 0) for t in range(200)], replicas=1, config=config)
    assert {d.replicas for d in decisions} == {1}
    assert run([(0, 0.0, 0, 0)], replicas=0, config=config)[0].replicas == 1
    assert run([(0, 0.0, 0, 0)], replicas=12)[0].replicas == 8


def test_replicas_still_starting_are_waited_for():
    policy = QueueDurationPolicy(CONFIG.model_copy(update={"upscale_delay_s": 0}))
    decision = policy.decide(PoolSnapshot(now=0, replicas=3, running=2, signal_s=9.0, queued=50), ScalingState())
    assert decision.replicas == 3 and "starting" in decision.reason


def test_config_rejects_inverted_bounds_and_unknown_fields():
    with pytest.raises(ValueError, match="max_replicas"):
        QueueDurationAutoscaling(min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError, match="Extra inputs"):
        QueueDurationAutoscaling(target_wait=1)


def test_stats_contract_keys_and_queue_names():
    stats = autoscaling_stats({"LLMServer-m-short": PoolQueueStats(queued=3, in_flight=7, wait_p90_s=1.5, slots=16)})
    assert stats == {"queued:LLMServer-m-short": 3.0, "in_flight:LLMServer-m-short": 7.0,
                     "diverted:LLMServer-m-short": 0.0, "slots:LLMServer-m-short": 16.0,
                     "queue_wait_p90_s:LLMServer-m-short": 1.5}
    for capacity_type in ("spot", "on-demand", "any"):
        name = deployment_name("org/model-1", "long", capacity_type)
        assert pool_of(name) == (deployment_name("org/model-1", "long"), capacity_type)


@pytest.mark.parametrize(("total", "expected"), [(0, {"on-demand": 1, "spot": 0}), (5, {"on-demand": 2, "spot": 3}),
                                                 (10, {"on-demand": 3, "spot": 7}), (9, {"on-demand": 3, "spot": 6})])
def test_split_pool_targets_follow_the_sides_bounds(total, expected):
    assert split_replicas(total, {"on-demand": (1, 3), "spot": (0, 7)}) == expected


def test_split_overflow_goes_to_the_side_with_room():
    assert split_replicas(6, {"on-demand": (0, 5), "spot": (0, 1)}) == {"on-demand": 5, "spot": 1}


def test_serve_accepts_the_generated_autoscaling_configs():
    pool = AutoscalingConfig(**pool_autoscaling_config(0, 4))
    assert (pool.upscale_delay_s, pool.downscale_delay_s, pool.downscale_to_zero_delay_s) == (0, 0, 0)
    ingress = AutoscalingConfig(**ingress_autoscaling_config(2, report_interval_s=0.5))
    assert (ingress.min_replicas, ingress.max_replicas, ingress.metrics_interval_s) == (2, 2, 0.5)


def test_the_serve_config_entry_point_survives_serve_pickling_in_a_fresh_process(tmp_path):
    """Serve pickles the policy's module by value; the controller is another process."""
    import subprocess
    import sys

    blob = tmp_path / "policy.bin"
    blob.write_bytes(AutoscalingPolicy(policy_function=APP_POLICY).get_serialized_policy_def())
    script = ("import pickle, sys; cls = pickle.loads(open(sys.argv[1], 'rb').read()); "
              "print(cls(stale_after_s=7)._policy.config.stale_after_s)")
    result = subprocess.run([sys.executable, "-c", script, str(blob)], capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout.strip() == "7.0", result.stderr


# --- the Ray adapter -------------------------------------------------------------------------

APP = "default"


class RecordingExporter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Decision, bool]] = []

    def export(self, deployment: str, decision: Decision, changed: bool) -> None:
        self.calls.append((deployment, decision, changed))


def context(name, *, running=0, target=None, metrics=None, state=None, now=100.0, bounds=(0, 4)):
    dep = DeploymentID(name=name, app_name=APP)
    replicas = [ReplicaID(unique_id=f"{name}-{i}", deployment_id=dep) for i in range(running)]
    raw = {}
    for i, (stats, ts) in enumerate(metrics or []):
        for key, value in stats.items():
            raw.setdefault(key, {})[replicas[i]] = [TimeStampedValue(ts - 1, 0.0), TimeStampedValue(ts, value)]
    ctx = AutoscalingContext(
        deployment_id=dep, deployment_name=name, app_name=APP, current_num_replicas=running,
        target_num_replicas=running if target is None else target, running_replicas=replicas,
        total_num_requests=0.0, total_queued_requests=0.0, aggregated_metrics={}, raw_metrics=raw,
        capacity_adjusted_min_replicas=bounds[0], capacity_adjusted_max_replicas=bounds[1],
        policy_state=state or {}, last_scale_up_time=None, last_scale_down_time=None, current_time=now,
        config=AutoscalingConfig(min_replicas=bounds[0], max_replicas=max(1, bounds[1])),
    )
    return dep, ctx


def policy(**kwargs):
    exporter = RecordingExporter()
    return QueueDurationAppPolicy(exporter=exporter, **{"default": CONFIG.model_dump(), **kwargs}), exporter


def test_app_policy_scales_a_pool_from_the_ingress_report_and_keeps_state():
    app_policy, exporter = policy()
    pool = "LLMServer-m-short"
    stats = autoscaling_stats({pool: PoolQueueStats(queued=4, in_flight=0)})
    ingress = context("OpenAIIngress", running=1, metrics=[(stats, 100.0)], bounds=(1, 1))
    zero = context(pool, running=0)
    decisions, states = app_policy(dict([ingress, zero]))
    assert decisions == {zero[0]: 0} and states[zero[0]]["demand_since"] == 100.0
    assert ingress[0] not in decisions and ingress[0] in states
    later = dict([context("OpenAIIngress", running=1, metrics=[(stats, 106.0)], bounds=(1, 1), now=106.0),
                  context(pool, running=0, state=states[zero[0]], now=106.0)])
    decisions, _ = app_policy(later)
    assert decisions == {zero[0]: 1}
    assert exporter.calls[-1][0] == pool and exporter.calls[-1][1].reason.startswith("scale from zero")


def test_app_policy_sums_ingress_replicas_and_takes_the_worst_wait():
    app_policy, exporter = policy(default={**CONFIG.model_dump(), "upscale_delay_s": 0})
    pool = "LLMServer-m-long"
    a = autoscaling_stats({pool: PoolQueueStats(queued=2, in_flight=10, wait_p90_s=0.5, slots=20)})
    b = autoscaling_stats({pool: PoolQueueStats(queued=3, in_flight=10, wait_p90_s=4.0, slots=20)})
    decisions, _ = app_policy(dict([context("OpenAIIngress", running=2, metrics=[(a, 100.0), (b, 100.0)]),
                                    context(pool, running=2)]))
    decision = exporter.calls[-1][1]
    assert decision.signal_s == 4.0 and decisions[DeploymentID(name=pool, app_name=APP)] == 4


def test_app_policy_holds_on_stale_or_absent_reports_without_deciding():
    app_policy, exporter = policy(stale_after_s=30)
    pool = "LLMServer-m-short"
    stats = autoscaling_stats({pool: PoolQueueStats(queued=9, in_flight=0)})
    decisions, _ = app_policy(dict([context("OpenAIIngress", running=1, metrics=[(stats, 50.0)]),
                                    context(pool, running=0)]))
    assert decisions == {}
    assert exporter.calls[-1][1].reason == "hold: no queue metrics from the ingress"


def test_app_policy_splits_a_spot_pool_and_applies_per_queue_overrides():
    queue = "LLMServer-m-short"
    app_policy, exporter = policy(pools={queue: {"upscale_delay_s": 0, "max_step_up": 8, "max_replicas": None}})
    stats = autoscaling_stats({queue: PoolQueueStats(queued=40, in_flight=20, wait_p90_s=5.0, slots=20)})
    on_demand = context(f"{queue}-ondemand", running=1, bounds=(1, 3))
    spot = context(f"{queue}-spot", running=1, bounds=(0, 7))
    decisions, states = app_policy(dict([context("OpenAIIngress", running=1, metrics=[(stats, 100.0)]),
                                         on_demand, spot]))
    assert decisions == {on_demand[0]: 3, spot[0]: 7}  # 2 x 5 s / 1 s = 10 = 3 + 7
    assert states[on_demand[0]] == states[spot[0]]
    assert {(name, d.replicas) for name, d, _ in exporter.calls} == {(f"{queue}-ondemand", 3), (f"{queue}-spot", 7)}
    with pytest.raises(ValueError, match="target_queue_wait_s"):
        QueueDurationAppPolicy(pools={queue: {"target_queue_wait_s": -1}})


def test_app_policy_logs_only_when_the_decision_changes():
    app_policy, exporter = policy()
    pool = "LLMServer-m-short"
    stats = autoscaling_stats({pool: PoolQueueStats(queued=0, in_flight=3, slots=10)})
    state = {}
    for now in (100.0, 100.1, 100.2):
        _, states = app_policy(dict([context("OpenAIIngress", running=1, metrics=[(stats, now)], now=now),
                                     context(pool, running=1, state=state, now=now)]))
        state = states[DeploymentID(name=pool, app_name=APP)]
    assert [changed for _, _, changed in exporter.calls] == [True, False, False]


# --- the diurnal simulation (benchmarks/diurnal_sim.py) drives the policy and the cost model ---


@pytest.fixture(scope="module")
def day():
    from benchmarks.diurnal_sim import SimConfig, run_all

    return run_all(SimConfig())


def test_simulation_conserves_requests(day):
    for result in day["results"]:
        assert result["requests"] == day["trace"]["requests"]
        assert result["requests"] == result["served"] + result["queued_at_end"] + result["in_service_at_end"]


def test_simulation_conserves_requests_under_a_backlog():
    from benchmarks.diurnal_sim import FixedScaler, SimConfig, simulate

    cfg = SimConfig()
    peak_hour = cfg.arrivals()[19 * 3600: 20 * 3600]
    result = simulate(cfg, FixedScaler(2), peak_hour, PriceTable(replicas={"sim-model": {"instance_type": "g6e.xlarge"}}))
    assert result["queued_at_end"] > 0 and result["over_slo_share"] > 0.5
    assert int(peak_hour.sum()) == result["served"] + result["queued_at_end"] + result["in_service_at_end"]


def test_queue_duration_policy_follows_the_day_for_less_than_always_on(day):
    by_policy = {result["policy"]: result for result in day["results"]}
    ours, always_on = by_policy["queue-duration"], by_policy["always-on"]
    assert ours["cost_usd"] < always_on["cost_usd"]
    assert ours["replica_hours"] < always_on["replica_hours"]
    night, evening = ours["replicas_per_minute"][3 * 60], ours["replicas_per_minute"][19 * 60]
    assert night < evening
