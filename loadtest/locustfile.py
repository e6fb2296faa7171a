"""Locust load test against the ingress: OpenAI chat completions, short and long,
some streamed, realtime and batch priority.

    API_KEY=... locust -f loadtest/locustfile.py --host http://<ingress>:8000
    # headless: add --headless -u 64 -r 8 -t 10m --csv results/locust

Environment: API_KEY (sent as `Authorization: Bearer ...`; none sent when unset),
MODEL (default: the server's first model). Streamed requests also report their
time to first token as request type "TTFT". `benchmarks/throughput.py` is the
built-in tokens/s benchmark; this file is for sustained mixed load.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from locust import HttpUser, between, task

TOPICS = ("the water cycle", "TCP congestion control", "the French revolution", "photosynthesis",
          "binary search", "the Roman aqueducts", "vaccines", "black holes")


@dataclass(frozen=True)
class Shape:
    """One kind of request in the mix."""

    name: str
    max_tokens: int
    stream: bool
    priority: str

    def prompt(self, rng: random.Random) -> str:
        topic = rng.choice(TOPICS)
        if self.max_tokens <= 64:
            return f"In one sentence, what is {topic}?"
        return f"Write a detailed, multi-paragraph explanation of {topic} for a curious student."


SHORT = Shape("short", 48, stream=False, priority="realtime")
SHORT_STREAM = Shape("short-stream", 48, stream=True, priority="realtime")
LONG_BATCH = Shape("long-batch", 512, stream=False, priority="batch")
LONG_STREAM = Shape("long-stream", 512, stream=True, priority="realtime")


def chat_request(shape: Shape, rng: random.Random, environ: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """Headers and JSON body of one chat completion of this shape."""
    headers = {"Content-Type": "application/json", "X-Priority": shape.priority}
    if environ.get("API_KEY"):
        headers["Authorization"] = f"Bearer {environ['API_KEY']}"
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": shape.prompt(rng)}],
        "max_tokens": shape.max_tokens,
        "temperature": 0.7,
        "stream": shape.stream,
    }
    if shape.stream:
        body["stream_options"] = {"include_usage": True}
    if environ.get("MODEL"):
        body["model"] = environ["MODEL"]
    return headers, body


class ChatUser(HttpUser):
    """Mostly short realtime chats; long answers as batch or streamed."""

    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        self.rng = random.Random()

    @task(6)
    def short(self) -> None:
        self._complete(SHORT)

    @task(3)
    def short_stream(self) -> None:
        self._stream(SHORT_STREAM)

    @task(2)
    def long_batch(self) -> None:
        self._complete(LONG_BATCH)

    @task(1)
    def long_stream(self) -> None:
        self._stream(LONG_STREAM)

    def _complete(self, shape: Shape) -> None:
        headers, body = chat_request(shape, self.rng, dict(os.environ))
        with self.client.post("/v1/chat/completions", json=body, headers=headers, name=shape.name,
                              catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
            elif not response.json().get("choices"):
                response.failure("no choices in the response")

    def _stream(self, shape: Shape) -> None:
        headers, body = chat_request(shape, self.rng, dict(os.environ))
        start = time.perf_counter()
        first_token_at = None
        with self.client.post("/v1/chat/completions", json=body, headers=headers, name=shape.name,
                              stream=True, catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            done = False
            for line in response.iter_lines(decode_unicode=True):
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    response.failure(f"error event mid-stream: {event['error'].get('message')}")
                    return
                choices = event.get("choices") or [{}]
                if first_token_at is None and choices[0].get("delta", {}).get("content"):
                    first_token_at = time.perf_counter()
            if not done:
                response.failure("stream ended without [DONE]")
                return
        if first_token_at is not None:
            self.environment.events.request.fire(
                request_type="TTFT", name=shape.name, response_time=(first_token_at - start) * 1000,
                response_length=0, exception=None, context={},
            )
