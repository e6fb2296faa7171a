"""What the scheduler works with: a request's metadata, the pool client it
dispatches through, and the record of each finished request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from serve_app.config import Priority
from serve_app.engine.base import EngineError, GenerationChunk, GenerationRequest
from serve_app.scheduling.predictor import PromptClass


@dataclass(frozen=True)
class RequestMeta:
    """What the ingress knows about a request besides the engine request."""

    priority: Priority
    client: str | None
    """API-key name, when authentication is on."""
    prompt_class: PromptClass


class PoolClient(Protocol):
    """Where attempts run: one pool's replicas (the ingress's Serve handles)."""

    def stream(
        self, model: str, pool: str, request: GenerationRequest, priority: Priority
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        """Output of one attempt; raises `ReplicaUnavailable` for a retryable failure."""

    def has_replicas(self, model: str, pool: str) -> bool:
        """Whether any replica of the pool is running (as far as the client knows now)."""


@dataclass
class RequestRecord:
    """One finished request, for metrics and the predictor."""

    model: str
    pool: str
    priority: Priority
    client: str | None
    predicted_tokens: int
    prediction_source: str
    long: bool = False
    """Counted as long by length-aware scheduling (capped, behind short ones)."""
    pools: list[str] = field(default_factory=list)
    """Pools that served a part of it, in order (more than one: re-bucketed)."""
    status: str = "error"
    """`ok`, `error` (an engine refusal or failure), `rejected` or `cancelled`."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    """How the output ended (`stop`: by itself, `length`: at `max_tokens`), if it did."""
    queue_wait_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float = 0.0
    attempts: int = 0
    resent: int = 0
    """Retries of an attempt that had sent no output yet."""
    resumed: int = 0
    """Retries continuing a stream that had already sent output."""


class SchedulerObserver(Protocol):
    """Told when a request leaves a queue and when it ends (the ingress's metrics)."""

    def dispatched(self, model: str, pool: str, wait_s: float) -> None: ...

    def finished(self, record: RequestRecord) -> None: ...
