"""GPU step times from a published source, for projections (never measured here).

BLIS (`inference-sim/inference-sim`, Apache-2.0) publishes, per model, GPU and
tensor parallelism, the coefficients of its blackbox latency model trained on
vLLM 0.8.4: a step takes `beta0 + beta1 x prefill (cache-miss) tokens + beta2 x
decode tokens` microseconds, `LinearStepTime` without its context and prefill
attention terms. Its alpha coefficients (time before a request reaches the
engine, per output token processing) model a server's front end, which the
simulator leaves to the app's own code: they are not used. `total_kv_blocks` is
the KV cache BLIS measured, in vLLM's 16-token GPU blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.fleetsim.step_time import LinearStepTime

BLIS_SOURCE = ("BLIS, inference-sim/inference-sim coefficients.yaml at commit 01cddc32110a945977d48022fdbed998af9a7ddd "
               "(Apache-2.0): {model}, {gpu}, tensor parallelism 1, vLLM 0.8.4, beta_coeffs {beta}")


@dataclass(frozen=True)
class PublishedEngine:
    step_time: LinearStepTime
    kv_cache_tokens: int


def _blis(model: str, gpu: str, beta: tuple[float, float, float], kv_blocks: int) -> PublishedEngine:
    source = BLIS_SOURCE.format(model=model, gpu=gpu, beta=list(beta))
    step_time = LinearStepTime(base_us=beta[0], per_decode_seq_us=beta[2], per_prefill_token_us=beta[1],
                               per_context_token_us=0.0, source=source)
    return PublishedEngine(step_time, kv_blocks * 16)


PUBLISHED = {
    "llama-3.1-8b-h100": _blis("meta-llama/llama-3.1-8b-instruct", "H100",
                               (5752.705191348184, 17.25086436834028, 5.999143920128404), 29205),
    "llama-3.1-8b-a100-80": _blis("meta-llama/llama-3.1-8b-instruct", "A100-80",
                                  (16441.531547147923, 47.837412108198656, 18.20560632171683), 29205),
}
"""Projection engines by name (bfloat16 weights: BLIS's runs were not quantized)."""
