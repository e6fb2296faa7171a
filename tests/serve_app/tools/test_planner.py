"""`serve-app plan`: benchmark files in, the table printed, JSON + PNG out, with
every factor's file and every price's date; bad inputs are one line, exit 1."""

from __future__ import annotations

import json
import math

from serve_app.tools.planner import main
from tests.serve_app.cost.test_measured import factor, throughput, write

SETUP_NAMES = ("on-demand baseline", "+ quantization", "+ length-aware scheduling", "+ Spot mix", "all combined")


def test_plan_prints_the_table_and_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "plan"
    baseline = throughput(tmp_path)
    mixed = write(tmp_path / "mixed.json", {"factors": {"length_scheduling": factor(1.25)}})
    assert main(["--baseline", str(baseline), "--measured", str(mixed), "--peak-rps", "20",
                 "--instance-type", "g6e.xlarge", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in SETUP_NAMES:
        assert name in printed
    assert "NOT MEASURED: no file gives factors.quantization" in printed and "ASSUMED" in printed and "as of 2026-12" in printed and "published" in printed
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["traffic"]["mean_output_tokens"] == 128  # from the baseline's workload
    per_replica = 400.0 / 128
    assert [s["peak_replicas"] for s in result["setups"]][:3] == [
        math.ceil(20 / per_replica), math.ceil(20 / per_replica), math.ceil(20 / (per_replica * 1.25))]
    assert result["factors"]["length_scheduling"]["source"] == str(mixed)
    assert result["factors"]["baseline_output_tokens_per_s"]["source"] == f"{baseline}:serve-run"
    assert result["prices"]["as_of"] == ["2026-12"]
    assert out.with_suffix(".png").stat().st_size > 10_000


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
