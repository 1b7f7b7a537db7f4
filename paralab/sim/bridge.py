"""From a real run's config to the simulator: the same run, predicted, as numbers and as a Trace.

``paralab.run`` measures a :class:`paralab.RunConfig`; this module describes that very run in the
simulator's vocabulary so the two can be laid side by side:

- :func:`specs_from_run` maps paralab's GPT (untied embeddings with a biased output layer, learned
  positions, biases, LayerNorm, GELU MLP of ``ffn``, fp32, dropout only when asked) and the strategy
  to a :class:`ModelSpec` and a :class:`ParallelSpec`;
- :func:`predict_run` predicts its step; :func:`predict_run_trace` gives the simulated timeline with
  the measured trace's shape: the same ranks, ``cfg.steps`` steps, and compute spans of the same
  kinds (forward / backward / optimizer for data- and tensor-parallel runs, one span per schedule
  action for pipelines), so a figure can overlay them.

Rank layout of the simulated trace: Megatron's order (tp fastest, then dp, then pp), which is also
what each single-axis strategy uses (its rank is its dp, tp or pp index).
"""

from __future__ import annotations

import dataclasses
import math
import os

from paralab.config import ZERO_REDUCE_SCATTERS_IN_FLIGHT, ConfigError, RunConfig, resolve_device
from paralab.layout import Layout, resolve_layout
from paralab.schedules import DEFAULT_SCHEDULE
from paralab.sim import cost, counting
from paralab.sim.hardware import get_hardware, local
from paralab.sim.presets import lab_model
from paralab.sim.specs import MEASURED_CURVES, HardwareSpec, ModelSpec, ParallelSpec, SpecError
from paralab.strategies.registry import get_strategy
from paralab.trace import COMPUTE, STEP, Span, Trace


def specs_from_run(cfg: RunConfig) -> tuple[ModelSpec, ParallelSpec]:
    """The (model, parallel) specs of a run config, without mutating it or starting anything.

    The parallel shape is the run's own Layout (paralab.layout), converted field by field; what the
    cost model also needs to know is how the strategy moves gradients: naive ``dp`` all-reduces every
    parameter tensor after backward (one message each, no overlap); ``ddp`` one message per
    ``bucket_mb`` bucket, overlapped with backward (and a flat copy of each); ``zero2`` reduce-scatters
    those buckets as backward fills them; paralab's ZeRO keeps ZERO_REDUCE_SCATTERS_IN_FLIGHT on the
    wire, torch's FSDP2 (``torch_fsdp``, its gradients set to None between steps) the last part's
    reduce-scatter input; paralab's ``zero3`` gathers each part just before it runs (no prefetch) unless
    ``zero_prefetch`` is set, as FSDP does on CPU. Gradients are fp32 Adam's (``adam-fp32``, the
    default for an fp32 model, mixed-precision Adam otherwise; SGD runs are costed as Adam), reduced
    in fp32 (``fp32_grads``) when a 16-bit run reduces in ``reduce_dtype="fp32"``, its default;
    ``torch_fsdp`` in 16 bits keeps fp32 shards as its master weights (``fp32_shards``); ``hybrid``'s
    ZeRO-2 sums a step's microbatches in each unit's buffer before one reduce-scatter
    (``zero_accumulates``), and paralab's pipeline stages send their whole activation, not a t-th
    (``pp_scatter_gather`` off); torch's DDP
    (``torch_ddp``, ``torch_hybrid``) keeps its buckets in the gradients' dtype
    (``buckets_in_grad_dtype``), and its DTensor sequence parallelism (``torch_tp``, ``torch_hybrid``)
    the column-parallel layers' gathered inputs (``sp_keeps_gathered_inputs``); ``ddp --hierarchical``
    over emulated nodes reduces in three steps over each node's ranks (``hierarchical_dp``). The
    model is priced in the run's dtype, with its recomputation. Strategies that run the pipeline
    executor (a pp axis) make their batch before the step window opens
    (``train_loop(batch_in_window=False)``), so their predicted step holds no data loading; the others
    load inside it.
    """
    if not isinstance(cfg, RunConfig):  # None had been an AttributeError inside validate()
        raise SpecError(f"the run must be a RunConfig (RunConfig.build(model, strategy=...)), got {cfg!r}")
    try:
        layout = resolve_layout(cfg)
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    model = _as_run(lab_model(cfg.model, cfg.model_name).replace(dtype=cfg.dtype), cfg)
    parallel = ParallelSpec(
        dp=layout.dp, tp=layout.tp, pp=layout.pp, ep=layout.ep, virtual_stages=layout.virtual_stages,
        stage_layers=layout.stage_layers,
        schedule=layout.schedule or DEFAULT_SCHEDULE, microbatches=layout.microbatches,
        micro_batch=layout.micro_batch,
        zero=layout.zero, sequence_parallel=layout.sequence_parallel, recompute=cfg.recompute, cp=layout.cp,
        cp_mode=layout.cp_mode or "ring", cp_split=layout.cp_split or "zigzag",
        overlap_grad_reduce=cfg.strategy != "dp",
        reduce_scatters_in_flight=_reduce_scatters_in_flight(cfg, layout.zero),
        # FSDP2 reduces in reduce_dtype on one GPU too
        fp32_grads=((_replicas(layout) > 1 or cfg.strategy == "torch_fsdp") and model.dtype != "fp32"
                    and cfg.reduce_dtype == "fp32"),
        prefetch_params=not ((cfg.strategy == "zero3" and not cfg.zero_prefetch)
                             or (cfg.strategy == "torch_fsdp" and cfg.device == "cpu")),
        fp32_shards=cfg.strategy == "torch_fsdp" and model.dtype != "fp32",
        buckets_in_grad_dtype=cfg.strategy in ("torch_ddp", "torch_hybrid"),  # reference_ddp.wrap_ddp's
        # paralab's ZeRO zeroes its flat gradient buffers in place; every other strategy sets them to None
        grads_set_to_none=not (layout.zero and not get_strategy(cfg.strategy).reference_for),
        sp_keeps_gathered_inputs=cfg.strategy in ("torch_tp", "torch_hybrid"),  # DTensor's plan
        loads_batch_in_step="pp" not in get_strategy(cfg.strategy).axes,
        zbv_for_pass_times=False,  # the lab's ranks run ZB-V in the order found for equal passes
        pp_scatter_gather=False,  # each tp rank of a stage sends its whole activation
        zero_accumulates=layout.zero == 2 and cfg.strategy == "hybrid",  # hybrid.py's Zero(accumulations=m)
    ).resolved()
    if cfg.hierarchical:  # over the emulated (or, from a trace, real) nodes' ranks
        parallel = parallel.hierarchy_over(layout.dp // layout.nodes)
    return model, parallel.replace(grad_buckets=_gradient_messages(cfg, model, parallel),
                                   grad_copy_bytes=_gradient_copy_bytes(cfg, model, parallel))


def _paralab_zero(cfg: RunConfig, zero: int) -> bool:
    """ZeRO-2/3 as paralab's zero.py runs it, whose reduction the bridge counts; torch's FSDP
    (a reference strategy) keeps its buffers and copies to itself."""
    return zero >= 2 and not get_strategy(cfg.strategy).reference_for


# reduce-scatter inputs torch's FSDP2 keeps while later parts' gradients are made (its
# ``reduce_scatter_max_input_buffers`` default: the last part's, until the next one needs its place)
FSDP2_REDUCE_SCATTER_INPUTS = 1


def _reduce_scatters_in_flight(cfg: RunConfig, zero: int) -> int:
    """Reduce-scatters whose whole gradients a ZeRO-2/3 rank keeps on the wire as backward goes on:
    paralab's ZERO_REDUCE_SCATTERS_IN_FLIGHT, torch FSDP2's last input."""
    if zero < 2:
        return 0
    return ZERO_REDUCE_SCATTERS_IN_FLIGHT if _paralab_zero(cfg, zero) else FSDP2_REDUCE_SCATTER_INPUTS


def _replicas(parallel: ParallelSpec | Layout) -> int:
    """Ranks that average each gradient: dp, and a context-parallel run's cp ranks, which hold the same
    parameters and see other tokens of the same sequences (the strategies reduce over both)."""
    return parallel.dp * parallel.cp


def _gradient_messages(cfg: RunConfig, model: ModelSpec, parallel: ParallelSpec) -> int:
    """Gradient messages a rank sends per step: naive dp one per parameter tensor (12 per block, 2
    embeddings, 4 in the head); DDP and ZeRO-2 one per bucket, which DDP cuts at ``bucket_mb`` of the
    rank's parameters in their dtype; none counted for the other strategies. Gradients are averaged
    over the dp x cp ranks (:func:`_replicas`)."""
    if _replicas(parallel) == 1 or parallel.zero not in (0, 2):
        return 0
    if cfg.strategy == "dp":
        return counting.stage_tensors(model, ParallelSpec(), 0)
    rank_bytes = model.dtype_bytes * counting.stage_params(model, parallel, 0)
    return max(1, math.ceil(rank_bytes / int(cfg.bucket_mb * 2**20)))


def _gradient_copy_bytes(cfg: RunConfig, model: ModelSpec, parallel: ParallelSpec) -> float:
    """Bytes per parameter the rank's gradient reduction reads and writes beside its collectives, pass
    by pass as the strategies run them, with g the gradients' own bytes and r the reduce dtype's:
    naive ``dp`` divides each gradient in place (2r), widening it first and copying it back when
    r > g (g + r each); DDP's buckets (paralab's ``ddp`` and the hybrids' BucketedReducer; torch DDP
    copies the same) are flattened (2g), widened when r > g, divided (2r) and copied back (r + g), and
    torch DDP's widened ones copied back once more, from its bucket into the gradient (2g);
    paralab's ZeRO-2/3 add each gradient into a zeroed flat buffer (r, then g + 2r), divide it (2r)
    and add the reduced shard into the shard's gradient (3r/d); its ZeRO-1 divides its one flat
    buffer (2r, widened first when r > g) and copies the shard back (2r/d, none when it is the
    master weights' fp32 main_grad), d being the dp x cp ranks (:func:`_replicas`). torch FSDP's are
    not counted."""
    d = _replicas(parallel)
    if d == 1 or (parallel.zero >= 2 and not _paralab_zero(cfg, parallel.zero)):
        return 0.0
    g, r = counting.autograd_grad_bytes(model, parallel), counting.bytes_per_param(model, parallel)[1]
    widen = g + r if r > g else 0
    if cfg.strategy == "dp":
        return 2 * r + 2 * widen
    if parallel.zero == 0:
        return 2 * g + widen + 2 * r + (r + g) + (2 * g if widen and parallel.buckets_in_grad_dtype else 0)
    if parallel.zero == 1:
        return widen + 2 * r + (0 if r > g else 2 * r / d)
    return r + (g + 2 * r) + 2 * r + 3 * r / d


def _as_run(model: ModelSpec, cfg: RunConfig) -> ModelSpec:
    """The model as the run's device keeps it: torch's CPU dropout keeps masks in the activations'
    dtype, and its fused attention has no dropout, so with dropout it writes the scores out (the
    lab's sdpa falls back to torch's math SDPA, ``math_sdpa``)."""
    if not runs_on_cpu(cfg) or not model.dropout:
        return model
    return model.replace(mask_bytes=model.dtype_bytes, attention="standard",
                         math_sdpa=cfg.model.attention == "sdpa")


def runs_on_cpu(cfg: RunConfig) -> bool:
    """Whether the run's ranks compute on CPUs: asked for, or "auto" where the launcher would take the
    CPU (:func:`paralab.config.resolve_device`)."""
    return cfg.device == "cpu" or (cfg.device == "auto" and resolve_device("auto", cfg.world_size) == "cpu")


def hardware_for_run(cfg: RunConfig, hardware: str | os.PathLike | HardwareSpec = "local") -> HardwareSpec:
    """The hardware one rank of this run sees. ``local``: calibrated with the threads the rank gets
    (``paralab.runtime.worker.threads_for``), slowed by the share of a core it really has when the
    ranks want more threads than the machine has cores: its compute, and its gloo calls too (each
    step of a ring waits for the next rank to be scheduled)."""
    if isinstance(hardware, HardwareSpec):
        return hardware
    hardware = os.fspath(hardware)  # a hardware file's Path, as get_hardware takes it
    if hardware.lower() != "local":
        return get_hardware(hardware)
    if not runs_on_cpu(cfg):  # it had priced a GPU run at this machine's CPU rates
        raise SpecError("hardware 'local' is this machine's CPU ranks as calibrated, and this run computes "
                        "on GPUs; give the GPU's preset (h100, a100, ...) or a hardware file")
    from paralab.runtime.worker import threads_for, usable_cores

    threads = threads_for(cfg, cfg.world_size)
    hw = local(threads=threads)
    share = min(1.0, usable_cores() / (threads * cfg.world_size))
    if share < 1.0:
        hw = dataclasses.replace(
            cost.scale_rates(hw, share),
            host_overhead_s={k: v / share for k, v in hw.host_overhead_s.items()},
            **{name: [[n, t / share] for n, t in getattr(hw, name)] for name in MEASURED_CURVES},
        )
    return hw


def predict_memory(cfg: RunConfig) -> dict[str, float]:
    """Predicted bytes per kind on the fullest rank of the run ``cfg`` describes (no hardware needed)."""
    return cost.memory_per_gpu(*specs_from_run(cfg))


def predict_run(cfg: RunConfig, hardware: str | os.PathLike | HardwareSpec = "local") -> cost.Prediction:
    """Predicted step of the run ``cfg`` describes (``hardware``: a preset name or a HardwareSpec)."""
    model, parallel = specs_from_run(cfg)
    return cost.predict(model, parallel, hardware_for_run(cfg, hardware))


def predict_run_trace(cfg: RunConfig, hardware: str | os.PathLike | HardwareSpec = "local") -> Trace:
    """The simulated run as a Trace shaped like the measured one: every rank, ``cfg.steps`` steps back
    to back, spans named as the strategies name theirs."""
    model, parallel = specs_from_run(cfg)
    one = cost.predict_trace(model, parallel, hardware_for_run(cfg, hardware))
    p = parallel.resolved()
    step_time = one.meta["prediction"]["step_time_s"]
    spans = []
    for step in range(cfg.steps):
        shift = step * step_time
        for span in one.spans:
            peers = _global_ranks(p, span.peer) if span.peer is not None else None
            groups = [_global_ranks(p, r) for r in span.group_ranks or ()]  # the tied pair's, pipeline ranks
            for k, rank in enumerate(_global_ranks(p, span.rank)):
                spans.append(_measured_style(span, rank, step, shift, peers[k] if peers else None,
                                             [group[k] for group in groups] or None))
    # every rank is drawn here: not one replica's pipeline (replica_of), whose groups run among ranks unseen
    meta = dict({k: v for k, v in one.meta.items() if k != "replica_of"}, source="simulated",
                strategy=cfg.strategy, world_size=cfg.world_size,
                dp=p.dp, tp=p.tp, pp=p.pp, schedule=p.schedule if p.pp > 1 else "",
                microbatches=p.microbatches, virtual_stages=p.virtual_stages, model=cfg.model_name,
                tokens_per_step=cfg.global_batch * cfg.model.seq_len)
    return Trace(spans=sorted(spans, key=lambda s: (s.start, s.rank)), meta=meta)


def _global_ranks(p: ParallelSpec, pipeline_rank: int) -> list[int]:
    """Every global rank that runs pipeline rank ``pipeline_rank``'s timeline (tp fastest, then dp)."""
    base = pipeline_rank * p.dp * p.tp
    return list(range(base, base + p.dp * p.tp))


def _measured_style(span: Span, rank: int, step: int, shift: float, peer: int | None,
                    group_ranks: list[int] | None) -> Span:
    """A copy on ``rank`` and ``step``, named as the recorder names the measured spans (a simulated
    send or receive is so named already: ``sim.events``); a pipeline send's or receive's ``peer``, and
    the members of a group of pipeline ranks (the tied embedding's first and last stage), the global
    ranks at the same dp and tp place of those pipeline ranks (the pipeline rank itself had paired a
    send with no receive, or with the sender's own)."""
    name = span.name
    if span.lane == COMPUTE:
        name = span.kind  # the recorder names compute spans by kind: forward, backward, optimizer
    elif span.lane == STEP:
        name = f"step {step}"
    return dataclasses.replace(span, rank=rank, step=step, start=span.start + shift, end=span.end + shift,
                               name=name, peer=peer, group_ranks=group_ranks)
