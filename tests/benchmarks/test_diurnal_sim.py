"""The diurnal simulation: latency that depends on load (the measured curve), SLO
attainment per policy, and a service rate that says whether it was measured."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.diurnal_sim import ASSUMED_CURVE, FixedScaler, SimConfig, main, simulate
from serve_app.config import PriceTable
from serve_app.cost.measured import LoadCurve
from tests.serve_app.cost.test_measured import throughput

PRICES = PriceTable(replicas={"sim-model": {"instance_type": "g6e.xlarge"}})
CURVE = LoadCurve(((8, 400.0),), "test: 50 tok/s per stream up to 8 streams, 400 tok/s past them")


def steady(rps: float, seconds: int = 1200) -> np.ndarray:
    return np.random.default_rng(1).poisson(np.full(seconds, rps))


def test_one_request_alone_takes_its_tokens_at_one_streams_speed():
    cfg = SimConfig(curve=CURVE, output_tokens=200, slots=32)
    arrivals = np.zeros(60, dtype=int)
    arrivals[0] = 1
    result = simulate(cfg, FixedScaler(1), arrivals, PRICES)
    assert result["served"] == 1 and result["latency_p50_s"] == pytest.approx(4.0)  # 200 tokens at 50 tok/s


def test_latency_grows_with_load_once_the_replica_saturates():
    cfg = SimConfig(curve=CURVE, output_tokens=200, slots=32, slo_s=10.0)
    light = simulate(cfg, FixedScaler(1), steady(0.3), PRICES)
    heavy = simulate(cfg, FixedScaler(1), steady(1.8), PRICES)  # 2 req/s is all one replica can finish
    assert light["latency_p50_s"] == pytest.approx(4.0, abs=0.15) and light["slo_attainment"] == 1.0
    assert heavy["latency_p50_s"] > light["latency_p50_s"] and heavy["latency_p99_s"] > 4 * light["latency_p99_s"]
    assert heavy["slo_attainment"] < 0.9 and heavy["over_slo_share"] == pytest.approx(1 - heavy["slo_attainment"])
    assert heavy["cost_usd"] == pytest.approx(light["cost_usd"])  # same replica, same bill: only latency moved


def test_the_assumed_curve_is_load_dependent_and_says_it_is_assumed():
    assert ASSUMED_CURVE.source.startswith("ASSUMED")
    alone, full = ASSUMED_CURVE.per_stream_tok_s(1), ASSUMED_CURVE.per_stream_tok_s(32)
    assert 200 / alone == pytest.approx(3.3, abs=0.05) and 200 / full == pytest.approx(6.0, abs=0.05)


def test_main_reads_the_measured_rate_and_reports_slo_attainment_and_cost_per_policy(tmp_path, capsys):
    out = tmp_path / "sim"
    baseline = throughput(tmp_path)  # 400 tok/s per replica at 32 streams
    assert main(["--measured", str(baseline), "--peak-rps", "4", "--output-tokens", "128", "--slo-s", "20",
                 "--instance-type", "m7i.2xlarge", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"service rate: {baseline}:serve-run" in printed and "ASSUMED" not in printed
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["service"]["source"] == f"{baseline}:serve-run"
    assert summary["service"]["latency_all_slots_busy_s"] == pytest.approx(128 * 32 / 400, abs=0.01)
    by_policy = {r["policy"]: r for r in summary["results"]}
    assert set(by_policy) == {"queue-duration", "ray-stock", "always-on"}
    for result in by_policy.values():
        assert 0 <= result["slo_attainment"] <= 1 and result["cost_usd"] > 0
        assert result["prices"]["as_of"] == ["2026-12"]
    assert by_policy["queue-duration"]["cost_usd"] < by_policy["always-on"]["cost_usd"]
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_a_measured_file_without_a_concurrency_is_refused(tmp_path):
    path = throughput(tmp_path)
    data = json.loads(path.read_text())
    del data["workload"]["concurrency"]
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        main(["--measured", str(path), "--out", str(tmp_path / "sim")])
