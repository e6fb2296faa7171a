"""Failures of the call to a replica become the right client-facing errors."""

import httpx
import pytest
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from deployments.router import OpenAIRouter


class FailingHandle:
    def __init__(self, exc: Exception) -> None:
        self._exc = exc

    def options(self, stream: bool = False):
        return self

    def __getattr__(self, name):
        return self

    def remote(self, *args):
        exc = self._exc

        class Failing:
            def __await__(self):
                raise exc
                yield

            def __aiter__(self):
                return self

            async def __anext__(self):
                raise exc

            def cancel(self):
                pass

        return Failing()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "exc, status, needle",
    [
        (BackPressureError(num_queued_requests=5, max_queued_requests=5), 503, "at capacity"),
        (ActorDiedError(), 503, "lost the replica"),
        (ValueError("boom"), 500, "boom"),
    ],
)
async def test_replica_call_failures(small_config, stream, exc, status, needle):
    handles = {model.name: FailingHandle(exc) for model in small_config.models}
    app = OpenAIRouter(small_config, handles).__serve_build_asgi_app__()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x", "stream": stream})
    assert response.status_code == status
    assert needle in response.json()["error"]["message"]
    if status == 503:
        assert response.headers["retry-after"] == "1"


async def test_remote_tracebacks_do_not_reach_the_client(small_config):
    from ray.exceptions import RayTaskError

    remote = RayTaskError("stream", "Traceback (most recent call last):\n  secret/path.py", ValueError("bad"))
    handles = {model.name: FailingHandle(remote) for model in small_config.models}
    app = OpenAIRouter(small_config, handles).__serve_build_asgi_app__()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/v1/completions", json={"prompt": "x"})
    message = response.json()["error"]["message"]
    assert response.status_code == 500 and "ValueError: bad" in message
    assert "secret/path.py" not in message
