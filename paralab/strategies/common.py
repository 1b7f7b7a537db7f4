"""What every strategy shares: the training loop, the gradient-synchronisation protocol, gradient
buckets, and the model, optimizer and data of a rank.

The loop is written once (:func:`train_loop`), so that the strategies differ only where the ideas
differ: in the forward-backward they run (plain passes over microbatches, or a pipeline schedule)
and in how gradients are synchronised (a :class:`GradSync`). Elastic training runs the same loop.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from contextlib import nullcontext

import torch

from paralab.data import DataLoader
from paralab.models.gpt import GPT, lm_loss
from paralab.models.moe import set_aux_loss_scale
from paralab.precision import LossScaler, MasterWeights, torch_dtype
from paralab.runtime.context import RankContext
from paralab.strategies.recompute import apply_recompute


# ------------------------------------------------------------------------------------ the loop
def train_loop(ctx: RankContext, optimizer: torch.optim.Optimizer, sync: GradSync,
               forward_backward: Callable, batch_of: Callable, first_step: int = 0,
               after_step: Callable | None = None, batch_in_window: bool = True) -> list[float | None]:
    """Train ``ctx.cfg.steps`` steps and return this rank's loss per step (None where it has none).

    Each step, inside its traced window: the fault hook, ``batch_of(step)`` (this rank's batch),
    ``sync.clear_grads``, ``forward_backward(batch)`` (the step's loss on this rank, or None),
    ``sync.after_backward``, the optimizer and ``sync.after_step``. Pipelines make the batch before the
    window opens (``batch_in_window=False``), so that the window, which their bubble is read from,
    holds the schedule alone. ``after_step(step, loss)`` runs after the window (elastic training
    records the step and saves checkpoints there)."""
    rec, meter = ctx.recorder, ctx.memory
    losses: list[float | None] = []
    for step in range(first_step, ctx.cfg.steps):
        batch = None if batch_in_window else batch_of(step)
        with rec.step(step):
            ctx.check_fault(step)
            if batch_in_window:
                batch = batch_of(step)
            sync.clear_grads(optimizer)
            loss = forward_backward(batch)
            sync.after_backward()
            with rec.span("optimizer"):
                optimizer.step()
            sync.after_step()
            meter.sample()
        losses.append(None if loss is None else float(loss))
        if losses[-1] is not None and not math.isfinite(losses[-1]):
            raise FloatingPointError(f"loss became {losses[-1]} at step {step}: training diverged "
                                     f"(try a lower learning rate than {ctx.cfg.lr:g})")
        if after_step is not None:
            after_step(step, losses[-1])
    return losses


def forward_backward(ctx: RankContext, loss_of: Callable, batch: list[tuple[torch.Tensor, torch.Tensor]],
                     microbatch_context: Callable | None = None):
    """Forward and backward over each microbatch of ``batch`` (a list of (inputs, targets)): gradient
    accumulation. The gradients add up in ``.grad``; each loss is divided by the number of
    microbatches, so they are those of the whole batch (and scaled for fp16, see paralab.precision).
    ``microbatch_context(mb, last)`` may wrap each pass (torch's DDP skips its all-reduce with
    ``no_sync`` until the last). Returns the batch's mean loss (a tensor, not synced)."""
    rec, meter = ctx.recorder, ctx.memory
    total = None
    for mb, (inputs, targets) in enumerate(batch):
        if len(batch) > 1:
            rec.set_context(microbatch=mb)
        around = microbatch_context(mb, mb == len(batch) - 1) if microbatch_context else nullcontext()
        with around:
            with rec.span("forward"), meter.saving(mb):
                loss = loss_of(inputs, targets) / len(batch)
            with rec.span("backward"):
                ctx.scaler.scale(loss).backward()
        meter.release(mb)
        total = loss.detach() if total is None else total + loss.detach()
    rec.set_context(microbatch=None)
    return total


# ------------------------------------------------------------------------------------ gradient sync
class GradSync:
    """How a strategy makes gradients agree across ranks. The default does nothing but clear them
    (single device)."""

    def clear_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Before the step's first forward: forget the last step's gradients (DDP also re-arms its
        bucket counters here)."""
        optimizer.zero_grad(set_to_none=True)

    def after_backward(self) -> None:
        """After the step's last backward, before the optimizer: gradients must agree when it returns."""

    def after_step(self) -> None:
        """After the optimizer step (ZeRO gathers the updated parameter shards here)."""


class SyncChain(GradSync):
    """Several synchronisations in order (hybrid: DDP over dp, then sequence-parallel sums over tp).
    Each clears what it owns; a sync that owns no gradients (sequence-parallel sums) clears nothing."""

    def __init__(self, *syncs: GradSync):
        self.syncs = syncs

    def clear_grads(self, optimizer) -> None:
        for sync in self.syncs:
            sync.clear_grads(optimizer)

    def after_backward(self) -> None:
        for sync in self.syncs:
            sync.after_backward()

    def after_step(self) -> None:
        for sync in self.syncs:
            sync.after_step()


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: float) -> list[list[torch.nn.Parameter]]:
    """Group parameters, last layer first (backward order), into buckets of at most ``bucket_bytes``
    (a parameter larger than that gets a bucket of its own)."""
    buckets, current, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def flatten_grads(bucket: list[torch.nn.Parameter]) -> torch.Tensor:
    """One contiguous copy of a bucket's gradients (a parameter with none, whose rank saw no data
    or whose branch was unused this step, contributes zeros), ready for one collective."""
    for p in bucket:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return torch.cat([p.grad.reshape(-1) for p in bucket])


def unflatten_grads(bucket: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a reduced flat buffer back into the bucket's gradients, in :func:`flatten_grads` order."""
    offset = 0
    for p in bucket:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


# ------------------------------------------------------------------------------------ a rank's pieces
def make_optimizer(cfg, params, ctx: RankContext | None = None):
    """Adam (fp32 states, as the ZeRO paper's accounting assumes) or plain SGD; over fp32 master
    weights when the parameters are 16-bit (paralab.precision.MasterWeights, using the rank's loss
    scaler and recorder). Parameters kept in fp32 while the run computes in bf16 (torch_fsdp's
    shards, which FSDP2 casts as it gathers them) are their own master weights: a copy would only
    cost 4 bytes a parameter.

    ``foreach=False`` keeps the per-parameter arithmetic identical whatever the parameters' grouping
    or sharding, so every layout updates parameters exactly as single-device training does."""

    def plain(params):
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=cfg.lr, foreach=False)
        return torch.optim.Adam(params, lr=cfg.lr, foreach=False)

    params = list(params)
    if cfg.dtype == "fp32" or (cfg.dtype == "bf16" and all(p.dtype == torch.float32 for p in params)):
        return plain(params)
    scaler = ctx.scaler if ctx is not None else LossScaler(cfg.dtype, cfg.initial_loss_scale)
    return MasterWeights(params, plain, scaler, ctx.recorder if ctx is not None else None)


def prepare(ctx: RankContext, module: torch.nn.Module) -> torch.nn.Module:
    """A model (or stage) as the run trains it: on the rank's device, in the run's dtype, with
    activation recomputation installed (paralab.strategies.recompute)."""
    module = module.to(ctx.device, torch_dtype(ctx.cfg.dtype))
    apply_recompute(module, ctx.cfg.recompute, ctx.recorder, ctx.memory)
    return module


def make_loader(ctx: RankContext) -> DataLoader:
    m = ctx.cfg.model
    return DataLoader(m.vocab, m.seq_len, ctx.cfg.global_batch, ctx.cfg.seed, ctx.device)


def replica_batches(loader: DataLoader, step: int, microbatches: int, dp_rank: int = 0, dp_size: int = 1):
    """This data-parallel replica's slice of the step's global batch, cut into ``microbatches``
    (inputs, targets) pairs."""
    inputs, targets = loader.rank_batch(step, dp_rank, dp_size)
    return list(zip(inputs.chunk(microbatches), targets.chunk(microbatches)))


def full_model(ctx: RankContext) -> GPT:
    return prepare(ctx, GPT(ctx.cfg.model, ctx.cfg.seed))


def named_state(model: torch.nn.Module) -> dict:
    """Final parameters and gradients under their global names, on the CPU (for parity tests)."""
    return {
        "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
        "grads": {n: p.grad.detach().cpu().clone()
                  for n, p in model.named_parameters() if p.grad is not None},
    }


def params_digest(params) -> str:
    """The bytes of ``params`` in order, hashed: equal on two ranks exactly when they hold the same
    weights bit for bit (data-parallel replicas must, after every step)."""
    digest = hashlib.sha256()
    for p in params:
        local = p.detach()
        local = local.to_local() if hasattr(local, "to_local") else local  # a DTensor: this rank's shard
        digest.update(local.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def train_model(ctx: RankContext, model: torch.nn.Module, sync: GradSync, loss_of: Callable | None = None,
                params=None, state_of: Callable | None = None,
                microbatch_context: Callable | None = None) -> dict:
    """Every strategy without a pipeline: each data-parallel replica (one rank, or a tensor-parallel
    group) runs forward and backward on its slice of the batch, ``sync`` makes the gradients agree
    and every rank takes the optimizer step. ``loss_of(inputs, targets)`` defaults to the model's
    cross-entropy, ``params`` (what the optimizer updates) to the model's parameters, ``state_of()``
    (final parameters and gradients for parity tests) to the model's named state on the first replica.
    Tensor-parallel ranks all compute the replica's loss; tp rank 0 reports it. Context-parallel ranks
    each compute the loss of their slice of the sequence and report it, weighted 1/(dp x cp)."""
    layout = ctx.layout
    coord = layout.coord(ctx.rank)
    set_aux_loss_scale([model], 1.0 / layout.microbatches, ctx.scaler)
    params = list(model.parameters() if params is None else params)
    loss_of = loss_of or (lambda x, y: lm_loss(model(x), y))
    optimizer = make_optimizer(ctx.cfg, params, ctx)
    ctx.memory.watch(params, optimizer)
    loader = make_loader(ctx)
    losses = train_loop(ctx, optimizer, sync,
                        lambda batch: forward_backward(ctx, loss_of, batch, microbatch_context),
                        lambda step: replica_batches(loader, step, layout.microbatches,
                                                     coord["dp"], layout.dp))
    state = None
    if ctx.cfg.collect_state:
        state = state_of() if state_of is not None else named_state(model) if coord["dp"] == 0 else None
    weight = 1.0 / (layout.dp * layout.cp)
    digest = params_digest(params) if ctx.cfg.collect_state else None
    return ctx.result(losses if coord["tp"] == 0 else None, loss_weight=weight, state=state,
                      params_digest=digest)
