"""Expert parallel (专家并行): a mixture of experts whose experts are spread over data-parallel ranks.

Every rank is a data-parallel replica: it trains on its slice of the batch and holds the attention,
norms, embeddings and routers whole. The experts are not replicated: the ranks are cut into expert
groups of ``ep`` neighbours (paralab.layout says where), each rank of a group holding E / ep of every
layer's experts. In each mixture-of-experts layer a token is sent by an all-to-all to the rank that
holds its expert and its output comes back by a second one (paralab.models.moe: dispatch and
combine, with the counts exchanged first, since every rank routes a different number of tokens to
each expert). Memory for the experts falls by ep; the price is two all-to-alls per layer in the
forward and two in the backward, and a rank whose experts are popular makes its group wait.

Gradients are reduced in two parts, as DeepSpeed-MoE and Megatron do:
- the replicated parameters over every dp rank, DDP's buckets averaged over dp (ddp.py);
- each expert over the ranks that hold it, one per expert group (the expert-data-parallel group),
  also divided by dp, not by that group's size: the backward all-to-all has already summed, into the
  expert's gradient, the contributions of every token its expert group sent it.

The run's loss is the language-model loss; the load-balancing loss reaches the routers through
backward (see paralab.models.moe).
"""

from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn

from paralab.config import ConfigError, RunConfig
from paralab.models.gpt import GPT
from paralab.models.moe import ExpertGroup, MoELayer
from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, SyncChain, named_state, prepare, train_model
from paralab.strategies.ddp import BucketedReducer
from paralab.strategies.registry import Strategy


def check(cfg: RunConfig, layout) -> None:
    if not cfg.model.experts:
        raise ConfigError(f"strategy ep shards the experts of a mixture-of-experts model, but model "
                          f"{cfg.model_name!r} is dense (experts=0); use 'tiny-moe' or a model with experts")


def expert_process_groups(layout, rank: int) -> tuple[ExpertGroup, object]:
    """This rank's expert group (as the MoE layers take it) and its expert-data-parallel process
    group. Every rank creates every group, in the same order, as torch.distributed requires."""
    mine, data_group = None, None
    for ranks in layout.expert_groups():
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = ExpertGroup(group, ranks.index(rank), len(ranks))
    for ranks in layout.expert_data_groups():
        group = dist.new_group(ranks)
        if rank in ranks:
            data_group = group
    return mine, data_group


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of every expert of every MoE layer in ``module`` (not routers, not shared experts)."""
    return [p for layer in module.modules() if isinstance(layer, MoELayer)
            for p in layer.experts.parameters()]


class DivideGrads(GradSync):
    """Divide some gradients by ``n`` after backward (experts that no other rank holds: nothing to
    reduce, but the gradient is still a sum over the expert group's tokens). Clears nothing."""

    def __init__(self, params: list[nn.Parameter], n: int):
        self.params, self.n = params, n

    def clear_grads(self, optimizer) -> None:
        pass

    def after_backward(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(self.n)


def parallelize_experts(ctx, module: nn.Module, dp_group, expert_data_group) -> GradSync:
    """The gradient sync of a model whose experts are expert-parallel: DDP buckets for the replicated
    parameters over ``dp_group`` and for the experts over ``expert_data_group``, both averaged over
    dp (see the module docstring). ``nn.ParameterList`` views hand each reducer its parameters."""
    layout, cfg, reduce_dtype = ctx.layout, ctx.cfg, torch_dtype(ctx.cfg.reduce_dtype)
    experts = expert_parameters(module)
    ids = {id(p) for p in experts}
    replicated = [p for p in module.parameters() if id(p) not in ids]
    dense = BucketedReducer(nn.ParameterList(replicated), layout.dp, cfg.bucket_mb, dp_group,
                            layout.microbatches, memory=ctx.memory, reduce_dtype=reduce_dtype)
    if layout.dp // layout.ep == 1:
        return SyncChain(dense, DivideGrads(experts, layout.dp))
    expert_sync = BucketedReducer(nn.ParameterList(experts), layout.dp, cfg.bucket_mb, expert_data_group,
                                  layout.microbatches, memory=ctx.memory, reduce_dtype=reduce_dtype)
    return SyncChain(dense, expert_sync)


def train(ctx) -> dict:
    layout = ctx.layout
    ep, expert_data_group = expert_process_groups(layout, ctx.rank)
    model = prepare(ctx, GPT(ctx.cfg.model, ctx.cfg.seed, ep=ep))
    sync = parallelize_experts(ctx, model, None, expert_data_group)
    # the first expert group holds every expert once: between them its ranks vouch for every parameter
    holds_every_expert_once = ctx.rank < layout.ep
    return train_model(ctx, model, sync,
                       state_of=lambda: named_state(model) if holds_every_expert_once else None)


STRATEGIES = [Strategy("ep", "experts of a mixture of experts over `--ep N` data-parallel ranks, tokens by "
                       "all-to-all", axes=("dp",),
                       options=("ep", "microbatches", "bucket_mb", "reduce_dtype"),
                       check=check, train=train, title="expert parallel (专家并行)")]
