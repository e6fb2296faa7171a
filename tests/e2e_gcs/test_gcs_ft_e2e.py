"""A head failure survived: GCS fault tolerance on a real Redis, as prod.yaml's
RayService runs it. A local Redis server (started here, a real process) keeps
the cluster's state; the GCS is killed under streamed load and restarted. The
app must keep serving while the GCS is down, lose no request, and the cluster
must come back with its state (nodes, the app, new work schedulable). This
process only owns the cluster and restarts its GCS; the Ray drivers (deploy,
final check) are processes of their own, so no Ray client thread here can stall
the restart or end the test session."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest
from ray.cluster_utils import Cluster

from benchmarks.servers import free_port
from tests.conftest import REPO, engine_processes, wait_until
from tests.e2e_gcs.driver import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKENS = 96
PROMPTS = [f"Write a short story about a {thing}." for thing in ("cat", "ship", "robot", "garden", "storm", "violin")]
GCS_DOWN_S = 12


@pytest.fixture(scope="module")
def redis():
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: .ci/run installs Debian's redis-server package"
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    assert wait_until(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                             text=True).stdout.strip() == "PONG", 10)
    yield f"127.0.0.1:{port}"
    server.terminate()
    server.wait(10)


def driver(*args: str, timeout_s: float = 420) -> str:
    """Run one of `tests.e2e_gcs.driver`'s commands; its standard output."""
    done = subprocess.run([sys.executable, "-m", "tests.e2e_gcs.driver", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout_s)
    assert done.returncode == 0, f"driver {args[0]} exited {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def app_on_gcs_ft(redis):
    """(the cluster, the app's base URL). This process owns the cluster's processes
    but never connects to it as a driver (see `tests.e2e_gcs.driver`)."""
    env = pytest.MonkeyPatch()
    env.setenv("RAY_REDIS_ADDRESS", redis)  # the head keeps its state in Redis
    env.setenv("PYTHONPATH", str(REPO))
    # a fixed GCS port: the restarted GCS must be where every client looks for it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "gcs_server_port": free_port()})
    port = free_port()
    try:
        driver("deploy", cluster.address, str(port))
        yield cluster, f"http://127.0.0.1:{port}"
        driver("shutdown", cluster.address, timeout_s=120)
    finally:
        cluster.shutdown()
        env.undo()
    assert wait_until(lambda: not engine_processes(), 60), f"vLLM processes left behind: {engine_processes()}"


async def one(http: httpx.AsyncClient, prompt: str) -> tuple[str, int, str | None]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS,
            "temperature": 0, "ignore_eos": True}
    try:
        reply = await http.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return "", 0, repr(exc)
    if reply.status_code != 200:
        return "", 0, f"HTTP {reply.status_code}"
    data = reply.json()
    return data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"], None


def test_the_app_serves_through_a_gcs_restart_and_the_cluster_recovers(app_on_gcs_ft):
    cluster, base = app_on_gcs_ft
    http_timeout = httpx.Timeout(120)

    async def reference() -> dict[str, str]:
        async with httpx.AsyncClient(base_url=base, timeout=http_timeout) as http:
            results = await asyncio.gather(*(one(http, p) for p in PROMPTS))
        return {p: text for p, (text, _, _) in zip(PROMPTS, results, strict=True)}

    expected = asyncio.run(reference())

    gcs_down, gcs_up = threading.Event(), threading.Event()

    async def until(event: threading.Event) -> None:
        while not event.is_set():
            await asyncio.sleep(0.1)

    async def under_load() -> tuple[list, list]:
        sent, during_outage = [], []
        async with httpx.AsyncClient(base_url=base, timeout=http_timeout) as http:
            async def wave(record: list) -> None:
                record.extend(zip(PROMPTS, await asyncio.gather(*(one(http, p) for p in PROMPTS)), strict=True))

            first = asyncio.create_task(wave(sent))
            await until(gcs_down)
            await asyncio.sleep(1)
            await wave(during_outage)  # sent while the GCS is down
            await until(gcs_up)
            await first
            await wave(sent)
        return sent, during_outage

    # The load runs in a thread; the GCS is killed and restarted from this main
    # thread, since Ray ties the GCS process's life to the thread that starts it.
    outcome: list = []
    loader = threading.Thread(target=lambda: outcome.append(asyncio.run(under_load())))
    started = time.monotonic()
    loader.start()
    time.sleep(3)
    cluster.head_node.kill_gcs_server()
    gcs_down.set()
    time.sleep(GCS_DOWN_S)
    cluster.head_node.start_gcs_server()
    gcs_up.set()
    loader.join(timeout=600)
    (sent, during_outage), = outcome
    results = sent + during_outage
    summary = {
        "sent": len(results),
        "succeeded": sum(error is None and tokens == TOKENS for _, (_, tokens, error) in results),
        "failed": sum(error is not None for _, (_, _, error) in results),
        "differing": sum(text != expected[prompt] for prompt, (text, _, error) in results if error is None),
        "hung": sum(error is not None and "Timeout" in error for _, (_, _, error) in results),
        "answered_while_gcs_down": sum(error is None for _, (_, _, error) in during_outage),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"\n[gcs-ft] GCS killed for {GCS_DOWN_S}s under load: {summary}")
    assert summary["failed"] == summary["differing"] == summary["hung"] == 0 and summary["succeeded"] == summary["sent"]
    assert summary["answered_while_gcs_down"] == len(PROMPTS)
    # The cluster recovered its state from Redis: the node, the app, and new work runs.
    assert json.loads(driver("check", cluster.address, timeout_s=180)) == {
        "app": "RUNNING", "nodes_alive": [True], "task": "scheduled"}
