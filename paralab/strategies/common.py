"""Pieces every strategy shares: the model on this rank's device, the optimizer, the data, and the
plain training loop that single-device, data-parallel and DDP training all follow.

The loop is written once so that the strategies differ only where the ideas differ: in how gradients
are synchronised (``GradSync``).
"""

from __future__ import annotations

import torch

from paralab.data import DataLoader
from paralab.models.gpt import GPT, lm_loss
from paralab.runtime.context import RankContext


def make_optimizer(cfg, params) -> torch.optim.Optimizer:
    """Adam (fp32 states, as the ZeRO paper's accounting assumes) or plain SGD.

    ``foreach=False`` keeps the per-parameter arithmetic identical whatever the parameters' grouping
    or sharding, so every layout updates parameters exactly as single-device training does."""
    params = list(params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, foreach=False)
    return torch.optim.Adam(params, lr=cfg.lr, foreach=False)


def make_loader(ctx: RankContext) -> DataLoader:
    m = ctx.cfg.model
    return DataLoader(m.vocab, m.seq_len, ctx.cfg.global_batch, ctx.cfg.seed, ctx.device)


def full_model(ctx: RankContext) -> GPT:
    return GPT(ctx.cfg.model, ctx.cfg.seed).to(ctx.device)


def named_state(model: torch.nn.Module) -> dict:
    """Final parameters and gradients under their global names, on the CPU (for parity tests)."""
    return {
        "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
        "grads": {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters() if p.grad is not None},
    }


class GradSync:
    """How a strategy makes gradients agree across data-parallel ranks. The default does nothing
    (single device)."""

    def clear_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Called before each step's forward: forget the last step's gradients."""
        optimizer.zero_grad(set_to_none=True)

    def before_backward(self) -> None:
        """Called before each backward (DDP arms its bucket hooks here)."""

    def after_backward(self) -> None:
        """Called after backward, before the optimizer: gradients must be averaged when it returns."""

    def after_step(self) -> None:
        """Called after the optimizer step (ZeRO gathers the updated parameter shards here)."""


def run_steps(ctx: RankContext, params, loss_of, sync: GradSync, dp_rank: int = 0, dp_size: int = 1) -> list[float]:
    """The training loop every non-pipelined strategy shares: each step, this rank runs forward and
    backward on its slice of the global batch (``loss_of(inputs, targets)``), ``sync`` finishes the
    gradients, and the optimizer steps. Returns this rank's loss per step."""
    cfg, rec, meter = ctx.cfg, ctx.recorder, ctx.memory
    params = list(params)
    optimizer = make_optimizer(cfg, params)
    meter.watch(params, optimizer)
    loader = make_loader(ctx)
    losses = []
    for step in range(cfg.steps):
        with rec.step(step):
            ctx.check_fault(step)
            inputs, targets = loader.rank_batch(step, dp_rank, dp_size)
            sync.clear_grads(optimizer)
            with rec.span("forward"), meter.saving(step):
                loss = loss_of(inputs, targets)
            sync.before_backward()
            with rec.span("backward"):
                loss.backward()
            meter.release(step)
            sync.after_backward()
            with rec.span("optimizer"):
                optimizer.step()
            sync.after_step()
            meter.sample()
        losses.append(loss.item())
    return losses


def train_data_parallel(ctx: RankContext, model: torch.nn.Module, sync: GradSync, dp_rank: int,
                        dp_size: int) -> dict:
    """single, dp and ddp: the whole model on every rank, a slice of the batch each, ``sync`` averages
    the gradients, every rank takes the same optimizer step."""
    losses = run_steps(ctx, model.parameters(), lambda x, y: lm_loss(model(x), y), sync, dp_rank, dp_size)
    state = named_state(model) if ctx.cfg.collect_state and dp_rank == 0 else None
    return ctx.result(losses, loss_weight=1.0 / dp_size, state=state)
