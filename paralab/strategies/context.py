"""Context parallel (上下文并行): every sequence split over the ranks, attention across the split.

Long sequences run out of activation memory first: every layer keeps activations in proportion to
the tokens it sees, and the sequence is one sample, so data parallelism cannot cut it. With context
parallelism the N ranks of a cp group each hold one slice of every sequence (zig-zag or contiguous,
sequence_split.py). Embeddings, LayerNorms, the MLP, the head and the loss work token by token, so
they run on the slice unchanged, given the slice's positions: activation memory per rank falls as
1/N. Attention is where tokens meet, so it crosses the split, one of two ways (``cp_mode``):

- ``ring`` (ring_attention.py, Liu et al. 2023): K/V blocks travel round the ring, each hop
  overlapped with a block's attention, partial results merged by the log-sum-exp rule. Per layer
  and rank it sends N-1 K/V blocks forward (2 x slice activations each) and 2N-1 blocks backward,
  but hides them behind compute while a block computes longer than it travels.
- ``alltoall`` (DeepSpeed-Ulysses, Jacobs et al. 2023): three all-to-alls turn q, k and v from
  sequence-sharded (every head of a slice) to head-sharded (heads/N heads of the whole sequence),
  each rank runs plain causal attention on its heads, a fourth turns the output back; backward the
  same four the other way. Each moves (N-1)/N of a slice's activation, less than the ring as N
  grows, but nothing hides it, and it needs the heads to divide by N.

Every rank computes the mean loss of its own tokens (each slice has as many), the parameters are
replicated, so the gradients are averaged over the cp group (over dp and cp together in hybrid):
DDP's buckets (ddp.py), launched from the backward. The model is paralab.models.gpt's, made context
parallel by :func:`parallelize_context`, which replaces two things: each attention's ``attend`` and
each embedding's ``positions``.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from paralab import comm
from paralab.config import ConfigError, RunConfig
from paralab.models.gpt import GPT, AttentionCore, lm_loss
from paralab.precision import torch_dtype
from paralab.strategies.common import named_state, prepare, train_model
from paralab.strategies.ddp import BucketedReducer
from paralab.strategies.registry import CONTEXT_OPTIONS, Strategy
from paralab.strategies.ring_attention import ContextParallelGroup, ring_attention


def check(cfg: RunConfig, layout) -> None:
    """Refuse, before any process starts, a sequence or head count the cp degree cannot split."""
    n, m = layout.cp, cfg.model
    if m.dropout:
        raise ConfigError(f"context parallel does not run attention dropout (its masks would have to follow "
                          f"the sequence across ranks): use dropout 0, got {m.dropout}")
    if m.attention == "math":
        raise ConfigError("attention='math' writes out the s x s scores; context parallel attends tile by "
                          "tile on the ring (or with torch's fused kernel after its all-to-all) and never "
                          "holds them: use attention='sdpa' with cp")
    ring, zigzag = layout.cp_mode == "ring", layout.cp_split == "zigzag"
    pieces = _chunks_per_rank(layout) * n
    if m.seq_len % pieces:
        why = ("zig-zag cuts it into 2 x cp chunks, rank i holding chunks i and 2cp-1-i" if zigzag else
               "ring attention cuts each rank's slice into two chunks" if ring else
               "each rank holds seq / cp tokens")
        fits = [pieces * k for k in range(max(m.seq_len // pieces - 2, 1), m.seq_len // pieces + 3)]
        # the command line sets no sequence length: the degrees that fit this model come first
        raise ConfigError(f"cp {n} ({layout.cp_mode}, {layout.cp_split}) needs the sequence length divisible "
                          f"by {pieces}, got {m.seq_len}: {why}; cp degrees ({OFFERED}) that fit its "
                          f"{m.seq_len} tokens{'' if ring else ' and heads'}: {_fitting(m, layout)} (or, "
                          "from Python, a model "
                          f"of a sequence length that fits: {', '.join(map(str, fits))})")
    if layout.sequence_parallel and (m.seq_len // n) % layout.tp:
        raise ConfigError(f"sequence parallel splits each cp rank's {m.seq_len // n} tokens (sequence "
                          f"{m.seq_len} / cp {n}) over tp {layout.tp} ranks, which does not divide them; use "
                          f"a sequence length divisible by {n * math.lcm(pieces // n, layout.tp)}")
    heads = m.heads // layout.tp
    if not ring and heads % n:
        per = f" per tensor-parallel rank (heads {m.heads} / tp {layout.tp})" if layout.tp > 1 else ""
        raise ConfigError(f"all-to-all (Ulysses) gives each of the cp {n} ranks an equal share of the "
                          f"heads: {heads} heads{per} do not divide by {n}; cp degrees ({OFFERED}) that fit "
                          f"its heads and tokens: {_fitting(m, layout)}, or cp_mode 'ring'")


def _chunks_per_rank(layout) -> int:
    """The sequence chunks a cp rank holds: two with ring attention or the zig-zag split, else one."""
    return 2 if layout.cp_mode == "ring" or layout.cp_split == "zigzag" else 1


OFFERED_DEGREES = range(2, 17)  # the cp degrees a refusal looks through for ones that fit
OFFERED = f"{OFFERED_DEGREES[0]} to {OFFERED_DEGREES[-1]}"


def _fitting(model, layout) -> str:
    """The cp degrees (of :data:`OFFERED_DEGREES`) this model's sequence splits into, whose slices
    sequence parallel splits over tp where it is on, and, for the all-to-all, whose ranks take equal
    shares of its heads: the degree that one refusal offered, the next check no longer refuses."""
    ring, per_rank, tp = layout.cp_mode == "ring", _chunks_per_rank(layout), layout.tp
    heads = model.heads // tp
    fits = [c for c in OFFERED_DEGREES if model.seq_len % (per_rank * c) == 0 and (ring or heads % c == 0)
            and not (layout.sequence_parallel and (model.seq_len // c) % tp)]
    return ", ".join(map(str, fits)) or "none"


# ---------------------------------------------------------------------------- all-to-all (Ulysses)
def sequence_to_heads(x: torch.Tensor, ring: ContextParallelGroup, name: str) -> torch.Tensor:
    """(batch, heads, slice, head_dim) -> (batch, heads / N, N x slice, head_dim): the j-th group of
    heads goes to rank j; what arrives is this rank's heads for every rank's slice, in rank order."""
    b, h, s, d = x.shape
    n = ring.size
    send = x.reshape(b, n, h // n, s, d).transpose(0, 1).contiguous()
    received = torch.empty_like(send)
    comm.all_to_all(received, send, group=ring.group, name=name)
    return received.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d)


def heads_to_sequence(y: torch.Tensor, ring: ContextParallelGroup, name: str) -> torch.Tensor:
    """The inverse of :func:`sequence_to_heads`: every rank's slice goes home, with this rank's heads."""
    b, h, length, d = y.shape
    n = ring.size
    send = y.reshape(b, h, n, length // n, d).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    comm.all_to_all(received, send, group=ring.group, name=name)
    return received.transpose(0, 1).reshape(b, n * h, length // n, d)


class _Reshard(torch.autograd.Function):
    """An all-to-all between the sequence-sharded and the head-sharded layouts; its gradient is the
    all-to-all the other way."""

    @staticmethod
    def forward(ctx, x, ring, name, to_heads: bool):
        ctx.ring, ctx.name, ctx.to_heads = ring, name, to_heads
        return (sequence_to_heads if to_heads else heads_to_sequence)(x, ring, name)

    @staticmethod
    def backward(ctx, grad):
        back = heads_to_sequence if ctx.to_heads else sequence_to_heads
        return back(grad.contiguous(), ctx.ring, f"{ctx.name} grad"), None, None, None


def ulysses_attention(q, k, v, ring: ContextParallelGroup, name: str) -> torch.Tensor:
    """Causal attention over the whole sequence for this rank's (batch, heads, slice, head_dim) q, k, v:
    all-to-all to heads, attention in position order (a zig-zag gathers chunks out of order), back."""
    q, k, v = (_Reshard.apply(t.contiguous(), ring, f"{name} {n}", True) for n, t in zip("qkv", (q, k, v)))
    length = q.shape[-2]
    held = torch.cat([ring.positions(length, r) for r in range(ring.size)]).to(q.device)  # each row's
    in_order = torch.argsort(held)
    q, k, v = (t.index_select(-2, in_order) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).index_select(-2, torch.argsort(in_order))
    return _Reshard.apply(y.contiguous(), ring, f"{name} out", False)


ATTENTION = {"ring": ring_attention, "alltoall": ulysses_attention}


# ---------------------------------------------------------------------------- the model
class ContextParallelCore(AttentionCore):
    """An attention core (paralab.models.gpt.AttentionCore's place, so selective recomputation finds
    it) attending across the cp group."""

    def __init__(self, ring: ContextParallelGroup, name: str):
        super().__init__()
        self.attend = partial(ATTENTION[ring.mode], ring=ring, name=name)

    def forward(self, q, k, v):
        return self.attend(q, k, v)


def parallelize_context(module: torch.nn.Module, ring: ContextParallelGroup, seq_len: int,
                        first_layer: int = 0) -> torch.nn.Module:
    """Make ``module`` (a GPT, or parts of one: plain or tensor-parallel) context parallel: every
    attention core attends across the cp group (its spans named L0, L1, ... from ``first_layer``),
    every embedding looks up this rank's positions. Parameters are untouched."""
    positions = ring.positions(seq_len)
    layer = first_layer
    for sub in list(module.modules()):
        for name, child in list(sub.named_children()):
            if isinstance(child, AttentionCore):
                setattr(sub, name, ContextParallelCore(ring, f"L{layer}"))
                layer += 1
        if hasattr(sub, "positions"):
            sub.positions = lambda length, device: positions.to(device)
    return module


def slice_tokens(ring: ContextParallelGroup, seq_len: int, device):
    """A function that cuts (batch, seq) token ids or targets to this rank's slice."""
    held = ring.positions(seq_len, device=device)
    return lambda tokens: tokens.index_select(1, held)


# ---------------------------------------------------------------------------- training
def train(ctx):
    cfg, layout = ctx.cfg, ctx.layout
    ring = ContextParallelGroup(None, tuple(range(ctx.world_size)), ctx.rank, layout.cp_split, layout.cp_mode)
    model = prepare(ctx, parallelize_context(GPT(cfg.model, cfg.seed), ring, cfg.model.seq_len))
    mine = slice_tokens(ring, cfg.model.seq_len, ctx.device)
    reducer = BucketedReducer(model, layout.cp, cfg.bucket_mb, accumulations=layout.microbatches,
                              memory=ctx.memory, reduce_dtype=torch_dtype(cfg.reduce_dtype))
    result = train_model(ctx, model, reducer, loss_of=lambda x, y: lm_loss(model(mine(x)), mine(y)),
                         state_of=lambda: named_state(model) if ring.index == 0 else None)
    result["attention_cpu_s"] = {str(step): s for step, s in ring.work.cpu_s.items()}
    result["attention_pairs"] = {str(step): n for step, n in ring.work.pairs.items()}
    return result


STRATEGIES = [Strategy("cp", "`--cp-mode ring` (K/V round a ring) or `alltoall` (Ulysses), "
                              "`--cp-split zigzag`", axes=("cp",),
                       options=(*CONTEXT_OPTIONS, "bucket_mb", "reduce_dtype"), check=check,
                       train=train, title="context parallel (上下文并行)")]
