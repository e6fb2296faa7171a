"""The README's benchmark figures are the committed result files' figures: the
rendered blocks match the files, and each row names its file and commit."""

from __future__ import annotations

import json

import pytest

from benchmarks import render_readme as rr

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_the_readme_and_the_benchmarks_doc_match_the_committed_result_files():
    for path, text in rr.rendered(rr.load_results()).items():
        assert path.read_text() == text, f"{path.name} is stale: run .venv/bin/python benchmarks/render_readme.py"


def test_the_readme_links_the_historical_logs_and_keeps_none_of_them():
    readme = rr.README.read_text()
    assert "[docs/benchmarks.md](docs/benchmarks.md)" in readme and "### Measured on" not in readme
    doc = rr.DOC.read_text()
    assert "not traceable to a commit" in doc and doc.count("### Measured on") == 3


def result_files(tmp_path):
    provenance = {"git": {"commit": COMMIT, "dirty": True}, "cpu": {"model": "AMD EPYC 9R14"},
                  "command": ".venv/bin/python benchmarks/throughput.py", "dtype": ["bfloat16"],
                  "systems": {"app": {"stream_interval": "4"}, "vllm": {"stream_interval": "4"}}}
    stats = {k: {"median": 1.0, "min": 0.9, "max": 1.1, "n": 3}
             for k in ("output_tok_per_s", "ttft_p50_s", "itl_p50_s", "tpot_p50_s")}
    files = {
        "throughput.json": {"benchmark": "throughput", "provenance": provenance, "workload": {"repeats": 3},
                            "ratios": {"app/vllm": {"output_tok_per_s": 1.02, "ttft_p50_s": 0.9, "e2el_p99_s": 1.0}},
                            "results": [{"target": "app", "stats": stats, "valid_runs": 3, "repeats": 3}]},
        "mixed_workload.json": {
            "benchmark": "mixed_workload", "provenance": {**provenance, "git": {"commit": COMMIT, "dirty": False}},
            "workload": {"repeats": 3, "target_load": 0.9},
            "ratios_to_vllm": {"0.9": {"app": {"short_e2el_p99_s": 0.5}}},
            "capacity_at_slo": {"systems": {"app": {"capacity_req_per_s": 3.6, "bracketed": False}}}},
        "predictor.json": {"benchmark": "predictor_sharegpt"},
        "predictor_run.json": {"benchmark": "predictor_sharegpt", "provenance": provenance, "predictors": {
            "constant": {"requests": 100, "bucket_accuracy": 0.78, "short_recall": 0.0, "kendall_tau_b": None},
            "app": {"requests": 100, "bucket_accuracy": 0.815, "short_recall": 0.28, "mae_tokens": 169.2,
                    "kendall_tau_b": 0.319, "cost_us": {"p50": 83.0, "p99": 460.5}, "settled_after_requests": 1500}}},
        "flat.json": {"benchmark": "predictor_smollm2", "provenance": {"commit": COMMIT, "dirty": False,
                                                                         "cpu": {"model": "Xeon"}}},
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    return rr.load_results(tmp_path)


def test_each_summary_row_names_its_file_and_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(rr, "REPO", tmp_path)
    results = result_files(tmp_path)
    lines = rr.summary(results).splitlines()
    assert lines[:2] == ["| figure | value | runs | file, commit, CPU |", "|---|---|---|---|"]
    assert ("| throughput: output tok/s app/vllm | 1.02 | 3 repeats | [throughput.json](throughput.json), "
            "`0123456789`-dirty, AMD EPYC 9R14 |") in lines
    assert any(line.startswith("| throughput: TTFT p50 app/vllm | 0.9 |") for line in lines)
    assert not any(line.startswith("| throughput: e2el") for line in lines)  # headline figures only
    assert any(line.startswith("| mixed at 0.9 load: short_e2el_p99_s app/vllm | 0.5 |") and "`0123456789`," in line
               for line in lines)
    assert any("capacity at the SLO, app (req/s) | 3.6 (lower bound)" in line for line in lines)
    assert ("| predictor_sharegpt: see the file | - | - | [predictor.json](predictor.json), "
            "no commit recorded (not traceable), CPU not recorded |") in lines
    assert "| predictor_smollm2: see the file | - | - | [flat.json](flat.json), `0123456789`, Xeon |" in lines
    assert ("| predictor_sharegpt: app bucket accuracy (a constant: 0.78) | 0.815 | 100 requests | "
            "[predictor_run.json](predictor_run.json), `0123456789`-dirty, AMD EPYC 9R14 |") in lines
    assert any(line.startswith("| predictor_sharegpt: app Kendall tau (a constant: -) | 0.319 |") for line in lines)
    assert any(line.startswith("| predictor_sharegpt: app cost p99 (us per request) | 460 |") for line in lines)
    full = rr.full(results)
    assert "| `app` | 0.815 | 0.28 | 169 | 0.319 | 83 / 460 | 1500 |" in full
    assert "| `app` | 1 [0.9-1.1] | 1 [0.9-1.1] | 1 [0.9-1.1] | 1 [0.9-1.1] | 3/3 |" in full
    assert "All systems ran with the same settings." in full and ".venv/bin/python benchmarks/throughput.py" in full


def test_a_block_is_replaced_between_its_markers_only():
    text = f"intro\n{rr.BEGIN}\nold\n{rr.END}\noutro\n"
    assert rr.replace_block(text, "new", "x") == f"intro\n{rr.BEGIN}\nnew\n{rr.END}\noutro\n"
    with pytest.raises(SystemExit, match="exactly one"):
        rr.replace_block("no markers", "new", "x")
    assert rr.summary({}).startswith("No result file is committed yet")
