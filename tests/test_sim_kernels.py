"""Eager against fused non-GEMM kernels (paralab.sim.kernels): the bytes counted op by op as the
reference implementations run them, and what the cost model makes of them."""

import dataclasses

import pytest

from paralab.sim import cost, kernels
from paralab.sim.hardware import PRESETS
from paralab.sim.presets import get_model
from paralab.sim.specs import ModelSpec, ParallelSpec

LLAMA_8B = get_model("llama3-8b")  # h 4096, 8 KV heads of 32 (K and V 1024 wide), SwiGLU of 14336
GPT = ModelSpec(layers=4, hidden=1024, heads=16, dropout=False)  # LayerNorm, GELU of 4h, no rotary


def per_token(model, kind):
    return sum(kernels.block_traffic(model, kind).values())


def test_an_eager_llama_block_moves_what_its_ops_read_and_write():
    h, kv, f = 4096, 1024, 14336
    # RMSNorm, bytes per element: to fp32 (2 + 4), pow (4 + 4), mean (4), x * rsqrt (4 + 4), back to
    # bf16 (4 + 2), times the weight (2 + 2)
    rmsnorm = 6 + 8 + 4 + 8 + 6 + 4
    rotary = 6 + 8 + 6  # Q and K to fp32, complex product, back
    repeat_kv = 2 * (2 * kv + 2 * h)  # K and V read at their heads, written at every head
    swiglu = (2 + 2) + (4 + 2)  # silu; its product with the up projection
    residual = 2 * (4 + 2)  # two adds: two bf16 inputs, one output
    eager = 2 * rmsnorm * h + residual * h + rotary * (h + kv) + repeat_kv + swiglu * f
    assert per_token(LLAMA_8B.replace(kernels="eager"), "eager") == eager
    # fused: the add folded into the norm (read 2, write 2), rotary once through, SwiGLU reads 2 writes 1
    fused = 2 * (4 + 4) * h + 4 * (h + kv) + 6 * f
    assert per_token(LLAMA_8B, "fused") == fused
    assert kernels.eager_ratio(LLAMA_8B.replace(kernels="eager")) == pytest.approx(eager / fused)
    assert kernels.eager_ratio(LLAMA_8B) == 1.0


def test_layernorm_is_one_kernel_eager_or_not_and_fp32_needs_no_casts():
    eager, fused = kernels.block_traffic(GPT, "eager"), kernels.block_traffic(GPT, "fused")
    assert eager["norms"] == fused["norms"] == 2 * 2 * 2 * 1024
    assert eager["MLP activation"] == fused["MLP activation"]  # GELU: one kernel both ways
    assert "rotary" not in eager and "K and V to every head" not in eager
    # with dropout (byte masks): eager, a dropout kernel (2 + 2 + 1) before each add (2 + 2 + 2);
    # fused, the add reads its second input and writes the sum and the mask (2 + 2 + 1)
    dropout = dataclasses.replace(GPT, dropout=True)
    assert kernels.block_traffic(dropout, "eager")["residual adds"] == 2 * (5 + 6) * 1024
    assert kernels.block_traffic(dropout, "fused")["residual adds"] == 2 * 5 * 1024
    fp32 = kernels.block_traffic(LLAMA_8B.replace(dtype="fp32"), "eager")
    assert fp32["norms"] == 2 * (8 + 4 + 8 + 8) * 4096  # pow, mean, product, weight: no casts
    assert fp32["rotary"] == 8 * (4096 + 1024)


def test_eager_kernels_lengthen_only_the_non_gemm_work():
    p, hw = ParallelSpec(dp=1, micro_batch=1).resolved(), PRESETS["h100"]
    eager_model = LLAMA_8B.replace(kernels="eager")
    fused, eager = cost.layer_work(LLAMA_8B, p, hw), cost.layer_work(eager_model, p, hw)
    assert (eager.linear, eager.core, eager.core_elementwise_bytes) == (
        fused.linear, fused.core, fused.core_elementwise_bytes)  # fmt: skip
    outside_core = fused.elementwise_bytes - fused.core_elementwise_bytes
    added = (kernels.eager_ratio(eager_model) - 1) * outside_core
    assert eager.elementwise_bytes - fused.elementwise_bytes == pytest.approx(added)
    # a layer's forward pays the added bytes once at HBM speed, its backward twice
    f, e = cost.stage_times(LLAMA_8B, p, hw)[0], cost.stage_times(eager_model, p, hw)[0]
    layers = LLAMA_8B.layers
    assert e.forward - f.forward == pytest.approx(layers * added / hw.memory_bandwidth, rel=1e-6)
    assert e.backward - f.backward == pytest.approx(2 * layers * added / hw.memory_bandwidth, rel=1e-6)


def test_an_unknown_kernels_setting_is_refused():
    assert any("unknown kernels 'jit'" in m for m in dataclasses.replace(GPT, kernels="jit").problems())
