"""A small GPT-style decoder, built as a sequence of parts so it can be split every way.

The model is ``[Embedding, Block 0, ..., Block L-1, Head]``. Layer-wise model parallel and pipeline
parallel hand contiguous runs of these parts to ranks; tensor parallel rebuilds the inside of each
Block; data parallel copies the whole list.

Why every part has its own seed: each part is initialised from a generator seeded with
``(seed, part index)``, so a pipeline stage that builds only blocks 4-7 gets exactly the weights
those blocks have in the full model, and every parallel layout starts from the same parameters as
single-device training without ever building the whole model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from paralab.config import ModelConfig
from paralab.models.moe import ExpertGroup, MoELayer, expert_seed

INIT_STD = 0.02


class Embedding(nn.Module):
    """Token plus learned position embeddings: (batch, seq) token ids -> (batch, seq, hidden)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.drop(self.tok(idx) + self.pos(self.positions(idx.shape[1], idx.device)))

    def positions(self, length: int, device) -> torch.Tensor:
        """The positions of the ``length`` tokens given: 0, 1, ... (a context-parallel rank holds
        others; paralab.strategies.context replaces this)."""
        return torch.arange(length, device=device)


class AttentionCore(nn.Module):
    """softmax(Q K^T / sqrt(d)) V over causal positions, for (batch, heads, seq, head_dim) Q, K, V.

    ``kind="sdpa"``: torch's fused scaled_dot_product_attention, which keeps only its output and one
    log-sum-exp per row for backward. ``kind="math"``: the scores written out, which keeps the s x s
    probabilities of every head, the term that grows with the square of the sequence. A module of its
    own (without parameters) so that selective recomputation can recompute exactly this."""

    def __init__(self, kind: str = "sdpa", dropout: float = 0.0):
        super().__init__()
        self.kind, self.dropout = kind, dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        if self.kind == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        probs = F.dropout(scores.masked_fill(~causal, float("-inf")).softmax(dim=-1), p)
        return probs @ v


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused QKV projection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.core = AttentionCore(cfg.attention, cfg.dropout)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(self.qkv.out_features // 3, dim=-1)
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        return self.proj(self.core(q, k, v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.ffn)
        self.proj = nn.Linear(cfg.ffn, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)). With ``cfg.experts``
    the MLP is a mixture of experts (paralab.models.moe) of MLPs, this rank's share of them under
    expert parallel (``ep``); ``layer`` is the block's index."""

    IS_TRANSFORMER_BLOCK = True  # the unit that full recomputation checkpoints

    def __init__(self, cfg: ModelConfig, layer: int = 0, ep: ExpertGroup | None = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MoELayer(cfg, MLP, layer, ep) if cfg.experts else MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class Head(nn.Module):
    """Final LayerNorm and the language-model head: (batch, seq, hidden) -> logits over the vocabulary."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.lm = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.ln(x))


def part_names(cfg: ModelConfig) -> list[str]:
    """Names of the model's parts in order: embed, blocks.0 .. blocks.L-1, head."""
    return ["embed"] + [f"blocks.{i}" for i in range(cfg.layers)] + ["head"]


def build_part(cfg: ModelConfig, index: int, seed: int, ep: ExpertGroup | None = None) -> nn.Module:
    """Build and initialise part ``index`` (0 = embedding, 1..L = blocks, L+1 = head); a block of a
    mixture of experts holds the experts of ``ep`` (all of them when None), each from its own seed."""
    if index == 0:
        part = Embedding(cfg)
    elif index <= cfg.layers:
        part = Block(cfg, index - 1, ep)
    elif index == cfg.layers + 1:
        part = Head(cfg)
    else:
        raise IndexError(f"part {index} does not exist: the model has {cfg.layers + 2} parts")
    part_seed = seed * 1_000_003 + index
    init_part(part, cfg, torch.Generator().manual_seed(part_seed))
    for j, expert in getattr(getattr(part, "mlp", None), "experts", {}).items():
        init_part(expert, cfg, torch.Generator().manual_seed(expert_seed(part_seed, int(j))))
    return part


@torch.no_grad()
def init_part(part: nn.Module, cfg: ModelConfig, gen: torch.Generator) -> None:
    """GPT-2 initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms, and the residual
    output projections (``*.proj``) scaled by 1/sqrt(2L) so the residual stream does not grow with depth."""
    for name, module in part.named_modules():
        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            std = INIT_STD / math.sqrt(2 * cfg.layers) if name.endswith("proj") else INIT_STD
            module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()


class GPT(nn.Module):
    """The whole model on one device, with parameter names shared by every parallel layout."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, ep: ExpertGroup | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = build_part(cfg, 0, seed)
        self.blocks = nn.ModuleList(build_part(cfg, i + 1, seed, ep) for i in range(cfg.layers))
        self.head = build_part(cfg, cfg.layers + 1, seed)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the batch, computed in fp32 whatever the
    logits' dtype (a 16-bit softmax over the vocabulary loses the small probabilities)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
