"""Cost meter: uptime by capacity type, token attribution, idle cost, a read-only
report that names its prices' dates."""

from __future__ import annotations

import pytest

from serve_app.config import PriceTable
from serve_app.cost.meter import CostMeter
from serve_app.cost.prices import Prices


def instance(on_demand: float, spot: float, gpus: int, vcpus: int, as_of: str = "2026-11-30") -> dict:
    quote = {"region": "us-east-1", "as_of": as_of, "source": "test"}
    return {"gpus": gpus, "vcpus": vcpus, "on_demand": {"hourly_usd": on_demand, **quote},
            "spot": {"hourly_usd": spot, **quote}}


TABLE = PriceTable.model_validate({
    "instances": {
        "gpu1": instance(2.0, 0.5, 1, 8),
        "gpu8": instance(16.0, 8.0, 8, 96, as_of="2026-12-01"),
        "cpu": instance(0.4, 0.2, 0, 8),
    },
    "replicas": {
        "big": {"instance_type": "gpu1"},
        "big/long": {"instance_type": "gpu8", "gpus_per_replica": 2},
        "tiny": {"instance_type": "cpu", "vcpus_per_replica": 2},
        "half": {"instance_type": "gpu1", "gpus_per_replica": 0.5},
    },
})
PRICES = Prices.resolve(TABLE)
HOUR = 3600.0


def test_replica_prices_by_share_and_capacity_type():
    assert PRICES.replica_hourly_usd("big", "short", spot=False) == 2.0
    assert PRICES.replica_hourly_usd("big", "short", spot=True) == 0.5
    assert PRICES.replica_hourly_usd("big", "long", spot=False) == 4.0  # pool entry wins: 2 of 8 GPUs
    assert PRICES.replica_hourly_usd("tiny", "default", spot=False) == pytest.approx(0.1)
    assert PRICES.replica_hourly_usd("half", "default", spot=True) == 0.25
    with pytest.raises(KeyError, match="unknown-model"):
        PRICES.replica_hourly_usd("unknown-model", "default", spot=True)


def test_uptime_is_metered_by_capacity_type_at_the_previous_counts():
    meter = CostMeter(TABLE, start=0.0)
    meter.sample(0.0, {("big", "short", "on-demand"): 1, ("big", "short", "spot"): 2})
    meter.sample(HOUR, {("big", "short", "spot"): 1})  # the on-demand one goes
    report = meter.report(2 * HOUR)
    assert report["replica_hours_by_capacity_type"] == {"on-demand": 1.0, "spot": 3.0}
    assert report["cost_usd"] == pytest.approx(2.0 + 3 * 0.5)
    assert report["window_s"] == 2 * HOUR


def test_interval_cost_goes_to_the_requests_finished_in_it_by_tokens():
    meter = CostMeter(TABLE, start=0.0, prompt_token_weight=0.5)
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
    meter = CostMeter(TABLE, start=0.0)
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
    meter = CostMeter(TABLE, start=100.0)
    assert meter.report(200.0)["cost_usd"] == 0
    assert meter.request_cost_usd("big", "short", "spot", 1, 1) is None
    meter.sample(200.0, {("big", "short", "spot"): 1})
    report = meter.report(200.0 + HOUR)
    assert report["cost_per_1k_requests_usd"] is None and report["idle_usd"] == pytest.approx(0.5)


def test_report_names_the_dates_and_sources_of_the_prices_it_used():
    meter = CostMeter(TABLE, start=0.0)
    meter.sample(0.0, {("big", "short", "spot"): 1, ("big", "long", "on-demand"): 1})
    prices = meter.report(HOUR)["prices"]
    assert prices["as_of"] == ["2026-11-30", "2026-12-01"]
    assert set(prices["quotes"]) == {"gpu1", "gpu8"}
    assert set(prices["quotes"]["gpu1"]) == {"spot"} and set(prices["quotes"]["gpu8"]) == {"on_demand"}
    assert prices["quotes"]["gpu1"]["spot"] == {"hourly_usd": 0.5, "region": "us-east-1", "as_of": "2026-11-30",
                                                "source": "test"}


def scripted(meter: CostMeter, reports_at: tuple[float, ...]) -> dict:
    """One scripted hour and a half; `report` called at `reports_at` along the way."""
    group, other = ("big", "short", "on-demand"), ("tiny", "default", "on-demand")
    steps = [
        (0.0, lambda: meter.sample(0.0, {group: 1, other: 2})),
        (600.0, lambda: meter.record(*group, prompt_tokens=10, output_tokens=90)),
        (1800.0, lambda: meter.sample(1800.0, {group: 2, other: 2})),
        (2400.0, lambda: meter.record(*other, prompt_tokens=0, output_tokens=50, requests=2)),
        (3600.0, lambda: meter.sample(3600.0, {group: 1})),
        (4000.0, lambda: meter.record(*group, prompt_tokens=5, output_tokens=20)),
        (5400.0, lambda: meter.sample(5400.0, {group: 1})),
    ]
    for at, step in steps:
        for when in reports_at:
            if when <= at:
                meter.report(when)
        reports_at = tuple(when for when in reports_at if when > at)
        step()
    return meter.report(6000.0)


def test_report_only_reads_so_reports_never_move_cost_between_attributed_and_idle():
    quiet = scripted(CostMeter(TABLE, start=0.0), ())
    # two reports in a row, reports between samples (before and after requests finished), and past the last sample
    noisy_meter = CostMeter(TABLE, start=0.0)
    noisy = scripted(noisy_meter, (300.0, 300.0, 900.0, 2000.0, 2000.0, 3000.0, 4500.0, 5600.0))
    assert noisy == quiet
    assert quiet["idle_usd"] > 0 and quiet["attributed_usd"] > 0
    for args in ((10, 90), (5, 20)):
        assert noisy_meter.request_cost_usd("big", "short", "on-demand", *args) is not None


def test_a_report_shows_the_open_interval_provisionally_and_the_next_sample_closes_it():
    meter = CostMeter(TABLE, start=0.0)
    group = ("big", "short", "on-demand")
    meter.sample(0.0, {group: 1})
    meter.record(*group, prompt_tokens=0, output_tokens=100)
    early = meter.report(HOUR / 2)
    assert early["provisional_s"] == HOUR / 2
    assert early["cost_usd"] == pytest.approx(1.0) and early["attributed_usd"] == pytest.approx(1.0)
    assert meter.request_cost_usd(*group, 0, 100) is None  # nothing closed yet
    meter.sample(HOUR, {group: 1})
    closed = meter.report(HOUR)
    assert closed["provisional_s"] == 0 and closed["attributed_usd"] == pytest.approx(2.0)
    assert meter.request_cost_usd(*group, 0, 100) == pytest.approx(2.0)  # the whole hour, not the half
