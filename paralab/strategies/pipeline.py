"""Layer-wise model parallel (模型并行) and pipeline parallel (流水线并行): one executor for every schedule.

The model's blocks are cut into S = p x v stages over p ranks (v model chunks per rank for the
interleaved and V-shaped schedules). A schedule (paralab.schedules) is plain data: for each rank, the
ordered forwards, backwards and the sends and receives that carry activations down the pipeline
and gradients back up. This executor runs whatever list it is given:

- ``mp`` is the naive schedule: one batch, no microbatches, so only one rank works at a time;
- ``pp`` runs gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev over ``microbatches`` slices of the
  batch. DualPipeV's F&B slots run here as their forward then their backward: the schedule, its
  order and its proofs are the same; the overlap inside a slot (one microbatch's all-to-all hidden
  behind the other's compute, on separate GPU streams) is what the simulator times.

Each microbatch's loss is divided by m, so the gradients that accumulate over the microbatches are
those of the whole batch and the optimizer step equals single-device training. Activations and
gradients travel with plain isend/irecv (shapes are known statically: microbatch x seq x hidden),
each stage boundary and direction on its own two-rank process group (:func:`stage_groups`): a
boundary carries its microbatches in order, but two boundaries between the same ranks need not
interleave their messages the same way on both sides, messages on one group match in issue order,
and under NCCL a group runs them one after another (a receive posted ahead must not hold up a send).
An output is sent and then dropped: backward needs only its autograd edge, not its data. Zero-bubble
schedules split the backward into backward_input (the gradient the previous stage waits for) and
backward_weight (deferred into the bubble).
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from functools import partial

import torch
import torch.distributed as dist
from torch.autograd.graph import get_gradient_edge

from paralab import comm
from paralab.config import ConfigError, RunConfig
from paralab.models.gpt import lm_loss
from paralab.models.moe import set_aux_loss_scale
from paralab.precision import torch_dtype
from paralab.schedules import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    RECV_BACKWARD,
    RECV_FORWARD,
    SCHEDULES,
    Schedule,
    build_schedule,
)
from paralab.strategies.common import GradSync, make_loader, make_optimizer, prepare, train_loop
from paralab.strategies.pipeline_stage import build_stages, check_pipeline, named_stage_state
from paralab.strategies.registry import PIPELINE_OPTIONS, Strategy
from paralab.strategies.weight_grads import DeferredWeightGrads


# ------------------------------------------------------------------------------------------ checks
def check_mp(cfg: RunConfig, layout) -> None:
    """mp is the naive schedule over one batch: say so rather than run something else."""
    if layout.microbatches != 1:
        raise ConfigError(f"mp runs the whole batch through the layers with no microbatches, got "
                          f"microbatches={layout.microbatches}; for microbatches use strategy 'pp'")
    if layout.schedule != "naive":
        raise ConfigError(f"mp is the naive schedule; for schedule {layout.schedule!r} use strategy 'pp'")
    check_pipeline(cfg, layout)


# ------------------------------------------------------------------------------------------ executor
class PipelineExecutor:
    """Runs one rank's action list of a schedule, one training step at a time.

    Per (stage, microbatch) it keeps what backward needs: the stage input (a leaf, whose gradient is
    sent up the pipeline) and the autograd edge of the output (or the loss on the last stage).
    ``inbox`` holds tensors that arrived (received, or handed over by a stage on this rank) and
    ``outbox`` tensors waiting for their send action.

    Composed into a larger layout (hybrid), the pipeline is one of several: ``pipeline_ranks`` lists
    the global rank of each of its stages' ranks (default: ranks 0..p-1), ``shape`` is what crosses a
    stage boundary (default: micro-batch x seq x hidden) and ``loss_fn(output, targets)`` turns the
    last stage's output into the microbatch's mean loss (default: cross-entropy on full logits).
    """

    def __init__(self, ctx, schedule: Schedule, stages: dict, groups: dict[int, dist.ProcessGroup],
                 pipeline_ranks: list[int] | None = None, shape: tuple[int, ...] | None = None,
                 loss_fn=lm_loss):
        self.ctx, self.schedule, self.stages, self.groups = ctx, schedule, stages, groups
        cfg = ctx.cfg
        self.m = schedule.microbatches
        self.shape = shape or (ctx.layout.micro_batch, cfg.model.seq_len, cfg.model.hidden)
        self.dtype = torch_dtype(cfg.dtype)  # activations and their gradients cross in the run's dtype
        self.pipeline_ranks = pipeline_ranks or schedule.ranks
        self.pp_rank = self.pipeline_ranks.index(ctx.rank)
        self.loss_fn = loss_fn
        self.owner = schedule.stage_to_rank
        self.last = schedule.num_stages - 1
        self.weight_grads = DeferredWeightGrads(stages) if schedule.is_split_backward else None
        self.split = schedule.split_backwards  # (stage, microbatch) whose backward is Bi then W
        self.peak_activations = 0

    def run_step(self, tokens: list[torch.Tensor] | None, targets: list[torch.Tensor] | None) -> float | None:
        """Run every action of this rank for one step; returns the step's loss on the last stage."""
        self.tokens, self.targets = tokens, targets
        self.inbox, self.outbox, self.saved = {}, {}, {}
        self.sending: list[tuple[comm.TracedWork, torch.Tensor]] = []
        self.live: set[tuple[int, int]] = set()
        self.loss = None
        rec, actions = self.ctx.recorder, self.schedule.actions[self.pp_rank]
        self.recvs = deque(a for a in actions if a.op in (RECV_FORWARD, RECV_BACKWARD))
        self.posted: deque = deque()
        for action in actions:
            rec.set_context(stage=action.stage, microbatch=action.microbatch)
            if action.is_compute:
                self._post_next_recv()
            getattr(self, action.op)(action)
            self._reap_sends()
        rec.set_context(stage=None, microbatch=None)
        for work, _ in self.sending:
            work.wait()
        self.sending.clear()
        return None if self.loss is None else self.loss.item()

    # --------------------------------------------------------------------------------- compute
    def forward(self, a) -> None:
        s, mb = a.stage, a.microbatch
        x = self.tokens[mb] if s == 0 else self.inbox.pop(("act", s, mb)).requires_grad_()
        with self.ctx.recorder.span(FORWARD), self.ctx.memory.saving((s, mb)), self._recording(s, mb):
            y = self.stages[s](x)
            if s == self.last:
                # the batch's mean loss is the sum over microbatches
                y = self.loss_fn(y, self.targets[mb]) / self.m
        self.live.add((s, mb))
        self.peak_activations = max(self.peak_activations, len(self.live))
        if s == self.last:
            self.saved[(s, mb)] = (x, self.ctx.scaler.scale(y))  # backward starts from the (fp16-scaled) loss
            self.loss = y.detach() if self.loss is None else self.loss + y.detach()
            return
        self.saved[(s, mb)] = (x, get_gradient_edge(y))  # the edge, not the tensor: y can go once sent
        self._deliver("act", s + 1, mb, y.detach())

    def backward(self, a) -> None:
        s, mb = a.stage, a.microbatch
        x, out = self.saved.pop((s, mb))
        with self.ctx.recorder.span(BACKWARD):
            torch.autograd.backward([out], self._grad_of(s, mb))
        self._release(s, mb)
        if s > 0:
            self._deliver("grad", s - 1, mb, x.grad)

    def backward_input(self, a) -> None:
        """Bi: the gradient of the stage input, which the previous stage is waiting for (see
        weight_grads.py: the linear layers' weight gradients wait for W)."""
        s, mb = a.stage, a.microbatch
        x, out = self.saved.pop((s, mb))
        with self.ctx.recorder.span(BACKWARD_INPUT):
            self.weight_grads.backward_input((s, mb), out, self._grad_of(s, mb), x if s > 0 else None)
        self.ctx.memory.shrink((s, mb), self.weight_grads.held_bytes((s, mb)))
        if s > 0:
            self._deliver("grad", s - 1, mb, x.grad)

    def backward_weight(self, a) -> None:
        """W: the weight gradients, accumulated into .grad; nobody waits for them."""
        s, mb = a.stage, a.microbatch
        with self.ctx.recorder.span(BACKWARD_WEIGHT):
            self.weight_grads.backward_weight((s, mb))
        self._release(s, mb)

    def _recording(self, s: int, mb: int):
        """Keep what W will need, for the forwards whose backward is split (only those: DualPipeV runs
        some backwards whole)."""
        return self.weight_grads.recording((s, mb)) if (s, mb) in self.split else nullcontext()

    # ------------------------------------------------------------------------------ p2p
    def send_forward(self, a) -> None:
        self._send(self.outbox.pop(("act", a.stage + 1, a.microbatch)), a.peer, (a.stage, "act"),
                   name=f"send {a.label}")

    def send_backward(self, a) -> None:
        self._send(self.outbox.pop(("grad", a.stage - 1, a.microbatch)), a.peer, (a.stage - 1, "grad"),
                   name=f"send {a.label}")

    def recv_forward(self, a) -> None:
        self.inbox[("act", a.stage, a.microbatch)] = self._take_recv(a)

    def recv_backward(self, a) -> None:
        self.inbox[("grad", a.stage, a.microbatch)] = self._take_recv(a)

    def _send(self, tensor: torch.Tensor, peer: int, link: tuple[int, str], name: str) -> None:
        work = comm.isend(tensor, self.pipeline_ranks[peer], group=self.groups[link], name=name)
        self.sending.append((work, tensor))

    def _post_next_recv(self) -> None:
        """Post the rank's next receive before a compute, so the transfer overlaps the compute
        (one receive ahead at most: one extra buffer)."""
        if self.recvs and not self.posted:
            a = self.recvs.popleft()
            link = (a.stage - 1, "act") if a.op == RECV_FORWARD else (a.stage, "grad")
            buffer = torch.empty(self.shape, device=self.ctx.device, dtype=self.dtype)
            name = f"recv {a.label}"
            # tagged as its own action: posted during the compute before it, it had borne that one's
            # microbatch ("recv F4 s1" tagged microbatch 1)
            with self.ctx.recorder.tagged(stage=a.stage, microbatch=a.microbatch):
                work = comm.irecv(buffer, self.pipeline_ranks[a.peer], group=self.groups[link], name=name)
            self.posted.append((a, work, buffer))

    def _take_recv(self, a) -> torch.Tensor:
        """Wait for the receive of action ``a`` (posted now if no compute came before it)."""
        self._post_next_recv()
        posted, work, buffer = self.posted.popleft()
        assert posted == a, f"receives out of order: expected {posted}, reached {a}"
        work.wait()
        return buffer

    def _reap_sends(self) -> None:
        """Close finished sends and drop their tensors: an output is freed once it is on its way. (gloo's
        isend says it is done only inside ``wait()``, so on CPU ranks the tensors stay until the step's
        end, and the trace ends each send when its receive did: Trace.land_sends.)"""
        still = []
        for work, tensor in self.sending:
            if work.is_completed():
                work.wait()
            else:
                still.append((work, tensor))
        self.sending = still

    # ---------------------------------------------------------------------------- helpers
    def _deliver(self, kind: str, stage: int, mb: int, tensor: torch.Tensor) -> None:
        """Hand a tensor to the stage that consumes it: locally, or through a later send action."""
        box = self.inbox if self.owner[stage] == self.pp_rank else self.outbox
        box[(kind, stage, mb)] = tensor  # keyed by the consuming stage, in both boxes

    def _grad_of(self, s: int, mb: int) -> list[torch.Tensor] | None:
        """The gradient of the stage output (None on the last stage, whose output is the loss)."""
        return None if s == self.last else [self.inbox.pop(("grad", s, mb))]

    def _release(self, s: int, mb: int) -> None:
        self.live.discard((s, mb))
        self.ctx.memory.release((s, mb))


LINKS = ("act", "grad")  # what crosses a stage boundary: activations forward, their gradients back


def stage_groups(schedule: Schedule,
                 pipelines: list[list[int]] | None = None) -> dict[tuple[int, str], dist.ProcessGroup]:
    """Two two-rank groups per stage boundary that crosses ranks, keyed (b, "act") and (b, "grad")
    (boundary b: stage b to b + 1), for this rank's pipeline: one a direction. NCCL runs a group's
    sends and receives in the order they were issued, one after another; on one group, stage 0's
    receive of a gradient posted ahead would keep its first activation from leaving, for which stage
    1 waits before it can send that gradient (gloo matches each message apart, so no CPU run could
    show it). ``pipelines`` holds the global ranks of every pipeline when there are several (hybrid);
    by default one pipeline over ranks 0..p-1. Every rank creates every group of every pipeline, in
    the same order, as torch requires."""
    me, groups = dist.get_rank(), {}
    for ranks in pipelines or [schedule.ranks]:
        for b in range(schedule.num_stages - 1):
            pair = sorted({ranks[schedule.stage_to_rank[b]], ranks[schedule.stage_to_rank[b + 1]]})
            if len(pair) == 2:
                for link in LINKS:
                    group = dist.new_group(pair)
                    if me in ranks:
                        groups[b, link] = group
    return groups


def microbatched_batch(loader, step: int, m: int, needs_tokens: bool, needs_targets: bool,
                       dp_rank: int = 0, dp_size: int = 1):
    """This data-parallel replica's slice of the step's global batch cut into m microbatches: token
    ids for the first stage, targets for the last (None for a rank that owns neither)."""
    if loader is None:
        return None, None
    inputs, labels = loader.rank_batch(step, dp_rank, dp_size)
    return ((list(inputs.chunk(m)) if needs_tokens else None),
            (list(labels.chunk(m)) if needs_targets else None))


def train(ctx) -> dict:
    cfg, layout = ctx.cfg, ctx.layout
    schedule = build_schedule(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages)
    owned = schedule.stages_on(ctx.rank)
    stages = build_stages(cfg.model, schedule.num_stages, owned, cfg.seed, layout.stage_layers,
                          partial(prepare, ctx))
    set_aux_loss_scale(stages.values(), 1.0 / schedule.microbatches, ctx.scaler)
    params = [p for s in owned for p in stages[s].parameters()]
    optimizer = make_optimizer(cfg, params, ctx)
    ctx.memory.watch(params, optimizer)
    executor = PipelineExecutor(ctx, schedule, stages, stage_groups(schedule))
    needs_tokens, needs_targets = 0 in owned, schedule.num_stages - 1 in owned
    loader = make_loader(ctx) if needs_tokens or needs_targets else None
    losses = train_loop(ctx, optimizer, GradSync(), lambda batch: executor.run_step(*batch),
                        lambda step: microbatched_batch(loader, step, schedule.microbatches, needs_tokens,
                                                        needs_targets), batch_in_window=False)
    state = named_stage_state(stages) if cfg.collect_state else None
    result = ctx.result(losses if needs_targets else None, loss_weight=1.0, state=state)
    result["peak_activations"] = executor.peak_activations
    return result


STRATEGIES = [
    Strategy("mp", "layers split over ranks, one batch, one rank busy at a time", axes=("pp",),
             options=("schedule", "stage_layers"), schedule="naive", check=check_mp, train=train,
             title="layer-wise model parallel (模型并行)"),
    Strategy("pp", f"`--schedule {' / '.join(SCHEDULES)}`, microbatches",
             axes=("pp",),
             options=PIPELINE_OPTIONS, schedules=SCHEDULES, check=check_pipeline, train=train,
             title="pipeline parallel (流水线并行)"),
]
