"""Step time from a model's shape and a GPU's datasheet: BLIS's roofline model.

A port, for dense models at tensor parallelism 1, of `rooflineStepTime` in BLIS
(`inference-sim/inference-sim`, Apache-2.0, `sim/latency/roofline.go` at
`ROOFLINE_COMMIT`), with its GPU figures (`hardware_config.json`, whose MFUs BLIS
calibrated in its discussion #589). A step runs its prefill and decode tokens in
one forward pass: the weights are read once, plus the KV cache each token writes
and reads and its activations, at peak bandwidth; the FLOPs of the projections,
the MLP (BLIS counts two matrices of `intermediate` width) and attention run at
peak times the phase's MFU. The step takes the longer of the two: no overhead term.

Where a GPU has trained coefficients (BLIS's H100), `published.cross_check` sets
the two side by side: the roofline has no fixed cost per step, and its decode
MFU makes large batches compute-bound. On the simulator's
aggregated `StepShape` the decode attention reads `context_tokens`, which also
counts the cached tokens of requests still prefilling (BLIS: decode requests only).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.fleetsim.step_time import StepShape

ROOFLINE_COMMIT = "f90a1e3a6787da17c2cd463dab6fb2660b1b1760"


@dataclass(frozen=True)
class DenseModel:
    """A dense transformer's shape, as its Hugging Face `config.json` gives it."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    bytes_per_param: float = 2.0
    """Weights and KV cache (bfloat16)."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def attention_params(self) -> int:
        """One layer's query, key, value and output projections."""
        return self.hidden * (self.hidden + 2 * self.kv_heads * self.head_dim) + self.hidden**2

    def parameters(self) -> float:
        """Every weight, as BLIS sizes them for KV capacity: three MLP matrices, untied embeddings."""
        return self.layers * (self.attention_params + 3 * self.hidden * self.intermediate) + 2 * self.vocab * self.hidden


@dataclass(frozen=True)
class Gpu:
    name: str
    tflops_bf16: float
    bandwidth_tb_s: float
    mfu_prefill: float
    mfu_decode: float
    memory_gib: float


GPUS = {  # BLIS hardware_config.json at ROOFLINE_COMMIT
    "H100": Gpu("H100", 989.5, 3.35, 0.45, 0.30, 80.0),
    "L40S": Gpu("L40S", 362.05, 0.864, 0.32, 0.08, 48.0),
}

LLAMA_3_1_8B = DenseModel("meta-llama/Llama-3.1-8B-Instruct", layers=32, hidden=4096, heads=32, kv_heads=8,
                          intermediate=14336, vocab=128256)
"""Its config.json."""


@dataclass(frozen=True)
class RooflineStepTime:
    model: DenseModel
    gpu: Gpu

    @property
    def source(self) -> str:
        return (f"BLIS roofline (inference-sim/inference-sim sim/latency/roofline.go and hardware_config.json at "
                f"commit {ROOFLINE_COMMIT}, Apache-2.0): {self.model.name}, {self.gpu.name}, analytical, not trained")

    def step_s(self, shape: StepShape) -> float:
        m = self.model
        # the projections' and two MLP matrices' multiply-adds, and rope
        per_token_flops = m.layers * (2 * m.attention_params + 2 * m.hidden + 4 * m.hidden * m.intermediate)
        per_pair_flops = m.layers * (4 * m.heads * m.head_dim + 5 * m.heads)
        peak = self.gpu.tflops_bf16 * 1e12
        compute_s = ((shape.prefill_tokens * per_token_flops + shape.prefill_pairs * per_pair_flops)
                     / (peak * self.gpu.mfu_prefill)
                     + (shape.decode_seqs * per_token_flops + shape.context_tokens * per_pair_flops)
                     / (peak * self.gpu.mfu_decode))
        weights = m.layers * (m.attention_params + 2 * m.hidden * m.intermediate)
        new_tokens = shape.prefill_tokens + shape.decode_seqs
        moved = (weights * m.bytes_per_param + m.kv_bytes_per_token * (new_tokens + shape.context_tokens)
                 + m.layers * m.hidden * m.bytes_per_param * new_tokens)
        return max(compute_s, moved / (self.gpu.bandwidth_tb_s * 1e12))


GPU_MEMORY_UTILIZATION = 0.9
ACTIVATION_GIB, NON_TORCH_GIB = 5.5, 0.15
"""BLIS's reference budget for a dense model at tensor parallelism 1 (`sim/latency/kv_capacity.go`)."""


def kv_cache_tokens(model: DenseModel, gpu: Gpu) -> int:
    """The KV cache BLIS derives for `model` on one `gpu`: memory at 90% less weights,
    activations and CUDA context, in tokens."""
    free_gib = (gpu.memory_gib * GPU_MEMORY_UTILIZATION - model.parameters() * model.bytes_per_param / 2**30
                - ACTIVATION_GIB - NON_TORCH_GIB)
    return int(free_gib * 2**30 // model.kv_bytes_per_token)
