"""GPU step times from a published source, for projections (never measured here).

BLIS (`inference-sim/inference-sim`, Apache-2.0) publishes, per model, GPU and
tensor parallelism, the coefficients of its blackbox latency model trained on
vLLM 0.8.4: a step takes `beta0 + beta1 x prefill (cache-miss) tokens + beta2 x
decode tokens` microseconds, `LinearStepTime` without its context and prefill
attention terms. Its alpha coefficients (time before a request reaches the
engine, per output token processing) model a server's front end, which the
simulator leaves to the app's own code: they are not used. `total_kv_blocks` is
the KV cache BLIS measured, in vLLM's 16-token GPU blocks.

BLIS trained no coefficients for a cheaper GPU: there its roofline
(`roofline.py`, analytical from the GPU's datasheet) stands in, and
`cross_check` compares the two models on the GPU that has both (H100).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.fleetsim.roofline import GPUS, LLAMA_3_1_8B, DenseModel, Gpu, RooflineStepTime, kv_cache_tokens
from benchmarks.fleetsim.step_time import LinearStepTime, StepShape, StepTimeModel

BLIS_SOURCE = ("BLIS, inference-sim/inference-sim coefficients.yaml at commit 01cddc32110a945977d48022fdbed998af9a7ddd "
               "(Apache-2.0): {model}, {gpu}, tensor parallelism 1, vLLM 0.8.4, beta_coeffs {beta}")


@dataclass(frozen=True)
class PublishedEngine:
    step_time: StepTimeModel
    """With a `source` naming where it comes from."""
    kv_cache_tokens: int
    gpu: str
    instance_type: str | None = None
    """The AWS instance type this GPU comes in (its on-demand price in the app's
    price book prices the projection); None: not in the price book."""


def _blis(model: str, gpu: str, beta: tuple[float, float, float], kv_blocks: int,
          instance_type: str | None = None) -> PublishedEngine:
    source = BLIS_SOURCE.format(model=model, gpu=gpu, beta=list(beta))
    step_time = LinearStepTime(base_us=beta[0], per_decode_seq_us=beta[2], per_prefill_token_us=beta[1],
                               per_context_token_us=0.0, source=source)
    return PublishedEngine(step_time, kv_blocks * 16, gpu, instance_type)


def _roofline(model: DenseModel, gpu: Gpu, instance_type: str) -> PublishedEngine:
    return PublishedEngine(RooflineStepTime(model, gpu), kv_cache_tokens(model, gpu), gpu.name, instance_type)


PUBLISHED = {
    "llama-3.1-8b-h100": _blis("meta-llama/llama-3.1-8b-instruct", "H100",
                               (5752.705191348184, 17.25086436834028, 5.999143920128404), 29205, "p5.48xlarge"),
    "llama-3.1-8b-a100-80": _blis("meta-llama/llama-3.1-8b-instruct", "A100-80",
                                  (16441.531547147923, 47.837412108198656, 18.20560632171683), 29205),
    "llama-3.1-8b-l40s": _roofline(LLAMA_3_1_8B, GPUS["L40S"], "g6e.xlarge"),
}
"""Projection engines by name (bfloat16 weights: BLIS's runs were not quantized)."""


CROSS_CHECK_SHAPES = {
    "decode 1 x 1k context": StepShape(1, 0, 1024),
    "decode 32 x 1k context": StepShape(32, 0, 32 * 1024),
    "decode 128 x 1k context": StepShape(128, 0, 128 * 1024),
    "prefill 512": StepShape(0, 512, 0, 512 * 256),
    "prefill 2048": StepShape(0, 2048, 0, 2048 * 1024),
}
"""Steps from decode-bound to prefill-bound (one request's prefill attends to half its tokens on average)."""


def cross_check() -> dict[str, dict[str, float]]:
    """On H100, BLIS's trained coefficients against its roofline: milliseconds per
    step and their ratio, for each of `CROSS_CHECK_SHAPES`."""
    trained, roofline = PUBLISHED["llama-3.1-8b-h100"].step_time, RooflineStepTime(LLAMA_3_1_8B, GPUS["H100"])
    rows = {}
    for name, shape in CROSS_CHECK_SHAPES.items():
        trained_ms, roofline_ms = trained.step_s(shape) * 1e3, roofline.step_s(shape) * 1e3
        rows[name] = {"trained_ms": round(trained_ms, 3), "roofline_ms": round(roofline_ms, 3),
                      "roofline_over_trained": round(roofline_ms / trained_ms, 3)}
    return rows
