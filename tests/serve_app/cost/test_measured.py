"""Reading benchmark JSONs: the throughput baseline per replica, measured factors
with their files, and the load curve."""

from __future__ import annotations

import json

import pytest

from serve_app.cost.measured import FACTORS, Hardware, LoadCurve, read_baseline, read_factors


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def throughput(tmp_path, name="throughput.json", **overrides):
    """`benchmarks/throughput.py`'s JSON shape."""
    result = {"target": "serve-run", "requests": 96, "failed": 0, "output_tok_per_s": 400.0, "req_per_s": 3.1,
              "latency_p50_s": 9.0, "latency_p99_s": 10.0, "ttft_p50_s": 0.4, "quantization": None,
              "vcpus_per_replica": 2, **overrides}
    return write(tmp_path / name, {
        "benchmark": "throughput", "engine": {"quantization": None},
        "provenance": {"cpu": {"model": "AMD EPYC", "cpus": 2, "flags": ["avx2"], "native_bf16": False}},
        "workload": {"requests": 96, "concurrency": 32, "max_tokens": 128},
        "results": [result, {**result, "target": "vllm-serve", "output_tok_per_s": 500.0},
                    {**result, "target": "int8", "quantization": "compressed-tensors", "output_tok_per_s": 520.0}],
    })


def factor(value, name="quantization", **extra):
    """A factor entry as the benchmarks write it, for `name`'s metric, from 3 runs on a CPU."""
    metric = FACTORS[name].metric if name in FACTORS else "made_up_metric"
    return {"value": value, "metric": metric, "definition": "x over y", "measured_on": "AMD EPYC, 2 cores",
            "hardware": {"kind": "cpu", "model": "AMD EPYC"}, "command": "cmd", "runs": 3, **extra}


def test_reads_one_target_of_the_throughput_benchmark(tmp_path):
    path = throughput(tmp_path)
    base = read_baseline(path)
    assert (base.output_tokens_per_s, base.requests_per_s, base.concurrency, base.max_tokens) == (400.0, 3.1, 32, 128)
    assert base.source == f"{path}:serve-run" and base.quantization is None
    assert base.hardware == Hardware(kind="cpu", model="AMD EPYC") and base.vcpus_per_replica == 2
    assert base.curve == LoadCurve(((32, 400.0),), f"{path}:serve-run")
    assert read_baseline(path, "vllm-serve").output_tokens_per_s == 500.0
    with pytest.raises(ValueError, match="no target"):
        read_baseline(path, "nope")
    with pytest.raises(ValueError, match="over the 5.0s SLO"):
        read_baseline(path, slo_p99_s=5.0)
    with pytest.raises(ValueError, match="failed"):
        read_baseline(throughput(tmp_path, failed=3))
    with pytest.raises(ValueError, match="not a throughput benchmark"):
        read_baseline(write(tmp_path / "other.json", {"factors": {}}))


def test_a_target_served_by_several_replicas_is_divided_down_to_one(tmp_path):
    base = read_baseline(throughput(tmp_path, replicas=2))
    assert (base.output_tokens_per_s, base.requests_per_s, base.concurrency) == (200.0, 1.55, 16)


def test_a_load_curve_in_the_result_is_the_curve(tmp_path):
    curve = [{"concurrency": 32, "output_tok_per_s": 400.0}, {"concurrency": 1, "output_tok_per_s": 30.0},
             {"concurrency": 8, "output_tok_per_s": 160.0}]
    assert read_baseline(throughput(tmp_path, load_curve=curve)).curve.points == ((1, 30.0), (8, 160.0), (32, 400.0))


def test_load_curve_is_pessimistic_below_its_first_point_and_saturates_past_its_last():
    curve = LoadCurve(((4, 100.0), (16, 200.0)), "t")
    assert curve.tokens_per_s(2) == 50.0 and curve.per_stream_tok_s(0) == curve.per_stream_tok_s(2) == 25.0
    assert curve.tokens_per_s(10) == pytest.approx(150.0)
    assert curve.tokens_per_s(64) == 200.0 and curve.per_stream_tok_s(64) == pytest.approx(200 / 64)
    speeds = [curve.per_stream_tok_s(n) for n in (1, 4, 8, 16, 32, 64)]
    assert speeds == sorted(speeds, reverse=True)  # more streams: each one slower


def test_quantization_is_read_from_the_chosen_result_not_the_file(tmp_path):
    """`--target int8` on a file whose top level describes the unquantized engine:
    the baseline is quantized (so the planner does not apply the factor again)."""
    path = throughput(tmp_path)
    assert read_baseline(path, "int8").quantization == "compressed-tensors"
    assert read_baseline(path).quantization is None
    assert read_baseline(path, "vllm-serve").quantization is None


def test_older_files_say_their_cpu_or_nothing(tmp_path):
    old = write(tmp_path / "old.json", {**json.loads(throughput(tmp_path).read_text()), "provenance": None,
                                        "machine": {"cpu": "Xeon"}})
    assert read_baseline(old).hardware == Hardware(kind="cpu", model="Xeon")
    bare = write(tmp_path / "bare.json", {**json.loads(old.read_text()), "machine": None})
    assert read_baseline(bare).hardware is None


def test_factors_come_with_their_file_and_unusable_ones_are_listed_with_why(tmp_path):
    one = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.3, "length_scheduling"),
                                                      "made_up": factor(9.0, "made_up")}})
    two = write(tmp_path / "fault.json", {"factors": {"spot_resume_overhead_s": factor(
        -0.4, "spot_resume_overhead_s", basis="derived", assumption="streams resume in one batch")}})
    found, unused = read_factors([one, two, one])  # a file given twice counts once
    assert found["length_scheduling"].value == 1.3 and found["length_scheduling"].source == str(one)
    spot = found["spot_resume_overhead_s"]
    assert spot.value == -0.4 and spot.basis == "derived" and spot.hardware.kind == "cpu"  # no clamp at 0
    assert unused == [f"made_up ({one}): not a factor the planner knows"]
    assert read_factors([throughput(tmp_path)]) == ({}, [])


def test_a_length_factor_that_is_not_capacity_at_an_slo_is_not_used(tmp_path):
    """The old factor: tok/s with over without length awareness at one offered load (~1.0 by construction)."""
    old = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.01, metric="throughput_ratio")}})
    found, unused = read_factors([old])
    assert found == {} and unused == [f"length_scheduling ({old}): measures throughput_ratio, not capacity_at_slo_ratio"]


def test_spot_lost_work_from_fewer_than_three_runs_is_not_used(tmp_path):
    one_run = write(tmp_path / "fault.json", {"factors": {"spot_resume_overhead_s": factor(
        2.5, "spot_resume_overhead_s", runs=2)}})
    found, unused = read_factors([one_run])
    assert found == {} and unused == [f"spot_resume_overhead_s ({one_run}): 2 run(s), fewer than 3"]


def test_a_factor_in_two_files_or_at_0_is_refused_and_one_without_its_description_unused(tmp_path):
    one = write(tmp_path / "a.json", {"factors": {"quantization": factor(1.4)}})
    two = write(tmp_path / "b.json", {"factors": {"quantization": factor(1.5)}})
    with pytest.raises(ValueError, match="in both"):
        read_factors([one, two])
    for missing in ("measured_on", "hardware", "runs", "metric"):
        bare = write(tmp_path / "c.json", {"factors": {"quantization": {
            k: v for k, v in factor(1.4).items() if k != missing}}})
        assert read_factors([bare]) == ({}, [f"quantization ({bare}): not a factor entry this planner reads "
                                             f"({missing})"])
    zero = write(tmp_path / "d.json", {"factors": {"quantization": factor(0.0)}})
    with pytest.raises(ValueError, match="must be > 0"):
        read_factors([zero])
    unexplained = write(tmp_path / "e.json", {"factors": {"quantization": factor(1.2, basis="derived")}})
    assert "a derived factor states its assumption" in read_factors([unexplained])[1][0]


def test_a_simulated_factor_is_used_only_with_its_calibration_error(tmp_path):
    simulated = {**factor(1.1, "length_scheduling"), "hardware": {"kind": "gpu", "model": "H100"}, "runs": 1,
                 "basis": "simulated"}
    without = write(tmp_path / "a.json", {"factors": {"length_scheduling": simulated}})
    assert "a simulated factor states its calibration error" in read_factors([without])[1][0]
    sized = write(tmp_path / "b.json", {"factors": {"length_scheduling": {**simulated, "calibration_error": 0.12}}})
    found, _ = read_factors([sized])
    assert found["length_scheduling"].basis == "simulated" and found["length_scheduling"].calibration_error == 0.12
