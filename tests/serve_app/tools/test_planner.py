"""The planner: benchmark reading, traffic profile, whole replicas and instances,
Spot's effective price, and the CLI's files."""

from __future__ import annotations

import json
import math

import pytest

from serve_app.config import PriceTable, ReplicaShape
from serve_app.tools.planner import (
    DIURNAL_SHAPE,
    HOURS_PER_MONTH,
    SpotRisk,
    Throughput,
    hourly_rates,
    main,
    plan,
    read_benchmark,
)

PRICES = PriceTable.model_validate({"instances": {
    "one": {"on_demand_hourly_usd": 1.0, "spot_hourly_usd": 0.4, "gpus": 1, "vcpus": 4},
    "eight": {"on_demand_hourly_usd": 8.0, "spot_hourly_usd": 3.2, "gpus": 8, "vcpus": 96},
}})
NO_RISK = SpotRisk(0.0, 0.0, 0.0)
DAYS = HOURS_PER_MONTH / 24


def throughput_json(tmp_path, **overrides):
    result = {"target": "serve-run", "requests": 96, "failed": 0, "output_tok_per_s": 400.0, "req_per_s": 3.1,
              "latency_p50_s": 9.0, "latency_p99_s": 10.0, **overrides}
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({
        "benchmark": "throughput", "engine": {"quantization": None}, "workload": {"max_tokens": 128},
        "results": [result, {**result, "target": "vllm-serve", "output_tok_per_s": 500.0}],
    }))
    return path


def test_reads_the_throughput_benchmark_shape(tmp_path):
    path = throughput_json(tmp_path)
    assert read_benchmark(path, None, None).output_tokens_per_s == 400.0
    assert read_benchmark(path, "vllm-serve", None).output_tokens_per_s == 500.0
    with pytest.raises(ValueError, match="no target"):
        read_benchmark(path, "nope", None)
    with pytest.raises(ValueError, match="over the 5.0s SLO"):
        read_benchmark(path, None, slo_p99_s=5.0)
    with pytest.raises(ValueError, match="failed"):
        read_benchmark(throughput_json(tmp_path, failed=3), None, None)


def test_traffic_profiles():
    rates = hourly_rates(10e6, None, None)
    assert sum(rates) * 3600 * DAYS == pytest.approx(10e6)
    assert rates.index(max(rates)) == DIURNAL_SHAPE.index(1.0)
    rates = hourly_rates(None, 40.0, 2.0)
    assert (max(rates), min(rates)) == (pytest.approx(40.0), pytest.approx(2.0))


def test_whole_replicas_per_hour_and_whole_instances():
    rates = [0.5, 1.0, 1.01, 7.9, 9.2] + [3.0] * 19
    tp = Throughput(output_tokens_per_s=100.0, requests_per_s=1.0, quantized=False, source="t")
    one = plan(tp, rates, PRICES, ReplicaShape(instance_type="one"), NO_RISK, 100.0, 1.6, 1.86, 0.7)
    base = one["setups"][0]
    assert base["hourly_replicas"] == [1, 1, 2, 8, 10] + [3] * 19
    assert base["monthly_usd"] == pytest.approx(sum(base["hourly_replicas"]) * 1.0 * DAYS, abs=0.01)
    eight = plan(tp, rates, PRICES, ReplicaShape(instance_type="eight", gpus_per_replica=1), NO_RISK,
                 100.0, 1.6, 1.86, 0.7)["setups"][0]
    instances = [1, 1, 1, 1, 2] + [1] * 19  # 8 replicas share an instance; 10 need two
    assert eight["monthly_usd"] == pytest.approx(sum(instances) * 8.0 * DAYS, abs=0.01)
    for setup in one["setups"]:
        assert setup["fluid_monthly_usd"] <= setup["monthly_usd"]


def test_multipliers_spot_split_and_the_preemption_price():
    tp = Throughput(output_tokens_per_s=100.0, requests_per_s=1.0, quantized=False, source="t")
    risk = SpotRisk(interruptions_per_hour=0.1, lost_work_s=60, replacement_s=300)
    result = plan(tp, [10.0] * 24, PRICES, ReplicaShape(instance_type="one"), risk, 100.0, 2.0, 1.25, 0.7)
    by_name = {s["name"]: s for s in result["setups"]}
    assert by_name["on-demand FP16"]["peak_replicas"] == 10
    assert by_name["+ quantization"]["peak_replicas"] == 5
    assert by_name["+ length batching"]["peak_replicas"] == 8
    assert by_name["all combined"]["peak_replicas"] == 4
    useful = 1 - 0.1 * 360 / 3600
    assert result["spot"]["useful_fraction"] == pytest.approx(useful)
    # 10 replicas, 70% Spot: 3 on-demand + 7 Spot at the effective price
    assert by_name["+ Spot mix"]["monthly_usd"] == pytest.approx(24 * DAYS * (3 * 1.0 + 7 * 0.4 / useful), abs=0.01)
    # 4 replicas: ceil(1.2) = 2 on-demand, 2 Spot
    assert by_name["all combined"]["monthly_usd"] == pytest.approx(24 * DAYS * (2 + 2 * 0.4 / useful), abs=0.01)
    requests = 10.0 * 3600 * 24 * DAYS
    assert by_name["on-demand FP16"]["cost_per_1k_requests_usd"] == pytest.approx(
        1000 * by_name["on-demand FP16"]["monthly_usd"] / requests, rel=1e-4)


def test_a_quantized_benchmark_is_the_quantized_setup():
    tp = Throughput(output_tokens_per_s=160.0, requests_per_s=1.6, quantized=True, source="t")
    result = plan(tp, [5.0] * 24, PRICES, ReplicaShape(instance_type="one"), NO_RISK, 100.0, 1.6, 1.0, 0.0)
    assert result["fp16_per_replica_rps"] == pytest.approx(1.0)
    assert result["setups"][1]["per_replica_rps"] == pytest.approx(1.6)


def test_cli_prints_the_table_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["--benchmark", str(throughput_json(tmp_path)), "--peak-rps", "20", "--instance-type", "g6e.xlarge",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("on-demand FP16", "+ quantization", "+ length batching", "+ Spot mix", "all combined"):
        assert name in printed
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["traffic"]["mean_output_tokens"] == 128  # from the benchmark's workload
    assert result["setups"][0]["peak_replicas"] == math.ceil(20 / (400.0 / 128))
    assert out.with_suffix(".png").stat().st_size > 10_000
    with pytest.raises(ValueError, match="has no GPU"):
        main(["--benchmark", str(throughput_json(tmp_path)), "--peak-rps", "1", "--instance-type", "m7i.2xlarge",
              "--gpus-per-replica", "1", "--out", str(out)])
