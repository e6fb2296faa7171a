"""The Ray side of preemption: a replica's guard that drains its node on a Spot notice.

The LLM replica starts a `PreemptionGuard` in its `__init__`. On a Spot node it
watches Ray's own view of the node (Ray drains a node on SIGTERM, see
`RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`, and an autoscaler may drain it too)
and, unless `PreemptionConfig.imds` is off, IMDS.
On the first notice it flags the replica as draining (the replica refuses new
requests with a retryable error), drains the node through the GCS so Serve
starts replacements elsewhere before it stops the replicas there, and counts
`serve_app_preemptions_total`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import ray
from ray.util.metrics import Counter

from deployments.ray_private import drain_node_for_preemption, draining_nodes
from serve_app.capacity import MARKET_TYPE_LABEL, SPOT
from serve_app.capacity.preemption import PreemptionNotice, PreemptionWatcher, imds_sources
from serve_app.config import PreemptionConfig
from serve_app.logs import logger_for

logger = logger_for(__name__)

GCS_TIMEOUT_S = 5.0


class Node(Protocol):
    """The node this replica runs on."""

    node_id: str
    labels: dict[str, str]

    def drain(self, deadline: float, message: str) -> None: ...

    def draining_deadline_ms(self) -> int | None: ...


class RayNode:
    """This worker's Ray node, and the GCS calls the autoscaler uses to drain one."""

    def __init__(self) -> None:
        context = ray.get_runtime_context()
        self.node_id: str = context.get_node_id()
        self.labels: dict[str, str] = dict(context.get_node_labels())

    def drain(self, deadline: float, message: str) -> None:
        """Mark the node draining until `deadline` (Unix s). PREEMPTION drains are
        never rejected; the raylet stops taking new work and Serve migrates."""
        accepted, reason = drain_node_for_preemption(self.node_id, int(deadline * 1000), message, GCS_TIMEOUT_S)
        if not accepted:
            raise RuntimeError(f"GCS refused to drain node {self.node_id}: {reason}")

    def draining_deadline_ms(self) -> int | None:
        """None while the node is not draining; else its deadline in ms (0: none)."""
        return draining_nodes(GCS_TIMEOUT_S).get(self.node_id)


class DrainSource:
    """A `NoticeSource` that reports a drain of this node started by anyone else."""

    name = "ray-drain"

    def __init__(self, node: Node, default_window_s: float) -> None:
        self._node = node
        self._default_window_s = default_window_s

    async def check(self) -> PreemptionNotice | None:
        deadline_ms = await asyncio.to_thread(self._node.draining_deadline_ms)
        if deadline_ms is None:
            return None
        deadline = deadline_ms / 1000 if deadline_ms else time.time() + self._default_window_s
        return PreemptionNotice(action="terminate", deadline=deadline, source="drain")


class PreemptionGuard:
    """Per-replica preemption state: `draining`, `track()` for in-flight work, `healthy()`.

    `healthy()` turns False once the replica is draining and either has nothing
    in flight or is within `drain_margin_s` of the deadline. Until then it stays
    healthy on purpose: the drain already makes Serve start a replacement and
    stop this replica gracefully once that is up, and an unhealthy replica would
    be stopped earlier, cutting in-flight streams short. Once idle it has nothing
    left to lose, and going unhealthy takes it out of routing sooner, so callers
    stop bouncing off its refusals.
    """

    def __init__(
        self,
        config: PreemptionConfig,
        *,
        on_notice: Callable[[PreemptionNotice], None] | None = None,
        node: Node | None = None,
        counter: Counter | None = None,
    ) -> None:
        self._config = config
        self._user_on_notice = on_notice
        self._node = node if node is not None else RayNode()
        self._counter = counter if counter is not None else Counter(
            "serve_app_preemptions_total", description="Spot interruption notices received, one per replica."
        )
        self._watcher: PreemptionWatcher | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._in_flight = 0

    @property
    def node_id(self) -> str:
        return self._node.node_id

    @property
    def capacity_type(self) -> str | None:
        return self._node.labels.get(MARKET_TYPE_LABEL)

    def start(self) -> bool:
        """Start watching (from a running event loop). False where nothing is watched:
        disabled, or a node that is not Spot unless `watch_all_nodes`."""
        if not self._config.enabled or not (self.capacity_type == SPOT or self._config.watch_all_nodes):
            return False
        sources = [*imds_sources(self._config), DrainSource(self._node, self._config.notice_window_s)]
        self._watcher = PreemptionWatcher(self._config, self._on_notice, sources)
        self._watcher.start()
        return True

    def stop(self) -> None:
        """Stop watching (the replica is shutting down); a drain already asked for stands."""
        if self._watcher is not None:
            self._watcher.stop()

    @property
    def notice(self) -> PreemptionNotice | None:
        return self._watcher.notice if self._watcher is not None else None

    @property
    def draining(self) -> bool:
        return self.notice is not None

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one request as in flight for its duration."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def healthy(self) -> bool:
        notice = self.notice
        if notice is None:
            return True
        return self._in_flight > 0 and notice.remaining_s(time.time()) > self._config.drain_margin_s

    def _on_notice(self, notice: PreemptionNotice) -> None:
        self._counter.inc()
        if notice.source != "drain":  # a drain notice means the node is draining already
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(notice))
        if self._user_on_notice is not None:
            self._user_on_notice(notice)

    async def _drain(self, notice: PreemptionNotice) -> None:
        message = f"spot {notice.action} notice from {notice.source}"
        try:
            await asyncio.to_thread(self._node.drain, notice.deadline, message)
            logger.warning("drained node %s until %.0f (%s)", self._node.node_id, notice.deadline, message)
        except Exception:
            logger.exception("could not drain node %s; Serve will not migrate its replicas early",
                             self._node.node_id)
