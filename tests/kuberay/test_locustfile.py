"""The locust user builds valid OpenAI chat requests (nothing is sent).

locust monkey-patches the standard library with gevent on import, so the
locustfile is imported in a child process that prints the requests it builds.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from serve_app.openai.app_fields import AppFields
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust is not installed")

DUMP = """
import json, random, sys
sys.path.insert(0, "loadtest")
import locustfile as lf
from locust import HttpUser
tasks = {fn.__name__: weight for fn, weight in
         ((fn, lf.ChatUser.tasks.count(fn)) for fn in set(lf.ChatUser.tasks))}
shapes = [v for v in vars(lf).values() if isinstance(v, lf.Shape)]
rng = random.Random(0)
requests = [dict(zip(("headers", "body"), lf.chat_request(s, rng, {"API_KEY": "sk-test", "MODEL": "m"})))
            for s in shapes for _ in range(3)]
anonymous = lf.chat_request(shapes[0], rng, {})
print(json.dumps({"is_user": issubclass(lf.ChatUser, HttpUser), "tasks": tasks, "requests": requests,
                  "anonymous": anonymous[0]}))
"""


@pytest.fixture(scope="module")
def dumped() -> dict:
    out = subprocess.run([sys.executable, "-c", DUMP], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_user_mixes_weighted_tasks(dumped):
    assert dumped["is_user"]
    assert len(dumped["tasks"]) >= 4 and all(weight >= 1 for weight in dumped["tasks"].values())


def test_requests_are_valid_chat_completions(dumped):
    for request in dumped["requests"]:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        fields = dict(request["body"])
        AppFields.pop_from(fields, 4096)
        body = ChatCompletionRequest.model_validate(fields)
        assert body.messages and body.model == "m"
        assert request["headers"]["Authorization"] == "Bearer sk-test"
        assert request["headers"]["X-Priority"] in {"realtime", "batch"}


def test_the_mix_has_short_long_streamed_and_both_priorities(dumped):
    bodies = [r["body"] for r in dumped["requests"]]
    assert {b["stream"] for b in bodies} == {True, False}
    assert min(b["max_tokens"] for b in bodies) <= 64 < 256 <= max(b["max_tokens"] for b in bodies)
    assert {r["headers"]["X-Priority"] for r in dumped["requests"]} == {"realtime", "batch"}
    assert all(b.get("stream_options", {}).get("include_usage") for b in bodies if b["stream"])


def test_no_api_key_sends_no_authorization(dumped):
    assert "Authorization" not in dumped["anonymous"]
