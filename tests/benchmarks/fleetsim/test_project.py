"""The routing projection end to end on a small trace: every figure labelled projected,
with the published source of its step time, for every system and load."""

from __future__ import annotations

import json

from benchmarks.fleetsim.project import SYSTEMS, capacity_at_slo, main
from serve_app.cost.measured import read_factors
from tests.benchmarks.fleetsim.trace_file import write_trace


def test_a_small_projection_names_its_sources_and_covers_every_system_and_load(tmp_path):
    trace = write_trace(tmp_path / "trace.csv", 120, 0.05, [8, 30, 300, 600])
    out = tmp_path / "routing"
    main(["--replicas", "2", "--loads", "0.5,1.0", "--trace", str(trace), "--out", str(out)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["projected"] is True and "BLIS" in result["engine"]["step_time"]["source"]
    assert result["capacity_req_per_s"] > 0
    for system in SYSTEMS:
        for load in ("0.5", "1.0"):
            run = result["results"][system][load]
            assert run["completed"] == 120 and run["failed"] == 0, (system, load, run["failures"])
    assert out.with_suffix(".png").exists()
    found, unused = read_factors([out.with_suffix(".json")])  # what `serve-app plan --measured` reads
    assert not unused
    assert found["length_scheduling"].basis == "simulated" and found["length_scheduling"].hardware.kind == "gpu"
    assert found["length_scheduling"].calibration_error is not None


def test_pools_are_sized_by_the_output_tokens_their_bucket_holds():
    from benchmarks.fleetsim.project import fleet_config, pool_replicas
    from benchmarks.fleetsim.simulate import SimRequest

    config = fleet_config(SYSTEMS["app-pools"])
    assert [pool.max_output_tokens for pool in config.models[0].pools] == [128, None]  # prod.yaml's short and long
    # 100 tokens of short answers against 300 of long ones: a quarter of 8 replicas
    requests = [SimRequest(10, 50, None), SimRequest(10, 50, None), SimRequest(10, 300, None)]
    assert pool_replicas(config, 8, requests) == {"short": 2, "long": 6}
    assert pool_replicas(config, 8, [SimRequest(10, 300, None)]) == {"short": 1, "long": 7}  # never none
    assert pool_replicas(fleet_config(SYSTEMS["app"]), 8, requests) == {"default": 8}


def test_capacity_at_the_slo_is_the_highest_load_whose_requests_mostly_met_it():
    runs = {"0.5": {"requests": 100, "good_requests": 99}, "0.9": {"requests": 100, "good_requests": 90},
            "1.0": {"requests": 100, "good_requests": 89}}
    assert capacity_at_slo(runs, capacity=200.0) == 0.9 * 200.0
    assert capacity_at_slo({"0.5": {"requests": 10, "good_requests": 1}}, capacity=200.0) is None
