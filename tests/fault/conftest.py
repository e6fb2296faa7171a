"""One multi-node Ray cluster for the package, the real tiny model on it.

A local `ray.cluster_utils.Cluster` stands in for the node groups: a head
(ingress, proxy, controller), one on-demand node and two Spot nodes labelled
`ray.io/market-type`. One pool with `spot_share` runs one on-demand and two
Spot replicas, in float32 so greedy runs on different engines agree token for
token. Each engine runs at most `MAX_NUM_SEQS` sequences, fewer than the
deployment's `max_ongoing_requests`: the ingress's slots must follow the engine.
Tests that take nodes away put capacity back before they end.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import ray
from ray import serve
from ray.cluster_utils import Cluster

from benchmarks.servers import free_port
from serve_app.app import build_from_config
from serve_app.capacity import MARKET_TYPE_LABEL, ON_DEMAND, SPOT
from serve_app.config import AppConfig
from tests.conftest import REPO, wait_until

MODEL = "smollm2"
PROMPTS = [f"Write a short story about a {thing}." for thing in (
    "cat", "ship", "robot", "garden", "storm", "violin", "mountain", "lantern", "river", "clock", "tiger", "bridge",
)]
MAX_TOKENS = 64
MAX_NUM_SEQS = 12
"""Sequences one engine runs at once; the deployment allows 16 ongoing requests."""
REPLICAS = 3
SPOT_DEPLOYMENT = f"LLMServer-{MODEL}-default-spot"
SINGLE_THREAD = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}


def app_config() -> AppConfig:
    return AppConfig.model_validate({
        "models": [{
            "name": MODEL,
            "engine": {
                "model": str(REPO / "models" / "SmolLM2-135M-Instruct"),
                "dtype": "float32",  # greedy runs on different engines agree token for token
                "max_model_len": 512,
                "max_num_seqs": MAX_NUM_SEQS,
                "cpu_kv_cache_gib": 1,
            },
            "stream_chunk_tokens": 4,
            "pools": [{
                "name": "default",
                "spot_share": 0.67,  # of 3 replicas: 1 on-demand, 2 Spot
                "deployment": {
                    "num_replicas": REPLICAS,
                    "max_ongoing_requests": 16,
                    "health_check_period_s": 2,
                    "ray_actor_options": {"num_cpus": 1, "runtime_env": {"env_vars": SINGLE_THREAD}},
                },
            }],
        }],
        "ingress": {
            "retry_backoff_s": 0.5,
            "max_attempts": 5,
            # as in prod.yaml: the ingress never sits on a node that can vanish
            "deployment": {"ray_actor_options": {"num_cpus": 0, "label_selector": {MARKET_TYPE_LABEL: ON_DEMAND}}},
        },
        # Removed nodes give no notice; a drained one does, through Ray (polled each second).
        # IMDS points at a closed port so its polls fail fast.
        "preemption": {"imds_url": f"http://127.0.0.1:{free_port()}", "poll_interval_s": 1},
    })


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    env = pytest.MonkeyPatch()
    env.setenv("PYTHONPATH", str(REPO))
    ray_cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {
        "on-demand": ray_cluster.add_node(num_cpus=1, labels={MARKET_TYPE_LABEL: ON_DEMAND}),
        "spot": [ray_cluster.add_node(num_cpus=1, labels={MARKET_TYPE_LABEL: SPOT}) for _ in range(2)],
    }
    ray.init(address=ray_cluster.address)
    port = free_port()
    # One proxy, on the head: every node here shares 127.0.0.1, and a proxy on a
    # removed node would take its client connections with it.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    started = time.monotonic()
    serve.run(build_from_config(app_config()), name="llm", route_prefix="/")
    print(f"\n[fault] app ready after {time.monotonic() - started:.0f}s")
    try:
        yield ray_cluster, nodes, f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        ray_cluster.shutdown()
        env.undo()


def running_replicas() -> dict[str, int]:
    deployments = serve.status().applications["llm"].deployments
    return {
        name: sum(n for state, n in d.replica_states.items() if getattr(state, "value", state) == "RUNNING")
        for name, d in deployments.items()
        if name.startswith("LLMServer")
    }


async def stream(http: httpx.AsyncClient, prompt: str, started: asyncio.Event) -> tuple[str, int, str | None]:
    """One greedy batch stream: (text, completion tokens, error). `started` is set at its first chunk or its end."""
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
        "temperature": 0, "ignore_eos": True, "stream": True, "priority": "batch",
        "stream_options": {"include_usage": True},
    }
    text, tokens, error = "", 0, None
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                return "", 0, f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    error = event["error"]["message"]
                elif event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event["choices"]:
                    text += event["choices"][0]["delta"].get("content") or ""
                    started.set()
        return text, tokens, error
    finally:
        started.set()


def moves(base: str) -> dict[str, int]:
    return httpx.get(f"{base}/stats", timeout=30).json()["moves"]


async def all_decoding(started: list[asyncio.Event]) -> None:
    """Returns once every stream has its first chunk (or has ended): a fault after that hits streams mid-answer,
    however fast this machine decodes (a fixed 4 s wait once came after 3.8 s streams had finished)."""
    async with asyncio.timeout(120):
        await asyncio.gather(*(event.wait() for event in started))


def run_with_faults(base: str, faults) -> tuple[list[tuple[str, int, str | None]], list[float]]:
    """Every prompt as a stream at once, and `faults()` once all of them are decoding:
    each stream's (text, tokens, error), and each one's seconds."""

    async def timed(http: httpx.AsyncClient, prompt: str, started: asyncio.Event) -> tuple[tuple[str, int, str | None], float]:
        start = time.monotonic()
        return await stream(http, prompt, started), time.monotonic() - start

    async def run():
        async with httpx.AsyncClient(base_url=base, timeout=300) as http:
            started = [asyncio.Event() for _ in PROMPTS]
            streams = [asyncio.create_task(timed(http, prompt, event)) for prompt, event in zip(PROMPTS, started, strict=True)]
            await all_decoding(started)
            await faults()
            return await asyncio.gather(*streams)

    results = asyncio.run(run())
    return [result for result, _ in results], [seconds for _, seconds in results]


def report(case: str, results, reference: list[str], before: dict, after: dict) -> dict:
    """Sent, succeeded, failed and differing streams, and the ingress's moves between `before` and `after`."""
    counts = {
        "sent": len(results),
        "succeeded": sum(1 for text, tokens, error in results if error is None and tokens == MAX_TOKENS),
        "failed": sum(1 for _, _, error in results if error is not None),
        "differs_from_uninterrupted": sum(1 for (text, _, _), ref in zip(results, reference, strict=True) if text != ref),
        "streams_resumed": after.get("resumed", 0) - before.get("resumed", 0),
        "requests_resent": after.get("resent", 0) - before.get("resent", 0),
    }
    print(f"\n[fault] {case}: {counts}")
    return counts


def ingress_slots(base: str) -> int:
    """The pool's slots as the ingress counts them (from its own poll of the controller)."""
    return httpx.get(f"{base}/stats", timeout=30).json()["pools"][f"{MODEL}/default"]["slots"]


def wait_for_full_pool_at_the_ingress(base: str) -> None:
    """Every replica running, and the ingress counting all their slots: it learns of a
    replica from its own poll of the controller, seconds after Serve reports it running."""
    wait_for_full_pool()
    expected = REPLICAS * MAX_NUM_SEQS
    assert wait_until(lambda: ingress_slots(base) == expected, 60), f"{ingress_slots(base)} slots, not {expected}"


def ongoing_by_node(deployment: str) -> dict[str, int]:
    """Requests each live replica of `deployment` runs now, by the hex id of the node it runs on."""
    alive = ray._private.state.actors(actor_state_name="ALIVE").values()
    replicas = [actor for actor in alive if actor["ActorClassName"] == f"ServeReplica:llm:{deployment}"]
    ongoing = ray.get([ray.get_actor(actor["Name"], namespace="serve").get_num_ongoing_requests.remote()
                       for actor in replicas])
    return {actor["Address"]["NodeID"]: count for actor, count in zip(replicas, ongoing, strict=True)}


def wait_for_full_pool(expected: int = REPLICAS, timeout_s: float = 400) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if sum(running_replicas().values()) >= expected:
            return time.monotonic() - start
        time.sleep(1)
    raise AssertionError(f"pool not back at {expected} replicas after {timeout_s}s: {running_replicas()}")


@pytest.fixture(scope="package")
def reference(cluster) -> tuple[list[str], list[float]]:
    """Every prompt's greedy text from an uninterrupted run, and its seconds."""
    _, _, base = cluster
    results, seconds = run_with_faults(base, lambda: asyncio.sleep(0))
    assert all(error is None and tokens == MAX_TOKENS for _, tokens, error in results), results
    return [text for text, _, _ in results], seconds
