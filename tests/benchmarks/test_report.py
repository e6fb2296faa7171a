"""Repeats, the validity gate, ratios and targets of both benchmarks, and the
JSON keys the cost planner reads."""

from __future__ import annotations

import json

import pytest

from benchmarks import mixed_report as mr
from benchmarks import throughput_report as tr
from benchmarks.metrics import RequestRecord
from benchmarks.provenance import measured_on
from benchmarks.report import dig, fmt_spread, spread, target, usable_runs, validity
from benchmarks.systems import System
from serve_app.cost.measured import read_baseline, read_factors


def test_spread_is_median_min_max_of_present_values():
    assert spread([3.0, None, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    assert spread([None]) == {"median": None, "min": None, "max": None, "n": 0}
    assert fmt_spread(spread([1.0, 2.0, 3.0])) == "2 [1-3]" and fmt_spread(spread([])) == "-"
    assert dig({"a": {"b": 1}}, "a.b") == 1 and dig({"a": {}}, "a.b.c") is None


def test_validity_gate():
    ok = validity({"loop_lag_p99_s": (0.01, 0.1), "client_machine_share": (0.02, 0.1)})
    assert ok["valid"] and ok["reasons"] == []
    bad = validity({"loop_lag_p99_s": (0.25, 0.1), "client_machine_share": (None, 0.1)})
    assert not bad["valid"]
    assert bad["reasons"] == ["loop_lag_p99_s 0.25 (limit < 0.1)", "client_machine_share not measured (limit < 0.1)"]
    assert not validity({"send_lag_p99_s": (0.1, 0.1)})["valid"]  # the limit itself fails


def test_usable_runs_prefer_valid_ones():
    good, bad, broken = {"validity": {"valid": True}}, {"validity": {"valid": False}}, {"error": "no start"}
    assert usable_runs([good, bad, broken]) == ([good], True)
    assert usable_runs([bad, broken]) == ([bad], False)


def test_targets():
    assert target(0.96, ">=", 0.95, "x")["pass"] is True
    assert target(1.31, "<=", 1.3, "x")["pass"] is False
    assert target(None, "<=", 1.3, "x")["pass"] is None
    assert "flags" in measured_on()


def run(repeat, tok_s, ttft, ready, valid=True, failed=0, e2el=(5.0, 6.0), cpu_engine=4.0):
    return {"repeat": repeat, "ready_s": ready, "command": "cmd", "validity": {"valid": valid, "reasons": [] if valid
                                                                              else ["loop_lag_p99_s 0.3"]},
            "summary": {"output_throughput": tok_s, "request_throughput": tok_s / 128, "failed": failed,
                        "failures": {"timeout": failed} if failed else {}, "goodput": None,
                        "ttft_s": {"p50": ttft, "p99": ttft * 2}, "tpot_s": {"p50": 0.05}, "itl_s": {"p50": 0.04},
                        "e2el_s": {"p50": e2el[0], "p99": e2el[1]}},
            "loop_lag_s": {"p99": 0.01}, "cpu": {"client_machine_share": 0.02, "server_cpu_s_per_1k_output_tokens": 5,
                                                 "server_cpu_s": 30.0, "wall_s": 20.0,
                                                 "cpu_s_per_1k_output_tokens": {g: 0.0 for g in tr.GROUPS}
                                                 | {"engine core": cpu_engine}}}


def system(name, quantization=None):
    return System(name, lambda: None, f"{name} system", {"model": "m", "quantization": quantization})


def entries():
    app_runs = [run(1, 400.0, 0.4, 60.0), run(2, 380.0, 0.5, 62.0), run(3, 100.0, 9.0, 61.0, valid=False)]
    app_runs[0]["load_curve"] = [{"concurrency": 1, "output_tok_per_s": 30.0}, {"concurrency": 8, "output_tok_per_s": 200.0}]
    results = {"app": tr.result_entry(system("app"), app_runs, 32),
               "nobuckets": tr.result_entry(system("nobuckets"), [run(1, 300.0, 0.3, 58.0, failed=2)], 32),
               "vllm": tr.result_entry(system("vllm"), [run(1, 400.0, 0.3, 45.0), run(2, 420.0, 0.3, 55.0)], 32),
               "int8": tr.result_entry(system("int8", "compressed-tensors"), [run(1, 500.0, 0.3, 60.0)], 32)}
    return app_runs, results


def test_a_result_takes_medians_of_valid_runs_and_keeps_the_planners_keys():
    _, results = entries()
    app = results["app"]
    assert (app["output_tok_per_s"], app["ttft_p50_s"], app["ready_s"]) == (390.0, 0.45, 61.0)  # run 3 left out
    assert app["stats"]["output_tok_per_s"] == {"median": 390.0, "min": 380.0, "max": 400.0, "n": 2}
    assert (app["latency_p50_s"], app["latency_p99_s"], app["valid_runs"], app["measured_runs"]) == (5.0, 6.0, 2, 3)
    assert app["load_curve"] == [{"concurrency": 1, "output_tok_per_s": 30.0},
                                 {"concurrency": 8, "output_tok_per_s": 200.0},
                                 {"concurrency": 32, "output_tok_per_s": 390.0}]
    assert app["cpu_s_per_1k_output_tokens"]["engine core"]["median"] == 4.0
    assert results["nobuckets"]["failed"] == 2 and results["nobuckets"]["failures"] == {"timeout": 2}
    assert "load_curve" not in results["vllm"]
    assert app["server_busy_vcpus"]["median"] == 1.5 and app["vcpus_per_replica"] >= 1


def test_ratios_and_targets_against_vllm():
    _, results = entries()
    ratios, targets = tr.comparisons(results)
    assert ratios["app/vllm"]["output_tok_per_s"] == pytest.approx(390 / 410, abs=1e-3)
    assert ratios["app/vllm"]["ready_s_minus_baseline"] == pytest.approx(11.0)
    assert targets["app"]["output_tok_per_s_ratio"]["pass"] is True       # 0.951 >= 0.95
    assert targets["app"]["ttft_p50_ratio"]["pass"] is False              # 1.5 > 1.3
    assert targets["app"]["ready_s_minus_baseline"]["pass"] is False      # 11 s > 10 s
    assert targets["nobuckets"]["output_tok_per_s_ratio"]["pass"] is False
    assert targets["nobuckets"]["ttft_p50_ratio"]["pass"] is True
    assert "int8" not in targets  # no vllm-int8 measured


SETTINGS = {name: {"model": "m", "engine.max_num_seqs": 32, "engine.quantization": None}
            for name in ("app", "nobuckets", "vllm")} | {
    "int8": {"model": "m-w8a8", "engine.max_num_seqs": 32, "engine.quantization": "compressed-tensors"}}


def test_the_planner_reads_the_throughput_json_and_its_quantization_factor(tmp_path):
    _, results = entries()
    workload = {"requests": 96, "concurrency": 32, "max_tokens": 128, "repeats": 3}
    factor, _ = tr.quantization_factor(results, SETTINGS, workload, "cmd")
    assert factor["value"] == pytest.approx(500 / 390, abs=1e-4)
    assert factor["hardware"]["kind"] == "cpu" and factor["runs"] == 1 and factor["metric"] == "throughput_ratio"
    path = tmp_path / "throughput.json"
    path.write_text(json.dumps({"workload": workload, "engine": {"quantization": None},
                                "results": list(results.values()), "factors": {"quantization": factor}}))
    base = read_baseline(path)
    assert (base.output_tokens_per_s, base.concurrency, base.max_tokens, base.quantization) == (390.0, 32, 128, None)
    assert base.curve.points == ((1, 30.0), (8, 200.0), (32, 390.0))
    assert read_baseline(path, "int8").quantization == "compressed-tensors"
    found, unknown = read_factors([path])
    assert found["quantization"].value == factor["value"] and unknown == []
    assert tr.quantization_factor({"app": results["app"]}, SETTINGS, workload, "y")[0] is None


def test_no_quantization_factor_from_configs_that_differ_in_more_than_quantization():
    _, results = entries()
    workload = {"requests": 96, "concurrency": 32, "max_tokens": 128, "repeats": 3}
    unequal = {**SETTINGS, "int8": {**SETTINGS["int8"], "engine.max_num_seqs": 64}}
    factor, why = tr.quantization_factor(results, unequal, workload, "cmd")
    assert factor is None
    assert why == ("int8/app: settings differ beyond quantization (engine.max_num_seqs); "
                   "vllm-int8/vllm: not both measured")


def mixed_run(system, load, repeat, short_p99, tok_s, long_p50=20.0, valid=True, goodput=None):
    return {"system": system, "load": load, "repeat": repeat,
            "validity": {"valid": valid, "reasons": [] if valid else ["send_lag_p99_s 0.4 (limit < 0.1)"]},
            "classes": {"short": {"e2el_s": {"p99": short_p99}, "ttft_s": {"p99": short_p99 / 2}},
                        "long": {"e2el_s": {"p50": long_p50}},
                        "all": {"output_throughput": tok_s, "goodput": goodput}}}


def mixed_stats():
    runs = [mixed_run("vllm", 0.9, 1, 4.0, 100.0), mixed_run("vllm", 0.9, 2, 6.0, 110.0),
            mixed_run("app", 0.9, 1, 1.5, 104.0, 22.0), mixed_run("app", 0.9, 2, 2.5, 106.0, 22.0),
            mixed_run("app", 0.9, 3, 99.0, 10.0, valid=False),
            mixed_run("nobuckets", 0.9, 1, 5.0, 100.0), mixed_run("rayllm", 0.9, 1, 8.0, 90.0, 30.0),
            mixed_run("app", 0.5, 1, 1.0, 60.0), {"system": "rayllm", "load": 0.5, "repeat": 1, "error": "boom"}]
    return mr.aggregate(runs)


def test_mixed_aggregate_excludes_invalid_runs_but_reports_them():
    stats = mixed_stats()
    app = stats["app"][0.9]
    assert app["figures"]["short_e2el_p99_s"] == {"median": 2.0, "min": 1.5, "max": 2.5, "n": 2}
    assert (app["runs"], app["valid_runs"], app["invalid"][0]["repeat"]) == (3, 2, 3)
    assert stats["rayllm"][0.5]["errors"] == ["boom"] and stats["rayllm"][0.5]["valid_runs"] == 0


def test_mixed_ratios_targets_and_factor():
    stats = mixed_stats()
    ratios = mr.ratios_to_baseline(stats)
    assert ratios["0.9"]["app"] == {"short_e2el_p99_s": 0.4, "short_ttft_p99_s": 0.4, "long_e2el_p50_s": 1.1,
                                    "output_tok_per_s": pytest.approx(1.0)}
    assert ratios["0.5"]["app"]["output_tok_per_s"] is None  # no baseline measured there
    targets = mr.targets_at(stats, 0.9)
    assert {k: t["pass"] for k, t in targets["app"].items()} == {
        "short_e2el_p99_ratio": True, "short_e2el_p99_ratio_floor": True, "output_tok_per_s_ratio": True,
        "long_e2el_p50_ratio": True}
    assert all(t["pass"] for t in targets["app_vs_rayllm"].values())
    assert targets["app_vs_rayllm"]["output_tok_per_s_ratio"]["op"] == ">"
    worse = mr.aggregate([mixed_run("vllm", 0.9, 1, 4.0, 100.0), mixed_run("app", 0.9, 1, 3.0, 90.0, 30.0)])
    assert {k: t["pass"] for k, t in mr.targets_at(worse, 0.9)["app"].items()} == {
        "short_e2el_p99_ratio": False, "short_e2el_p99_ratio_floor": True, "output_tok_per_s_ratio": False,
        "long_e2el_p50_ratio": False}
    assert all(t["pass"] is None for t in mr.targets_at(worse, 0.9)["app_vs_rayllm"].values())


def test_capacity_at_the_slo_is_the_highest_offered_rate_meeting_the_goodput_goal():
    rates = {0.5: 2.0, 0.7: 2.8, 0.9: 3.6, 1.1: 4.4}
    # goodput (req/s within the SLOs) per load; the goal is 90% of the offered rate
    good = {"app": {0.5: 2.0, 0.7: 2.8, 0.9: 3.4, 1.1: 2.0}, "nobuckets": {0.5: 2.0, 0.7: 2.0, 0.9: 1.0, 1.1: 0.5},
            "vllm": {0.5: 2.0, 0.7: 2.7, 0.9: 3.5, 1.1: 4.3}, "rayllm": {0.5: 1.0, 0.7: 1.0, 0.9: 1.0, 1.1: 1.0}}
    stats = mr.aggregate([mixed_run(system, load, 1, 1.0, 100.0, goodput=g)
                          for system, by_load in good.items() for load, g in by_load.items()])
    capacity = mr.capacity_at_slo(stats, rates, 0.9)
    assert (capacity["app"]["capacity_req_per_s"], capacity["app"]["bracketed"]) == (3.6, True)  # 3.4 >= 3.24
    assert (capacity["nobuckets"]["capacity_req_per_s"], capacity["nobuckets"]["bracketed"]) == (2.0, True)
    assert (capacity["vllm"]["capacity_req_per_s"], capacity["vllm"]["bracketed"]) == (4.4, False)  # a lower bound
    assert capacity["rayllm"]["capacity_req_per_s"] is None  # below the lowest rate tried
    factor, why = mr.length_scheduling_factor(capacity, 0.9, "TTFT <= 1s", "cmd", 200, 3)
    assert factor["value"] == pytest.approx(3.6 / 2.0) and factor["metric"] == "capacity_at_slo_ratio" and not why
    assert factor["runs"] == 3 and "goodput (TTFT <= 1s) was at least 90%" in factor["definition"]
    unbracketed = {**capacity, "app": capacity["vllm"]}
    factor, why = mr.length_scheduling_factor(unbracketed, 0.9, "x", "cmd", 200, 3)
    assert factor is None and "not bracketed for app" in why
    # the old definition, tok/s at one offered load, gives no factor at all any more
    assert mr.length_scheduling_factor({}, 0.9, "x", "cmd", 200, 3)[0] is None


def test_mixed_class_summaries_and_compact_records():
    from benchmarks.workload import PlannedRequest

    plan = [PlannedRequest(0, "short", 0.0, 128, False, "q", {}), PlannedRequest(1, "long", 0.5, 300, True, "s", {})]
    records = [RequestRecord(kind="short", ttft_s=0.2, e2el_s=1.0, output_tokens=9),
               RequestRecord(kind="long", start_s=0.5, ttft_s=0.3, e2el_s=30.0, output_tokens=300)]
    args = type("Args", (), {"slo_ttft_s": 1.0, "slo_tpot_s": 0.2, "slo_e2el_short_s": 0.5})()
    classes = mr.class_summaries(records, 40.0, mr.slo_for(args))
    assert classes["short"]["requests"] == 1 and classes["other"]["requests"] == 0
    assert classes["all"]["output_tokens"] == 309 and classes["all"]["good_requests"] == 1  # short misses its E2EL
    assert mr.compact(plan, records)[1] == [1, "long", "ok", 0.5, 0.3, 30.0, 300]


def test_a_recorded_command_names_no_path_of_this_machine(monkeypatch):
    from benchmarks.provenance import REPO, command_line

    script = str(REPO / "benchmarks" / "throughput.py")
    monkeypatch.setattr("sys.orig_argv", ["/usr/bin/python3", script, "--out", "/tmp/run/result.json"])
    assert command_line() == ".venv/bin/python benchmarks/throughput.py --out '<tmp>/result.json'"
    monkeypatch.setattr("sys.orig_argv", ["python", "-m", "benchmarks.fleetsim.validate"])
    assert command_line() == ".venv/bin/python -m benchmarks.fleetsim.validate"
