"""Hybrid parallelism (混合并行): data x context x tensor x pipeline parallel on one device mesh.

``dp x cp x tp x pp`` ranks form a torch DeviceMesh with the named dims of paralab.layout.AXES,
tensor parallel innermost (``print(run.layout)`` shows which rank sits where). Each parallelism is a
small function over its dim of the mesh, and they compose:

- ``parallelize_tensor``: the stages' parts are Megatron tensor-parallel layers over the tp group
  (tensor.py), with or without sequence parallel; with tp = 1 they are the plain GPT parts.
- ``parallelize_context`` (context.py): with cp > 1, every attention of those parts attends across
  the cp group (ring or all-to-all) and the embedding takes the rank's positions; each cp rank
  holds a slice of every sequence of its replica's batch.
- ``parallelize_pipeline``: the pipeline executor (pipeline.py) runs the schedule along the pp dim;
  activations (a cp rank's slice) go between the ranks with the same (dp, cp, tp) coordinate in
  neighbouring stages.
- ``parallelize_data``: each dp replica takes 1/dp of the global batch, cut into microbatches, and
  its gradients are synchronised over the dp and cp ranks together (every one of them saw other
  tokens) once per step, after the last microbatch (not after each): DDP's buckets (ddp.py),
  launched when the last microbatch's gradient lands, or a ZeRO stage 1 or 2 over those ranks
  (``zero`` option; zero.py). With ``ep`` > 1 (a mixture-of-experts model) the
  experts are sharded over ep of the dp ranks and reduced over the ranks holding the same ones
  (expert.py; paralab.layout says where they sit).

The degrees are resolved and checked once, before any process starts (paralab.layout, then
:func:`check`, which reuses the pipeline's and the tensor-parallel checks). The loss of each replica
of each replica's slice is reported by the tp rank 0 of the stage that computes it, weighted 1/(dp x cp).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from paralab.config import ConfigError, RunConfig
from paralab.layout import AXES
from paralab.models.gpt import build_part, lm_loss
from paralab.models.moe import ExpertGroup, set_aux_loss_scale
from paralab.precision import torch_dtype
from paralab.schedules import DEFAULT_SCHEDULE, SCHEDULES, build_schedule
from paralab.strategies import context, tensor
from paralab.strategies.common import (
    SyncChain,
    make_loader,
    make_optimizer,
    params_digest,
    prepare,
    train_loop,
)
from paralab.strategies.ddp import bucketed_sync
from paralab.strategies.expert import expert_process_groups, parallelize_experts
from paralab.strategies.pipeline import PipelineExecutor, microbatched_batch, stage_groups
from paralab.strategies.pipeline_stage import build_stages, check_pipeline
from paralab.strategies.registry import (
    CONTEXT_OPTIONS,
    PIPELINE_OPTIONS,
    Strategy,
    check_reduce_dtype_applies,
)
from paralab.strategies.ring_attention import ContextParallelGroup
from paralab.strategies.tensor_layers import TensorParallelGroup, vocab_parallel_cross_entropy
from paralab.strategies.zero import Zero


# ------------------------------------------------------------------------------------------ checks
def check(cfg: RunConfig, layout) -> None:
    """What the composition cannot do, and each axis's own rules (tensor.check, check_pipeline)."""
    if layout.zero == 3:
        cost = ("with m microbatches a stage would all-gather its parameters 2m times a step, m times the "
                "traffic of zero1, to shard the parameters too" if layout.pp > 1 else
                "hybrid runs pp=1 as a pipeline of one stage too, so its stage 3 (FSDP inside hybrid's "
                "mesh, beside tp as torchtitan's 2-D layout) is not built here")
        raise ConfigError(
            "not supported: zero3 in hybrid "
            f"({'with pp=' + str(layout.pp) if layout.pp > 1 else 'over dp'}): "
            "stage 3 gathers each part for its forward and again for its backward, once per microbatch, "
            f"and frees it in between, which the pipeline executor does not do; {cost}; use zero=1 or 2, "
            "or strategy 'zero3' for pure data parallel")
    if layout.zero and layout.ep > 1:
        raise ConfigError(f"not supported: zero={layout.zero} with ep={layout.ep}: "
                          "ZeRO would shard every parameter over all dp ranks, "
                          "but an expert lives only on its expert-data-parallel ranks; use zero=0")
    if layout.zero not in (0, 1, 2):
        raise ConfigError(f"zero must be 0 (ddp), 1 or 2, got {layout.zero}")
    if layout.zero and layout.dp * layout.cp == 1:  # it had run, sharding over one rank: nothing
        raise ConfigError(f"zero={layout.zero} shards over the dp x cp ranks, and this layout has one "
                          f"(dp {layout.dp} x cp {layout.cp}): give dp >= 2")
    tensor.check_sequence_parallel(layout)
    if layout.zero == 2 and layout.sequence_parallel:
        raise ConfigError("not supported: zero=2 with sequence_parallel (the sequence-parallel gradients "
                          "are summed over tp after backward, but zero2 has reduce-scattered them during "
                          "backward); use zero=1 or ddp (zero=0)")
    check_reduce_dtype_applies(cfg, layout.dp * layout.cp > 1 or layout.sequence_parallel,
                               "hybrid reduces gradients over dp x cp, and over tp under sequence "
                               "parallelism, and this run has dp x cp = 1 without it")
    if layout.tp > 1:
        tensor.check(cfg, layout)
    if layout.cp > 1:
        context.check(cfg, layout)
    if layout.pipelined:
        check_pipeline(cfg, layout)


# ------------------------------------------------------------------------------------------ the mesh
@dataclasses.dataclass
class MeshPosition:
    """This rank on the mesh: its pp and dp coordinates, its tp and cp groups, the group that averages
    its gradients (the dp ranks, with cp > 1 the dp and cp ranks), the global ranks of its pipeline
    (by pipeline rank) and, with ep > 1, its expert group and expert-data-parallel group."""

    pp: int
    dp: int
    tp: TensorParallelGroup
    cp: ContextParallelGroup
    grad_group: object
    pipeline_ranks: list[int]
    ep: ExpertGroup | None = None
    expert_data_group: object = None


def place_on_mesh(ctx) -> MeshPosition:
    layout = ctx.layout
    mesh = init_device_mesh(ctx.device.type, layout.shape, mesh_dim_names=AXES)
    coord = dict(zip(AXES, mesh.get_coordinate()))
    tp_group = TensorParallelGroup(mesh.get_group("tp"), coord["tp"], layout.tp, layout.sequence_parallel)
    cp_group = ContextParallelGroup(mesh.get_group("cp"), tuple(layout.group_of("cp", ctx.rank)), coord["cp"],
                                    layout.cp_split, layout.cp_mode)
    grad_group = mesh.get_group("dp")
    if layout.cp > 1:  # every rank makes every group, in the same order (a torch.distributed rule)
        for ranks in layout.groups("dp", "cp"):
            group = dist.new_group(ranks)
            if ctx.rank in ranks:
                grad_group = group
    pipeline = layout.group_of("pp", ctx.rank)
    ep, expert_data_group = expert_process_groups(layout, ctx.rank) if layout.ep > 1 else (None, None)
    return MeshPosition(coord["pp"], coord["dp"], tp_group, cp_group, grad_group, pipeline, ep,
                        expert_data_group)


# ------------------------------------------------------------------------------------------ composition
def parallelize_tensor(ctx, schedule, position: MeshPosition) -> dict[int, nn.Module]:
    """This rank's pipeline stages, their parts split over the tp group (plain parts when tp = 1) and
    made context parallel over the cp group (when cp > 1)."""
    cfg, layout, tp, cp = ctx.cfg, ctx.layout, position.tp, position.cp

    def build(model, index, seed):
        part = (tensor.parallel_part(model, index, seed, tp) if tp.size > 1
                else build_part(model, index, seed, position.ep))
        if cp.size > 1:
            context.parallelize_context(part, cp, model.seq_len, first_layer=index - 1)
        return part

    return build_stages(cfg.model, schedule.num_stages, schedule.stages_on(position.pp), cfg.seed,
                        layout.stage_layers, partial(prepare, ctx), build)


def parallelize_pipeline(ctx, schedule, stages: dict, position: MeshPosition) -> PipelineExecutor:
    """The executor for this rank's pipeline. Activations hold the cp rank's slice of the sequence.
    With tp > 1 they are sequence-first, and a sequence-parallel boundary carries only this rank's
    slice of that; the loss is the vocabulary-parallel cross-entropy on the head's slice of the logits."""
    cfg, tp = ctx.cfg, position.tp
    micro, seq, hidden = ctx.layout.micro_batch, cfg.model.seq_len // position.cp.size, cfg.model.hidden
    if tp.size == 1:
        shape, loss_fn = (micro, seq, hidden), lm_loss
    else:
        shape = (seq // tp.size if tp.sequence_parallel else seq, micro, hidden)

        def loss_fn(logits, targets):
            return vocab_parallel_cross_entropy(logits, targets, tp).mean()
    groups = stage_groups(schedule, ctx.layout.groups("pp"))
    return PipelineExecutor(ctx, schedule, stages, groups,
                            pipeline_ranks=position.pipeline_ranks, shape=shape, loss_fn=loss_fn)


def parallelize_data(ctx, module: nn.Module, position: MeshPosition):
    """(gradient sync, optimizer) over the dp (and cp) ranks: DDP's buckets over them (none for one
    replica: :func:`~paralab.strategies.ddp.bucketed_sync`) then the
    sequence-parallel sums over tp (sums commute; the buckets hold the gradients as backward left them, so
    dp goes first), or the sequence-parallel sums then a ZeRO stage 1 or 2 whose optimizer holds only this
    rank's shards (stage 1 keeps full gradients, so they are summed over tp before the reduce-scatter;
    stage 2 with sequence parallel is refused by check)."""
    layout, reduce_dtype = ctx.layout, torch_dtype(ctx.cfg.reduce_dtype)
    if layout.ep > 1:
        optimizer = make_optimizer(ctx.cfg, module.parameters(), ctx)
        ctx.memory.watch(list(module.parameters()), optimizer)
        return parallelize_experts(ctx, module, position.grad_group, position.expert_data_group), optimizer
    if layout.zero:
        zero = Zero(ctx, module, layout.zero, group=position.grad_group, passes=layout.microbatches,
                    accumulations=layout.microbatches)
        sp_grads = tensor.SequenceParallelGrads(module, position.tp, reduce_dtype)  # after Zero: its views
        optimizer = make_optimizer(ctx.cfg, [u.shard for u in zero.units], ctx)
        ctx.memory.watch([], optimizer)
        return SyncChain(sp_grads, zero), optimizer
    reducer = bucketed_sync(module, layout.dp * layout.cp, ctx.cfg.bucket_mb, position.grad_group,
                            accumulations=layout.microbatches, memory=ctx.memory, reduce_dtype=reduce_dtype)
    optimizer = make_optimizer(ctx.cfg, module.parameters(), ctx)
    ctx.memory.watch(list(module.parameters()), optimizer)
    return SyncChain(reducer, tensor.SequenceParallelGrads(module, position.tp, reduce_dtype)), optimizer


# ------------------------------------------------------------------------------------------ training
def train(ctx) -> dict:
    cfg, layout = ctx.cfg, ctx.layout
    position = place_on_mesh(ctx)
    schedule = build_schedule(layout.schedule or DEFAULT_SCHEDULE, layout.pp, layout.microbatches,
                              layout.virtual_stages)
    stages = parallelize_tensor(ctx, schedule, position)
    set_aux_loss_scale(stages.values(), 1.0 / layout.microbatches, ctx.scaler)
    module = nn.ModuleDict({str(s): stage for s, stage in stages.items()})
    sync, optimizer = parallelize_data(ctx, module, position)
    executor = parallelize_pipeline(ctx, schedule, stages, position)
    owned = schedule.stages_on(position.pp)
    needs_tokens, needs_targets = 0 in owned, schedule.num_stages - 1 in owned
    loader = make_loader(ctx) if needs_tokens or needs_targets else None
    mine = context.slice_tokens(position.cp, cfg.model.seq_len, ctx.device)

    def batch_of(step):
        tokens, targets = microbatched_batch(loader, step, schedule.microbatches, needs_tokens, needs_targets,
                                             position.dp, layout.dp)
        tokens, targets = (None if b is None else [mine(t) for t in b] for b in (tokens, targets))
        if position.tp.size > 1:  # tensor-parallel layers are sequence-first
            tokens, targets = (None if b is None else [t.t() for t in b] for b in (tokens, targets))
        return tokens, targets

    losses = train_loop(ctx, optimizer, sync, lambda batch: executor.run_step(*batch), batch_of,
                        batch_in_window=False)
    reports = needs_targets and position.tp.rank == 0
    state = gather_state(module, stages, sync, position) if cfg.collect_state else None
    digest = params_digest(module.parameters()) if cfg.collect_state else None
    result = ctx.result(losses if reports else None, loss_weight=1.0 / (layout.dp * layout.cp), state=state,
                        params_digest=digest)
    result["mesh"] = {"coord": {"pp": position.pp, "dp": position.dp, "cp": position.cp.index,
                                "tp": position.tp.rank}}
    result["peak_activations"] = executor.peak_activations
    if layout.zero:
        result["zero"] = sync.syncs[-1].describe()
    return result


def gather_state(module: nn.Module, stages: dict, sync: SyncChain, position: MeshPosition) -> dict | None:
    """Full parameters and averaged gradients under GPT's names, on the tp rank 0 of dp replica 0 (cp
    rank 0) of every stage (with ep > 1, of the first expert group, which holds every expert once);
    gathered over dp (ZeRO's shards) and tp after training, outside the traced steps."""
    zero = sync.syncs[-1] if isinstance(sync.syncs[-1], Zero) else None
    if zero is not None:  # every dp rank takes part; dp rank 0 gets them
        full = zero.sharded.full_state()
        grads = None if full is None else full["grads"]
    else:
        grads = {name: p.grad for name, p in module.named_parameters()}
    if position.dp >= (position.ep.size if position.ep is not None else 1) or position.cp.index != 0:
        return None
    named = [item for stage in stages.values() for item in stage.global_named_parameters()]
    by_name = {name: grads[local].to(param.device).view_as(param)
               for (local, _), (name, param) in zip(module.named_parameters(), named)}
    return tensor.gather_state(named, position.tp, by_name)


STRATEGIES = [Strategy("hybrid", "`--dp D --cp C --tp T --pp P` on a device mesh, `--zero 1/2` over dp, "
                                  "`--ep E` inside dp", axes=("dp", "cp", "tp", "pp"),
                       options=(*PIPELINE_OPTIONS, *CONTEXT_OPTIONS, "sequence_parallel", "zero",
                                "bucket_mb", "ep", "reduce_dtype"),
                       schedules=SCHEDULES, check=check, train=train, title="hybrid parallel (混合并行)")]
