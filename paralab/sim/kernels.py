"""What one transformer block's non-GEMM kernels move, op by op: eager PyTorch against fused kernels.

The cost model prices a layer's non-GEMM work from the activations it keeps (Korthikanti et al.
2022's count, :func:`paralab.sim.cost.layer_work`); the runs of docs/simulator.md that use a kernel
library (Megatron-LM and Apex, Transformer Engine, FlashAttention, torch.compile) are predicted
from that count as it stands. Eager PyTorch launches one kernel per op instead: each reads its
inputs from memory and writes its output back, at the precision it computes in. This module counts
the bytes of one token through one layer's forward both ways, op by op, and their ratio scales the
count for a model whose ``kernels`` is "eager". No rate is fitted: the ops are those the reference
implementations run.

Eager, as torchtitan's and Meta's Llama and llm-foundry's MPT write the block:

- RMSNorm upcasts to fp32, squares, takes the mean, multiplies by its reciprocal square root, casts
  back and multiplies by the weight: six kernels, three of them reading and writing fp32 copies.
  LayerNorm is one native kernel, eager or not.
- Rotary embeddings upcast Q and K to fp32, multiply them as complex numbers, and cast back.
- Grouped-query attention copies K and V out to every query head before SDPA (``repeat_kv``).
- SwiGLU runs silu, then its product with the up projection; GELU is one kernel.
- Each dropout is a kernel of its own (writing its mask), and so is each residual add.

Fused, as a kernel library runs it: the residual add (with its dropout) folds into the norm that
follows, which reads both inputs once and writes the sum and the normalised output; rotary is one
read and one write; attention reads K and V at their own heads; SwiGLU reads gate and up once and
writes their product; the bias and GELU are one kernel.

The attention core's own elementwise work (the standard kernel's softmax and dropout) is priced
apart by the cost model and is not counted here.
"""

from __future__ import annotations

from paralab.sim.counting import norms_per_layer
from paralab.sim.specs import ModelSpec

FP32 = 4  # bytes of the fp32 copies eager norms and rotary embeddings compute in


def _casts(e: int) -> int:
    """Bytes per element of an eager upcast to fp32 and the cast back (each reads one width and
    writes the other); none when the model's dtype is fp32 already."""
    return 2 * (e + FP32) if e < FP32 else 0


def _rmsnorm_eager(e: int) -> int:
    """Bytes per element of an eager RMSNorm: pow, mean and the rsqrt product in fp32 (read 4 and
    write 4, read 4, read 4 and write 4), the weight product in the model's dtype, and the casts."""
    return 5 * FP32 + 2 * e + _casts(e)


def _rotary_eager(e: int) -> int:
    """Bytes per element of Q or K through eager rotary embeddings: a complex product in fp32 and the
    casts."""
    return 2 * FP32 + _casts(e)


def block_traffic(model: ModelSpec, kernels: str) -> dict[str, float]:
    """Bytes the non-GEMM kernels of one layer's forward read and write for one token, by op."""
    e, h, kv, f = model.dtype_bytes, model.hidden, model.kv_dim, model.ffn
    norms = norms_per_layer(model)
    mask = model.mask_bytes if model.dropout else 0
    eager = kernels == "eager"
    rms = model.norm_params == 1
    out = {"norms": norms * h * (_rmsnorm_eager(e) if eager and rms else 2 * e)}
    # two residual adds a layer. Eager: a dropout kernel (read, write, its mask) and an add that reads
    # both inputs and writes the sum. Fused into the next norm: the second input read, the sum written
    dropout = 2 * e + mask if model.dropout else 0
    out["residual adds"] = 2 * h * (dropout + 3 * e if eager else 2 * e + mask)
    if not model.learned_positions:
        out["rotary"] = (h + kv) * (_rotary_eager(e) if eager else 2 * e)
    if eager and kv < h:
        out["K and V to every head"] = 2 * e * (kv + h)
    out["MLP activation"] = f * (5 * e if eager else 3 * e) if model.gated_mlp else f * 2 * e
    return out


def eager_ratio(model: ModelSpec) -> float:
    """How many times the fused kernels' bytes an eager block moves (1 for a fused model)."""
    if model.kernels != "eager":
        return 1.0
    return sum(block_traffic(model, "eager").values()) / sum(block_traffic(model, "fused").values())
