"""The routing projection end to end on a small trace: every figure labelled projected,
with the published source of its step time, for every system and load."""

from __future__ import annotations

import json
import random

from benchmarks.fleetsim.project import SYSTEMS, main


def test_a_small_projection_names_its_sources_and_covers_every_system_and_load(tmp_path):
    rng = random.Random(0)
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.05:.3f},{rng.randint(50, 1500)},{rng.choice([8, 30, 300, 600])}" for i in range(120)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
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
