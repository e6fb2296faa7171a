"""Failures of the call to a replica become retries or the right client-facing errors."""

import httpx
import pytest
from ray.exceptions import ActorDiedError, RayTaskError
from ray.serve.exceptions import BackPressureError

from deployments.router import OpenAIRouter
from serve_app.config import pool_deployment_name


class FailingHandle:
    def __init__(self, exc: Exception) -> None:
        self._exc = exc
        self.calls = 0

    def options(self, stream: bool = False):
        return self

    def __getattr__(self, name):
        return self

    def remote(self, *args):
        self.calls += 1
        exc = self._exc

        class Failing:
            def __aiter__(self):
                return self

            async def __anext__(self):
                raise exc

            def cancel(self):
                pass

        return Failing()


async def app_over(config, exc: Exception):
    config = config.model_copy(update={"router": config.router.model_copy(update={"retry_backoff_s": 0})})
    handles = {pool_deployment_name(model.name, "default"): FailingHandle(exc) for model in config.models}

    async def one_each():
        return {name: 1 for name in handles}

    router = OpenAIRouter.__new__(OpenAIRouter)
    await router.__init__(config, handles, count_replicas=one_each)
    return router.__serve_build_asgi_app__(), handles


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "exc, status, needle",
    [
        (BackPressureError(num_queued_requests=5, max_queued_requests=5), 503, "after 3 tries (BackPressureError)"),
        (ActorDiedError(), 503, "after 3 tries (ActorDiedError)"),
        (ValueError("boom"), 500, "boom"),
    ],
)
async def test_replica_call_failures(small_config, stream, exc, status, needle):
    app, handles = await app_over(small_config, exc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x", "stream": stream})
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]
    tries = handles[pool_deployment_name("fake-a", "default")].calls
    if status == 503:
        assert response.headers["retry-after"] == "1" and tries == 3
    else:
        assert tries == 1  # an engine failure is not retried


async def test_remote_tracebacks_do_not_reach_the_client(small_config):
    remote = RayTaskError("stream", "Traceback (most recent call last):\n  secret/path.py", ValueError("bad"))
    app, _ = await app_over(small_config, remote)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x"})
    message = response.json()["error"]["message"]
    assert response.status_code == 500 and "ValueError: bad" in message
    assert "secret/path.py" not in message


async def test_spot_pools_take_batch_and_what_fits_the_notice_window(small_config):
    from deployments.router import ServePoolClient
    from serve_app.engine.base import GenerationRequest, SamplingOptions
    from tests.fakes import FakeEngine, FakeHandle, start_llm_server

    model = small_config.models[0].model_copy(
        update={"deployment": small_config.models[0].deployment.model_copy(update={"num_replicas": 2})}
    )
    pool = model.pools[0].model_copy(update={"spot_share": 0.5})
    model = model.model_copy(update={"pools": [pool]})
    config = small_config.model_copy(update={"models": [model]})
    sides = config.pool_deployments(model, pool)
    assert sides["spot"]["ray_actor_options"]["label_selector"] == {"ray.io/market-type": "spot"}
    assert sides["spot"]["ray_actor_options"]["fallback_strategy"] == [
        {"label_selector": {"ray.io/market-type": "on-demand"}}
    ]
    assert sides["spot"]["graceful_shutdown_timeout_s"] == 110  # the notice window less the margin
    names = {side: pool_deployment_name(model.name, pool.name, side) for side in sides}
    engines = {side: FakeEngine() for side in sides}
    handles = {names[side]: FakeHandle(await start_llm_server(model, engines[side])) for side in sides}
    client = ServePoolClient(config, handles)
    client.set_running({name: 1 for name in names.values()})
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


async def test_a_lost_replica_steers_retries_to_the_other_side_until_the_next_poll(small_config):
    from deployments.router import ServePoolClient
    from serve_app.batcher import ReplicaUnavailable
    from serve_app.engine.base import GenerationRequest, SamplingOptions

    model = small_config.models[0]
    pool = model.pools[0].model_copy(update={"spot_share": 0.5})
    model = model.model_copy(update={"pools": [pool], "deployment": model.deployment.model_copy(update={"num_replicas": 2})})
    config = small_config.model_copy(update={"models": [model]})
    spot, on_demand = (pool_deployment_name(model.name, pool.name, side) for side in ("spot", "on-demand"))
    handles = {spot: FailingHandle(ActorDiedError()), on_demand: FailingHandle(ValueError("served"))}
    client = ServePoolClient(config, handles)
    client.set_running({spot: 1, on_demand: 1})
    request = GenerationRequest("r", SamplingOptions(max_tokens=4), prompt="a")
    with pytest.raises(ReplicaUnavailable):
        [chunk async for chunk in client.stream(model.name, pool.name, request, "batch")]
    assert client.running(model.name, pool.name) == {"on-demand": 1, "spot": 0}
    [chunk async for chunk in client.stream(model.name, pool.name, request, "batch")]  # batch, yet on-demand now
    assert (handles[spot].calls, handles[on_demand].calls) == (1, 1)
