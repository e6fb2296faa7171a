"""The scheduler's `PoolClient` over Serve handles: one attempt on one pool deployment."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from serve_app.capacity import SPOT
from serve_app.capacity.chooser import CapacityChooser, CapacityState
from serve_app.capacity.decode_speed import DecodeSpeed
from serve_app.config import Priority
from serve_app.engine.base import REPLICA_GONE_CODES, EngineError, GenerationChunk, GenerationRequest
from serve_app.logs import logger_for
from serve_app.scheduling.errors import Overloaded, ReplicaUnavailable
from serve_app.topology import Topology

logger = logger_for(__name__)

ENGINE_INFO_TIMEOUT_S = 5.0
"""How long `/stats` waits for a replica to say what its engine resolved."""

_REPLICA_LOST = (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError)

FAILED_STATUSES = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
"""Serve deployment statuses under which a pool with no running replica counts as down."""
STARTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING"})
"""Serve replica states that will become RUNNING."""
LOST_REPLICA_HOLD_S = 30.0
"""How long a replica lost mid-attempt (dead, draining, engine lost) stays off its
deployment's running count while the controller still reports it running (it
notices a dead replica within a health-check period; Serve's default is 10 s)."""
UNREACHABLE_HOLD_S = 5.0
"""The same for a replica unreachable for the moment (`ActorUnavailableError`)."""


@dataclass(frozen=True)
class DeploymentState:
    """One deployment as Serve's controller reports it."""

    replicas: frozenset[str] = frozenset()
    """Actor ids (hex) of its RUNNING replicas."""
    starting: int = 0
    status: str = "HEALTHY"
    message: str = ""

    @property
    def running(self) -> int:
        return len(self.replicas)


AttemptRecorder = Callable[[str, str, str, int, int, int], None]
"""(model, pool, capacity type, prompt tokens, output tokens, requests) of one attempt."""


class ServePoolClient:
    """Picks one of a pool's deployments (capacity types) per attempt, with the
    `CapacityChooser`, and streams from it over a Serve handle.

    Running replicas per deployment come from the ingress's poll, by actor id.
    A replica lost mid-attempt (its actor died, or it refused as draining or
    with a dead engine) leaves its deployment's count at once, so the retry
    goes to a side or pool that still has replicas (a lost Spot node often
    takes all of its side). Losses are kept by actor id and expire on the
    clock: a replica counts once however many streams it ended, a loss the
    controller already reflects subtracts nothing more, and a replica the
    controller keeps reporting comes back after `LOST_REPLICA_HOLD_S`
    (`UNREACHABLE_HOLD_S` if it was only unreachable), poll or no poll.
    """

    def __init__(self, topology: Topology, handles: dict[str, DeploymentHandle],
                 on_attempt: AttemptRecorder | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._topology = topology
        self._handles = handles
        self._streams = {name: handle.options(stream=True) for name, handle in handles.items()}
        self._on_attempt = on_attempt
        self._clock = clock
        self._states: dict[str, DeploymentState] = {}
        self._off: dict[str, float] = {}
        """Actor ids of replicas lost or unreachable -> when they count again."""
        self._in_flight: Counter[str] = Counter()
        self._chooser = CapacityChooser()
        config = topology.config
        self._decode_speed = DecodeSpeed(config.notice_cap, config.preemption.notice_window_s,
                                         config.preemption.drain_margin_s)
        self._engine_info: dict[str, dict] = {}

    def set_states(self, states: dict[str, DeploymentState]) -> None:
        now = self._clock()
        self._off = {replica: until for replica, until in self._off.items() if until > now}
        self._states = dict(states)

    def _running(self, name: str) -> int:
        """The deployment's running replicas as last polled, less those lost or unreachable since."""
        state = self._states.get(name)
        if state is None:
            return 0
        now = self._clock()
        return sum(1 for replica in state.replicas if self._off.get(replica, now) <= now)

    def _lose_replica(self, replica: str | None, hold_s: float) -> None:
        """Take a replica off its deployment's count for `hold_s` (longer if it already is)."""
        if replica is not None:
            self._off[replica] = max(self._off.get(replica, 0.0), self._clock() + hold_s)

    def down_reason(self, model: str, pool: str) -> str | None:
        """Why nothing can serve the pool now or soon, or None. A pool is down when
        none of its deployments has a replica running, and each has either failed
        (a replica that cannot start, an engine refusing its config) or has none
        starting and cannot start one on demand (a fixed-size pool that lost all)."""
        reasons = []
        for deployment in self._topology.pool(model, pool).values():
            state = self._states.get(deployment.name)
            if state is None:
                return None  # not reported yet: starting up
            if state.running:
                return None
            scaling = deployment.options.get("autoscaling_config") or {}
            on_demand = scaling.get("max_replicas", 0) > 0
            if state.status in FAILED_STATUSES:
                reasons.append(f"{deployment.name} {state.status}")  # Serve's message goes to the log only
            elif state.starting or on_demand:
                return None
            else:
                reasons.append(f"{deployment.name} has no replica running or starting")
        return "; ".join(reasons)

    def slots(self, model: str, pool: str) -> int:
        """Requests the pool's running replicas take at once, over all its deployments."""
        return sum(self._running(d.name) * d.slots_per_replica
                   for d in self._topology.pool(model, pool).values())

    def has_replicas(self, model: str, pool: str) -> bool:
        return any(self._running(d.name) for d in self._topology.pool(model, pool).values())

    def running(self, model: str, pool: str) -> dict[str, int]:
        return {side: self._running(d.name) for side, d in self._topology.pool(model, pool).items()}

    def replica_groups(self) -> dict[tuple[str, str, str], int]:
        """Running replicas by (model, pool, capacity type): what the cost meter bills."""
        return {(d.model, d.pool, d.capacity_type): self._running(d.name) for d in self._topology.deployments}

    async def engine_info(self, model: str, pool: str) -> dict[str, dict]:
        """What each running deployment of a pool says its engine resolved at start
        (asked once per deployment), by capacity type."""
        known = {}
        for side, deployment in self._topology.pool(model, pool).items():
            name = deployment.name
            if name not in self._engine_info and self._running(name) > 0:
                try:
                    async with asyncio.timeout(ENGINE_INFO_TIMEOUT_S):
                        self._engine_info[name] = asdict(await self._handles[name].engine_info.remote())
                except Exception as exc:  # shown as missing; asked again next time
                    logger.warning("engine info of %s unavailable: %s", name, type(exc).__name__)
            if name in self._engine_info:
                known[side] = self._engine_info[name]
        return known

    def _choose(self, model: str, pool: str, request: GenerationRequest, priority: Priority) -> tuple[str, str]:
        """(capacity type, deployment name) for this attempt."""
        sides = self._topology.pool(model, pool)
        if len(sides) == 1:
            side, deployment = next(iter(sides.items()))
            return side, deployment.name
        snapshot = {}
        for side, deployment in sides.items():
            running = self._running(deployment.name)
            free = running * deployment.slots_per_replica - self._in_flight[deployment.name]
            snapshot[side] = CapacityState(healthy=running, free_slots=max(0, free))
        limits = [limit for limit in (request.max_tokens, request.stop_after) if limit is not None]
        spot_cap = self._decode_speed.cap(sides[SPOT].name) if SPOT in sides else 0
        side = self._chooser.choose(snapshot, priority, min(limits) if limits else None, spot_cap)[0]
        return side, sides[side].name

    async def stream(
        self, model: str, pool: str, request: GenerationRequest, priority: Priority
    ) -> AsyncIterator[GenerationChunk | EngineError]:
        side, name = self._choose(model, pool, request, priority)
        responses = self._streams[name].stream.remote(request)
        self._in_flight[name] += 1
        first_token_at, tokens, prompt_tokens, ended = None, 0, 0, False
        try:
            async for chunk in responses:
                if isinstance(chunk, EngineError) and chunk.code in REPLICA_GONE_CODES:
                    self._lose_replica(chunk.replica, LOST_REPLICA_HOLD_S)
                elif isinstance(chunk, GenerationChunk) and chunk.num_tokens:
                    first_token_at = first_token_at or time.monotonic()
                    tokens += chunk.num_tokens
                    prompt_tokens = chunk.prompt_tokens + len(request.continuation)
                ended = isinstance(chunk, EngineError) or chunk.finish_reason is not None
                yield chunk
            ended = True
            if first_token_at is not None:
                self._decode_speed.observe(name, tokens, time.monotonic() - first_token_at)
        except BackPressureError:
            # Serve's own queue in front of the replicas is full: load, not a lost replica.
            raise Overloaded(f"{name}: Serve's queue is full", retry_after_s=1) from None
        except _REPLICA_LOST as exc:
            replica = getattr(exc, "actor_id", None)
            if isinstance(exc, ActorUnavailableError):  # may come back: not avoided, off the count briefly
                self._lose_replica(replica, UNREACHABLE_HOLD_S)
                raise ReplicaUnavailable(type(exc).__name__) from exc
            self._lose_replica(replica, LOST_REPLICA_HOLD_S)
            raise ReplicaUnavailable(type(exc).__name__, replica=replica) from exc
        except Exception as exc:
            # The remote text (a traceback, paths) goes to the log; the client gets the error's type.
            cause = getattr(exc, "cause", None) or exc
            logger.error("model %s: %s failed: %s", model, name, f"{type(cause).__name__}: {cause}"[:2000])
            yield EngineError(f"model {model!r} failed ({type(cause).__name__})", status=500, code="engine_error")
        finally:
            self._in_flight[name] -= 1
            if not ended:  # the caller stopped early (moved on, went away): stop the replica's work
                responses.cancel()
            if self._on_attempt is not None and tokens:
                requests = 0 if request.continuation else 1  # a resumed attempt is the same request
                self._on_attempt(model, pool, side, prompt_tokens, tokens, requests)
