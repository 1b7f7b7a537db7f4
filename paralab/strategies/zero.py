"""ZeRO: data parallel (数据并行) without every rank holding a copy of every model state.

Rajbhandari et al. (2020) observe that plain data parallelism keeps the *model states* (parameters,
gradients, optimizer states) replicated on all Nd ranks, although each rank only needs its share of
them at any moment. With fp32 Adam a model of P parameters holds 4P bytes of parameters, 4P of
gradients and 8P of optimizer states (momentum and variance) per rank. ZeRO partitions them in three
stages, each a strategy here:

=========  ===========  ============================================  ===============================
strategy   paper        bytes per rank (fp32 Adam)                    communication per step
=========  ===========  ============================================  ===============================
zero1      P_os         4P + 4P + 8P/Nd                               reduce-scatter grads, all-gather
                                                                      params: 2P (as DDP's all-reduce)
zero2      P_os+g       4P + (4P + 8P)/Nd                             the same 2P
zero3      P_os+g+p     (4P + 4P + 8P)/Nd = 16P/Nd                    all-gather params in forward and
                                                                      again in backward, reduce-scatter
                                                                      grads: 3P, 1.5x DDP
=========  ===========  ============================================  ===============================

"P of communication" means P parameter elements x 4 bytes x (Nd-1)/Nd on the wire from each rank,
the ring accounting of paralab.comm: an all-reduce is a reduce-scatter plus an all-gather, which is
why stages 1 and 2 cost exactly what DDP does. (Counts are padded: each unit is rounded up to a
multiple of Nd elements, see zero_shards.py.)

How each stage runs, per step, on every rank:

- **zero1**: backward accumulates the full local gradient into one flat buffer (the paper keeps
  full gradients in stage 1); one reduce-scatter leaves the averaged gradient of this rank's shard;
  Adam updates the shard with the shard's optimizer state; one all-gather rebuilds the parameters.
- **zero2**: each gradient, as backward produces it (post-accumulate-grad hooks), is moved into
  its bucket's flat buffer (DDP's buckets, ddp.py); a complete bucket is reduce-scattered
  asynchronously, overlapping the rest of backward, and then dropped: only the shard's gradient stays.
- **zero3**: only the shards stay. A forward pre-hook all-gathers each part (embed, each block, the
  head) just before it runs and a forward hook frees it; a hook on the part's output gathers it again
  when backward reaches it; when the part's last gradient has arrived its gradients are
  reduce-scattered and its parameters freed again. Each gather waits: the part cannot compute before
  its parameters arrive. With ``zero_prefetch`` (``--zero-prefetch``) the hook that needs part k also
  starts the gather of the part that runs next (k + 1 in forward, k - 1 in backward) before it waits
  for k's, so that gather travels while part k computes, as FSDP's and DeepSpeed's prefetch do; the
  price is a second gathered part held at once.

Memory is measured, not computed: the rank's meter counts the distinct storages ZeRO says it holds
(``Zero.held``), by kind, so the summary's ``memory_by_kind`` and the trace's ``memory.*`` counters
include the transient ones (a gathered part, a bucket's gradients) and the rank result's
``memory["final"]`` shows what stays resident between steps, the quantity the table above gives.

Adam runs over nn.Parameter views of the rank's shards (foreach=False), so every element goes
through the same arithmetic as in single-device training; the tests hold the losses and final
parameters to single-device training within 1e-5, and zero3's losses to torch's FSDP2.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paralab import comm
from paralab.config import ZERO_REDUCE_SCATTERS_IN_FLIGHT, ConfigError
from paralab.models.gpt import part_names
from paralab.precision import torch_dtype
from paralab.strategies.common import GradSync, full_model, make_buckets, train_model
from paralab.strategies.registry import Strategy
from paralab.strategies.zero_shards import ShardedModel

STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


def unit_groups(model: torch.nn.Module, cfg, stage: int) -> list[tuple[str, list[str]]]:
    """How parameters are grouped into flat units: the whole model (stage 1: one flat buffer, one
    reduce-scatter), DDP's gradient buckets (stage 2: reduced as backward produces them), the model's
    parts (stage 3: gathered just before each part runs)."""
    named = list(model.named_parameters())
    if stage == 1:
        return [("model", [n for n, _ in named])]
    if stage == 3:
        return [(part, [n for n, _ in named if n.startswith(part + ".")]) for part in part_names(cfg.model)]
    name_of = {id(p): n for n, p in named}
    buckets = make_buckets([p for _, p in named], cfg.bucket_mb * 2**20)  # backward order
    return [(f"bucket {i}", [name_of[id(p)] for p in reversed(b)])
            for i, b in reversed(list(enumerate(buckets)))]


class Zero(GradSync):
    """One ZeRO stage on one rank: where gradients go in backward, how they are reduced, how
    parameters come back. ``held()`` lists every tensor it keeps, for the memory meter.

    ``group``: the data-parallel ranks that shard the states (default: all). ``passes``: backward
    passes per step (microbatches). ``accumulations``: how many of them stages 2 and 3 sum in a
    unit's buffer before each reduce-scatter. The zero strategies reduce every microbatch's gradients
    as the paper does (1: stage 2 then moves (m + 1) P per step, stage 3 3mP); hybrid sums them all
    first (m: one reduce-scatter per step, the full-size buffer kept meanwhile). Gradients are
    reduced in ``ctx.cfg.reduce_dtype``; with 16-bit parameters the reduced fp32 shard gradient is
    the master weights' ``main_grad`` (paralab.precision)."""

    def __init__(self, ctx, model: torch.nn.Module, stage: int, group=None, passes: int = 1,
                 accumulations: int = 1, prefetch: bool = False):
        self.stage, self.group, self.passes, self.accumulations = stage, group, passes, accumulations
        self.prefetch = prefetch
        self.reduce_dtype = torch_dtype(ctx.cfg.reduce_dtype)
        rank, self.world = ctx.rank, ctx.world_size
        if group is not None:
            rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.sharded = ShardedModel(model, unit_groups(model, ctx.cfg, stage), rank, self.world,
                                    resident_full=stage < 3, group=group)
        self.units = self.sharded.units
        self.meter = ctx.memory
        self.meter.count_held(self.held)
        self.pending: list[tuple[comm.TracedWork, torch.Tensor, torch.Tensor, object]] = []  # in flight
        self.gathering: dict[str, comm.TracedWork] = {}  # stage 3: parts whose gather is in flight
        self.buffers: dict[str, torch.Tensor] = {}  # units whose gradients are arriving
        self.offsets = {id(p): p.storage_offset() - u.full.storage_offset() for u in self.units
                        for p in u.params}
        self.index = {u.name: i for i, u in enumerate(self.units)}  # stage 3: the parts in forward order
        self.arrived = dict.fromkeys((u.name for u in self.units), 0)
        self.reduced = dict.fromkeys((u.name for u in self.units), 0)
        # The optimizer steps with gradients as wide as the parameters and the reduction, whichever is
        # wider: 16-bit parameters reduced in fp32 keep them beside the shard (the master weights'
        # main_grad); fp32 parameters reduced in 16 bits (to halve the bytes) get them back in fp32.
        self.grad_dtype = torch.promote_types(self.sharded.flat.dtype, self.reduce_dtype)
        self.mixed = self.grad_dtype != self.sharded.flat.dtype
        if stage == 1:
            self._bind_full_gradients()
        else:
            self._bind_shard_gradients()
            for u in self.units:
                for p in u.params:
                    p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u, p))
        if stage == 3:
            for u in self.units:
                part = model.get_submodule(u.name)
                part.register_forward_pre_hook(lambda _m, _args, u=u: self._gather(u, "forward"))
                part.register_forward_hook(lambda _m, _args, out, u=u: self._after_forward(u, out))

    # ------------------------------------------------------------------ gradient buffers
    def _bind_full_gradients(self) -> None:
        """Stage 1: every gradient is a view of one flat buffer laid out like the parameters, so
        autograd accumulates straight into it and the shard's gradient is its slice of it."""
        self.grad_flat = torch.zeros_like(self.sharded.flat)
        for u in self.units:
            for t in (*u.params, u.shard):
                t.grad = self.grad_flat.as_strided(t.shape, t.stride(), t.storage_offset())

    def _bind_shard_gradients(self) -> None:
        """Stages 2 and 3: only the shards' gradients are kept, in one flat buffer (``grad_dtype``)."""
        self.grad_shards = torch.zeros(sum(u.shard.numel() for u in self.units),
                                       device=self.sharded.flat.device, dtype=self.grad_dtype)
        offset = 0
        for u in self.units:
            self._bind_shard_grad(u, self.grad_shards[offset : offset + u.shard.numel()])
            offset += u.shard.numel()

    def _bind_shard_grad(self, u, grad: torch.Tensor) -> None:
        """The gradient the optimizer steps the shard with: ``.grad``, or the master weights'
        ``main_grad`` when it is wider than the 16-bit shard."""
        if self.mixed:
            u.shard.main_grad = grad
        else:
            u.shard.grad = grad

    def shard_grad(self, u) -> torch.Tensor:
        return u.shard.main_grad if self.mixed else u.shard.grad

    def held(self) -> dict:
        grads = ([p.grad for u in self.units for p in (*u.params, u.shard)] + list(self.buffers.values())
                 + [t for _, flat, out, _ in self.pending for t in (flat, out)])
        if self.mixed:
            grads += [getattr(u.shard, "main_grad", None) for u in self.units]
        return {"params": [self.sharded.flat] + [u.full for u in self.units], "grads": grads}

    # ------------------------------------------------------------------ the step
    def clear_grads(self, optimizer=None) -> None:
        """Zero the flat gradient buffers in place: the shards' gradients are views into them."""
        if self.stage == 1:
            self.grad_flat.zero_()
        else:
            self.grad_shards.zero_()  # every microbatch's reduced gradient is added into it
        self.arrived = dict.fromkeys(self.arrived, 0)
        self.reduced = dict.fromkeys(self.reduced, 0)

    def _grad_ready(self, u, p) -> None:
        """Stages 2 and 3: add the gradient that just arrived into the unit's flat buffer (made at the
        unit's first gradient) and drop it, so a unit's gradients are held once, not twice."""
        if u.name not in self.buffers:
            self.buffers[u.name] = torch.zeros(u.padded, device=p.device, dtype=self.reduce_dtype)
        offset = self.offsets[id(p)]
        self.buffers[u.name][offset : offset + p.numel()].add_(p.grad.reshape(-1))
        self.meter.sample()  # the high-water mark: this gradient and the unit's buffer
        p.grad = None
        self.arrived[u.name] += 1
        if self.arrived[u.name] == len(u.params) * self.accumulations:
            self.arrived[u.name] = 0
            self._reduce_scatter(u)

    def _reduce_scatter(self, u) -> None:
        """The unit's gradients are complete: pre-divide by Nd and start the reduce-scatter of this
        rank's slice, which is added into its shard gradient when it lands (zero3 also frees the
        part's parameters). At most ZERO_REDUCE_SCATTERS_IN_FLIGHT buffers wait on the wire, so full
        gradients never pile up to the whole model."""
        while len(self.pending) >= ZERO_REDUCE_SCATTERS_IN_FLIGHT:
            self._land(*self.pending.pop(0))
        flat = self.buffers.pop(u.name).div_(self.world)
        out = torch.empty(u.shard.numel(), device=flat.device, dtype=flat.dtype)
        work = comm.reduce_scatter(out, flat, group=self.group, async_op=True, name=f"grads {u.name}")
        self.pending.append((work, flat, out, u))
        self.reduced[u.name] += 1
        if self.stage == 3:
            self.sharded.free(u)

    def _land(self, work, flat, out, u) -> None:
        work.wait()
        self.shard_grad(u).add_(out)

    def after_backward(self) -> None:
        """After the step's last backward: every rank's shard gradient is the average over the global
        batch."""
        if self.stage == 1:
            u = self.units[0]
            flat = self.grad_flat.to(self.reduce_dtype).div_(self.world)  # a copy unless the dtypes agree
            reduced = torch.empty(u.shard.numel(), device=flat.device, dtype=flat.dtype)
            comm.reduce_scatter(reduced, flat, group=self.group, name="grads")
            if self.mixed:
                u.shard.main_grad = reduced.to(self.grad_dtype)
            else:
                u.shard.grad.copy_(reduced)
            return
        expected = self.passes // self.accumulations
        missing = [u.name for u in self.units if self.reduced[u.name] != expected]
        if missing:
            raise RuntimeError(f"{missing} got no gradient for every parameter this step; "
                               "ZeRO here expects all")
        for pending in self.pending:
            self._land(*pending)
        self.pending.clear()
        for name in list(self.gathering):  # a prefetch nobody used (none in a plain step): land it, free it
            self.gathering.pop(name).wait()
            self.sharded.free(self.units[self.index[name]])

    def after_step(self) -> None:
        """Stages 1 and 2: after the update, all-gather the shards back into the full parameters.
        (In place: the shard is this rank's slice of the buffer it gathers into.) Stage 3 gathers
        each part when it is next used instead."""
        if self.stage == 3:
            return
        for u in self.units:
            comm.all_gather(u.full, u.shard.detach(), group=self.group, name=f"params {u.name}")

    # ------------------------------------------------------------------ stage 3 hooks
    def _gather(self, u, phase: str) -> None:
        """Make part ``u``'s full parameters ready: with prefetch, first start the gather of the part
        that runs after it in this pass, then wait for ``u``'s (started earlier by its neighbour's
        hook, or now). Backward's saved tensors alias the part's buffer, so its version counter is
        kept: the gather restores the values autograd saved."""
        self._start_gather(u, phase)
        if self.prefetch:
            following = self.index[u.name] + (1 if phase == "forward" else -1)
            if 0 <= following < len(self.units):
                self._start_gather(self.units[following], phase)
        self.gathering.pop(u.name).wait()
        self.meter.sample()

    def _start_gather(self, u, phase: str) -> None:
        """Launch the all-gather that refills the part's freed buffer, unless it is already in flight."""
        if u.name in self.gathering:
            return
        self.sharded.allocate(u)
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(u.full):
            self.gathering[u.name] = comm.all_gather(u.full, u.shard.detach(), group=self.group,
                                                     async_op=True, name=f"{phase} gather {u.name}")

    def _after_forward(self, u, out: torch.Tensor) -> None:
        self.sharded.free(u)
        if out.requires_grad:
            out.register_hook(lambda _grad: self._gather(u, "backward"))

    def describe(self) -> dict:
        return {
            "stage": self.stage,
            "units": [u.name for u in self.units],
            "param_count": sum(u.numel for u in self.units),
            "padded_count": sum(u.padded for u in self.units),
            "shard_count": sum(u.shard.numel() for u in self.units),
        }


def train(ctx):
    model = full_model(ctx)
    zero = Zero(ctx, model, STAGES[ctx.cfg.strategy], passes=ctx.layout.microbatches,
                prefetch=ctx.cfg.zero_prefetch)
    result = train_model(ctx, model, zero, params=[u.shard for u in zero.units],
                         state_of=zero.sharded.full_state)
    result["zero"] = zero.describe()
    return result


def check(cfg, layout) -> None:
    """ZeRO-3's prefetch on one rank, which gathers nothing from anyone, is refused (it had run)."""
    if cfg.zero_prefetch and layout.dp == 1:
        raise ConfigError("zero_prefetch gathers ZeRO-3's next part from the other ranks ahead of time: "
                          "one rank has no others (world_size >= 2)")


STRATEGIES = [
    Strategy(f"zero{stage}", summary, axes=("dp",),
             options=("reduce_dtype", *{2: ("bucket_mb",), 3: ("zero_prefetch",)}.get(stage, ())),
             zero=stage, train=train, check=check, title=f"sharded data parallel, ZeRO-{stage}")
    for stage, summary in ((1, "optimizer states sharded over the data-parallel ranks"),
                           (2, "optimizer states and gradients sharded"),
                           (3, "optimizer states, gradients and parameters sharded; `--zero-prefetch`"))
]
