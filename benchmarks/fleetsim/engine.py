"""One replica's engine, modelled as vLLM's V1 scheduler runs it.

Each step schedules, within a budget of `max_num_batched_tokens`: first the
running requests (one token for a decoding one, the next chunk of its prompt
for one still prefilling), then waiting ones in priority order (lower first,
then arrival) while fewer than `max_num_seqs` run. A request's KV cache grows
block by block; when a running request needs a block and none is free, the
lowest-priority running request (the latest, at equal priority) is preempted
and recomputed later from its prompt plus the output it has. The step takes
what the `StepTimeModel` says; a request whose prompt is computed gets one new
token at the end of every step. Prefix caching is not modelled. A killed
engine (its node gone) ends every request it holds with `EngineLost`.

What a request will answer is not the engine's to know: `natural_tokens` (the
workload's oracle) says how long the served model's answer runs, and the
engine stops there (`stop`) unless `ignore_eos`, `max_tokens` or the attempt's
`stop_after` end it first (`length`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fleetsim.step_time import StepShape, StepTimeModel
from serve_app.config import EngineConfig
from serve_app.engine.base import EngineLost, GenerationChunk, GenerationRequest, attempt_budget
from serve_app.engine.cpu_dtype import cpu_flags, resolve_cpu_dtype


@dataclass(frozen=True)
class EngineShape:
    """The engine settings the scheduler obeys (as the app's `EngineConfig` gives them)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    kv_cache_tokens: int
    """Tokens the KV cache holds (its blocks x `block_size`)."""
    block_size: int = 16


def step_shape(scheduled: Iterable[tuple[int, int, bool]]) -> StepShape:
    """The shape of a step that runs, per request, (tokens computed before, new tokens, decoding)."""
    decode = prefill = context = pairs = 0
    for before, new, decoding in scheduled:
        context += before
        if decoding:
            decode += 1
        else:
            prefill += new
            pairs += new * (before + new // 2)
    return StepShape(decode, prefill, context, pairs)


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def cpu_kv_cache_tokens(engine: EngineConfig) -> int:
    """Tokens a CPU engine's KV cache holds: its `cpu_kv_cache_gib` over the bytes one
    token's keys and values take in every layer of its checkpoint, in the dtype it
    resolves to on this machine."""
    if engine.cpu_kv_cache_gib is None:
        raise ValueError("a simulated CPU engine needs its cpu_kv_cache_gib")
    checkpoint = json.loads((Path(engine.model) / "config.json").read_text())
    head_dim = checkpoint.get("head_dim") or checkpoint["hidden_size"] // checkpoint["num_attention_heads"]
    kv_heads = checkpoint.get("num_key_value_heads", checkpoint["num_attention_heads"])
    dtype = resolve_cpu_dtype(engine.dtype, cpu_flags()).dtype
    per_token = 2 * checkpoint["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]
    return engine.cpu_kv_cache_gib * 2**30 // per_token


_LOST = object()
"""Put in a request's chunk queue when its engine is killed."""


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    prompt_tokens: int
    """The attempt's prompt: the request's prompt plus its continuation."""
    target: int
    """Output tokens it will produce in this attempt."""
    natural_end: bool
    """Whether reaching `target` is the answer ending by itself (`stop`)."""
    arrival: int
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)
    computed: int = 0
    """Tokens whose KV is computed (prompt and output)."""
    output: int = 0
    pending: int = 0
    """Output tokens not yet sent (the stream interval gathers them)."""
    blocks: int = 0
    waiting: bool = False
    """In the waiting queue."""

    @property
    def tokens(self) -> int:
        """Prompt and output so far: what a recompute must prefill."""
        return self.prompt_tokens + self.output

    @property
    def order(self) -> tuple[int, int]:
        return self.request.priority, self.arrival


class SimEngine:
    def __init__(self, shape: EngineShape, step_time: StepTimeModel,
                 natural_tokens: Callable[[GenerationRequest], int]) -> None:
        self.shape = shape
        self._step_time = step_time
        self._natural_tokens = natural_tokens
        self._total_blocks = self._free_blocks = shape.kv_cache_tokens // shape.block_size
        self._running: dict[_Sequence, None] = {}
        """In scheduling order (an ordered set)."""
        self._waiting: list[tuple[tuple[int, int], _Sequence]] = []
        self._arrivals = itertools.count()
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self.steps = 0
        self.preemptions = 0
        self.prefill_tokens = self.decode_tokens = 0
        """Tokens computed, prompt (and recomputed) ones and decoded ones."""

    def in_flight_tokens(self) -> int:
        """The routing load the app's replica reports (`LLMServer.record_routing_stats`):
        what the requests it holds may still produce by their `max_tokens` (the model's
        context without one), not by the answer lengths only the engine knows."""
        held = [*self._running, *(s for _, s in self._waiting)]
        return sum((s.request.max_tokens or self.shape.max_model_len) - s.output for s in held)

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    def kill(self) -> None:
        """The node is gone: the engine stops, and every request it holds ends with `EngineLost`."""
        self.stop()
        for sequence in [*self._running, *(s for _, s in self._waiting)]:
            sequence.chunks.put_nowait(_LOST)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Output as the modelled engine makes it; an `EngineRequestError` for a
        request that does not fit the context (`attempt_budget`, the app's rule)."""
        prompt = len(request.prompt_token_ids) + len(request.continuation)
        budget = attempt_budget(prompt, request, self.shape.max_model_len)
        natural = max(1, self._natural_tokens(request) - len(request.continuation))
        ends_naturally = not request.params.ignore_eos and natural <= budget
        sequence = _Sequence(request, prompt, natural if ends_naturally else budget, ends_naturally,
                             next(self._arrivals))
        self._enqueue(sequence)
        self._work.set()
        try:
            while True:
                chunk = await sequence.chunks.get()
                if chunk is _LOST:
                    raise EngineLost("the engine's node is gone")
                yield chunk
                if chunk.finish_reason is not None:
                    return
        finally:
            self._drop(sequence)

    def _enqueue(self, sequence: _Sequence) -> None:
        heapq.heappush(self._waiting, (sequence.order, sequence))
        sequence.waiting = True

    def _drop(self, sequence: _Sequence) -> None:
        """A finished or abandoned request leaves and frees its blocks."""
        if self._running.pop(sequence, False) is False and sequence.waiting:
            self._waiting = [(k, s) for k, s in self._waiting if s is not sequence]
            heapq.heapify(self._waiting)
            sequence.waiting = False
        self._free_blocks += sequence.blocks
        sequence.blocks = 0

    def _blocks_for(self, sequence: _Sequence, new_tokens: int) -> int:
        return math.ceil((sequence.computed + new_tokens) / self.shape.block_size) - sequence.blocks

    def _allocate(self, sequence: _Sequence, new_tokens: int) -> bool:
        needed = self._blocks_for(sequence, new_tokens)
        if needed > self._free_blocks:
            return False
        self._free_blocks -= needed
        sequence.blocks += needed
        return True

    def _preempt(self) -> _Sequence:
        """The lowest-priority running request goes back to waiting, its cache freed."""
        victim = max(self._running, key=lambda s: s.order)
        del self._running[victim]
        self._free_blocks += victim.blocks
        victim.blocks = victim.computed = 0
        self._enqueue(victim)
        self.preemptions += 1
        return victim

    def _schedule(self) -> tuple[dict[_Sequence, int], StepShape]:
        """vLLM's step: running requests first, then waiting ones, within the token budget.
        A request runs `tokens - computed` new tokens: 1 while decoding, a chunk of its
        prompt (or, after a preemption, of its prompt and output) while prefilling."""
        budget = self.shape.max_num_batched_tokens
        scheduled: dict[_Sequence, int] = {}
        preempted = False
        for sequence in list(self._running):
            if sequence not in self._running or budget == 0:
                continue  # preempted to make room for one before it
            new = min(sequence.tokens - sequence.computed, budget)
            while not self._allocate(sequence, new):
                preempted = True
                victim = self._preempt()
                budget += scheduled.pop(victim, 0)
                if victim is sequence:
                    break
            else:
                scheduled[sequence] = new
                budget -= new
        while not preempted and self._waiting and budget > 0 and len(self._running) < self.shape.max_num_seqs:
            _, sequence = self._waiting[0]
            new = min(sequence.tokens - sequence.computed, budget)
            if not self._allocate(sequence, new):
                break
            heapq.heappop(self._waiting)
            sequence.waiting = False
            self._running[sequence] = None
            scheduled[sequence] = new
            budget -= new
        return scheduled, step_shape((s.computed, new, new == 1 and s.output > 0 and s.computed == s.tokens - 1)
                                     for s, new in scheduled.items())

    async def _run(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._work.clear()
                await self._work.wait()
                continue
            scheduled, shape = self._schedule()
            if not scheduled:
                if self._free_blocks == self._total_blocks:
                    raise RuntimeError(f"the KV cache ({self.shape.kv_cache_tokens} tokens) cannot hold one "
                                       f"prefill chunk")
                continue  # every running request was preempted: the next pass admits again
            seconds = self._step_time.step_s(shape)
            await asyncio.sleep(seconds)
            self.steps += 1
            self.prefill_tokens += shape.prefill_tokens
            self.decode_tokens += shape.decode_seqs
            for sequence, new in scheduled.items():
                if sequence not in self._running:
                    continue  # its client left during the step
                sequence.computed += new
                if sequence.computed >= sequence.tokens:
                    self._emit(sequence)

    def _emit(self, sequence: _Sequence) -> None:
        """One new token; a chunk when the stream interval is full, on the first and on the last."""
        sequence.output += 1
        sequence.pending += 1
        done = sequence.output >= sequence.target
        if done or sequence.output == 1 or sequence.pending >= sequence.request.stream_interval:
            finish = ("stop" if sequence.natural_end else "length") if done else None
            sequence.chunks.put_nowait(GenerationChunk(
                text="", num_tokens=sequence.pending, prompt_tokens=sequence.prompt_tokens,
                finish_reason=finish, token_ids=(0,) * sequence.pending))
            sequence.pending = 0
        if done:
            self._drop(sequence)
