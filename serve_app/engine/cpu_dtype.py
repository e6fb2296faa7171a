"""Which dtype a CPU engine computes in: bfloat16 only where the CPU has it natively.

vLLM's CPU build emulates bfloat16 on CPUs without native bf16 instructions
(x86 without `avx512_bf16`/`amx_bf16`, Arm without `bf16`). Measured with
SmolLM2-135M, offline, 32 requests at once: on a 2-core AMD EPYC with AVX2
only, emulated bf16 ran at 27 output tok/s against 125 for float32; on a 2-core
Xeon with AMX, native bf16 ran at 459 tok/s against 220 for float32. So
`dtype: auto` resolves here, on the machine the engine runs on, from the CPU's
own feature flags. Either bf16 path rounds differently from float32: greedy
answers can change where the model's top two tokens are close.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_app.config import EngineConfig
from serve_app.logs import logger_for

logger = logger_for(__name__)

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""CPU feature flags (as /proc/cpuinfo names them) that mean native bfloat16
arithmetic: x86 AVX512-BF16 or AMX-BF16, Arm's BF16 extension."""

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of this machine's first CPU (x86 `flags`, Arm `Features`);
    empty where /proc/cpuinfo does not exist."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class ResolvedDtype:
    dtype: str
    """What the engine is given: `bfloat16`, `float16`, `float32` (or `auto` off CPU)."""
    reason: str
    """Why, for the log and for operators (`/v1/models`, `/stats`)."""


def resolve_cpu_dtype(requested: str, flags: frozenset[str]) -> ResolvedDtype:
    """The dtype a CPU engine should run for a configured `requested` dtype.

    `auto` becomes bfloat16 with native bf16 support and float32 without it.
    An explicit dtype is kept, with a warning when it is bfloat16 on a CPU that
    can only emulate it (slow, and wrong answers were measured)."""
    native = sorted(flags & NATIVE_BF16_FLAGS)
    if requested == "auto":
        if native:
            return ResolvedDtype("bfloat16", f"auto: native bf16 ({', '.join(native)})")
        return ResolvedDtype("float32", "auto: no native bf16 on this CPU (avx512_bf16/amx_bf16/bf16 absent)")
    if requested == "bfloat16" and not native:
        logger.warning("dtype bfloat16 on a CPU without native bf16: vLLM emulates it, about 4.6x "
                       "slower than float32 (measured); use dtype: auto (float32 here)")
        return ResolvedDtype("bfloat16", "configured; emulated: no native bf16 on this CPU")
    return ResolvedDtype(requested, "configured")


def engine_kwargs_here(engine: EngineConfig) -> dict[str, Any]:
    """`engine.engine_kwargs()` with the dtype a replica resolves on this machine,
    for everything that must hold the replicas' config (the ingress's copy of
    vLLM's OpenAI layer, the benchmarks' baselines)."""
    from vllm.platforms import current_platform

    kwargs = engine.engine_kwargs()
    if current_platform.is_cpu():
        kwargs["dtype"] = resolve_cpu_dtype(engine.dtype, cpu_flags()).dtype
    return kwargs
