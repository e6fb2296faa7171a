"""Price table and cost meter: uptime by capacity type, token attribution, idle cost."""

from __future__ import annotations

import pytest

from serve_app.config import PriceTable
from serve_app.cost.meter import CostMeter

PRICES = PriceTable.model_validate({
    "instances": {
        "gpu1": {"on_demand_hourly_usd": 2.0, "spot_hourly_usd": 0.5, "gpus": 1, "vcpus": 8},
        "gpu8": {"on_demand_hourly_usd": 16.0, "spot_hourly_usd": 8.0, "gpus": 8, "vcpus": 96},
        "cpu": {"on_demand_hourly_usd": 0.4, "spot_hourly_usd": 0.2, "gpus": 0, "vcpus": 8},
    },
    "replicas": {
        "big": {"instance_type": "gpu1"},
        "big/long": {"instance_type": "gpu8", "gpus_per_replica": 2},
        "tiny": {"instance_type": "cpu", "vcpus_per_replica": 2},
        "half": {"instance_type": "gpu1", "gpus_per_replica": 0.5},
    },
})
HOUR = 3600.0


def test_replica_prices_by_share_and_capacity_type():
    assert PRICES.replica_hourly_usd("big", "short", spot=False) == 2.0
    assert PRICES.replica_hourly_usd("big", "short", spot=True) == 0.5
    assert PRICES.replica_hourly_usd("big", "long", spot=False) == 4.0  # pool entry wins: 2 of 8 GPUs
    assert PRICES.replica_hourly_usd("tiny", "default", spot=False) == pytest.approx(0.1)
    assert PRICES.replica_hourly_usd("half", "default", spot=True) == 0.25
    with pytest.raises(KeyError, match="unknown-model"):
        PRICES.replica_hourly_usd("unknown-model", "default", spot=True)


def test_price_table_rejects_bad_shapes_and_carries_the_default_instances():
    with pytest.raises(ValueError, match="unknown instance type"):
        PriceTable.model_validate({"replicas": {"m": {"instance_type": "nope"}}})
    with pytest.raises(ValueError, match="has no GPU"):
        PriceTable.model_validate({"replicas": {"m": {"instance_type": "m7i.2xlarge", "gpus_per_replica": 1}}})
    with pytest.raises(ValueError, match="Extra inputs"):
        PriceTable.model_validate({"replicas": {"m": {"instance_type": "g5.2xlarge", "gpu": 1}}})
    defaults = PriceTable().instances
    assert {"g5.2xlarge", "g6e.xlarge", "p5.48xlarge", "m7i.2xlarge"} <= set(defaults)
    assert all(p.spot_hourly_usd < p.on_demand_hourly_usd for p in defaults.values())


def test_uptime_is_metered_by_capacity_type_at_the_previous_counts():
    meter = CostMeter(PRICES, start=0.0)
    meter.sample(0.0, {("big", "short", "on-demand"): 1, ("big", "short", "spot"): 2})
    meter.sample(HOUR, {("big", "short", "spot"): 1})  # the on-demand one goes
    report = meter.report(2 * HOUR)
    assert report["replica_hours_by_capacity_type"] == {"on-demand": 1.0, "spot": 3.0}
    assert report["cost_usd"] == pytest.approx(2.0 + 3 * 0.5)
    assert report["window_s"] == 2 * HOUR


def test_interval_cost_goes_to_the_requests_finished_in_it_by_tokens():
    meter = CostMeter(PRICES, start=0.0, prompt_token_weight=0.5)
    group = ("big", "short", "on-demand")
    meter.sample(0.0, {group: 1})
    meter.record(*group, prompt_tokens=200, output_tokens=100)  # 200 weighted tokens
    meter.record(*group, prompt_tokens=0, output_tokens=600)  # 600
    meter.sample(HOUR, {group: 1})  # the hour costs 2.0: 0.5 and 1.5
    assert meter.request_cost_usd(*group, prompt_tokens=200, output_tokens=100) == pytest.approx(0.5)
    assert meter.request_cost_usd(*group, prompt_tokens=0, output_tokens=600) == pytest.approx(1.5)
    report = meter.report(2 * HOUR)  # the second hour served nothing: idle
    assert report["attributed_usd"] == pytest.approx(2.0) and report["idle_usd"] == pytest.approx(2.0)
    assert report["requests"] == 2 and report["output_tokens"] == 700
    assert report["cost_per_1k_requests_usd"] == pytest.approx(1000 * 4.0 / 2)
    assert report["cost_per_1m_output_tokens_usd"] == pytest.approx(1e6 * 4.0 / 700)


def test_breakdowns_add_up_to_the_totals():
    meter = CostMeter(PRICES, start=0.0)
    groups = [("big", "short", "spot"), ("big", "long", "on-demand"), ("tiny", "default", "on-demand")]
    meter.sample(0.0, dict.fromkeys(groups, 2))
    for i, group in enumerate(groups):
        meter.record(*group, prompt_tokens=10 * (i + 1), output_tokens=50, requests=5)
    report = meter.report(HOUR / 2)
    for name in ("by_model", "by_pool", "by_capacity_type"):
        parts = report[name].values()
        assert sum(p["cost_usd"] for p in parts) == pytest.approx(report["cost_usd"])
        assert sum(p["requests"] for p in parts) == report["requests"] == 15
    assert set(report["by_pool"]) == {"big/short", "big/long", "tiny/default"}
    assert [(g["model"], g["pool"], g["capacity_type"]) for g in report["groups"]] == sorted(groups)
    assert sum(g["cost_usd"] for g in report["groups"]) == pytest.approx(report["cost_usd"])
    assert report["by_model"]["tiny"]["cost_usd"] == pytest.approx(2 * 0.1 / 2)
    assert report["by_capacity_type"]["spot"]["cost_per_1k_requests_usd"] == pytest.approx(1000 * 0.5 / 5)


def test_no_requests_no_per_request_figures_and_no_cost_before_any_replica():
    meter = CostMeter(PRICES, start=100.0)
    assert meter.report(200.0)["cost_usd"] == 0
    assert meter.request_cost_usd("big", "short", "spot", 1, 1) is None
    meter.sample(200.0, {("big", "short", "spot"): 1})
    report = meter.report(200.0 + HOUR)
    assert report["cost_per_1k_requests_usd"] is None and report["idle_usd"] == pytest.approx(0.5)
