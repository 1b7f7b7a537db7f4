"""The pieces of Megatron-style tensor parallelism: the conjugate operators f and g, column- and
row-parallel linear layers, the vocabulary-parallel embedding and the vocabulary-parallel
cross-entropy. paralab.strategies.tensor assembles them into a GPT.

Activations are sequence-first, ``(seq, batch, hidden)``, as in Megatron: with sequence parallelism
each rank's slice of the sequence is then a contiguous block of memory, which is what all-gather and
reduce-scatter exchange.

f sits where a tensor-parallel region begins, g where it ends. Without sequence parallelism f is the
identity in forward and an all-reduce in backward, g the reverse. With it, the activations outside the
regions are split along the sequence, so f becomes an all-gather along the sequence (reduce-scatter in
backward) and g a reduce-scatter (all-gather in backward): the same bytes on the wire, since a ring
all-reduce is a reduce-scatter followed by an all-gather. The column-parallel layer after f keeps only
its input's sequence slice for backward and gathers it again there (``_GatheredLinear``): one more
all-gather a layer, for activations split t ways all through the block.

Every collective goes through paralab.comm with a name saying where it sits ("attn g", "mlp f", ...),
so the trace shows each one in its place in the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from paralab import comm


@dataclass(frozen=True)
class TensorParallelGroup:
    """The ranks that split each layer between them, and this rank's place among them."""

    group: object  # a torch.distributed ProcessGroup; None is the whole world
    rank: int
    size: int
    sequence_parallel: bool = False


# ---------------------------------------------------------------------------- f and g
class _CopyToRegion(torch.autograd.Function):
    """f: every rank needs the whole input; each returns only its part of the input's gradient."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallelGroup, name: str):
        ctx.tp, ctx.name = tp, name
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        comm.all_reduce(grad, group=ctx.tp.group, name=ctx.name)
        return grad, None, None


class _ReduceFromRegion(torch.autograd.Function):
    """g: each rank holds a partial sum of the output; the sum's gradient is every partial's gradient."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallelGroup, name: str):
        out = x.clone()
        comm.all_reduce(out, group=tp.group, name=name)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatheredLinear(torch.autograd.Function):
    """f with sequence parallelism and the column-parallel matmul it feeds, as Megatron-LM runs them
    (Korthikanti et al. 2022, sec. 4.2.2): gather the sequence slices and multiply, but keep only this
    rank's slice for the weight gradient and gather it again in backward. The layer's input is then
    held at 1/t of its size (the paper's 34 s b h / t a layer), for one more all-gather a pass, which
    starts before the input gradient's matmul and travels while it runs; the input gradient's
    reduce-scatter likewise travels while the weight gradient's matmul runs."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp: TensorParallelGroup, name: str):
        ctx.tp, ctx.name, ctx.has_bias = tp, name, bias is not None
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        return F.linear(_gathered(x, tp, name), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        tp, grad = ctx.tp, grad.contiguous()
        whole = _whole_sequence(x, tp)
        gathering = comm.all_gather(whole, x, group=tp.group, async_op=True, name=f"{ctx.name} again")
        grad_whole = grad.matmul(weight)
        grad_x = grad_whole.new_empty(x.shape)
        scattering = comm.reduce_scatter(grad_x, grad_whole, group=tp.group, async_op=True, name=ctx.name)
        gathering.wait()
        grad_2d = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad_2d.t().matmul(whole.reshape(-1, whole.shape[-1]))
        grad_bias = grad_2d.sum(0) if ctx.has_bias else None
        scattering.wait()
        return grad_x, grad_weight, grad_bias, None, None


def _whole_sequence(x: torch.Tensor, tp: TensorParallelGroup) -> torch.Tensor:
    """An empty tensor the size of every rank's sequence slice ``x`` put together."""
    return x.new_empty((x.shape[0] * tp.size, *x.shape[1:]))


def _gathered(x: torch.Tensor, tp: TensorParallelGroup, name: str) -> torch.Tensor:
    out = _whole_sequence(x, tp)
    comm.all_gather(out, x, group=tp.group, name=name)
    return out


class _ScatterToSequence(torch.autograd.Function):
    """g with sequence parallelism: sum the partial outputs, keep this rank's sequence slice; in
    backward, gather the slices' gradients."""

    @staticmethod
    def forward(ctx, x, tp: TensorParallelGroup, name: str):
        ctx.tp, ctx.name = tp, name
        return _reduce_scatter(x, tp, name)

    @staticmethod
    def backward(ctx, grad):
        return _gathered(grad.contiguous(), ctx.tp, ctx.name), None, None


def _reduce_scatter(x: torch.Tensor, tp: TensorParallelGroup, name: str) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((x.shape[0] // tp.size, *x.shape[1:]))
    comm.reduce_scatter(out, x, group=tp.group, name=name)
    return out


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                           tp: TensorParallelGroup, name: str) -> torch.Tensor:
    """The paper's f, then the column-parallel matmul it feeds: f enters a tensor-parallel region
    (identity forward, all-reduce backward; with sequence parallelism, all-gather the sequence forward
    and again in backward, reduce-scatter backward)."""
    if tp.sequence_parallel:
        return _GatheredLinear.apply(x, weight, bias, tp, name)
    return F.linear(_CopyToRegion.apply(x, tp, name), weight, bias)


def leave_parallel_region(x: torch.Tensor, tp: TensorParallelGroup, name: str) -> torch.Tensor:
    """The paper's g: leave a tensor-parallel region (all-reduce forward, identity backward; with
    sequence parallelism, reduce-scatter to the sequence slices forward, all-gather backward)."""
    op = _ScatterToSequence if tp.sequence_parallel else _ReduceFromRegion
    return op.apply(x, tp, name)


# ---------------------------------------------------------------------------- layers
def split_param(shape: tuple[int, ...], dim: int | None, groups: int = 1) -> nn.Parameter:
    """An uninitialised parameter (filled from the single-device model). ``tp_split = (dim, groups)``
    says how it was cut from the full tensor: along ``dim``, within each of ``groups`` equal blocks
    (3 for a fused QKV, so each rank gets its heads' q, k and v); ``dim`` None means replicated."""
    param = nn.Parameter(torch.empty(shape))
    param.tp_split = (dim, groups)
    return param


class ColumnParallelLinear(nn.Module):
    """Y = X A + b with A split by columns (output features): f, then a local matmul whose output
    stays split; it feeds a row-parallel layer or the vocabulary-parallel loss, never gathered."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallelGroup, name: str,
                 groups: int = 1):
        super().__init__()
        self.tp, self.name = tp, name
        self.weight = split_param((out_features // tp.size, in_features), 0, groups)
        self.bias = split_param((out_features // tp.size,), 0, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return column_parallel_linear(x, self.weight, self.bias, self.tp, f"{self.name} f")


class RowParallelLinear(nn.Module):
    """Y = X A + b with A split by rows (input features): each rank's matmul gives a partial sum, g
    adds them up, then the bias (replicated) is added once."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallelGroup, name: str):
        super().__init__()
        self.tp, self.name = tp, name
        self.weight = split_param((out_features, in_features // tp.size), 1)
        self.bias = split_param((out_features,), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return leave_parallel_region(F.linear(x, self.weight), self.tp, f"{self.name} g") + self.bias


class VocabParallelEmbedding(nn.Module):
    """Each rank holds the embeddings of a contiguous range of vocab/tp tokens. It looks up the tokens
    in its range, writes zeros for the others, and g sums the ranks' partial results."""

    def __init__(self, vocab: int, hidden: int, tp: TensorParallelGroup):
        super().__init__()
        self.tp = tp
        self.weight = split_param((vocab // tp.size, hidden), 0)
        self.vocab_start = tp.rank * (vocab // tp.size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        partial = F.embedding(local.masked_fill(outside, 0), self.weight)
        return leave_parallel_region(partial.masked_fill(outside.unsqueeze(-1), 0.0), self.tp, "embed g")


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split along the vocabulary: three all-reduces of one number per token
    (the max, the target's logit, the sum of exponentials) replace gathering the logits."""

    @staticmethod
    def forward(ctx, logits, targets, tp: TensorParallelGroup):
        logits_max = logits.max(dim=-1).values
        comm.all_reduce(logits_max, op=comm.ReduceOp.MAX, group=tp.group, name="loss max")
        shifted = logits - logits_max.unsqueeze(-1)

        vocab_local = logits.shape[-1]
        local = targets - tp.rank * vocab_local
        mine = (local >= 0) & (local < vocab_local)
        local = local.masked_fill(~mine, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        comm.all_reduce(target_logit, group=tp.group, name="loss target")

        exp = shifted.exp_()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group=tp.group, name="loss sum-exp")
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, mine)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, mine = ctx.saved_tensors
        grad = softmax * grad_loss.unsqueeze(-1)
        grad.scatter_add_(-1, local.unsqueeze(-1), -(grad_loss * mine).unsqueeze(-1))
        return grad, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 tp: TensorParallelGroup) -> torch.Tensor:
    """Per-token loss from this rank's vocabulary slice of the logits; the same on every rank.
    Computed in fp32 whatever the logits' dtype, as paralab.models.gpt.lm_loss is."""
    return _VocabParallelCrossEntropy.apply(logits.float(), targets, tp)
