"""The scheduler's pool client over Serve handles: which side an attempt goes to, and
what a lost replica does to the next choice."""

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from deployments.pool_client import LOST_REPLICA_HOLD_S, DeploymentState, ServePoolClient
from serve_app.engine.base import GenerationRequest, SamplingOptions
from serve_app.scheduling.errors import ReplicaUnavailable
from serve_app.topology import Topology, deployment_name
from tests.fakes import FailingHandle, FakeEngine, FakeHandle, start_llm_server


async def test_spot_pools_take_batch_and_what_fits_the_notice_window(small_config):

    model = small_config.models[0].model_copy(
        update={"deployment": small_config.models[0].deployment.model_copy(update={"num_replicas": 2})}
    )
    pool = model.pools[0].model_copy(update={"spot_share": 0.5})
    model = model.model_copy(update={"pools": [pool]})
    config = small_config.model_copy(update={"models": [model]})
    topology = Topology(config)
    sides = {side: deployment.options for side, deployment in topology.pool(model.name, pool.name).items()}
    assert sides["spot"]["ray_actor_options"]["label_selector"] == {"ray.io/market-type": "spot"}
    assert sides["spot"]["ray_actor_options"]["fallback_strategy"] == [
        {"label_selector": {"ray.io/market-type": "on-demand"}}
    ]
    assert sides["spot"]["graceful_shutdown_timeout_s"] == 110  # the notice window less the margin
    names = {side: deployment_name(model.name, pool.name, side) for side in sides}
    engines = {side: FakeEngine() for side in sides}
    handles = {names[side]: FakeHandle(await start_llm_server(model, engines[side])) for side in sides}
    client = ServePoolClient(topology, handles)
    client.set_states({name: DeploymentState(running=1) for name in names.values()})
    assert client.slots(model.name, pool.name) == 2 * model.deployment.max_ongoing_requests

    async def send(max_tokens, priority):
        request = GenerationRequest("r", SamplingOptions(max_tokens=max_tokens), prompt="a")
        [chunk async for chunk in client.stream(model.name, pool.name, request, priority)]

    await send(4, "batch")
    await send(4, "realtime")  # equal headroom: on-demand
    await send(50, "batch")  # fits the cold cap: 5 tok/s x (120 - 10 - 5) s = 525 tokens
    await send(None, "batch")  # no limit: never on Spot
    assert [len(engines[side].requests) for side in ("on-demand", "spot")] == [2, 2]
    await send(600, "batch")  # over the cap: on-demand
    assert len(engines["on-demand"].requests) == 3


def two_sided(small_config, replicas: int = 2):
    """A config whose one pool has a Spot and an on-demand deployment, and their names."""
    model = small_config.models[0]
    pool = model.pools[0].model_copy(update={"spot_share": 0.5})
    model = model.model_copy(update={"pools": [pool],
                                     "deployment": model.deployment.model_copy(update={"num_replicas": replicas})})
    config = small_config.model_copy(update={"models": [model]})
    spot, on_demand = (deployment_name(model.name, pool.name, side) for side in ("spot", "on-demand"))
    return config, model, spot, on_demand


def died(actor_id: str) -> ActorDiedError:
    exc = ActorDiedError()
    exc.actor_id = actor_id  # Ray fills it from the death's cause
    return exc


async def attempt(client: ServePoolClient, model, priority: str = "batch") -> None:
    request = GenerationRequest("r", SamplingOptions(max_tokens=4), prompt="a")
    [chunk async for chunk in client.stream(model.name, model.pools[0].name, request, priority)]


async def test_a_lost_replica_steers_retries_to_the_other_side(small_config):
    config, model, spot, on_demand = two_sided(small_config)
    handles = {spot: FailingHandle(ActorDiedError()), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(Topology(config), handles)
    client.set_states({spot: DeploymentState(running=1), on_demand: DeploymentState(running=1)})
    with pytest.raises(ReplicaUnavailable):
        await attempt(client, model)
    assert client.running(model.name, model.pools[0].name) == {"on-demand": 1, "spot": 0}
    await attempt(client, model)  # batch, yet on-demand now
    assert (handles[spot].calls, handles[on_demand].calls) == (1, 1)


async def test_a_lost_replica_counts_once_and_stays_lost_until_the_controller_reports_a_change(small_config):
    config, model, spot, on_demand = two_sided(small_config, replicas=4)
    pool = model.pools[0].name
    handles = {spot: FailingHandle(died("a1")), on_demand: FailingHandle(ValueError("served"))}
    now = [0.0]
    client = ServePoolClient(Topology(config), handles, clock=lambda: now[0])
    before = {spot: DeploymentState(running=2), on_demand: DeploymentState(running=2)}
    client.set_states(before)
    for _ in range(2):  # two streams on the same replica: one replica lost
        with pytest.raises(ReplicaUnavailable):
            await attempt(client, model)
    assert client.running(model.name, pool)["spot"] == 1
    now[0] = 5.0
    client.set_states(before)  # a poll that raced the controller: still lost
    assert client.running(model.name, pool)["spot"] == 1
    client.set_states({**before, spot: DeploymentState(running=1, starting=1)})  # noticed: its count now
    assert client.running(model.name, pool)["spot"] == 1
    client.set_states(before)  # the replacement runs
    assert client.running(model.name, pool)["spot"] == 2


async def test_a_lost_replica_comes_back_after_the_hold_or_at_once_if_only_unreachable(small_config):
    config, model, spot, on_demand = two_sided(small_config)
    pool = model.pools[0].name
    now = [0.0]
    handles = {spot: FailingHandle(died("a1")), on_demand: FailingHandle(ActorUnavailableError("blip", None))}
    client = ServePoolClient(Topology(config), handles, clock=lambda: now[0])
    states = {spot: DeploymentState(running=1), on_demand: DeploymentState(running=1)}
    client.set_states(states)
    with pytest.raises(ReplicaUnavailable):
        await attempt(client, model, "realtime")  # equal headroom, realtime: on-demand
    assert client.running(model.name, pool)["on-demand"] == 0
    client.set_states(states)  # only unreachable for the moment: the next poll brings it back
    assert client.running(model.name, pool)["on-demand"] == 1
    with pytest.raises(ReplicaUnavailable):
        await attempt(client, model)  # batch: Spot, which dies
    client.set_states(states)
    assert client.running(model.name, pool)["spot"] == 0
    now[0] = LOST_REPLICA_HOLD_S
    client.set_states(states)  # the controller never said otherwise: its count again
    assert client.running(model.name, pool)["spot"] == 1


async def test_a_replica_counts_once_however_many_streams_found_it_unreachable_or_dead(small_config):
    config, model, spot, on_demand = two_sided(small_config, replicas=4)
    pool = model.pools[0].name
    unreachable = ActorUnavailableError("blip", bytes.fromhex("ab" * 16))
    handles = {spot: FailingHandle(unreachable), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(Topology(config), handles)
    client.set_states({spot: DeploymentState(running=2), on_demand: DeploymentState(running=2)})
    for _ in range(2):  # two streams find the same replica unreachable
        with pytest.raises(ReplicaUnavailable):
            await attempt(client, model)
    assert client.running(model.name, pool)["spot"] == 1
    handles[spot].exc = died(unreachable.actor_id)  # then it turns out dead
    with pytest.raises(ReplicaUnavailable):
        await attempt(client, model)
    assert client.running(model.name, pool)["spot"] == 1


@pytest.mark.parametrize(
    "state, scaling, down",
    [
        (DeploymentState(running=1), None, None),
        (DeploymentState(running=0, starting=1), None, None),  # a replacement is on its way
        (DeploymentState(running=0), None, "has no replica running or starting"),  # fixed size, all lost
        (DeploymentState(running=0), {"min_replicas": 0, "max_replicas": 2}, None),  # starts on demand
        (DeploymentState(running=0, starting=1, status="DEPLOY_FAILED", message="engine refused: bad dtype"),
         {"min_replicas": 0, "max_replicas": 2}, "DEPLOY_FAILED: engine refused: bad dtype"),
    ],
)
def test_a_pool_is_down_when_nothing_runs_and_nothing_will(small_config, state, scaling, down):
    model = small_config.models[0]
    if scaling is not None:
        options = model.deployment.model_copy(update={"autoscaling_config": scaling, "num_replicas": None})
        model = model.model_copy(update={"deployment": options})
    config = small_config.model_copy(update={"models": [model, *small_config.models[1:]]})
    client = ServePoolClient(Topology(config), {})
    assert client.down_reason(model.name, "default") is None  # nothing reported yet: starting up
    client.set_states({deployment_name(model.name, "default"): state})
    reason = client.down_reason(model.name, "default")
    assert reason == down if down is None else down in reason
