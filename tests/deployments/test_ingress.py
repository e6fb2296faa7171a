"""Failures of the call to a replica become retries or the right client-facing errors."""

import asyncio

import httpx
import pytest
from ray.exceptions import ActorDiedError, RayTaskError
from ray.serve.exceptions import BackPressureError

from deployments.ingress import OpenAIIngress
from serve_app.topology import deployment_name
from tests.fakes import FailingHandle, replicas_up


async def app_over(config, exc: Exception):
    config = config.model_copy(update={"ingress": config.ingress.model_copy(update={"retry_backoff_s": 0})})
    handles = {deployment_name(model.name, "default"): FailingHandle(exc) for model in config.models}

    async def one_each():
        return {name: replicas_up(1, name) for name in handles}

    ingress = OpenAIIngress.__new__(OpenAIIngress)
    await ingress.__init__(config, handles, read_states=one_each)
    return ingress.__serve_build_asgi_app__(), handles


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "exc, status, code, tries",
    [
        (BackPressureError(num_queued_requests=5, max_queued_requests=5), 503, "overloaded", 1),  # load, not a loss
        (ActorDiedError(), 503, "unavailable", 3),
        (ValueError("boom"), 500, "engine_error", 1),  # an engine failure is not retried
    ],
)
async def test_replica_call_failures(small_config, stream, exc, status, code, tries):
    app, handles = await app_over(small_config, exc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x", "stream": stream})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and (type(exc).__name__ in error["message"] or "boom" in error["message"]
                                      or "queue is full" in error["message"])
    assert handles[deployment_name("fake-a", "default")].calls == tries
    if status == 503:
        assert response.headers["retry-after"] == "1"


async def test_remote_tracebacks_do_not_reach_the_client(small_config):
    remote = RayTaskError("stream", "Traceback (most recent call last):\n  secret/path.py", ValueError("bad"))
    app, _ = await app_over(small_config, remote)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x"})
    message = response.json()["error"]["message"]
    assert response.status_code == 500 and "ValueError" in message  # the type, for the client
    assert "secret/path.py" not in message and "bad" not in message  # no remote text: that goes to the log


@pytest.mark.parametrize("starting, min_reads, max_reads", [(1, 3, 6), (0, 1, 1)])
async def test_replica_counts_are_read_often_only_while_replicas_start(small_config, starting, min_reads, max_reads):
    reads = []
    handles = {deployment_name(model.name, "default"): FailingHandle(ValueError()) for model in small_config.models}

    async def states():
        reads.append(asyncio.get_running_loop().time())
        return {name: replicas_up(1, name, starting=starting) for name in handles}

    ingress = OpenAIIngress.__new__(OpenAIIngress)
    await ingress.__init__(small_config, handles, read_states=states)
    await asyncio.sleep(1.6)
    ingress._poller.cancel()
    assert min_reads <= len(reads) <= max_reads
