"""Hybrid 3D parallelism (混合并行): data x tensor x pipeline parallel on one device mesh.

``dp x tp x pp`` ranks form a torch DeviceMesh with named dims ("pp", "dp", "tp"), tensor parallel
innermost (the layout is in paralab.strategies.mesh; ``rank_layout(dp, tp, pp)`` prints it). Each
parallelism is a small function over its dim of the mesh, and they compose:

- ``parallelize_tensor``: the stages' parts are Megatron tensor-parallel layers over the tp group
  (tensor.py), with or without sequence parallel; with tp = 1 they are the plain GPT parts.
- ``parallelize_pipeline``: the pipeline executor (pipeline.py) runs the schedule along the pp dim;
  activations go between the ranks with the same (dp, tp) coordinate in neighbouring stages.
- ``parallelize_data``: each dp replica takes 1/dp of the global batch, cut into microbatches, and
  its gradients are synchronised over the dp group once per step, after the last microbatch (not
  after each): DDP's buckets (ddp.py), launched when the last microbatch's gradient lands, or a ZeRO
  stage 1 or 2 over dp (``zero`` option; zero.py).

The degrees are validated once, before any process starts, by reusing the pipeline's and the
tensor-parallel validators. The loss of each replica is reported by the tp rank 0 of the stage that
computes it, weighted 1/dp.
"""

from __future__ import annotations

import dataclasses
import sys

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from paralab.config import ConfigError, RunConfig
from paralab.models.gpt import build_part, lm_loss
from paralab.schedules import SCHEDULES, build_schedule, theoretical_bubble
from paralab.strategies import tensor
from paralab.strategies.common import make_loader, make_optimizer
from paralab.strategies.ddp import BucketedReducer
from paralab.strategies.mesh import DIMS, RankLayout, rank_layout
from paralab.strategies.pipeline import PipelineExecutor, microbatched_batch, stage_groups
from paralab.strategies.pipeline_stage import build_stages, check_pipeline
from paralab.strategies.tensor_layers import TensorParallelGroup, vocab_parallel_cross_entropy
from paralab.strategies.zero import Zero

__all__ = ["rank_layout", "validate", "train"]


# ------------------------------------------------------------------------------------------ validate
def validate(cfg: RunConfig) -> None:
    """Check the degrees once, before any process starts; fills in dp (world / (tp x pp)) if 0."""
    world, tp, pp = cfg.world_size, cfg.tp, cfg.pp
    if tp < 1 or pp < 1 or cfg.dp < 0:
        raise ConfigError(f"hybrid degrees must be >= 1, got dp={cfg.dp}, tp={tp}, pp={pp}")
    dp = cfg.dp or max(world // (tp * pp), 1)
    if dp * tp * pp != world:
        fits = [f"{d}x{t}x{p}" for d in _divisors(world) for t in _divisors(world // d)
                for p in [world // (d * t)]]
        raise ConfigError(f"hybrid needs dp x tp x pp = world size: {dp} x {tp} x {pp} = {dp * tp * pp}, but "
                          f"world size is {world}; use world size {dp * tp * pp}, or dp x tp x pp that fit "
                          f"{world} ranks: {', '.join(fits)}")
    cfg.dp = dp
    if cfg.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero must be 0 (ddp), 1 or 2, got {cfg.zero}")
    if cfg.zero == 3:
        raise ConfigError(
            f"not supported: zero3 in hybrid ({'with pp=' + str(pp) if pp > 1 else 'over dp'}): stage 3 "
            "gathers each part for its forward and again for its backward, once per microbatch, and frees "
            "it in between, which the pipeline executor does not do; use zero=1 or 2, or strategy 'zero3' "
            "for pure data parallel")
    if cfg.sequence_parallel and tp == 1:
        raise ConfigError("sequence_parallel splits the sequence over the tp ranks: it needs tp > 1")
    if cfg.zero == 2 and cfg.sequence_parallel:
        raise ConfigError("not supported: zero=2 with sequence_parallel (the sequence-parallel gradients "
                          "are summed over tp after backward, but zero2 has reduce-scattered them during "
                          "backward); use zero=1 or ddp (zero=0)")
    m = cfg.microbatches
    if m < 1 or cfg.global_batch % (dp * m):
        fits = [b for b in range(dp * max(m, 1), 4 * dp * max(m, 1) + 1, dp * max(m, 1))]
        raise ConfigError(f"global batch {cfg.global_batch} does not split into dp={dp} replicas x {m} "
                          f"microbatches; global batches that fit: {fits}")
    if tp > 1:
        tensor.validate(dataclasses.replace(cfg, world_size=tp))
    if pp > 1:  # the pipeline of one dp replica: pp ranks, that replica's slice of the batch
        line = dataclasses.replace(cfg, world_size=pp, global_batch=cfg.global_batch // dp)
        check_pipeline(line, SCHEDULES)
        cfg.schedule, cfg.virtual_stages = line.schedule, line.virtual_stages
    elif cfg.schedule or cfg.virtual_stages != 1 or cfg.stage_layers:
        raise ConfigError("a pipeline schedule, virtual_stages or stage_layers needs pp > 1; with pp=1 "
                          "the microbatches simply accumulate gradients")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------------------ the mesh
@dataclasses.dataclass
class Place:
    """This rank on the mesh: its coordinate, its tp group, its dp group and its pipeline."""

    layout: RankLayout
    pp: int
    dp: int
    tp: TensorParallelGroup
    dp_group: object
    line: list[int]  # global ranks of this rank's pipeline, by stage rank


def place_on_mesh(ctx) -> Place:
    cfg = ctx.cfg
    layout = rank_layout(cfg.dp, cfg.tp, cfg.pp)
    mesh = init_device_mesh(ctx.device.type, layout.shape, mesh_dim_names=DIMS)
    pp, dp, tp = mesh.get_coordinate()
    line = next(line for line in layout.groups("pp") if ctx.rank in line)
    tp_group = TensorParallelGroup(mesh.get_group("tp"), tp, cfg.tp, cfg.sequence_parallel)
    return Place(layout, pp, dp, tp_group, mesh.get_group("dp"), line)


# ------------------------------------------------------------------------------------------ composition
def parallelize_tensor(cfg: RunConfig, schedule, place: Place, device) -> dict[int, nn.Module]:
    """This rank's pipeline stages, their parts split over the tp group (plain parts when tp = 1)."""
    tp = place.tp

    def build(model, index, seed):
        return build_part(model, index, seed) if tp.size == 1 else tensor.parallel_part(model, index, seed, tp)

    return build_stages(cfg.model, schedule.num_stages, schedule.stages_on(place.pp), cfg.seed,
                        cfg.stage_layers, device, build)


def parallelize_pipeline(ctx, schedule, stages: dict, place: Place) -> PipelineExecutor:
    """The executor for this rank's pipeline. With tp > 1 the activations are sequence-first, and a
    sequence-parallel boundary carries only this rank's slice of the sequence; the loss is the
    vocabulary-parallel cross-entropy on the head's slice of the logits."""
    cfg, tp = ctx.cfg, place.tp
    micro = cfg.global_batch // cfg.dp // schedule.microbatches
    seq, hidden = cfg.model.seq_len, cfg.model.hidden
    if tp.size == 1:
        shape, loss_fn = (micro, seq, hidden), lm_loss
    else:
        shape = (seq // tp.size if tp.sequence_parallel else seq, micro, hidden)

        def loss_fn(logits, targets):
            return vocab_parallel_cross_entropy(logits, targets, tp).mean()
    groups = stage_groups(schedule, place.layout.groups("pp"))
    return PipelineExecutor(ctx, schedule, stages, groups, line=place.line, shape=shape, loss_fn=loss_fn)


class ReplicatedStates:
    """ddp over dp: every replica keeps full states of its shard of the model; DDP's buckets are
    all-reduced over the dp group once per step, each launched when the last microbatch's gradient
    of its parameters lands (so the last backward still overlaps it)."""

    def __init__(self, ctx, module: nn.Module, place: Place, accumulations: int, sp_grads):
        self.reducer = BucketedReducer(module, ctx.cfg.dp, ctx.cfg.bucket_mb, place.dp_group, accumulations,
                                       memory=ctx.memory)
        self.optimizer = make_optimizer(ctx.cfg, module.parameters())
        self.sp_grads = sp_grads
        ctx.memory.watch(list(module.parameters()), self.optimizer)

    def begin_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.reducer.before_backward()

    def reduce(self) -> None:
        """Average over dp, then sum the sequence-parallel partial gradients over tp (sums commute;
        the buckets hold the gradients as backward left them, so dp goes first)."""
        self.reducer.after_backward()
        self.sp_grads.after_backward()

    def step(self) -> None:
        self.optimizer.step()

    def averaged_grads(self, module: nn.Module) -> dict:
        return {name: p.grad for name, p in module.named_parameters()}


class ShardedStates:
    """ZeRO stage 1 or 2 over dp: each replica's optimizer states (and, stage 2, gradients) are
    sharded over the dp group; one reduce-scatter per step, then one all-gather of the parameters."""

    def __init__(self, ctx, module: nn.Module, place: Place, accumulations: int, stage: int, sp_grads_of):
        self.zero = Zero(ctx, module, stage, group=place.dp_group, accumulations=accumulations)
        self.optimizer = make_optimizer(ctx.cfg, [u.shard for u in self.zero.units])
        self.sp_grads = sp_grads_of(module)  # after Zero: it replaced the parameters with views
        ctx.memory.watch([], self.optimizer)

    def begin_step(self) -> None:
        self.zero.clear_grads()

    def reduce(self) -> None:
        """Stage 1 keeps full gradients: sum the sequence-parallel ones over tp before the dp
        reduce-scatter (stage 2 with sequence parallel is refused in validate)."""
        self.sp_grads.after_backward()
        self.zero.after_backward()

    def step(self) -> None:
        self.optimizer.step()
        self.zero.after_step()

    def averaged_grads(self, module: nn.Module) -> dict | None:
        """Every parameter's averaged gradient, gathered over dp (dp rank 0 gets them)."""
        state = self.zero.sharded.full_state()
        return None if state is None else state["grads"]


def parallelize_data(ctx, module: nn.Module, place: Place, accumulations: int):
    def sp_grads_of(mod):
        return tensor.SequenceParallelGrads(mod, place.tp)

    if ctx.cfg.zero:
        return ShardedStates(ctx, module, place, accumulations, ctx.cfg.zero, sp_grads_of)
    return ReplicatedStates(ctx, module, place, accumulations, sp_grads_of(module))


# ------------------------------------------------------------------------------------------ training
def train(ctx) -> dict:
    cfg, rec = ctx.cfg, ctx.recorder
    place = place_on_mesh(ctx)
    if ctx.rank == 0:  # stderr: stdout carries `paralab run --json`
        print(f"hybrid rank layout\n{place.layout.text()}", file=sys.stderr, flush=True)
    schedule = build_schedule(cfg.schedule or "1f1b", cfg.pp, cfg.microbatches, cfg.virtual_stages)
    stages = parallelize_tensor(cfg, schedule, place, ctx.device)
    module = nn.ModuleDict({str(s): stage for s, stage in stages.items()})
    states = parallelize_data(ctx, module, place, schedule.microbatches)
    executor = parallelize_pipeline(ctx, schedule, stages, place)
    owned = schedule.stages_on(place.pp)
    needs_tokens, needs_targets = 0 in owned, schedule.num_stages - 1 in owned
    loader = make_loader(ctx) if needs_tokens or needs_targets else None
    losses = []
    for step in range(cfg.steps):
        tokens, targets = microbatched_batch(loader, step, schedule.microbatches, needs_tokens, needs_targets,
                                             place.dp, cfg.dp)
        if place.tp.size > 1:  # tensor-parallel layers are sequence-first
            tokens, targets = (None if b is None else [t.t() for t in b] for b in (tokens, targets))
        with rec.step(step):
            ctx.check_fault(step)
            states.begin_step()
            loss = executor.run_step(tokens, targets)
            states.reduce()
            with rec.span("optimizer"):
                states.step()
            ctx.memory.sample()
        if loss is not None:
            losses.append(loss)
    reports = needs_targets and place.tp.rank == 0
    state = gather_state(module, stages, states, place) if cfg.collect_state else None
    result = ctx.result(losses if reports else None, loss_weight=1.0 / cfg.dp, state=state)
    result["mesh"] = {"coord": {"pp": place.pp, "dp": place.dp, "tp": place.tp.rank},
                      **({"layout": place.layout.to_dict()} if ctx.rank == 0 else {})}
    result["peak_activations"] = executor.peak_activations
    if cfg.zero:
        result["zero"] = states.zero.describe()
    if cfg.pp > 1:
        result["bubble_theoretical"] = theoretical_bubble(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages)
    return result


def gather_state(module: nn.Module, stages: dict, states, place: Place) -> dict | None:
    """Full parameters and averaged gradients under GPT's names, on the tp rank 0 of dp replica 0 of
    every stage; gathered over dp (ZeRO's shards) and tp after training, outside the traced steps."""
    grads = states.averaged_grads(module)  # every dp rank takes part; dp rank 0 gets them
    if place.dp != 0:
        return None
    named = [item for stage in stages.values() for item in stage.global_named_parameters()]
    with torch.no_grad():
        for (local, _), (_, param) in zip(module.named_parameters(), named):
            param.grad = grads[local].to(param.device).view_as(param)
    return tensor.gather_state(named, place.tp)
