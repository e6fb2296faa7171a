"""Spot in the simulator: a lost node's streams resume through the app's batcher (or
break and are sent again), a drained replica takes nothing new, and the projection
reports each interruption's toll and what it costs at the Spot Advisor's rates."""

from __future__ import annotations

import asyncio
import json

import pytest

from benchmarks.fleetsim import spot_project, virtual_time
from benchmarks.fleetsim.fleet import LeastLoadedRouter
from benchmarks.fleetsim.simulate import SimApp, SimRequest
from benchmarks.fleetsim.spot import ResendingClient
from tests.benchmarks.fleetsim.test_simulate import LONG, SHORT, STEP, config
from tests.benchmarks.fleetsim.trace_file import write_trace

ANSWER = 100
"""Tokens of the answer a node is lost in the middle of (about 1.1 s at `STEP`'s pace)."""


def lose_the_node_mid_answer(seed: int | None) -> tuple:
    """One answer on a fleet of two, its replica's node lost half-way: its record, the
    times it broke, and the decode and prefill tokens the engines computed."""
    async def main():
        app = SimApp(config("local.yaml"), STEP, LeastLoadedRouter(), replicas=2)
        client = ResendingClient(app)
        sent = asyncio.create_task(client.send(SimRequest(20, ANSWER, ANSWER, (("user", LONG),), seed=seed), 0.0))
        await asyncio.sleep(0.5)
        (busy,) = [replica for replica in app.fleet.replicas(app.model.name, "default") if replica.ongoing]
        app.fleet.remove_replica(busy)
        app.pool_changed("default")
        record = await sent
        engines = app.fleet.engines
        return record, client.broken, sum(e.decode_tokens for e in engines), sum(e.prefill_tokens for e in engines)

    return virtual_time.run(main())


def test_a_lost_node_s_stream_resumes_on_the_other_replica_and_nothing_is_decoded_twice():
    record, broken, decoded, prefilled = lose_the_node_mid_answer(seed=None)
    assert record.ok and record.output_tokens == ANSWER and broken == 0
    assert decoded < ANSWER  # every token decoded once (the two prefill steps each made one)
    assert prefilled > 20 + ANSWER / 4  # the resumed attempt prefilled its prompt and what was sent


def test_a_seeded_stream_cannot_resume_so_its_client_sends_it_again_timed_from_the_first_send():
    record, broken, decoded, _ = lose_the_node_mid_answer(seed=0)
    assert record.ok and record.output_tokens == ANSWER and broken == 1
    assert decoded > ANSWER + ANSWER / 4  # the tokens before the loss were decoded again
    # timed from the first send: the answer kept began after the loss, and took every step again (10 ms or more)
    assert record.start_s == 0.0 and record.ttft_s > 0.5 and record.e2el_s > 0.5 + ANSWER * 0.010


def test_a_draining_replica_takes_no_new_request_and_leaves_the_pool_s_slots():
    async def main():
        app = SimApp(config("local.yaml"), STEP, LeastLoadedRouter(), replicas=2)
        draining, serving = app.fleet.replicas(app.model.name, "default")
        draining.draining = True
        app.pool_changed("default")
        records = await asyncio.gather(*(app.send(SimRequest(20, 8, 16, (("user", SHORT),)), 0.0)
                                         for _ in range(10)))
        return records, draining, serving, app.batcher.stats()[(app.model.name, "default")].slots

    records, draining, serving, slots = virtual_time.run(main())
    assert all(record.ok for record in records)
    assert draining.engine.steps == 0 and serving.engine.steps > 0 and slots == serving.slots


def test_advisor_costs_grow_with_the_interruption_rate_and_the_lost_work():
    tolls = {"little": {"lost_work_replica_s": 10.0}, "much": {"lost_work_replica_s": 1000.0}}
    costs = spot_project.advisor_costs(tolls, replacement_s=300.0, spot_hourly=0.4, od_hourly=1.0, od_usd_per_1m=2.0)
    rate = 0.25 / spot_project.HOURS_PER_MONTH
    assert costs[">20%"]["little"]["lost_s_per_replica_hour"] == pytest.approx(rate * 310)
    assert costs[">20%"]["little"]["usd_per_1m_output_tokens"] == pytest.approx(0.8 / (1 - rate * 310 / 3600))
    buckets = list(spot_project.SPOT_ADVISOR_BUCKETS)
    for name in tolls:
        prices = [costs[bucket][name]["usd_per_1m_output_tokens"] for bucket in buckets]
        assert prices == sorted(prices)
    assert costs[">20%"]["much"]["usd_per_1m_output_tokens"] > costs[">20%"]["little"]["usd_per_1m_output_tokens"]


def test_a_small_spot_projection_breaks_streams_only_where_nothing_resumes_and_writes_the_planner_s_factor(tmp_path):
    trace = write_trace(tmp_path / "trace.csv", 400, 0.2, [8, 30, 200, 400])
    out = tmp_path / "spot"
    spot_project.main(["--replicas", "2", "--load", "0.3", "--duration-s", "160", "--interruptions", "1",
                       "--replacement-s", "60", "--seeds", "0", "--trace", str(trace), "--out", str(out)])
    result = json.loads(out.with_suffix(".json").read_text())
    runs, tolls = result["results"], result["per_interruption"]
    assert result["projected"] and set(runs) == set(spot_project.SPOT_SYSTEMS)
    assert runs["spot-resend"]["streams_broken"] > 0
    assert all(runs[name]["streams_broken"] == 0 for name in runs if name != "spot-resend")
    # the earlier the drain, the more streams end before the node goes, the fewer are resumed
    again = [tolls[name]["prefill_tokens_again"] for name in
             ("spot-resume", "spot-resume-late-drain", "spot-resume-no-drain")]
    assert 0 <= again[0] <= again[1] < again[2]
    assert tolls["spot-resend"]["decode_tokens_again"] > 0
    factor = result["factors"]["spot_lost_work_s"]
    assert factor["basis"] == "simulated" and factor["hardware"] == {"kind": "gpu", "model": "L40S"}
    assert factor["value"] == tolls["spot-resume"]["lost_work_replica_s"] and factor["calibration_error"] > 0
