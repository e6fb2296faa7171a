"""BLIS's roofline on cases worked by hand: a one-layer toy model on a toy GPU, and
the published engines built from it."""

from __future__ import annotations

import pytest

from benchmarks.fleetsim.published import CROSS_CHECK_SHAPES, PUBLISHED, cross_check
from benchmarks.fleetsim.roofline import GPUS, LLAMA_3_1_8B, DenseModel, Gpu, RooflineStepTime, kv_cache_tokens
from benchmarks.fleetsim.step_time import StepShape

# hidden 4 in 2 heads of 2 (one KV head: KV width 2), MLP 8 wide, 1 byte per value
TOY = DenseModel("toy", layers=1, hidden=4, heads=2, kv_heads=1, intermediate=8, vocab=10, bytes_per_param=1.0)
TOY_GPU = Gpu("toy", tflops_bf16=100.0, bandwidth_tb_s=1.0, mfu_prefill=0.5, mfu_decode=0.25, memory_gib=1.0)
PREFILL_FLOPS_S, DECODE_FLOPS_S, BYTES_S = 50e12, 25e12, 1e12
WEIGHTS = 4 * (4 + 2 * 2) + 4 * 4 + 2 * 4 * 8  # Q, K, V; output projection; up and down: 112 bytes
TOKEN_FLOPS = 2 * (16 + 2 * 4 * 2) + 2 * 16 + 2 * 4 + 4 * 4 * 8  # projections, output, rope, MLP: 232
PAIR_FLOPS = 4 * 2 * 2 + 5 * 2  # QK^T and AV per head, softmax and masking: 26
KV_PER_TOKEN = 2 * 1 * 1 * 2 * 1.0  # K and V, one layer, one KV head of 2: 4 bytes


def test_a_lone_decode_step_reads_the_weights_its_kv_and_activations_at_peak_bandwidth():
    moved = WEIGHTS + KV_PER_TOKEN * (1 + 10) + 4 * 1  # the weights, 1 written and 10 read, one token's activation
    compute = (TOKEN_FLOPS + 10 * PAIR_FLOPS) / DECODE_FLOPS_S
    assert moved / BYTES_S > compute  # memory-bound, as decoding at batch 1 is
    assert RooflineStepTime(TOY, TOY_GPU).step_s(StepShape(1, 0, 10)) == pytest.approx(moved / BYTES_S)


def test_a_long_prefill_is_compute_bound_at_the_prefill_mfu():
    shape = StepShape(0, 1000, 0, prefill_pairs=1000 * 500)
    compute = (1000 * TOKEN_FLOPS + 500_000 * PAIR_FLOPS) / PREFILL_FLOPS_S
    assert compute > (WEIGHTS + KV_PER_TOKEN * 1000 + 4 * 1000) / BYTES_S
    assert RooflineStepTime(TOY, TOY_GPU).step_s(shape) == pytest.approx(compute)


def test_decoding_requests_add_compute_at_the_decode_mfu_until_it_binds():
    roofline = RooflineStepTime(TOY, TOY_GPU)
    assert roofline.step_s(StepShape(1, 0, 0)) == pytest.approx((WEIGHTS + KV_PER_TOKEN + 4) / BYTES_S)
    compute, moved = 5000 * TOKEN_FLOPS / DECODE_FLOPS_S, (WEIGHTS + (KV_PER_TOKEN + 4) * 5000) / BYTES_S
    assert compute > moved
    assert roofline.step_s(StepShape(5000, 0, 0)) == pytest.approx(compute)


def test_the_kv_cache_is_what_is_left_of_ninety_percent_after_weights_activations_and_context():
    gpu = GPUS["L40S"]
    weights_gib = LLAMA_3_1_8B.parameters() * 2 / 2**30
    assert 14.5 < weights_gib < 15.5  # Llama 3.1 8B: 8.03 billion parameters in bfloat16
    free = (48 * 0.9 - weights_gib - 5.5 - 0.15) * 2**30
    assert kv_cache_tokens(LLAMA_3_1_8B, gpu) == int(free // (2 * 32 * 8 * 128 * 2))


def test_the_cheaper_gpu_is_slower_per_step_and_names_its_source():
    l40s, h100 = PUBLISHED["llama-3.1-8b-l40s"], RooflineStepTime(LLAMA_3_1_8B, GPUS["H100"])
    for shape in CROSS_CHECK_SHAPES.values():
        assert l40s.step_time.step_s(shape) > h100.step_s(shape)
    assert "roofline.go" in l40s.step_time.source and "L40S" in l40s.step_time.source
    assert l40s.kv_cache_tokens < PUBLISHED["llama-3.1-8b-h100"].kv_cache_tokens


def test_the_h100_cross_check_compares_both_models_on_every_shape():
    rows = cross_check()
    assert set(rows) == set(CROSS_CHECK_SHAPES)
    for row in rows.values():
        assert row["roofline_over_trained"] == pytest.approx(row["roofline_ms"] / row["trained_ms"], rel=1e-2)
