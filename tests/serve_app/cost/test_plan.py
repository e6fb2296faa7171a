"""The cost plan: traffic profile, whole replicas and instances, Spot's effective
price, factors only from measurements (1.0 and said so otherwise), a source for
every factor and a date for every price."""

from __future__ import annotations

import pytest

from serve_app.config import PriceTable, ReplicaShape
from serve_app.cost.measured import FACTORS, Baseline, Hardware, MeasuredFactor
from serve_app.cost.plan import (
    DIURNAL_SHAPE,
    HOURS_PER_MONTH,
    PUBLISHED,
    SETUPS,
    hourly_rates,
    plan,
    plan_factors,
    useful_fraction,
)
from serve_app.cost.prices import Prices, load_price_book
from tests.serve_app.cost.test_meter import instance

PRICES = Prices.resolve(PriceTable.model_validate({"instances": {
    "one": instance(1.0, 0.4, 1, 4), "eight": instance(8.0, 3.2, 8, 96)}}))
DAYS = HOURS_PER_MONTH / 24
HOSTED = load_price_book().hosted_models


def baseline(tok_s=100.0, quantization=None) -> Baseline:
    return Baseline(tok_s, tok_s / 100, 32, 100, 5.0, 9.0, 0.3, quantization, None, "tp.json:serve-run")


CPU = Hardware(kind="cpu", model="AMD EPYC")


def measured(kind="cpu", **values) -> dict[str, MeasuredFactor]:
    return {name: MeasuredFactor(value=value, metric=FACTORS[name].metric, definition="d", measured_on="cpu",
                                 hardware=Hardware(kind=kind, model="m"), command="c", runs=3, source=f"{name}.json")
            for name, value in values.items()}


def factors(base=None, interruptions_per_day=0.0, lost_work_s=0.0, replacement_s=0.0, **values):
    return plan_factors(base or baseline(), measured(**values), interruptions_per_day, lost_work_s, replacement_s)


def run(rates, shape="one", base=None, spot_share=0.7, gpus=None, **kw):
    base = base or baseline()
    return plan(base, factors(base, **kw), rates, PRICES, ReplicaShape(instance_type=shape, gpus_per_replica=gpus),
                100.0, spot_share, HOSTED)


def test_traffic_profiles():
    rates = hourly_rates(10e6, None, None)
    assert sum(rates) * 3600 * DAYS == pytest.approx(10e6)
    assert rates.index(max(rates)) == DIURNAL_SHAPE.index(1.0)
    rates = hourly_rates(None, 40.0, 2.0)
    assert (max(rates), min(rates)) == (pytest.approx(40.0), pytest.approx(2.0))


def test_whole_replicas_per_hour_and_whole_instances():
    rates = [0.5, 1.0, 1.01, 7.9, 9.2] + [3.0] * 19
    base = run(rates)["setups"][0]
    assert base["hourly_replicas"] == [1, 1, 2, 8, 10] + [3] * 19
    assert base["monthly_usd"] == pytest.approx(sum(base["hourly_replicas"]) * 1.0 * DAYS, abs=0.01)
    eight = run(rates, shape="eight", gpus=1)["setups"][0]
    instances = [1, 1, 1, 1, 2] + [1] * 19  # 8 replicas share an instance; 10 need two
    assert eight["monthly_usd"] == pytest.approx(sum(instances) * 8.0 * DAYS, abs=0.01)
    for setup in run(rates, quantization=1.5, length_scheduling=1.2)["setups"]:
        assert setup["fluid_monthly_usd"] <= setup["monthly_usd"]


def test_measured_factors_spot_split_and_the_preemption_price():
    result = run([10.0] * 24, quantization=2.0, length_scheduling=1.25, spot_resume_overhead_s=60.0,
                 interruptions_per_day=2.4, replacement_s=300.0, lost_work_s=999.0)
    by_name = {s["name"]: s for s in result["setups"]}
    assert [s["peak_replicas"] for s in result["setups"]] == [10, 5, 8, 10, 4]
    useful = 1 - 0.1 * 360 / 3600  # the measured resume overhead, not the assumed 999 s
    assert result["spot"]["useful_fraction"] == pytest.approx(useful)
    assert result["factors"]["spot_lost_work_s"]["source"] == "spot_resume_overhead_s.json"
    # 10 replicas, 70% Spot: 3 on-demand + 7 Spot at the effective price
    assert by_name["+ Spot mix"]["monthly_usd"] == pytest.approx(24 * DAYS * (3 * 1.0 + 7 * 0.4 / useful), abs=0.01)
    # 4 replicas: ceil(1.2) = 2 on-demand, 2 Spot
    assert by_name["all combined"]["monthly_usd"] == pytest.approx(24 * DAYS * (2 + 2 * 0.4 / useful), abs=0.01)
    requests = 10.0 * 3600 * 24 * DAYS
    base = by_name["on-demand baseline"]
    assert base["cost_per_1k_requests_usd"] == pytest.approx(1000 * base["monthly_usd"] / requests, rel=1e-4)
    assert base["cost_per_1m_output_tokens_usd"] == pytest.approx(1e6 * base["monthly_usd"] / (requests * 100),
                                                                  rel=1e-4)


def test_the_simulated_lost_work_per_interruption_prices_spot_before_the_fault_tests_derived_one():
    simulated = MeasuredFactor(value=40.0, metric=FACTORS["spot_lost_work_s"].metric, definition="d",
                               measured_on="simulated", hardware=Hardware(kind="gpu", model="L40S"), command="c",
                               runs=1, basis="simulated", calibration_error=0.12, source="fleetsim_spot.json")
    chosen = plan_factors(baseline(), {**measured(spot_resume_overhead_s=60.0), "spot_lost_work_s": simulated},
                          2.4, 999.0, 300.0, target="gpu", allow_other_hardware=True)
    lost = chosen["spot_lost_work_s"]
    assert (lost.value, lost.basis, lost.source) == (40.0, "simulated", "fleetsim_spot.json")
    assert "12%" in lost.assumption and not lost.warning  # simulated on the GPU it prices
    assert useful_fraction(chosen) == pytest.approx(1 - 0.1 * 340 / 3600)


def test_an_unmeasured_factor_is_1_and_says_so_never_the_published_figure():
    result = run([10.0] * 24)
    assert {s["peak_replicas"] for s in result["setups"]} == {10}  # nothing measured: nothing gained
    for name in ("quantization", "length_scheduling"):
        factor = result["factors"][name]
        assert factor["value"] == 1.0 and factor["basis"] == "not measured" and "UNMEASURED" in factor["source"]
    assert result["factors"]["spot_lost_work_s"]["basis"] == "assumed"
    by_name = {s["name"]: s for s in result["setups"]}
    assert by_name["+ quantization"]["factors"]["quantization"]["basis"] == "not measured"
    assert by_name["+ quantization"]["unmeasured"] == ["quantization"]
    assert by_name["all combined"]["unmeasured"] == ["quantization", "length_scheduling"]
    assert by_name["on-demand baseline"]["unmeasured"] == []
    # published figures sit in their own column, labelled, with a source
    for name, published in PUBLISHED.items():
        assert by_name[name]["published"] == published and published["source"]
    assert by_name["on-demand baseline"]["published"] is None


def test_every_factor_of_every_setup_has_a_source_and_every_setup_its_price_date():
    for kw in ({}, {"quantization": 1.3, "length_scheduling": 1.1, "spot_resume_overhead_s": 4.0}):
        result = run([5.0] * 24, **kw)
        assert [s["name"] for s in result["setups"]] == [s.name for s in SETUPS]
        for setup in result["setups"]:
            assert setup["factors"], setup["name"]
            for name, factor in setup["factors"].items():
                assert factor["source"] and factor["basis"], (setup["name"], name)
                assert factor["source"] == result["factors"][name]["source"]
            assert setup["price_as_of"] == ["2026-11-30"]
        spot = {s["name"]: s for s in result["setups"]}["+ Spot mix"]
        assert {"spot_interruptions_per_hour", "spot_lost_work_s", "spot_replacement_s"} <= set(spot["factors"])
        assert set(result["prices"]["quotes"]["one"]) == {"on_demand", "spot"}
        assert result["hosted_models"] == {name: p.model_dump() for name, p in HOSTED.items()}


def test_a_quantized_baseline_is_the_quantized_setup():
    base = baseline(tok_s=160.0, quantization="fp8")
    result = run([5.0] * 24, base=base, quantization=1.6)
    assert result["baseline"]["unquantized_per_replica_rps"] == pytest.approx(1.0)
    assert result["setups"][1]["per_replica_rps"] == pytest.approx(1.6)
    assert "quantization" in result["setups"][0]["factors"]  # the unquantized baseline is derived with it


def test_spot_lost_work_is_derived_with_its_assumption_and_never_clamped():
    result = run([10.0] * 24, spot_resume_overhead_s=-30.0, interruptions_per_day=24.0, replacement_s=300.0)
    lost = result["factors"]["spot_lost_work_s"]
    assert lost["basis"] == "derived" and lost["value"] == -30.0 and "replica-seconds" in lost["assumption"]
    assert result["spot"]["useful_fraction"] == pytest.approx(1 - 1.0 * 270 / 3600)  # -30 s counts as measured


def test_a_factor_from_other_hardware_is_refused_or_flagged_loudly():
    cpu_base = Baseline(100.0, 1.0, 32, 100, 5.0, 9.0, 0.3, None, None, "tp.json:app", hardware=CPU)
    gpu_factor = measured(kind="gpu", quantization=1.6)
    with pytest.raises(ValueError, match="quantization was measured on gpu .* applied to a cpu instance type"):
        plan_factors(cpu_base, gpu_factor, 0.0, 0.0, 0.0, target="cpu")
    with pytest.raises(ValueError, match="the baseline was measured on cpu"):
        plan_factors(cpu_base, {}, 0.0, 0.0, 0.0, target="gpu")
    flagged = plan_factors(cpu_base, measured(quantization=1.6), 0.0, 0.0, 0.0, target="gpu",
                           allow_other_hardware=True)
    assert flagged["quantization"].warning == "QUANTIZATION WAS MEASURED ON CPU (M), APPLIED TO A GPU INSTANCE TYPE"
    assert flagged["baseline_output_tokens_per_s"].warning.startswith("THE BASELINE WAS MEASURED ON CPU")
    same = plan_factors(cpu_base, measured(quantization=1.6), 0.0, 0.0, 0.0, target="cpu")
    assert same["quantization"].warning == "" and same["baseline_output_tokens_per_s"].warning == ""
    unknown = plan_factors(baseline(), {}, 0.0, 0.0, 0.0, target="gpu")  # an old file: said, not refused
    assert unknown["baseline_output_tokens_per_s"].warning == (
        "the baseline: hardware not recorded; priced as a gpu instance type")


def test_a_simulated_factor_carries_its_calibration_error_into_the_plan():
    gpu_base = Baseline(100.0, 1.0, 32, 100, 5.0, 9.0, 0.3, None, None, "tp.json:app",
                        hardware=Hardware(kind="gpu", model="H100"))
    simulated = MeasuredFactor(value=1.05, metric=FACTORS["length_scheduling"].metric, definition="d",
                               measured_on="simulated: 8 x H100", hardware=Hardware(kind="gpu", model="H100"),
                               command="c", runs=1, basis="simulated", calibration_error=0.123,
                               assumption="the GPU step time is published", source="fleetsim_routing.json")
    factor = plan_factors(gpu_base, {"length_scheduling": simulated}, 0.0, 0.0, 0.0, target="gpu")["length_scheduling"]
    assert factor.basis == "simulated" and factor.value == 1.05 and factor.warning == ""
    assert factor.assumption == ("the simulator's calibration error, up to 12% against measurement; "
                                 "the GPU step time is published")
