"""The preemption guard: its states against a fake node, then a real drain on a
local multi-node Ray cluster (head, an on-demand node, a Spot node)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from deployments.preemption_guard import PreemptionGuard
from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND, SPOT
from serve_app.capacity.preemption import PreemptionConfig
from serve_app.capacity.split import CapacitySplit
from tests.fakes import FakeImds, FakeNode

REPO = Path(__file__).resolve().parents[2]


class FakeCounter:
    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


@pytest.fixture
def imds():
    fake = FakeImds()
    yield fake
    fake.close()


def fast_config(url: str, **overrides) -> PreemptionConfig:
    return PreemptionConfig(imds_url=url, poll_interval_s=0.05, imds_timeout_s=0.5, drain_margin_s=10, **overrides)


async def eventually(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_on_demand_node_is_not_watched_unless_forced(imds):
    idle = PreemptionGuard(fast_config(imds.url), node=FakeNode(ON_DEMAND), counter=FakeCounter())
    forced = PreemptionGuard(fast_config(imds.url, watch_all_nodes=True), node=FakeNode(ON_DEMAND),
                             counter=FakeCounter())
    off = PreemptionGuard(fast_config(imds.url, enabled=False), node=FakeNode(SPOT), counter=FakeCounter())
    assert (idle.start(), forced.start(), off.start()) == (False, True, False)
    forced.stop()
    assert not idle.draining and idle.healthy()


async def test_imds_notice_drains_the_node_and_counts_once(imds):
    node, counter, seen = FakeNode(SPOT), FakeCounter(), []
    guard = PreemptionGuard(fast_config(imds.url), node=node, counter=counter, on_notice=seen.append)
    assert guard.start()
    await asyncio.sleep(0.2)
    assert not guard.draining and node.drains == [] and guard.healthy()
    deadline = imds.announce(in_s=120)
    await eventually(lambda: node.drains)
    guard.stop()
    assert guard.draining and counter.value == 1 and seen == [guard.notice]
    assert node.drains[0][0] == deadline and "terminate" in node.drains[0][1]


async def test_health_holds_while_work_is_in_flight_until_the_margin(imds):
    guard = PreemptionGuard(fast_config(imds.url), node=FakeNode(SPOT), counter=FakeCounter())
    guard.start()
    with guard.track():
        imds.announce(in_s=60)
        await eventually(lambda: guard.draining)
        assert guard.healthy(), "in-flight work keeps the replica healthy"
    assert not guard.healthy(), "idle and draining: unhealthy"
    guard.stop()

    near = PreemptionGuard(fast_config(imds.url), node=FakeNode(SPOT), counter=FakeCounter())
    near.start()
    imds.announce(in_s=5)  # inside the 10 s margin
    with near.track():
        await eventually(lambda: near.draining)
        assert not near.healthy(), "deadline near: unhealthy even with work in flight"
    near.stop()


async def test_a_drain_started_elsewhere_is_a_notice_without_a_second_drain(imds):
    node, counter = FakeNode(SPOT), FakeCounter()
    guard = PreemptionGuard(fast_config(imds.url), node=node, counter=counter)
    guard.start()
    node.deadline_ms = int((time.time() + 30) * 1000)  # e.g. Ray draining the node on SIGTERM
    await eventually(lambda: guard.draining)
    guard.stop()
    assert guard.notice.source == "drain" and guard.notice.deadline == node.deadline_ms / 1000
    assert node.drains == [] and counter.value == 1


async def test_with_imds_off_the_guard_takes_the_drain_and_never_asks_imds(imds):
    node, counter = FakeNode(SPOT), FakeCounter()
    guard = PreemptionGuard(fast_config(imds.url, imds=False), node=node, counter=counter)
    imds.announce(in_s=120)  # a notice IMDS would report, were it asked
    assert guard.start()
    node.deadline_ms = int((time.time() + 100) * 1000)  # Ray draining the node on the pod's SIGTERM
    await eventually(lambda: guard.draining)
    guard.stop()
    assert guard.notice.source == "drain" and guard.notice.deadline == node.deadline_ms / 1000
    assert imds.tokens == [] and imds.gets == [] and node.drains == [] and counter.value == 1


# --- on a real cluster -------------------------------------------------------------


class Probe:
    """A replica that answers with its node id and refuses work while draining."""

    async def __init__(self, config: PreemptionConfig) -> None:
        self._guard = PreemptionGuard(config)
        self._guard.start()

    async def __call__(self) -> dict:
        if self._guard.draining:
            return {"node_id": self._guard.node_id, "refused": True}
        with self._guard.track():
            return {"node_id": self._guard.node_id, "refused": False}

    def check_health(self) -> None:
        if not self._guard.healthy():
            raise RuntimeError("draining")


@pytest.fixture(scope="module")
def cluster():
    """Head (1 CPU), an on-demand node and a Spot node (1 CPU each); Serve without proxies."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", str(REPO))  # replicas unpickle `Probe` from this module
        ray_cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        try:
            on_demand = ray_cluster.add_node(num_cpus=1, labels={MARKET_TYPE_LABEL: ON_DEMAND})
            spot = ray_cluster.add_node(num_cpus=1, labels={MARKET_TYPE_LABEL: SPOT})
            ray.init(address=ray_cluster.address)
            serve.start(proxy_location="Disabled")
            yield {ON_DEMAND: on_demand.node_id, SPOT: spot.node_id}
        finally:
            serve.shutdown()
            ray.shutdown()
            ray_cluster.shutdown()


@pytest.mark.cluster
def test_notice_drains_the_spot_node_and_serve_moves_the_replica(cluster, imds):
    options = CapacitySplit(spot_share=1.0).serve_options(
        {"num_replicas": 1, "ray_actor_options": {"num_cpus": 1},
         "health_check_period_s": 1, "graceful_shutdown_timeout_s": 5}
    )
    assert list(options) == [SPOT]
    config = PreemptionConfig(imds_url=imds.url, poll_interval_s=0.2, imds_timeout_s=0.5)
    app = serve.deployment(Probe).options(name="Probe", **options[SPOT]).bind(config)
    handle = serve.run(app, name="probe", route_prefix=None)
    assert handle.remote().result(timeout_s=30) == {"node_id": cluster[SPOT], "refused": False}

    gcs = ray._private.worker.global_worker.gcs_client
    deadline = imds.announce(in_s=90)
    noticed = time.monotonic()
    while cluster[SPOT] not in gcs.get_draining_nodes():
        assert time.monotonic() - noticed < 10, "the Spot node was never drained"
        time.sleep(0.1)
    drained_s = time.monotonic() - noticed
    assert gcs.get_draining_nodes()[cluster[SPOT]] == int(deadline * 1000)

    # The guard marks the replica draining before it drains the node, so from
    # here on the Spot replica may only refuse; answers come from the replacement,
    # until Serve stops routing to the Spot replica at all (20 answers in a row).
    answers, refused, streak = [], 0, 0
    while streak < 20:
        assert time.monotonic() - noticed < 90, f"no replacement after {answers=} {refused=}"
        reply = handle.remote().result(timeout_s=30)
        if reply["refused"]:
            assert reply["node_id"] == cluster[SPOT]
            refused, streak = refused + 1, 0
            time.sleep(0.1)
        else:
            answers.append(reply["node_id"])
            streak += 1
    moved_s = time.monotonic() - noticed
    assert set(answers) == {cluster[ON_DEMAND]}

    replicas = serve.status().applications["probe"].deployments["Probe"].replica_states
    assert replicas.get("RUNNING") == 1, replicas
    print(f"drained after {drained_s:.1f}s, replacement serving after {moved_s:.1f}s, {refused} refusals")
