"""Engine arguments of one model's replicas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from serve_app.config.base import StrictModel

ENGINE_BACKENDS = ("vllm",)
"""Engine backends the app can construct (see `serve_app.engine.create_engine`)."""


class EngineConfig(StrictModel):
    """Engine arguments for one model's replicas (vLLM `AsyncEngineArgs` subset)."""

    model: str
    """HF model id or a local checkpoint directory. Relative paths resolve
    against the directory `serve run` is started from."""
    tokenizer: str | None = None
    """Tokenizer id or directory; defaults to `model`."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Activation/weight dtype. `auto` on a CPU engine: bfloat16 where the CPU has
    native bf16 (`avx512_bf16`, `amx_bf16`), float32 otherwise (emulated bf16 is
    slow and was measured giving wrong answers); on a GPU: the checkpoint's dtype."""
    quantization: str | None = None
    """vLLM quantization method: `fp8` on H100/H200, `awq`/`gptq` on other GPUs,
    `compressed-tensors` for a W8A8 INT8 checkpoint on CPU. None serves the
    checkpoint as is."""
    max_model_len: int | None = Field(default=None, gt=0)
    """Context length (prompt + output tokens); None uses the model's own."""
    max_num_seqs: int = Field(default=256, gt=0)
    """Most sequences one engine step batches together."""
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    """Token budget of one engine step (chunked prefill); None lets vLLM choose."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (templates, system prompts)."""
    enforce_eager: bool = False
    """Skip torch.compile and run the model eagerly: a much faster start where
    compiling buys no speed (measured on CPU; see the README)."""
    tensor_parallel_size: int = Field(default=1, gt=0)
    """GPUs one replica shards the model over."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory vLLM may claim (weights + KV cache)."""
    cpu_kv_cache_gib: int | None = Field(default=None, gt=0)
    """CPU builds only: GiB of KV cache (sets VLLM_CPU_KVCACHE_SPACE)."""
    cpu_isolate_workers: bool = True
    """CPU builds only: once the engine runs, move the other processes of its Ray
    node off the cores vLLM bound its workers to (`serve_app/engine/cpu_cores.py`)."""
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    """Engine queue order: first come first served, or by request priority
    (the ingress sets it from the priority class and the predicted length)."""
    seed: int = 0
    """Engine RNG seed, so sampled runs repeat."""
    extra_engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further `AsyncEngineArgs` fields passed through verbatim."""

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for vLLM's `AsyncEngineArgs`, dtype as configured."""
        kwargs = self.model_dump(exclude={"cpu_kv_cache_gib", "cpu_isolate_workers", "extra_engine_args"})
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        return {**kwargs, **self.extra_engine_args}
