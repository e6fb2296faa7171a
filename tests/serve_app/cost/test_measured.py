"""Reading benchmark JSONs: the throughput baseline per replica, measured factors
with their files, and the load curve."""

from __future__ import annotations

import json

import pytest

from serve_app.cost.measured import LoadCurve, read_baseline, read_factors


def write(path, data):
    path.write_text(json.dumps(data))
    return path


def throughput(tmp_path, name="throughput.json", **overrides):
    """`benchmarks/throughput.py`'s JSON shape."""
    result = {"target": "serve-run", "requests": 96, "failed": 0, "output_tok_per_s": 400.0, "req_per_s": 3.1,
              "latency_p50_s": 9.0, "latency_p99_s": 10.0, "ttft_p50_s": 0.4, **overrides}
    return write(tmp_path / name, {
        "benchmark": "throughput", "engine": {"quantization": None},
        "workload": {"requests": 96, "concurrency": 32, "max_tokens": 128},
        "results": [result, {**result, "target": "vllm-serve", "output_tok_per_s": 500.0}],
    })


def factor(value, **extra):
    return {"value": value, "definition": "x over y", "measured_on": "AMD EPYC, 2 cores", "command": "cmd", **extra}


def test_reads_one_target_of_the_throughput_benchmark(tmp_path):
    path = throughput(tmp_path)
    base = read_baseline(path)
    assert (base.output_tokens_per_s, base.requests_per_s, base.concurrency, base.max_tokens) == (400.0, 3.1, 32, 128)
    assert base.source == f"{path}:serve-run" and base.quantization is None
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


def test_factors_come_with_their_file_and_unknown_ones_are_listed(tmp_path):
    one = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.3), "made_up": factor(9.0)}})
    two = write(tmp_path / "fault.json", {"factors": {"spot_resume_overhead_s": factor(2.5)}})
    found, unknown = read_factors([one, two, one])  # a file given twice counts once
    assert found["length_scheduling"].value == 1.3 and found["length_scheduling"].source == str(one)
    assert found["spot_resume_overhead_s"].source == str(two) and found["spot_resume_overhead_s"].measured_on
    assert unknown == [f"made_up ({one})"]
    assert read_factors([throughput(tmp_path)]) == ({}, [])


def test_a_factor_in_two_files_or_without_its_description_is_refused(tmp_path):
    one = write(tmp_path / "a.json", {"factors": {"quantization": factor(1.4)}})
    two = write(tmp_path / "b.json", {"factors": {"quantization": factor(1.5)}})
    with pytest.raises(ValueError, match="in both"):
        read_factors([one, two])
    bare = write(tmp_path / "c.json", {"factors": {"quantization": {"value": 1.4}}})
    with pytest.raises(ValueError, match="measured_on"):
        read_factors([bare])
    zero = write(tmp_path / "d.json", {"factors": {"quantization": factor(0.0)}})
    with pytest.raises(ValueError, match="cannot be 0"):
        read_factors([zero])
