"""Tensor parallel (张量并行) as in Megatron-LM, with optional sequence parallelism.

Every rank holds a slice of every layer. In attention, each rank owns heads/tp heads: the fused QKV
projection is column-parallel (each rank gets its heads' q, k and v) and the output projection
row-parallel, so a block's attention needs one all-reduce in forward (g) and one in backward (f).
The MLP is the same pair: the first linear column-parallel, the second row-parallel. The embedding is
split along the vocabulary, and so is the language-model head, whose logits are never gathered: the
vocabulary-parallel cross-entropy all-reduces three numbers per token instead.

The position embedding and the LayerNorms are replicated. Without sequence parallelism every rank
computes the same values and gets the same gradients for them. With sequence parallelism
(``sequence_parallel``) the LayerNorm and dropout regions work on a slice of the sequence, so those
parameters, the row-parallel biases (added after g) and the position embedding see only their slice:
their gradients are all-reduced after backward. Activation memory per rank in those regions falls by
the tensor-parallel degree; a column-parallel linear keeps its input's slice too and gathers it again
in backward for its weight gradient, one more all-gather for that memory, as Megatron-LM does
(tensor_layers._GatheredLinear).

Dropout in a replicated region draws from torch's generator, seeded alike on every tp rank, so all of
them drop the same elements, as they must. Inside a split region (a rank's attention heads; with
sequence parallelism its sequence slice) it draws from the rank's own split-region stream
(paralab.random_streams), so no two ranks drop the same places of different heads or slices.

Every rank sees the whole batch and computes the same loss; tp rank 0 reports it. The layers are in
paralab.strategies.tensor_layers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from paralab import comm, random_streams
from paralab.config import ConfigError, ModelConfig, RunConfig
from paralab.models.gpt import AttentionCore, build_part
from paralab.precision import torch_dtype
from paralab.strategies.common import (
    GradSync,
    SyncChain,
    flatten_grads,
    prepare,
    train_model,
    unflatten_grads,
)
from paralab.strategies.registry import Strategy, check_reduce_dtype_applies, get_strategy
from paralab.strategies.tensor_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelGroup,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)


def check_sequence_parallel(layout) -> None:
    """ConfigError for sequence parallelism at tp 1, where one rank splits nothing, naming the fix: tp,
    or the world size for a strategy whose tp is the world (the fix had said "world_size >= 2" to a
    torch_hybrid run of two ranks, and nothing to hybrid)."""
    if layout.sequence_parallel and layout.tp == 1:
        whole_world = get_strategy(layout.strategy).axes == ("tp",)
        raise ConfigError(f"sequence_parallel splits the sequence over the tp ranks: it needs tp > 1, and "
                          f"this {layout.strategy} run has tp 1 (dp {layout.dp}); give "
                          f"{'world_size' if whole_world else 'tp'} >= 2")


def check(cfg: RunConfig, layout) -> None:
    """Refuse a tp degree that does not split every sliced size evenly, before any process starts."""
    tp, m = layout.tp, cfg.model
    check_sequence_parallel(layout)
    sizes = {"hidden size": m.hidden, "attention heads": m.heads, "MLP size": m.ffn, "vocabulary": m.vocab}
    if layout.sequence_parallel:
        sizes["sequence length that sequence parallel splits"] = m.seq_len
    fits = [d for d in range(1, 17) if all(size % d == 0 for size in sizes.values())]
    for what, size in sizes.items():
        if size % tp:
            raise ConfigError(f"tp {tp} does not divide the {what}, {size}; tp degrees that fit: {fits}")


def check_tp(cfg: RunConfig, layout) -> None:
    """tp's refusals: :func:`check`'s, and a reduction dtype where nothing is reduced (each tp rank holds
    its own slice of the weights, or a whole copy of a norm's whose gradient it computed in full; only
    sequence parallelism leaves partial gradients to all-reduce)."""
    check(cfg, layout)
    check_reduce_dtype_applies(cfg, layout.sequence_parallel, "tp reduces gradients only under sequence "
                               "parallelism (sequence_parallel=True)")


# ---------------------------------------------------------------------------- the model
class SplitRegionDropout(nn.Dropout):
    """Dropout on a tensor this rank alone holds (its sequence slice): masks from the split-region stream."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with random_streams.split_region(self.training and self.p > 0):
            return super().forward(x)


class SplitRegionAttentionCore(AttentionCore):
    """The attention core on this rank's heads, its dropout drawn from the split-region stream."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with random_streams.split_region(self.training and self.dropout > 0):
            return super().forward(q, k, v)


def residual_dropout(cfg: ModelConfig, tp: TensorParallelGroup) -> nn.Dropout:
    """The dropout of the embedding and the residual branches: on a sequence slice with sequence
    parallelism, on the replicated whole without."""
    return SplitRegionDropout(cfg.dropout) if tp.sequence_parallel else nn.Dropout(cfg.dropout)


class ParallelEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.tp = tp
        self.tok = VocabParallelEmbedding(cfg.vocab, cfg.hidden, tp)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.drop = residual_dropout(cfg, tp)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(seq, batch) token ids -> (seq, batch, hidden), or this rank's sequence slice of it."""
        x = self.tok(idx)
        positions = self.positions(idx.shape[0], idx.device)
        if self.tp.sequence_parallel:  # x holds this rank's slice of the sequence
            positions = positions.chunk(self.tp.size)[self.tp.rank]
        return self.drop(x + self.pos(positions).unsqueeze(1))

    def positions(self, length: int, device) -> torch.Tensor:
        """The positions of the ``length`` tokens given (see paralab.models.gpt.Embedding.positions)."""
        return torch.arange(length, device=device)


class ParallelAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv = ColumnParallelLinear(cfg.hidden, 3 * cfg.hidden, tp, "attn", groups=3)
        self.core = SplitRegionAttentionCore(cfg.attention, cfg.dropout)  # this rank's heads only
        self.proj = RowParallelLinear(cfg.hidden, cfg.hidden, tp, "attn")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (seq, batch, local heads x head_dim) each
        s, b = q.shape[:2]
        q, k, v = (t.view(s, b, -1, self.head_dim).permute(1, 2, 0, 3) for t in (q, k, v))
        return self.proj(self.core(q, k, v).permute(2, 0, 1, 3).reshape(s, b, -1))


class ParallelMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.fc = ColumnParallelLinear(cfg.hidden, cfg.ffn, tp, "mlp")
        self.proj = RowParallelLinear(cfg.ffn, cfg.hidden, tp, "mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class ParallelBlock(nn.Module):
    """The pre-LayerNorm block of paralab.models.gpt.Block, its attention and MLP split over tp ranks."""

    IS_TRANSFORMER_BLOCK = True

    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = ParallelAttention(cfg, tp)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = ParallelMLP(cfg, tp)
        self.drop = residual_dropout(cfg, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class ParallelHead(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.lm = ColumnParallelLinear(cfg.hidden, cfg.vocab, tp, "head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's vocabulary slice of the logits."""
        return self.lm(self.ln(x))


class ParallelGPT(nn.Module):
    """paralab.models.gpt.GPT split over a tensor-parallel group, with the same parameter names."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallelGroup):
        super().__init__()
        self.tp = tp
        self.embed = ParallelEmbedding(cfg, tp)
        self.blocks = nn.ModuleList(ParallelBlock(cfg, tp) for _ in range(cfg.layers))
        self.head = ParallelHead(cfg, tp)
        mark_sequence_parallel(self, tp)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss of (batch, seq) ids; the same on every rank."""
        x = self.embed(idx.t())
        for block in self.blocks:
            x = block(x)
        return vocab_parallel_cross_entropy(self.head(x), targets.t(), self.tp).mean()


# ---------------------------------------------------------------------------- shards of the full model
def shard(full: torch.Tensor, dim: int | None, groups: int, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s slice of ``full`` (see tensor_layers.split_param)."""
    if dim is None:
        return full
    return torch.cat([block.chunk(size, dim)[rank] for block in full.chunk(groups, dim)], dim)


def unshard(shards: list[torch.Tensor], dim: int, groups: int) -> torch.Tensor:
    """The full tensor from every rank's slice, the inverse of :func:`shard`."""
    blocks = [s.chunk(groups, dim) for s in shards]
    return torch.cat([torch.cat([b[i] for b in blocks], dim) for i in range(groups)], dim)


def split_of(param: torch.Tensor) -> tuple[int | None, int]:
    return getattr(param, "tp_split", (None, 1))


def mark_sequence_parallel(module: nn.Module, tp: TensorParallelGroup) -> None:
    """With sequence parallelism, tag the replicated parameters: they see only a sequence slice, so
    their gradients are partial sums over the tp ranks (SequenceParallelGrads adds them up)."""
    if tp.sequence_parallel:
        for param in module.parameters():
            if split_of(param)[0] is None:
                param.sequence_parallel = True


@torch.no_grad()
def copy_shards(part: nn.Module, cfg: ModelConfig, index: int, seed: int, tp: TensorParallelGroup) -> None:
    """Fill a parallel part with this rank's slices of single-device part ``index`` (same seed)."""
    full = dict(build_part(cfg, index, seed).named_parameters())
    for name, param in part.named_parameters():
        param.copy_(shard(full[name], *split_of(param), tp.rank, tp.size))


def parallel_part(cfg: ModelConfig, index: int, seed: int, tp: TensorParallelGroup) -> nn.Module:
    """Part ``index`` of the GPT (0 = embed, 1..L = blocks, L+1 = head) split over ``tp``: the
    building block of a pipeline stage whose layers are tensor-parallel (hybrid)."""
    kind = ParallelEmbedding if index == 0 else ParallelHead if index == cfg.layers + 1 else ParallelBlock
    part = kind(cfg, tp)
    copy_shards(part, cfg, index, seed, tp)
    mark_sequence_parallel(part, tp)
    return part


def build_model(ctx, tp: TensorParallelGroup) -> ParallelGPT:
    """The parallel model, each shard cut from the single-device part built with the same seed."""
    cfg = ctx.cfg
    model = ParallelGPT(cfg.model, tp)
    for index, part in enumerate([model.embed, *model.blocks, model.head]):
        copy_shards(part, cfg.model, index, cfg.seed, tp)
    return prepare(ctx, model)


def gather_state(named_params, tp: TensorParallelGroup, grads: dict | None = None) -> dict | None:
    """Full parameters and gradients under GPT's names on tp rank 0 (None elsewhere), from this
    rank's ``(global name, parameter)`` pairs and their gradients (``grads`` by global name, else each
    parameter's ``.grad``: ZeRO's averaged gradients are fp32 beside 16-bit parameters). Plain
    torch.distributed calls after training, so the trace holds only the training steps."""
    state: dict = {"params": {}, "grads": {}}
    for name, param in named_params:
        grad = param.grad if grads is None else grads[name]
        for kind, tensor in (("params", param.detach()), ("grads", grad)):
            dim, groups = split_of(param)
            if dim is not None:
                shards = [torch.empty_like(tensor) for _ in range(tp.size)] if tp.rank == 0 else None
                dist.gather(tensor.contiguous(), shards, group=tp.group, group_dst=0)
                tensor = unshard(shards, dim, groups) if tp.rank == 0 else None
            if tp.rank == 0:
                state[kind][name] = tensor.cpu().clone()
    return state if tp.rank == 0 else None


class SequenceParallelGrads(GradSync):
    """After backward: all-reduce, in one flat buffer, the gradients of replicated parameters that saw
    only this rank's sequence slice (LayerNorms, row-parallel biases, the position embedding). It
    owns no gradients, so it clears none: it runs beside the sync that does (see SyncChain)."""

    def __init__(self, model: nn.Module, tp: TensorParallelGroup, reduce_dtype: torch.dtype = torch.float32):
        self.tp, self.reduce_dtype = tp, reduce_dtype
        self.params = [p for p in model.parameters() if getattr(p, "sequence_parallel", False)]

    def clear_grads(self, optimizer) -> None:
        pass

    def after_backward(self) -> None:
        if not self.params:
            return
        flat = flatten_grads(self.params).to(self.reduce_dtype)
        comm.all_reduce(flat, group=self.tp.group, name="sequence-parallel grads")
        unflatten_grads(self.params, flat)


# ---------------------------------------------------------------------------- training
def train(ctx):
    tp = TensorParallelGroup(None, ctx.rank, ctx.layout.tp, ctx.layout.sequence_parallel)
    model = build_model(ctx, tp)
    sync = SyncChain(GradSync(), SequenceParallelGrads(model, tp, torch_dtype(ctx.cfg.reduce_dtype)))
    return train_model(ctx, model, sync, loss_of=model,
                       state_of=lambda: gather_state(model.named_parameters(), tp))


STRATEGIES = [Strategy("tp", "Megatron column/row parallel, vocab-parallel loss, `--sequence-parallel`",
                       axes=("tp",), options=("sequence_parallel", "reduce_dtype"), check=check_tp,
                       train=train, title="tensor parallel (张量并行)")]
