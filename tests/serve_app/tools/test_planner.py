"""`serve-app plan`: benchmark files in, the table printed, JSON + PNG out, with
every factor's file and every price's date; bad inputs are one line, exit 1."""

from __future__ import annotations

import json
import math

import pytest

from serve_app.tools.planner import main
from tests.serve_app.cost.test_measured import factor, throughput, write

SETUP_NAMES = ("on-demand baseline", "+ quantization", "+ length-aware scheduling", "+ Spot mix", "all combined")


def test_plan_prints_the_table_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "plan"
    baseline = throughput(tmp_path)
    mixed = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.25, "length_scheduling")}})
    assert main(["--baseline", str(baseline), "--measured", str(mixed), "--peak-rps", "20",
                 "--instance-type", "m7i.2xlarge", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in SETUP_NAMES:
        assert name in printed
    assert "NOT MEASURED: UNMEASURED: no file gives factors.quantization" in printed and "ASSUMED" in printed and "as of 2026-12" in printed and "published" in printed
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["traffic"]["mean_output_tokens"] == 128  # from the baseline's workload
    per_replica = 400.0 / 128
    assert [s["peak_replicas"] for s in result["setups"]][:3] == [
        math.ceil(20 / per_replica), math.ceil(20 / per_replica), math.ceil(20 / (per_replica * 1.25))]
    assert result["factors"]["length_scheduling"]["source"] == str(mixed)
    assert result["factors"]["baseline_output_tokens_per_s"]["source"] == f"{baseline}:serve-run"
    assert result["prices"]["as_of"] == ["2026-12"]
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "[UNMEASURED: quantization taken as 1.0]" in printed  # the + quantization row says it is not priced
    assert result["replica"]["vcpus_per_replica"] == 2 and result["replica"]["instance_share"] == 0.25


def test_a_cpu_measurement_for_a_gpu_instance_type_is_refused_unless_allowed_then_flagged(tmp_path, capsys):
    out = str(tmp_path / "plan")
    args = ["--baseline", str(throughput(tmp_path)), "--peak-rps", "5", "--instance-type", "g6e.xlarge",
            "--out", out]
    assert main(args) == 1
    assert "the baseline was measured on cpu (AMD EPYC), applied to a gpu instance type" in capsys.readouterr().err
    assert main([*args, "--allow-other-hardware"]) == 0
    assert "!!! THE BASELINE WAS MEASURED ON CPU (AMD EPYC), APPLIED TO A GPU INSTANCE TYPE" in capsys.readouterr().out


def test_a_cpu_replica_is_priced_at_the_vcpus_it_held(tmp_path, capsys):
    out = tmp_path / "plan"
    common = ["--baseline", str(throughput(tmp_path)), "--peak-rps", "5", "--out", str(out)]
    assert main([*common, "--vcpus-per-replica", "1"]) == 1
    assert "below the 2 vCPUs the measured replica held" in capsys.readouterr().err
    assert main([*common, "--vcpus-per-replica", "4"]) == 0  # more is the operator's choice
    assert json.loads(out.with_suffix(".json").read_text())["replica"]["instance_share"] == 0.5


def test_a_quantized_target_is_not_counted_twice(tmp_path):
    out = tmp_path / "plan"
    quant = write(tmp_path / "quant.json", {"factors": {"quantization": factor(1.3)}})
    assert main(["--baseline", str(throughput(tmp_path)), "--target", "int8", "--measured", str(quant),
                 "--peak-rps", "20", "--out", str(out)]) == 0
    setups = {s["name"]: s for s in json.loads(out.with_suffix(".json").read_text())["setups"]}
    measured_rps = 520.0 / 128  # the int8 result's throughput: already quantized
    assert setups["+ quantization"]["per_replica_rps"] == pytest.approx(measured_rps, abs=1e-4)
    assert setups["on-demand baseline"]["per_replica_rps"] == pytest.approx(measured_rps / 1.3, abs=1e-4)


def test_the_old_benchmark_flag_still_works(tmp_path):
    assert main(["--benchmark", str(throughput(tmp_path)), "--requests-per-month", "1e6", "--out",
                 str(tmp_path / "p")]) == 0


def test_bad_inputs_are_one_line_and_exit_1(tmp_path, capsys):
    out = str(tmp_path / "plan")
    assert main(["--baseline", str(throughput(tmp_path)), "--peak-rps", "1", "--instance-type", "m7i.2xlarge",
                 "--gpus-per-replica", "1", "--out", out]) == 1
    assert "has no GPU" in capsys.readouterr().err
    assert main(["--baseline", str(tmp_path / "missing.json"), "--peak-rps", "1", "--out", out]) == 1
    assert "missing.json" in capsys.readouterr().err
    twice = [write(tmp_path / f"{n}.json", {"factors": {"quantization": factor(1.2)}}) for n in "ab"]
    assert main(["--baseline", str(throughput(tmp_path)), "--peak-rps", "1", "--measured", str(twice[0]),
                 "--measured", str(twice[1]), "--out", out]) == 1
    assert "in both" in capsys.readouterr().err


def test_the_older_one_run_spot_file_is_listed_unused_and_the_assumed_lost_work_priced(tmp_path, capsys):
    old = write(tmp_path / "fault_spot.json", {"factors": {"spot_resume_overhead_s": {
        "value": 0.0, "definition": "d", "measured_on": "cpu", "command": "pytest"}}})
    out = tmp_path / "plan"
    assert main(["--baseline", str(throughput(tmp_path)), "--measured", str(old), "--peak-rps", "5",
                 "--spot-lost-work-s", "45", "--out", str(out)]) == 0
    assert "spot_resume_overhead_s" in capsys.readouterr().out
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["factors"]["spot_lost_work_s"]["basis"] == "assumed" and result["factors"]["spot_lost_work_s"]["value"] == 45
    assert result["unused_factors"] == [f"spot_resume_overhead_s ({old}): not a factor entry this planner reads "
                                        "(metric, hardware, runs)"]
