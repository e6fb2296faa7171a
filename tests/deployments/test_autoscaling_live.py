"""The queue-duration policy inside a real Serve controller: an ingress reports a
fake queue for a second deployment, which the application-level policy scales
0 -> 1 on sustained queued demand, to 2 while the wait stays above target,
and back to 0 after idling.

The app is deployed the way `serve run config.yaml` deploys one (a
`ServeDeploySchema` through the controller's `deploy_apps`): Serve 2.60 takes an
application-level `autoscaling_policy` only from a config, not from `serve.run`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.serve._private.api import serve_start
from ray.serve.schema import ServeDeploySchema

from serve_app.autoscaling.contract import PoolQueueStats, autoscaling_stats
from serve_app.config import APP_POLICY
from serve_app.topology import INGRESS_DEPLOYMENT, ingress_autoscaling_config, pool_autoscaling_config

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
APP_NAME = "autoscaling-live"
POOL = "LLMServer-fake-short"


@serve.deployment
class FakeIngress:
    """Reports whatever queue the test sets for the pool."""

    def __init__(self, pool) -> None:
        self._stats = PoolQueueStats(queued=0, in_flight=0)

    def set_queue(self, queued: int, wait_s: float) -> None:
        self._stats = PoolQueueStats(queued=queued, in_flight=0, wait_p90_s=wait_s, oldest_wait_s=wait_s)

    def record_autoscaling_stats(self) -> dict[str, float]:
        return autoscaling_stats({POOL: self._stats})


@serve.deployment(ray_actor_options={"num_cpus": 0})
class FakePool:
    def __call__(self) -> str:
        return "ok"


def build_app(args: dict):
    pool = FakePool.options(name=POOL, autoscaling_config=pool_autoscaling_config(0, 2, initial_replicas=0))
    ingress = FakeIngress.options(name=INGRESS_DEPLOYMENT, ray_actor_options={"num_cpus": 0},
                                autoscaling_config=ingress_autoscaling_config(1, report_interval_s=0.2))
    return ingress.bind(pool.bind())


def running_replicas(deployment: str) -> int:
    states = serve.status().applications[APP_NAME].deployments[deployment].replica_states
    return sum(n for state, n in states.items() if getattr(state, "value", state) == "RUNNING")


def wait_for(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not reached within {timeout_s}s")
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def live_app():
    ray.init(address="local", num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    client = serve_start(proxy_location="Disabled")  # handles only: no HTTP port to collide on
    config = ServeDeploySchema.model_validate({"applications": [{
        "name": APP_NAME,
        "route_prefix": None,
        "import_path": f"{__name__}:build_app",
        "autoscaling_policy": {"policy_function": APP_POLICY, "policy_kwargs": {
            "default": {"target_queue_wait_s": 0.5, "upscale_delay_s": 1, "downscale_delay_s": 1,
                        "scale_from_zero_delay_s": 1, "idle_to_zero_delay_s": 2},
            "stale_after_s": 5,
        }},
    }]})
    client.deploy_apps(config, _blocking=True)
    try:
        yield serve.get_app_handle(APP_NAME)
    finally:
        serve.shutdown()
        ray.shutdown()


def test_pool_scales_from_zero_on_sustained_wait_and_back_after_idle(live_app):
    assert running_replicas(POOL) == 0
    time.sleep(2)  # no demand: it stays at zero
    assert running_replicas(POOL) == 0

    live_app.set_queue.remote(3, 4.0).result()
    up_s = wait_for(lambda: running_replicas(POOL) == 1, timeout_s=30)
    assert up_s >= 1.0  # the scale-from-zero delay held it for a while first
    # the wait stays above target with a replica running: the next step, up to max_replicas
    wait_for(lambda: running_replicas(POOL) == 2, timeout_s=30)

    live_app.set_queue.remote(0, 0.0).result()
    wait_for(lambda: running_replicas(POOL) == 0, timeout_s=30)
