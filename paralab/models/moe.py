"""Mixture of experts (混合专家): a router sends each token to k of E feed-forward experts.

A mixture-of-experts block keeps the GPT block's attention and replaces its one MLP by E of them
(the experts) and a router, a linear map from the hidden state to E logits. Each token goes to the
k experts with the highest router probability and comes back as their outputs weighted by its gates:
the probability itself when k = 1 (Switch, Fedus et al. 2021), the k probabilities renormalised to
sum to one when k > 1 (GShard, Lepikhin et al. 2020). Parameters grow with E; the FLOPs per token
only with k.

Capacity. With ``capacity_factor`` c an expert takes at most ``ceil(c x s x k / E)`` tokens from a
group of s tokens; the rest of its assignments are *dropped* (the token keeps only its residual path
for that choice). Assignments queue by choice first (every token's first choice before any second
choice, as GShard does), then by position. paralab's group is one sequence, so which tokens are
dropped does not depend on how the batch is split over ranks or microbatches: every layout drops
exactly the tokens single-device training drops. Without a capacity (``None``) the layer is dropless.

Losses. The load-balancing loss of Switch / GShard, per group (sequence):
``aux = E x sum_e f_e P_e`` with f_e the share of the group's k x s assignments that chose expert e
(before the capacity cut) and P_e the mean router probability of e: 1 under a uniform routing, E when
every token goes to one expert; the mean over groups, times ``aux_loss``. The router z-loss of ST-MoE
(Zoph et al. 2022) is the mean over tokens of logsumexp(logits)^2, times ``z_loss``. Neither is added
to the reported loss: each reaches the router through the layer's output in backward, scaled as the
training loss is (:func:`set_aux_loss_scale`: 1 / microbatches, times fp16's loss scale), so every
strategy, pipelines included, trains on ``loss + aux`` without carrying it through its schedule.

Expert parallel. Given an :class:`ExpertGroup`, the layer holds only its own E / ep experts. Tokens
are sorted by expert, the per-rank counts exchanged, and the tokens sent to the rank that holds
their expert by an all-to-all (*dispatch*); the experts run; a second all-to-all brings the outputs
back (*combine*); backward runs both the other way. Every expert runs even on no tokens, so every
expert parameter gets a gradient each step (data-parallel bucket hooks count on it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from paralab import comm
from paralab.config import ModelConfig
from paralab.moe_load import counter_name
from paralab.runtime import recorder as _recorder


@dataclass(frozen=True)
class ExpertGroup:
    """The ranks one layer's experts are spread over: ``size`` ranks, this one at ``rank`` holding
    experts ``rank x E/size`` .. ``(rank + 1) x E/size - 1``; ``group``: their process group."""

    group: object
    rank: int
    size: int

    def local_experts(self, experts: int) -> range:
        per_rank = experts // self.size
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)


@dataclass
class Routing:
    """What the router decided for T tokens: ``probs`` (T, E), for each token its ``experts`` (T, k)
    and ``gates`` (T, k), and which of those assignments are ``kept`` within capacity (T, k)."""

    probs: torch.Tensor
    experts: torch.Tensor
    gates: torch.Tensor
    kept: torch.Tensor


def capacity(seq_len: int, top_k: int, experts: int, factor: float | None) -> int | None:
    """Tokens an expert takes from one sequence (None: no limit, dropless)."""
    return None if factor is None else math.ceil(factor * seq_len * top_k / experts)


def route(logits: torch.Tensor, top_k: int, seq_len: int, capacity_factor: float | None) -> Routing:
    """Top-k routing of ``logits`` (T, E) for T tokens in sequences of ``seq_len``, and the capacity cut."""
    num_experts = logits.shape[-1]
    probs = logits.float().softmax(dim=-1)
    top_p, top_e = probs.topk(top_k, dim=-1)
    gates = top_p if top_k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    limit = capacity(seq_len, top_k, num_experts, capacity_factor)
    if limit is None:
        kept = torch.ones_like(top_e, dtype=torch.bool)
    else:
        # each sequence's assignments in queue order (choice, then position) and their place in the queue
        queue = top_e.view(-1, seq_len, top_k).transpose(1, 2).reshape(-1, top_k * seq_len)
        one_hot = nn.functional.one_hot(queue, num_experts)
        place = (one_hot.cumsum(dim=1) * one_hot).sum(dim=-1) - 1
        kept = (place < limit).view(-1, top_k, seq_len).transpose(1, 2).reshape(-1, top_k)
    return Routing(probs, top_e, gates, kept)


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Switch / GShard auxiliary loss, E x sum_e f_e P_e per sequence, averaged over sequences."""
    num_experts, top_k = probs.shape[-1], experts.shape[-1]
    chosen = nn.functional.one_hot(experts, num_experts).sum(dim=1).view(-1, seq_len, num_experts)
    share = chosen.float().sum(dim=1) / (seq_len * top_k)  # f_e per sequence (not differentiable)
    mean_prob = probs.view(-1, seq_len, num_experts).mean(dim=1)  # P_e per sequence
    return (num_experts * (share * mean_prob).sum(dim=-1)).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss: mean over tokens of logsumexp(logits)^2 (keeps router logits small)."""
    return logits.float().logsumexp(dim=-1).square().mean()


class _WithAuxLoss(torch.autograd.Function):
    """The identity on ``x``; in backward it also hands ``aux`` the gradient ``scale``, as if ``aux``
    had been added to a training loss that is itself scaled by ``scale``."""

    @staticmethod
    def forward(ctx, x, aux, scale):
        ctx.scale, ctx.aux_shape = scale, aux.shape
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, grad.new_full(ctx.aux_shape, ctx.scale, dtype=torch.float32), None


class _AllToAll(torch.autograd.Function):
    """Rows of ``x`` to every rank of ``group`` (``send[r]`` rows to rank r, ``recv[r]`` rows from
    it), through paralab.comm so the trace shows it; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, send, recv, group, name):
        ctx.send, ctx.recv, ctx.group, ctx.name = send, recv, group, name
        out = x.new_empty((sum(recv), x.shape[1]))
        comm.all_to_all(out, x.contiguous(), recv, send, group=group, name=name)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), grad.shape[1]))
        comm.all_to_all(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group,
                        name=f"{ctx.name} backward")
        return out, None, None, None, None


def all_to_all_rows(x: torch.Tensor, send: list[int], recv: list[int], group, name: str) -> torch.Tensor:
    """Differentiable all-to-all of the rows of ``x`` (see :class:`_AllToAll`)."""
    return _AllToAll.apply(x, send, recv, group, name)


class MoELayer(nn.Module):
    """The experts, their router and, optionally, a shared expert, in place of a block's MLP.

    ``make_ffn(cfg)`` builds one expert (paralab's GPT passes its MLP); ``layer`` names the layer in
    the trace's counters; ``ep`` spreads the experts over an expert-parallel group (None: all here).
    Expert j is ``experts[str(j)]`` whatever rank holds it, so parameters keep global names."""

    def __init__(self, cfg: ModelConfig, make_ffn: Callable[[ModelConfig], nn.Module], layer: int = 0,
                 ep: ExpertGroup | None = None):
        super().__init__()
        self.num_experts, self.top_k = cfg.experts, cfg.top_k
        self.capacity_factor, self.aux_coef, self.z_coef = cfg.capacity_factor, cfg.aux_loss, cfg.z_loss
        self.layer, self.ep = layer, ep
        self.aux_loss_scale = 1.0  # what the training loss is multiplied by (1 / microbatches)
        self.loss_scaler = None  # fp16: the run's LossScaler, whose value multiplies the loss too
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.shared = make_ffn(cfg) if cfg.shared_expert else None
        local = ep.local_experts(cfg.experts) if ep is not None else range(cfg.experts)
        self.experts = nn.ModuleDict({str(j): make_ffn(cfg) for j in local})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.router(tokens)
        seq_len = shape[-2]
        routing = route(logits, self.top_k, seq_len, self.capacity_factor)
        # the kept assignments, sorted by expert (stable: token order within an expert)
        expert_of = routing.experts[routing.kept]
        # each assignment's slot, token x k + choice: where its weighted output is combined
        slot_of = torch.arange(routing.experts.numel(), device=x.device).view_as(routing.experts)
        order = torch.argsort(expert_of, stable=True)
        slot_of, gate_of = slot_of[routing.kept][order], routing.gates[routing.kept][order]
        token_of = slot_of // self.top_k
        counts = torch.bincount(expert_of, minlength=self.num_experts)
        rows, received = self._run_experts(tokens[token_of], counts)
        out = combine(rows * gate_of.unsqueeze(1).to(rows.dtype), slot_of, tokens.shape[0], self.top_k)
        if self.shared is not None:
            out = out + self.shared(tokens)
        aux = self.aux_coef * load_balancing_loss(routing.probs, routing.experts, seq_len)
        if self.z_coef:
            aux = aux + self.z_coef * router_z_loss(logits)
        self._record(counts, int((~routing.kept).sum()), received, aux)
        # read in forward: the scaler changes only between steps, after this microbatch's backward
        scale = self.aux_loss_scale * (self.loss_scaler.value if self.loss_scaler is not None else 1.0)
        return _WithAuxLoss.apply(out, aux, scale).view(shape)

    def _run_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Each row through its expert, ``rows`` sorted by expert (``counts`` per expert); returns the
        outputs in the same order and how many rows this rank's experts computed."""
        if self.ep is None or self.ep.size == 1:
            return self._local(rows, counts.tolist()), rows.shape[0]
        group, size = self.ep.group, self.ep.size
        send_counts = counts.view(size, -1)  # [destination rank, its local expert]
        recv_counts = torch.empty_like(send_counts)  # [source rank, my local expert]
        comm.all_to_all(recv_counts, send_counts, group=group, name="token counts")
        send, recv = send_counts.sum(dim=1).tolist(), recv_counts.sum(dim=1).tolist()
        arrived = all_to_all_rows(rows, send, recv, group, "dispatch")  # by source rank, then expert
        by_expert = _expert_major(recv_counts)
        done = self._local(arrived[by_expert], recv_counts.sum(dim=0).tolist())
        back = torch.empty_like(by_expert)
        back[by_expert] = torch.arange(len(by_expert), device=by_expert.device)
        return all_to_all_rows(done[back], recv, send, group, "combine"), len(by_expert)

    def _local(self, rows: torch.Tensor, per_expert: list[int]) -> torch.Tensor:
        """This rank's experts on their rows (``per_expert`` consecutive rows each, in expert order);
        an expert with no rows still runs, so its parameters get a (zero) gradient."""
        chunks = rows.split(per_expert)
        return torch.cat([expert(chunk) for expert, chunk in zip(self.experts.values(), chunks)])

    def _record(self, counts: torch.Tensor, dropped: int, received: int, aux: torch.Tensor) -> None:
        rec = _recorder.active()
        if rec is None:
            return
        for e, n in enumerate(counts.tolist()):
            rec.counter(counter_name(self.layer, "routed", e), n)
        rec.counter(counter_name(self.layer, "dropped"), dropped)
        rec.counter(counter_name(self.layer, "received"), received)
        rec.counter(counter_name(self.layer, "aux"), float(aux.detach()))


def combine(weighted: torch.Tensor, slot_of: torch.Tensor, tokens: int, top_k: int) -> torch.Tensor:
    """Each token's weighted expert outputs summed: the rows placed in their slots (token x k + choice)
    of a buffer of k per token, a dropped assignment's slot left zero, and summed over k. One
    ``index_add`` over the tokens would do it, but its backward keeps the rows it added (k copies of
    every token, hidden wide) until the layer's backward; placing them keeps only their slots."""
    placed = weighted.new_zeros(tokens * top_k, weighted.shape[1]).index_put((slot_of,), weighted)
    return placed.view(tokens, top_k, -1).sum(dim=1)


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Indices that reorder rows grouped (source rank, expert) — ``counts[src, e]`` rows each, source
    major — into expert-major order (every source's rows for expert 0, then expert 1, ...)."""
    starts = (counts.flatten().cumsum(0) - counts.flatten()).view_as(counts).tolist()
    sizes = counts.tolist()
    pieces = [torch.arange(starts[s][e], starts[s][e] + sizes[s][e])
              for e in range(counts.shape[1]) for s in range(counts.shape[0])]
    return torch.cat(pieces).to(counts.device)


def set_aux_loss_scale(modules, scale: float, scaler=None) -> None:
    """Scale every MoE layer's auxiliary-loss gradient as the training loss is scaled: ``scale`` (1 / m
    when a step's loss is the sum of m microbatch losses, each divided by m) times the fp16 loss
    scale of ``scaler`` (paralab.precision.LossScaler), which the master weights divide every
    gradient by."""
    for module in modules:
        for layer in module.modules():
            if isinstance(layer, MoELayer):
                layer.aux_loss_scale, layer.loss_scaler = scale, scaler


def expert_seed(part_seed: int, expert: int) -> int:
    """The seed expert ``expert`` of a part is initialised from, so that any rank holding it, whatever
    the expert-parallel split, builds the same weights."""
    return part_seed * 65_537 + 1 + expert
