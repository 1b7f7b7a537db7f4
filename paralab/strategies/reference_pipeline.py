"""torch.distributed.pipelining run on paralab's split: the reference for pipeline parallel (流水线并行).

Strategy ``torch_pp`` builds the same stages as paralab's ``pp`` (paralab.strategies.pipeline_stage:
same blocks per stage, same weights), wraps each in torch's ``PipelineStage`` and runs torch's own
schedule class over the same microbatches: ``ScheduleGPipe``, ``Schedule1F1B`` or
``ScheduleInterleaved1F1B`` (which, like paralab, puts stage s on rank s mod p). Tests compare its
losses with paralab's; benchmarks time the two side by side.

torch runs the whole schedule inside ``step``, so only the step spans appear in paralab's trace. The
memory meter counts each microbatch's saved tensors from its forward to its backward as ``pp`` counts
them (``_MeteredStage``).

torch averages the microbatch gradients after the step (``scale_grads``) where paralab divides each
microbatch's loss by m first; the two agree to rounding.
"""

from __future__ import annotations

from functools import partial

from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from paralab.config import ConfigError, RunConfig
from paralab.models.gpt import lm_loss
from paralab.strategies.common import GradSync, make_loader, make_optimizer, prepare, train_loop
from paralab.strategies.pipeline_stage import build_stages, check_pipeline, named_stage_state
from paralab.strategies.registry import PIPELINE_OPTIONS, Strategy

TORCH_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


class _MeteredStage(PipelineStage):
    """torch's PipelineStage whose chunks' saved tensors the memory meter counts as activations, from a
    chunk's forward (and, on the last stage, the loss the schedule computes right after it) until its
    backward has run."""

    def __init__(self, *args, memory, **kwargs):
        super().__init__(*args, **kwargs)
        self.memory = memory
        self.forwarded = None  # (stage, chunk) of the latest forward, whose loss comes next

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        self.forwarded = (self.stage_index, fwd_chunk_id)
        with self.memory.saving(self.forwarded):
            return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        result = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
        self.memory.release((self.stage_index, bwd_chunk_id))
        return result


def check(cfg: RunConfig, layout) -> None:
    check_pipeline(cfg, layout)
    if cfg.model.experts:
        raise ConfigError("torch_pp is the reference for dense models: torch's PipelineStage runs a stage "
                          "on placeholder inputs to learn its shapes, which a mixture of experts would route "
                          "and count; run a mixture of experts with pp or hybrid")
    if layout.schedule == "1f1b" and layout.microbatches < layout.pp:
        raise ConfigError("torch's Schedule1F1B needs microbatches >= stages: "
                          f"{layout.microbatches} < {layout.pp}")


def train(ctx) -> dict:
    cfg, layout = ctx.cfg, ctx.layout
    p, m, num_stages = layout.pp, layout.microbatches, layout.num_stages
    owned = [s for s in range(num_stages) if s % p == ctx.rank]
    stages = build_stages(cfg.model, num_stages, owned, cfg.seed, layout.stage_layers,
                          partial(prepare, ctx))
    pipe = [_MeteredStage(stages[s], s, num_stages, ctx.device, memory=ctx.memory) for s in owned]

    def loss_fn(out, targets):
        with ctx.memory.saving(pipe[-1].forwarded):  # called on the last stage only, after its forward
            return ctx.scaler.scale(lm_loss(out, targets))

    schedule_cls = TORCH_SCHEDULES[layout.schedule]
    schedule = schedule_cls(pipe if layout.schedule == "interleaved" else pipe[0], n_microbatches=m,
                            loss_fn=loss_fn)
    params = [param for s in owned for param in stages[s].parameters()]
    optimizer = make_optimizer(cfg, params, ctx)
    ctx.memory.watch(params, optimizer)
    first, last = 0 in owned, num_stages - 1 in owned
    loader = make_loader(ctx) if first or last else None

    def forward_backward(batch):
        inputs, targets = batch
        microbatch_losses: list = []
        kwargs = {"target": targets, "losses": microbatch_losses} if last else {}
        schedule.step(*((inputs,) if first else ()), **kwargs)
        return sum(loss.item() for loss in microbatch_losses) / m / ctx.scaler.value if last else None

    losses = train_loop(ctx, optimizer, GradSync(), forward_backward,
                        lambda step: loader.rank_batch(step) if loader is not None else (None, None),
                        batch_in_window=False)
    state = named_stage_state(stages) if cfg.collect_state else None
    return ctx.result(losses if last else None, loss_weight=1.0, state=state)


STRATEGIES = [Strategy("torch_pp", "torch.distributed.pipelining on paralab's stages", axes=("pp",),
                       options=PIPELINE_OPTIONS, schedules=tuple(TORCH_SCHEDULES), check=check, train=train,
                       reference_for="pp")]
