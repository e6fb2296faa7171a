"""Both benchmark scripts end to end, on fake OpenAI servers started as child
processes on loopback (no engine, no Ray): one invocation, every system, the
JSON the cost planner reads and the PNG."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import mixed_setup, mixed_workload, systems, throughput
from serve_app.cost.measured import read_baseline, read_factors
from tests.benchmarks.fake_server import FakeServer
from tests.conftest import REPO


def fake_registry(*_args, **_kwargs):
    def make(name, **flags):
        quantization = "compressed-tensors" if "int8" in name else None
        settings = {"server": "fake", "engine.quantization": quantization, "stream_interval": 4 if "vllm" in name else 1}
        return systems.System(name, lambda: FakeServer(REPO, startup_timeout_s=60), f"fake {name}",
                              {"model": "fake", "quantization": quantization}, settings=settings, **flags)

    return {"app": make("app", uses_template=True), "nobuckets": make("nobuckets", uses_template=True),
            "int8": make("int8", uses_template=True), "vllm": make("vllm"), "vllm-int8": make("vllm-int8"),
            "vllm-priority": make("vllm-priority", true_priority=True), "rayllm": make("rayllm")}


@pytest.mark.parametrize("script", ["throughput.py", "mixed_workload.py"])
def test_help(script):
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=120)
    assert "--repeats" in out.stdout and "--out" in out.stdout


def test_throughput_one_invocation(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(throughput, "registry", fake_registry)
    out = tmp_path / "throughput"
    monkeypatch.setattr(sys, "argv", [
        "throughput.py", "--systems", "app,vllm,int8", "--repeats", "2", "--requests", "8", "--concurrency", "4",
        "--max-tokens", "12", "--curve-concurrencies", "1,2", "--curve-rounds", "1", "--no-realtime-client",
        "--max-client-share", "1.0", "--max-lag-p99-s", "5", "--out", str(out)])
    assert throughput.main() == 0
    printed = capsys.readouterr().out
    assert "[app 1/2] starting" in printed and "[int8 2/2]" in printed and "targets:" in printed
    data = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert [r["target"] for r in data["results"]] == ["app", "vllm", "int8"]
    app = data["results"][0]
    for key in ("output_tok_per_s", "req_per_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s"):
        assert app[key] > 0
    assert app["failed"] == 0 and app["measured_runs"] == 2 and [r["repeat"] for r in app["runs"]] == [1, 2]
    assert [p["concurrency"] for p in app["load_curve"]] == [1, 2, 4]
    assert (data["workload"]["concurrency"], data["workload"]["max_tokens"]) == (4, 12)
    assert data["engine"]["quantization"] is None and data["valid"] is True
    assert set(data["targets"]["app"]) == {"output_tok_per_s_ratio", "ttft_p50_ratio", "ready_s_minus_baseline"}
    assert data["answers"]["rows"][0]["app"].startswith("Paris") and set(data["answers"]["correct"]) == {
        "app", "vllm", "int8"}
    assert "client" in app["cpu_s_per_1k_output_tokens"] and app["stats"]["ready_s"]["n"] == 2
    assert read_baseline(out.with_suffix(".json")).output_tokens_per_s == app["output_tok_per_s"]
    factors, _ = read_factors([out.with_suffix(".json")])
    assert factors["quantization"].value > 0 and "flags" in factors["quantization"].measured_on
    assert factors["quantization"].hardware.kind == "cpu" and factors["quantization"].runs == 2
    assert_provenance(data, {"app", "vllm", "int8"})
    assert app["vcpus_per_replica"] >= 1 and read_baseline(out.with_suffix(".json")).vcpus_per_replica >= 1


def assert_provenance(data, names):
    """Every benchmark JSON can be traced: commit, CPU and flags, command, dtype, each system's settings."""
    prov = data["provenance"]
    assert len(prov["git"]["commit"]) == 40 and isinstance(prov["git"]["dirty"], bool)
    assert prov["cpu"]["model"] and isinstance(prov["cpu"]["flags"], list) and "native_bf16" in prov["cpu"]
    assert prov["command"].startswith(".venv/bin/python") and prov["dtype"]
    assert set(prov["systems"]) == names
    assert data["settings_differ"]["stream_interval"] == {
        name: prov["systems"][name]["stream_interval"] for name in names}


def test_mixed_workload_one_invocation(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(mixed_setup, "registry", fake_registry)
    out = tmp_path / "mixed"
    monkeypatch.setattr(sys, "argv", [
        "mixed_workload.py", "--systems", "app,nobuckets,vllm,vllm-priority,rayllm", "--loads", "0.5,0.9",
        "--requests", "30", "--calibration-requests", "12", "--calibration-concurrency", "4", "--settle-s", "0",
        "--max-send-lag-p99-s", "5", "--no-realtime-client", "--out", str(out)])
    assert mixed_workload.main() == 0
    printed = capsys.readouterr().out
    assert "calibrated:" in printed and "NOT MET per run" in printed and "short E2EL p99" in printed
    data = json.loads(out.with_suffix(".json").read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert data["calibration"]["capacity_req_per_s"] > 0
    assert set(data["stats"]) == {"app", "nobuckets", "vllm", "vllm-priority", "rayllm"}
    assert set(data["stats"]["app"]) == {"0.5", "0.9"}
    assert data["stats"]["app"]["0.9"]["classes"]["short"]["e2el_s"]["p99"]["median"] > 0
    assert set(data["ratios_to_vllm"]["0.9"]) == {"app", "nobuckets", "vllm-priority", "rayllm"}
    assert set(data["targets"]) == {"app", "app_vs_rayllm"}
    assert data["workload"]["short_requests"]["met_per_run"] is False
    # a length factor exactly when both capacities at the SLO are bracketed by the loads tried (fake servers
    # usually meet the SLO at both loads; on a busy machine they may miss it at 0.9)
    capacity = data["capacity_at_slo"]["systems"]
    bracketed = all(capacity[s]["bracketed"] for s in ("app", "nobuckets"))
    factors, unused = read_factors([out.with_suffix(".json")])
    assert unused == []
    if bracketed:
        assert factors["length_scheduling"].value == pytest.approx(
            capacity["app"]["capacity_req_per_s"] / capacity["nobuckets"]["capacity_req_per_s"], rel=1e-3)
    else:
        assert factors == {} and "not bracketed" in data["factors_not_emitted"]["length_scheduling"]
    assert_provenance(data, {"app", "nobuckets", "vllm", "vllm-priority", "rayllm"})
    # calibration and the vllm baseline first, then one server per system, all loads each
    assert [r["system"] for r in data["runs"]][:2] == ["vllm", "vllm"]
    assert len(data["runs"]) == 10 and all(r["validity"]["valid"] for r in data["runs"])
    predictor = data["predictor"]
    assert predictor["overall"]["requests"] == 60 and len(predictor["requests"]) == 60
    assert predictor["requests"][0]["point"].endswith("load 0.5")
    assert {r["kind"] for r in predictor["requests"]} == {"short", "other", "long"}
