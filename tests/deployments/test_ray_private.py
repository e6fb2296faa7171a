"""Each private Ray API that `deployments/ray_private.py` adapts still exists in
the installed Ray with the shape the adapter calls (no cluster: the live drain
runs in `test_preemption_guard.py`). An upgrade that moves one fails here."""

from __future__ import annotations

import inspect

import pytest
import ray
from ray._raylet import GcsClient, InnerGcsClient
from ray.core.generated import autoscaler_pb2
from ray.serve._private.request_router import request_router
from ray.serve._private.request_router.common import ReplicaQueueLengthCache

from deployments import ray_private


def parameters(method) -> list[str]:
    return [name for name in inspect.signature(method).parameters if name != "self"]


def test_the_adapters_were_written_for_the_installed_ray():
    assert ray.__version__ == ray_private.RAY_VERSION


def test_the_workers_gcs_client_drains_nodes_and_lists_drains():
    assert "worker.gcs_client = " in inspect.getsource(ray._private.worker.connect)
    assert hasattr(GcsClient, "__getattr__"), "GcsClient delegates to InnerGcsClient"
    assert parameters(InnerGcsClient.drain_node) == [
        "node_id", "reason", "reason_message", "deadline_timestamp_ms", "timeout"]
    assert parameters(InnerGcsClient.get_draining_nodes) == ["timeout"]
    assert autoscaler_pb2.DrainNodeReason.Name(
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION) == "DRAIN_NODE_REASON_PREEMPTION"


def test_request_routers_keep_a_queue_length_cache_by_replica():
    init = inspect.getsource(request_router.RequestRouter.__init__)
    assert "self._replica_queue_len_cache = ReplicaQueueLengthCache(" in init
    assert parameters(ReplicaQueueLengthCache.get) == ["replica_id"]


def test_serve_instance_details_come_from_the_private_client_s_controller():
    from ray.serve import context
    from ray.serve._private.client import ServeControllerClient
    from ray.serve._private.controller import ServeController
    from ray.serve.schema import ReplicaDetails

    assert callable(context._get_global_client)
    assert "self._controller" in inspect.getsource(ServeControllerClient.__init__)
    assert "get_serve_instance_details" in inspect.getsource(ServeControllerClient.get_serve_details)
    assert parameters(ServeController.get_serve_instance_details)[:1] == ["source"]  # Ray may add _ray_trace_ctx
    assert {"actor_id", "state"} <= set(ReplicaDetails.model_fields)


async def test_a_controller_that_does_not_answer_is_given_up_on_in_time(monkeypatch):
    import asyncio

    from ray.serve import context

    class Silent:
        """A controller whose status call never returns (a GCS or controller outage)."""

        class get_serve_instance_details:  # noqa: N801 - shaped like an actor method
            @staticmethod
            def remote():
                return asyncio.get_running_loop().create_future()

    class Client:
        _controller = Silent()

    monkeypatch.setattr(context, "_get_global_client", lambda: Client())
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await ray_private.serve_instance_details(timeout_s=0.2)
    assert asyncio.get_running_loop().time() - started < 2
