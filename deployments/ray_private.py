"""Every use of a private Ray API in the serving app, each behind one small adapter.

Written against Ray 2.60.0 (`RAY_VERSION`, the version `pyproject.toml` pins).
`tests/deployments/test_ray_private.py` checks each of them against the
installed Ray, so an upgrade that moves one fails there, loudly, instead of in
production.
"""

from __future__ import annotations

import asyncio
from typing import Any

RAY_VERSION = "2.60.0"


def _gcs_client() -> Any:
    import ray

    return ray._private.worker.global_worker.gcs_client


def drain_node_for_preemption(node_id: str, deadline_ms: int, message: str, timeout_s: float) -> tuple[bool, str]:
    """Mark a node draining (reason PREEMPTION) until `deadline_ms` (Unix ms).

    Private because Ray 2.60 has no public drain API: its autoscaler drains
    nodes through the GCS client's `drain_node`, with the reason enum from the
    generated `autoscaler_pb2`. PREEMPTION drains are never rejected; the
    raylet stops taking new work and Serve migrates the node's replicas."""
    from ray.core.generated import autoscaler_pb2

    return _gcs_client().drain_node(
        node_id,  # hex: the GCS parses it with NodeID.FromHex
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
        message,
        deadline_ms,
        timeout=timeout_s,
    )


def draining_nodes(timeout_s: float) -> dict[str, int]:
    """Draining nodes (hex id) -> drain deadline in Unix ms (0: none).

    Private because Ray 2.60's public node listings (`ray.nodes()`, the state
    API) do not show a node's drain; the GCS client's `get_draining_nodes` does."""
    return _gcs_client().get_draining_nodes(timeout=timeout_s)


def cached_queue_len(request_router: Any, replica_id: Any) -> int | None:
    """A Serve request router's last probed queue length of a replica, if any.

    Private because Ray 2.60's `RequestRouter` exposes the cache only as the
    attribute `_replica_queue_len_cache` (its own built-in routers read it
    the same way); probing again would cost a round trip per choice."""
    return request_router._replica_queue_len_cache.get(replica_id)


async def serve_instance_details(timeout_s: float) -> dict[str, Any]:
    """Serve's controller's view of every application, replicas and their actor
    ids included (the dict behind `ray.serve.schema.ServeInstanceDetails`),
    within `timeout_s` (`TimeoutError` past it).

    Private because Ray 2.60's public `serve.status()` gives replica counts but
    not which replicas, and blocks with no timeout; it reads the same controller
    call through the private client (`_get_global_client()._controller`)."""
    from ray.serve.context import _get_global_client

    async with asyncio.timeout(timeout_s):
        return await _get_global_client()._controller.get_serve_instance_details.remote()
