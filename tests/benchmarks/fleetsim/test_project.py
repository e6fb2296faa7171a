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
