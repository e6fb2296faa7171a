"""The scheduler's pool client over Serve handles: which side an attempt goes to, and
what a lost replica does to the next choice."""

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

from deployments.llm_server import refusal
from deployments.pool_client import LOST_REPLICA_HOLD_S, UNREACHABLE_HOLD_S, DeploymentState, ServePoolClient
from serve_app.engine.base import REPLICA_DRAINING
from serve_app.scheduling.errors import ReplicaUnavailable
from serve_app.topology import Topology, deployment_name
from tests.fakes import FailingHandle, FakeEngine, FakeHandle, generation_request, replicas_up, start_llm_server


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
    client.set_states({name: replicas_up(1, name) for name in names.values()})
    assert client.slots(model.name, pool.name) == 2 * model.deployment.max_ongoing_requests

    async def send(max_tokens, priority):
        request = generation_request(max_tokens)
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
    request = generation_request(4)
    [chunk async for chunk in client.stream(model.name, model.pools[0].name, request, priority)]


async def test_a_lost_replica_steers_retries_to_the_other_side(small_config):
    config, model, spot, on_demand = two_sided(small_config)
    handles = {spot: FailingHandle(died("spot-0")), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(Topology(config), handles)
    client.set_states({spot: replicas_up(1, "spot"), on_demand: replicas_up(1, "od")})
    with pytest.raises(ReplicaUnavailable) as lost:
        await attempt(client, model)
    assert lost.value.replica == "spot-0"  # later attempts avoid it
    assert client.running(model.name, model.pools[0].name) == {"on-demand": 1, "spot": 0}
    await attempt(client, model)  # batch, yet on-demand now
    assert (handles[spot].calls, handles[on_demand].calls) == (1, 1)


class RefusingHandle(FailingHandle):
    """A Spot replica draining for a preemption: it refuses every request."""

    def remote(self, *args):
        self.calls += 1

        async def refuse():
            yield refusal(REPLICA_DRAINING, "spot-0")

        class Refusing:
            def __aiter__(self):
                return refuse()

            def cancel(self):
                pass

        return Refusing()


async def test_a_draining_replicas_refusal_moves_the_retry_to_the_other_side(small_config):
    config, model, spot, on_demand = two_sided(small_config)
    handles = {spot: RefusingHandle(None), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(Topology(config), handles)
    client.set_states({spot: replicas_up(1, "spot"), on_demand: replicas_up(1, "od")})
    await attempt(client, model)  # batch: Spot, which refuses
    assert client.running(model.name, model.pools[0].name) == {"on-demand": 1, "spot": 0}
    await attempt(client, model)
    assert (handles[spot].calls, handles[on_demand].calls) == (1, 1)


async def test_a_lost_replica_counts_once_even_when_the_controller_already_dropped_it(small_config):
    config, model, spot, on_demand = two_sided(small_config, replicas=4)
    pool = model.pools[0].name
    handles = {spot: FailingHandle(died("spot-1")), on_demand: FailingHandle(ValueError("served"))}
    now = [0.0]
    client = ServePoolClient(Topology(config), handles, clock=lambda: now[0])
    before = {spot: replicas_up(2, "spot"), on_demand: replicas_up(2, "od")}
    client.set_states(before)
    for _ in range(2):  # two streams on the same replica: one replica lost
        with pytest.raises(ReplicaUnavailable):
            await attempt(client, model)
    assert client.running(model.name, pool)["spot"] == 1
    now[0] = 5.0
    client.set_states(before)  # a poll that raced the controller: still lost
    assert client.running(model.name, pool)["spot"] == 1
    # The controller has dropped it (a drain's usual order): the loss must not subtract a second time.
    client.set_states({**before, spot: DeploymentState(replicas=frozenset({"spot-0"}), starting=1)})
    assert client.running(model.name, pool)["spot"] == 1
    client.set_states({**before, spot: DeploymentState(replicas=frozenset({"spot-0", "spot-2"}))})  # replaced
    assert client.running(model.name, pool)["spot"] == 2


async def test_losses_expire_on_the_clock_without_a_poll(small_config):
    config, model, spot, on_demand = two_sided(small_config)
    pool = model.pools[0].name
    now = [0.0]
    handles = {spot: FailingHandle(died("spot-0")), on_demand: FailingHandle(ActorUnavailableError("blip", None))}
    client = ServePoolClient(Topology(config), handles, clock=lambda: now[0])
    client.set_states({spot: replicas_up(1, "spot"), on_demand: replicas_up(1, "od")})
    unreachable = ActorUnavailableError("blip", bytes.fromhex("ab" * 16))
    handles[on_demand].exc = unreachable
    with pytest.raises(ReplicaUnavailable) as blip:
        await attempt(client, model, "realtime")  # equal headroom, realtime: on-demand
    assert blip.value.replica is None  # only unreachable: not avoided for good
    client.set_states({spot: replicas_up(1, "spot"), on_demand: DeploymentState(replicas=frozenset({
        unreachable.actor_id}))})
    assert client.running(model.name, pool)["on-demand"] == 0
    with pytest.raises(ReplicaUnavailable):
        await attempt(client, model)  # batch: Spot, which dies
    assert client.running(model.name, pool) == {"on-demand": 0, "spot": 0}
    # The controller cannot be asked (a GCS outage: no poll at all); the marks still expire.
    now[0] = UNREACHABLE_HOLD_S
    assert client.running(model.name, pool) == {"on-demand": 1, "spot": 0}
    now[0] = LOST_REPLICA_HOLD_S
    assert client.running(model.name, pool) == {"on-demand": 1, "spot": 1}


async def test_a_replica_counts_once_however_many_streams_found_it_unreachable_or_dead(small_config):
    config, model, spot, on_demand = two_sided(small_config, replicas=4)
    pool = model.pools[0].name
    unreachable = ActorUnavailableError("blip", bytes.fromhex("ab" * 16))
    handles = {spot: FailingHandle(unreachable), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(Topology(config), handles)
    client.set_states({spot: DeploymentState(replicas=frozenset({unreachable.actor_id, "spot-1"})),
                       on_demand: replicas_up(2, "od")})
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
        (replicas_up(1), None, None),
        (DeploymentState(starting=1), None, None),  # a replacement is on its way
        (DeploymentState(), None, "has no replica running or starting"),  # fixed size, all lost
        (DeploymentState(), {"min_replicas": 0, "max_replicas": 2}, None),  # starts on demand
        (DeploymentState(starting=1, status="DEPLOY_FAILED", message="engine refused: bad dtype"),
         {"min_replicas": 0, "max_replicas": 2}, "DEPLOY_FAILED"),
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
    assert reason is None or "engine refused" not in reason  # Serve's message never reaches a client
