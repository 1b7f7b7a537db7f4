"""The planner: every way to split a model over N GPUs that divides and fits, ranked by throughput
(the first row the leanest of those as fast as the fastest: :func:`leanest_first`).

Search space: tp (powers of two up to the node size, so tensor parallelism stays on NVLink, as
Narayanan et al. 2021 advise), pp (dividing the layers, or where they do not, Megatron-LM's split
with lighter end stages: :func:`paralab.stage_split.megatron_split`; beside either, the split that
evens the chunks' FLOPs, the output layer counted: :func:`_balanced_twins`), dp (what is left),
micro-batch size, schedule (1F1B, ZB-H1, interleaved with v = 2 or 4, and for a mixture of experts
DualPipeV), ZeRO stage 0..3 (with a pipeline too, as FSDP under pipelining does), recompute (none,
selective where the attention keeps its scores, full), sequence parallelism (on with tp > 1 wherever
tp divides the sequence, or each cp slice of it: same wire bytes, less memory and less elementwise
traffic under the cost model, so it never loses; where tp does not divide it, tp runs without it),
for a mixture of experts ep (every power of two dividing dp and the experts: more ep holds fewer
experts per GPU but sends more of each all-to-all across nodes) and, for long sequences (from
paralab.sim.context.LONG_SEQUENCE tokens) or a batch that does not split over the replicas, context
parallelism: cp taken out of what would be dp,
ring (zig-zag) or all-to-all where the query heads divide by cp (KV heads fewer than cp
replicated); :func:`explain` says what it bought.

Ranking is two-pass so 1,024 GPUs plan in well under 5 s: candidates that fit are scored with the
closed-form pipeline (:func:`paralab.sim.cost.predict` with ``simulate=False``), then the rows
returned are re-scored with the schedule event simulator and re-sorted. A candidate is priced only while its
floor (:func:`paralab.sim.cost.step_floor`) could still place it, which spares most of a long
sequence's thousands of layouts without changing the answer.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Iterator
from fractions import Fraction

from paralab.cyclic_gc import without_cyclic_gc
from paralab.schedules import shape_problems
from paralab.sim import context, cost, counting
from paralab.sim.specs import (
    MAX_MICROBATCHES,
    RECOMPUTE,
    HardwareSpec,
    ModelSpec,
    ParallelSpec,
    SpecError,
    kind_problems,
    sequence_parallel_divides,
    ulysses_splits,
)
from paralab.stage_split import balanced_split, megatron_split, split_text
from paralab.text import count_text

# every micro-batch size up to 8, not only powers of two: a replica batch of 3 x 2^k is common (batch 768
# on 256 replicas; MPT trained micro-batches of 6), and a power of two does not split it whole (MegaScale's
# 175B at batch 768 on 1,024 A100s plans a ZeRO-3 row of micro-batch 3 +2.2%, a ZeRO-3 row the docs call
# an upper bound); a size that does not divide the replica batch is skipped at once
MICRO_BATCHES = tuple(range(1, 9))


MOST_TOKENS_PER_STEP = 2**24  # Llama 3's largest batch, 16M tokens (its paper, Table 4)


def default_global_batch(gpus: int, seq: int) -> int:
    """Sequences per step when none is given: one per GPU, at least 512 (GPT-3's smallest batch is
    0.5M tokens), but no more than 16M tokens' worth, in a power of two (degrees divide it): one per
    GPU of 131,072-token sequences on 1,024 GPUs would be a 134M-token step, beyond any published
    run, where Llama 3 trained its long context on 16M (128 sequences)."""
    cap = 2 ** int(math.log2(max(MOST_TOKENS_PER_STEP // seq, 1)))  # a power of two, as layouts split
    return min(max(gpus, 512), cap)


def planned_batch(model: ModelSpec, gpus: int, global_batch: int | None) -> int:
    """The global batch a plan ranks its layouts for: the one given, else :func:`default_global_batch`."""
    return global_batch or default_global_batch(gpus, model.seq)


def layouts(model: ModelSpec, gpus: int, hw: HardwareSpec) -> Iterator[tuple[int, int, int]]:
    """Every (tp, pp, dp) for ``gpus`` GPUs whose degrees divide the model (tp inside a node; pp
    dividing the layers, or with an uneven split)."""
    tps = [t for t in (1, 2, 4, 8, 16, 32) if t <= hw.gpus_per_node and gpus % t == 0]
    for tp in tps:
        if model.heads % tp or model.kv_heads % tp or model.ffn % tp:
            continue
        rest = gpus // tp
        for pp in (d for d in range(1, rest + 1) if rest % d == 0 and _split(model.layers, d) is not None):
            yield tp, pp, gpus // (tp * pp)


def _split(layers: int, chunks: int) -> dict | None:
    """The ParallelSpec fields that lay ``layers`` over ``chunks`` model chunks: {} when they divide,
    Megatron-LM's uneven split with lighter ends when they do not, None when neither works."""
    if layers % chunks == 0:
        return {}
    split = megatron_split(layers, chunks)
    return dict(stage_layers=split) if split else None


def candidates(model: ModelSpec, gpus: int, hw: HardwareSpec, global_batch: int,
               fp32_grads: bool = False) -> Iterator[ParallelSpec]:
    """Every ParallelSpec for ``gpus`` GPUs whose degrees divide the model and the batch, keeping
    gradients in fp32 when ``fp32_grads`` (:func:`plan`)."""
    policies = recompute_policies(model)
    for tp, pp, replicas in layouts(model, gpus, hw):
        for cp, cp_mode in _context_parallel(model, tp, replicas, global_batch):
            dp = replicas // cp
            sequence_parallel = tp > 1 and sequence_parallel_divides(model.seq, tp, cp)
            for mb in MICRO_BATCHES:
                m = global_batch // (dp * mb)
                if global_batch % (dp * mb) or m > MAX_MICROBATCHES:  # more than a step simulates
                    continue
                for schedule, v, split in _schedules(model, pp, m):
                    for zero in (0, 1, 2, 3) if dp * cp > 1 else (0,):  # ZeRO shards over dp x cp
                        for ep in _expert_degrees(model, dp) if cp == 1 else (1,):
                            for recompute in policies:
                                yield ParallelSpec(
                                    dp=dp, tp=tp, pp=pp, ep=ep, virtual_stages=v, schedule=schedule,
                                    microbatches=m, micro_batch=mb, global_batch=global_batch, zero=zero,
                                    sequence_parallel=sequence_parallel, recompute=recompute, cp=cp,
                                    cp_mode=cp_mode, fp32_grads=fp32_grads, **split,
                                )  # fmt: skip


def recompute_policies(model: ModelSpec, cp: int = 1) -> tuple[str, ...]:
    """Recompute policies that differ for ``model`` at context-parallel degree ``cp``: without cp,
    selective recompute reruns the attention core a fused kernel already keeps nothing of, so with one
    it is no recompute by another name; across a cp split it reruns the core (the split checkpoints it:
    :func:`paralab.sim.context.reruns_fused_core`). The planner weighs the policies of cp 1 in every
    layout (selective is not searched with cp on a fused attention)."""
    return tuple(r for r in RECOMPUTE if not (r == "selective" and model.attention == "fused" and cp == 1))


def short_of_sequences(batch: int, replicas: int) -> bool:
    """Whether a batch does not split over the replicas, whole sequences each: 8 sequences on 1,024
    GPUs, or 1,000 on 1,024 replicas, leave GPUs no sequence of their own, which without cp go to
    pipeline or tensor parallelism (8 sequences had planned a 16-stage pipeline, 93% idle)."""
    return batch % replicas != 0


def _context_parallel(model: ModelSpec, tp: int, replicas: int, batch: int) -> list[tuple[int, str]]:
    """(cp, mode) to try: none for short sequences in a batch that splits over the replicas; for long
    ones, or a batch :func:`short_of_sequences`, every degree that divides the replicas and the
    sequence, as a zig-zag ring, and as all-to-all where the query heads divide too and the KV heads
    divide or are replicated (:func:`~paralab.sim.specs.ulysses_splits`)."""
    out = [(1, "ring")]
    if model.seq < context.LONG_SEQUENCE and not short_of_sequences(batch, replicas):
        return out
    for cp in (c for c in context.CP_DEGREES if replicas % c == 0 and model.seq % (2 * c) == 0):
        out.append((cp, "ring"))
        if ulysses_splits(model, tp, cp):
            out.append((cp, "alltoall"))
    return out


def _schedules(model: ModelSpec, pp: int, m: int) -> list[tuple[str, int, dict]]:
    if pp == 1:
        return [("1f1b", 1, {})]
    split = _split(model.layers, pp)
    out = [("1f1b", 1, split), ("zb-h1", 1, split)]
    for v in (2, 4):
        split = _split(model.layers, pp * v)
        if split is not None and not shape_problems("interleaved", pp, m, v):
            out.append(("interleaved", v, split))
    out += _balanced_twins(model, pp, out)
    split = _split(model.layers, 2 * pp)
    if model.experts and split is not None and not shape_problems("dualpipev", pp, m, 2):
        out.append(("dualpipev", 2, split))
    return out


def _balanced_twins(model: ModelSpec, pp: int, schedules: list[tuple[str, int, dict]]) -> list[tuple]:
    """Each of ``schedules`` again with the layers split so the chunks' FLOPs even out, the output layer
    counted on the last as its FLOPs in blocks (:func:`paralab.stage_split.balanced_split`), where that
    split leaves its busiest rank less than the one already tried. Llama 3's 128k-token vocabulary
    weighs about two blocks of its 8B model and one of its 70B: split evenly, the last stage is the
    busiest, and Llama 3 70B on 1,000 H100s plans 2.7% faster with one layer moved off its last chunk.
    (Megatron-LM's split of DeepSeek-V3, 1 + 30 x 2 + 0, already leaves the head alone on its last
    stage; a balanced split keeps a layer on every stage, so it is no twin there.)"""
    head = counting.logits_forward_flops(model) / sum(counting.layer_forward_flops(model).values())
    return [(schedule, v, dict(stage_layers=twin)) for schedule, v, split in schedules
            if (twin := _twin_split(model.layers, pp, v, head, split.get("stage_layers")))]


@functools.cache
def _twin_split(layers: int, pp: int, v: int, head: float, tried: tuple[int, ...] | None) -> tuple | None:
    """The split that evens ``pp`` x ``v`` chunks' FLOPs, where it leaves the busiest rank less than
    ``tried`` (None: even) does, else None. Cached: every layout of a plan asks for the same few."""
    chunks = pp * v
    if chunks > layers:
        return None
    even = tuple(balanced_split(layers, chunks, 0, head))
    busiest = _busiest_rank(tried or (layers // chunks,) * chunks, pp, head)
    return even if _busiest_rank(even, pp, head) < busiest else None


def _busiest_rank(split: tuple[int, ...], pp: int, head: float) -> float:
    """The most blocks' worth of work on one of ``pp`` ranks, chunk c on rank c mod pp (1F1B, ZB-H1 and
    interleaved place them so), the output layer weighing ``head`` blocks on the last chunk."""
    work = [0.0] * pp
    for chunk, layers in enumerate(split):
        work[chunk % pp] += layers + (head if chunk == len(split) - 1 else 0)
    return max(work)


def _expert_degrees(model: ModelSpec, dp: int) -> list[int]:
    """ep for a mixture of experts: powers of two dividing dp and the experts (1 for a dense model)."""
    if not model.experts:
        return [1]
    return [e for e in (2**i for i in range(12)) if e <= dp and dp % e == 0 and model.experts % e == 0]


# what a ZeRO-3 prediction counts on that measurements have not borne out (docs/simulator.md, "Not
# reproduced: ZeRO-3 at scale"), said by the planner's explanation and by simulate's notes
ZERO3_UNSHOWN = "which large runs have not shown: an upper bound (docs/simulator.md)"
REFINED_ROWS = 10  # rows a plan simulates unless told: its default top, whatever top it returns
# rates within this share of the faster are as fast: the plan's winner is the leanest of them, and the
# explanation says a runner-up this close is as fast
AS_FAST = 5e-4


@without_cyclic_gc
def plan(
    model: ModelSpec, gpus: int, hw: HardwareSpec, global_batch: int | None = None, top: int = 10,
    refine: int | None = None, fp32_grads: bool = False, keep: dict[str, int] | None = None
) -> list[cost.Prediction]:
    """Configurations that fit, fastest first, but for the first row (:func:`leanest_first`); at most
    ``top``; empty when nothing fits. With ``keep`` (degrees by name, ``{"tp": 2, "pp": 2}``) only the
    layouts with those degrees: what else a layout that does not fit could change (its schedule,
    micro-batch, ZeRO stage, recompute) to fit.

    Gradients are kept and reduced in the model's dtype, as torch's FSDP does by default; with
    ``fp32_grads`` in fp32, as Megatron-LM's main_grad does by default under bf16 (2 more bytes a
    parameter, unsharded below ZeRO-2, and twice the bytes of the gradient reduction).

    Candidates are scored by the closed form, then the ``refine`` fastest (default: the ``top``
    returned, and at least :data:`REFINED_ROWS`, so that asking for fewer rows only truncates) are
    simulated event by event (those of more than ``cost.SIMULATED_PASSES`` passes priced as
    :func:`paralab.sim.cost.pipeline_pricing` says), again until the ``refine`` fastest are all
    refined ones: a closed form that was optimistic must not keep a place the simulation took from
    it, and rows shown side by side are priced alike
    (a DualPipeV row left in closed form, 3% pessimistic, had been ranked below a simulated layout
    slower than its simulation).

    Pricing every candidate would take seconds at 1,024 GPUs with context parallel in the search, so
    they are taken cheapest floor first (:func:`paralab.sim.cost.step_floor`, a bound no closed form
    of theirs undercuts), and one is priced (memory, then the closed form) only while its floor could
    still put it among the first ``max(top, refine)``: the answer is the one pricing them all gives
    (rows exactly as fast and as full go to the earlier candidate)."""
    cost.check_types(model, ParallelSpec(), hw)  # a preset's name had been an AttributeError
    if problems := (_request_problems(gpus, global_batch, top, refine) + _keep_problems(keep)
                    or cost.machine_problems(model, hw)):
        raise SpecError("; ".join(problems))  # before any floor divides by what it gives
    refine = max(top, REFINED_ROWS) if refine is None else refine
    places = max(top, refine)
    if places < 1:
        return []
    batch = planned_batch(model, gpus, global_batch)
    limit = cost.usable_memory(hw)
    tokens = batch * model.seq
    floors: dict[tuple, float] = {}

    def floor(run: ModelSpec, spec: ParallelSpec) -> float:
        """A layout's floor, kept for the layouts that share it: ZeRO moves only what a floor leaves out
        (one serves its 4 stages), and a cp layout's slice run (``run``, cp 1) reads neither cp mode nor
        split (the ring and all-to-all layouts of a shape share it; cost.step_floor's ``slice_floor``)."""
        ignored = ("zero", "_hash") if spec.cp > 1 else ("zero", "_hash", "cp_mode", "cp_split")
        key = (run, *(value for name, value in vars(spec).items() if name not in ignored))
        if key not in floors:
            floors[key] = cost.step_floor(run, spec, hw, floor)
        return floors[key]

    specs = candidates(model, gpus, hw, batch, fp32_grads)
    if keep:
        specs = (spec for spec in specs if all(getattr(spec, k) == v for k, v in keep.items()))
    waiting = sorted((floor(model, spec), i, spec) for i, spec in enumerate(specs))
    waiting.reverse()  # cheapest floor last, to pop
    # (rank, prediction, simulated), fastest first; a tie keeps the candidates' order
    rows: list[tuple[tuple, cost.Prediction, bool]] = []

    def could_place(seconds: float) -> bool:  # a floor of ``seconds``
        best = -tokens / seconds if seconds else -math.inf
        return len(rows) < places or (best, 0.0) <= rows[places - 1][0][:2]

    def price_while_placing() -> None:
        while waiting and could_place(waiting[-1][0]):
            _, i, spec = waiting.pop()
            if cost.memory_per_gpu(model, spec)["total"] <= limit:
                pred = cost.predict(model, spec, hw, simulate=False)
                bisect.insort(rows, ((*_rank(pred), i), pred, False))

    price_while_placing()
    while unsimulated := [i for i, (*_, simulated) in enumerate(rows[:refine]) if not simulated]:
        for i in unsimulated:
            key, pred, _ = rows[i]
            pred = cost.predict(model, pred.parallel, hw)
            rows[i] = ((*_rank(pred), key[-1]), pred, True)
        rows.sort(key=lambda row: row[0])
        price_while_placing()
    return leanest_first([pred for _, pred, _ in rows], refine)[:top]


def leanest_first(ranked: list[cost.Prediction], refine: int) -> list[cost.Prediction]:
    """``ranked`` (fastest first) with the leanest of the first ``refine`` rows as fast as the fastest
    (within :data:`AS_FAST`) moved to the front: ZeRO-0 at 68.0 GiB had won over ZeRO-1 at 45.9, 0.01%
    slower, the explanation calling the leaner runner-up as fast. A ZeRO-3 row goes first only where no
    other is as fast: its gathers are priced as hidden, which large runs have not shown (an upper bound,
    docs/simulator.md). Of rows alike, the first (the faster)."""
    fastest = ranked[0].tokens_per_s if ranked else 0.0
    as_fast = [pred for pred in ranked[:refine] if pred.tokens_per_s >= fastest * (1 - AS_FAST)]
    if not as_fast:
        return ranked
    leanest = min(as_fast, key=lambda pred: (pred.parallel.zero == 3, pred.memory_bytes_per_gpu["total"]))
    return [leanest, *(pred for pred in ranked if pred is not leanest)]


def _request_problems(gpus, global_batch, top, refine) -> list[str]:
    """What a plan cannot be asked for: a GPU count that is not a whole number >= 1, a batch that is
    not whole (0: the default), or a negative number of rows (8.5 sequences had planned nothing and
    then advised 9.0; top -1 had returned three rows)."""
    asked = {"gpus": (gpus, 1), "global_batch": (global_batch, 0), "top": (top, 0), "refine": (refine, 0)}
    return [f"{name} must be a whole number >= {low}, got {value!r}" for name, (value, low) in asked.items()
            if value is not None and not (type(value) is int and value >= low)]


def _keep_problems(keep) -> list[str]:
    """What ``keep`` cannot ask: a setting ParallelSpec does not have (had been an AttributeError), or
    a value not of its kind (tp "2" had matched no layout, an empty plan read as "nothing fits")."""
    if keep is None:
        return []
    if not isinstance(keep, dict):
        return [f"keep must be a dict of ParallelSpec settings, like {{'tp': 2}}, got {keep!r}"]
    if unknown := sorted(set(keep) - set(ParallelSpec.__dataclass_fields__)):
        return [f"keep: ParallelSpec has no setting {', '.join(map(repr, unknown))}"]
    return kind_problems(ParallelSpec().replace(**keep), "keep")


def why_nothing_fits(model: ModelSpec, gpus: int, hw: HardwareSpec, global_batch: int | None = None,
                     fp32_grads: bool = False) -> str:
    """Why :func:`plan` came back empty, and what would do: a batch that splits, or more GPUs."""
    batch = planned_batch(model, gpus, global_batch)
    replicas = [dp for _, _, dp in layouts(model, gpus, hw)]
    if not replicas:
        return (f"no tp x pp x dp split of {gpus:,} GPUs divides {model.name}'s heads ({model.heads}, "
                f"{model.kv_heads} KV) and MLP width ({model.ffn}) with tp <= {hw.gpus_per_node}")
    specs = list(candidates(model, gpus, hw, batch, fp32_grads))
    if not specs:
        # context parallelism takes its degree out of the replicas
        fewest = min(dp // cp for tp, _, dp in layouts(model, gpus, hw)
                     for cp, _ in _context_parallel(model, tp, dp, batch))
        batch_text = f"{batch:,}" + ("" if global_batch else " (the planner's default here)")
        if batch > MAX_MICROBATCHES * max(MICRO_BATCHES) * max(replicas):
            return (f"a global batch of {batch_text} is more than the planner's layouts take: "
                    f"{MAX_MICROBATCHES:,} microbatches of at most {max(MICRO_BATCHES)} sequences per "
                    f"replica on {count_text(gpus, 'GPU')}")
        return (f"no split of {count_text(gpus, 'GPU')} divides a global batch of {batch_text} "
                f"(dp x micro-batch must divide it); the fewest replicas a split here has is dp {fewest:,}: "
                f"try a global batch of {nearest_multiple(batch, fewest):,}")
    smallest, _, lean = min((cost.memory_per_gpu(model, spec)["total"], i, spec)
                            for i, spec in enumerate(specs))
    usable = cost.usable_memory(hw)
    # weights, gradients and Adam's states per parameter (2 + 2 + 12 in mixed precision), fully sharded
    per_param = sum(counting.bytes_per_param(model, ParallelSpec(fp32_grads=fp32_grads).resolved()))
    states = per_param * counting.parameter_counts(model)["total"]
    least = math.ceil(states / usable)  # a bound: activations, and layouts that split, may ask more
    leanest = (f"the leanest of {len(specs):,} splits needs {bytes_text(smallest)} per GPU "
               f"against {bytes_text(usable)} usable; ")
    if least > gpus:
        return leanest + (f"{model.name}'s model states alone are {bytes_text(states)}, the usable memory "
                          f"of {least} {hw.name} GPUs at least")
    return leanest + "the activations are what does not fit: try " + _leaner_activations(model, lean)


def _leaner_activations(model: ModelSpec, lean: ParallelSpec) -> str:
    """What could shrink the activations of the leanest layout, ``lean``: a smaller micro-batch only
    where it has one to shrink, and a fused attention where the s x s scores are stored (a 65,536-token
    sequence's scores, 109 GiB on 4 GPUs, had been told to take a micro-batch of 1, which it had)."""
    tries = ["more GPUs", "a shorter sequence"]
    if lean.micro_batch > 1:
        tries.append(f"a micro-batch below its {lean.micro_batch}")
    if model.attention == "standard":
        tries.append("a fused (flash) attention, which keeps no s x s scores")
    return ", ".join(tries[:-1]) + " or " + tries[-1]


def replicas_shut_out(model: ModelSpec, gpus: int, hw: HardwareSpec, global_batch: int) -> list[int]:
    """The replica counts of this machine's layouts (dp, less what context parallelism takes of it)
    that ``global_batch`` does not split over (a replica takes whole sequences), fewest first, where
    the nearest batch that does stays within the planner's most tokens a step: a default batch of 512
    on 7 GPUs leaves out dp 7."""
    most = max(MOST_TOKENS_PER_STEP // model.seq, 1)
    replicas = {dp // cp for tp, _, dp in layouts(model, gpus, hw)
                for cp, _ in _context_parallel(model, tp, dp, global_batch)}
    return sorted(n for n in replicas if global_batch % n and nearest_multiple(global_batch, n) <= most)


def nearest_multiple(batch: int, step: int) -> int:
    """The multiple of ``step`` nearest ``batch`` (the larger on a tie; ``step`` at least)."""
    below = batch // step * step
    return below if below and batch - below < below + step - batch else below + step


def _rank(pred: cost.Prediction) -> tuple[float, float]:
    return (-pred.tokens_per_s, pred.memory_bytes_per_gpu["total"])


def describe(p: ParallelSpec) -> str:
    """One line naming every choice of a configuration."""
    sched = f"{p.schedule} v={p.virtual_stages}" if p.virtual_stages > 1 else p.schedule
    imbalance = f", expert imbalance {p.expert_imbalance:g}" if p.expert_imbalance != 1 else ""
    parts = [degrees_text(p) + imbalance]
    if p.pp > 1:
        parts.append(sched)
    if p.stage_layers is not None:  # per model chunk: a rank of a multi-chunk schedule holds several
        where = "stage" if p.chunks == p.pp else f"model chunk (pp x {p.chunks // p.pp} = {p.chunks})"
        parts.append(f"layers per {where} {split_text(p.stage_layers)}")
    parts += [f"{count_text(p.microbatches, 'microbatch', 'microbatches')} of {p.micro_batch}",
              f"ZeRO-{p.zero}" + _fsdp_text(p) + (", fp32 gradients" if p.fp32_grads else ""),
              f"recompute {p.recompute}"]
    if p.sequence_parallel:
        parts.append("sequence parallel")
    if p.hierarchical_dp:
        parts.append(f"hierarchical all-reduce over nodes of {p.hierarchical_dp} dp ranks")
    return ", ".join(parts)


def degrees_text(p: ParallelSpec, split: bool = True) -> str:
    """How a configuration splits its GPUs: tp x pp x dp, its experts over ep and sequences over cp (a
    ring's split named unless ``split`` is False: zigzag and contiguous rings differ in step time, and had
    read alike)."""
    ring = f" {p.cp_split}" if p.cp_mode == "ring" and split else ""
    return (f"tp {p.tp} x pp {p.pp} x dp {p.dp:,}" + (f" (ep {p.ep})" if p.ep > 1 else "")
            + (f" x cp {p.cp} {p.cp_mode}{ring}" if p.cp > 1 else ""))


def _compute_cause(win: ParallelSpec, run: ParallelSpec) -> str:
    """Why a layout computes more than the winner, as " from ...": it recomputes more, or its GEMMs
    are shaped otherwise (another split of the heads, the sequence, the experts or the batch: smaller
    ones run further from peak); empty where neither differs (a recompute no heavier than the winner's
    is not the cause)."""
    causes = []
    if RECOMPUTE.index(run.recompute) > RECOMPUTE.index(win.recompute):
        causes.append(f"recompute {run.recompute} (the winner's: {win.recompute})")
    if _gemm_split(run) != _gemm_split(win):
        causes.append("smaller GEMMs")
    return " from " + " or ".join(causes) if causes else ""


def _gemm_split(p: ParallelSpec) -> tuple[int, Fraction, int]:
    """What sets the shapes of a layout's GEMMs: tp (the heads and MLP width), the tokens of a
    microbatch on one GPU (sequences over cp's split: cp 2 of 2 sequences multiplies what cp 1 of 1
    does) and ep (the tokens an expert gets)."""
    return p.tp, Fraction(p.micro_batch, p.cp), p.ep


def _fsdp_text(p: ParallelSpec) -> str:
    """How PyTorch FSDP's ZeRO-3 differs, where it does: its root unit, its fp32 shards."""
    kinds = [name for name, on in (("FSDP root unit", p.fsdp_root), ("fp32 shards", p.fp32_shards)) if on]
    return f" ({', '.join(kinds)})" if kinds else ""


LOSSES = {
    "bubble": "the pipeline bubble",
    "tp_comm": "tensor-parallel communication",
    "ep_comm": "the expert-parallel all-to-alls",
    "dp_comm_exposed": "exposed data-parallel communication",
    "optimizer": "the optimizer step",
    "cp_comm_exposed": "the exposed context-parallel communication",
}


def explain(ranked: list[cost.Prediction], model: ModelSpec | None = None,
            hw: HardwareSpec | None = None) -> list[str]:
    """One sentence for the winner and one for the runner-up, naming what decides between them; with
    the model and hardware, one more when the winner is context parallel, saying why."""
    if not ranked:
        return []
    win = ranked[0]
    out = [
        f"Winner: {describe(win.parallel)} - {flops_text(win.tflops_per_gpu)} of hardware FLOPs per GPU "
        f"({win.hfu:.0%} HFU, {win.mfu:.0%} MFU), "
        f"{bytes_text(win.memory_bytes_per_gpu['total'])} per GPU; {_largest_loss(win, model, hw)}."
        + (f" It counts on the rest of ZeRO-3's gathers hiding under compute, {ZERO3_UNSHOWN}."
           if win.parallel.zero == 3 else "")
    ]
    if win.parallel.cp > 1 and model is not None and hw is not None:
        out.append(why_context_parallel(win, model, hw))
    if len(ranked) > 1:
        run = ranked[1]
        slower = win.tokens_per_s / run.tokens_per_s - 1
        deltas = {k: run.breakdown_s.get(k, 0.0) - win.breakdown_s.get(k, 0.0) for k in (*LOSSES, "compute")}
        losses = sorted((k for k in deltas if deltas[k] > 0), key=deltas.get, reverse=True)
        cause, offset = max(deltas, key=deltas.get), min(deltas, key=deltas.get)
        computes = f"more compute per step{_compute_cause(win.parallel, run.parallel)}"
        reason = computes if cause == "compute" else f"more time in {LOSSES[cause]}"
        # a large gain elsewhere would leave the reader wondering how so large a cause makes so small a gap
        gain, gained = ("compute" if offset == "compute" else f"time in {LOSSES[offset]}"), -deltas[offset]
        partly = (f", partly made up by less {gain} ({seconds_text(gained)})"
                  if 0 < 0.25 * deltas[cause] < gained < deltas[cause] else "")
        if gained >= deltas[cause] > 0 and len(losses) > 1:  # the gain outweighs the cause: what else lost
            second = "compute" if losses[1] == "compute" else LOSSES[losses[1]]
            partly = (f" and {second} ({seconds_text(deltas[losses[1]])}), against less {gain} "
                      f"({seconds_text(gained)})")
        # as fast, e.g. selective recompute with fused attention (nothing to drop); a row a little faster
        # than the winner is behind it for its memory (leanest_first)
        why = (f"{slower:.1%} slower, mainly {reason} (+{seconds_text(abs(deltas[cause]))} a step){partly}"
               if slower > AS_FAST else "as fast: what differs costs nothing here" if slower >= 0 else
               f"as fast ({-slower:.2%} faster, within {AS_FAST:.2%}), behind the leaner winner")
        memory = bytes_text(run.memory_bytes_per_gpu["total"])
        out.append(f"Runner-up: {describe(run.parallel)} - {why}, at {memory} per GPU.")
    return out


def _largest_loss(win: cost.Prediction, model: ModelSpec | None, hw: HardwareSpec | None) -> str:
    """The winner's largest loss, with its share of the step: one of :data:`LOSSES`, or, given the model
    and hardware, its recompute (:func:`_without_recompute`), which the breakdown counts as compute
    (Llama 3 405B on 512 H100s had been said to lose most to data-parallel communication, 3% of the
    step, where full recompute takes 24% of it)."""
    losses = {k: win.breakdown_s.get(k, 0.0) for k in LOSSES}
    without = _without_recompute(win, model, hw)
    if without is not None:  # what recompute adds, the layout with and without it priced alike
        with_it = cost.predict(model, win.parallel, hw, simulate=False)
        losses["recompute"] = with_it.step_time_s - without.step_time_s
    biggest = max(losses, key=losses.get)
    share = losses[biggest] / win.step_time_s
    if sum(losses.values()) / win.step_time_s < 0.01:
        return _small_losses_text(win, recompute_priced=without is not None)
    if biggest == "recompute":
        return _recompute_text(win, without, hw, share, losses[biggest])
    uneven = (_uneven_stages_text(win, model, hw) if biggest == "bubble" and model is not None
              and hw is not None else "")
    # under ZeRO-3 that is its gathers and reduce-scatters where they do not hide, which the sentence
    # after it (its gathers hiding) had seemed to contradict
    whose = (" (ZeRO-3's gathers and reduce-scatters, where they do not hide)"
             if biggest == "dp_comm_exposed" and win.parallel.zero == 3 else "")
    return f"its largest loss is {LOSSES[biggest]}{whose} ({share:.0%} of the step){uneven}"


def _small_losses_text(win: cost.Prediction, recompute_priced: bool) -> str:
    """Losses that add up to under 1% explain nothing: what MFU misses is then in the kernels' own speed
    (and in the forward a recompute reruns, where its time was not priced apart)."""
    losses = "the bubble, communication, recompute" if recompute_priced else "the bubble, communication"
    unpriced = win.parallel.recompute != "none" and not recompute_priced
    rerun = " and the forward it recomputes" if unpriced else ""
    return (f"it loses under 1% of the step to {losses} and the optimizer together: what its MFU misses is "
            f"in its kernels' own speed{rerun}")


def _without_recompute(win: cost.Prediction, model: ModelSpec | None,
                       hw: HardwareSpec | None) -> cost.Prediction | None:
    """The winner's layout without recompute, by the closed form (the time recompute adds is the
    difference of two such: a second simulation could double a plan's time); None where the winner
    does not recompute or the model and hardware are not given."""
    if win.parallel.recompute == "none" or model is None or hw is None:
        return None
    return cost.predict(model, win.parallel.replace(recompute="none", recompute_layers=0), hw, simulate=False)


RERUN = {"selective": "the attention core's forward", "full": "the forward"}  # what each recompute runs again


def _recompute_text(win: cost.Prediction, without: cost.Prediction, hw: HardwareSpec, share: float,
                    seconds: float) -> str:
    """Recompute as the winner's largest loss: what it reruns, what it costs, and whether memory forces
    it (the layout's memory without it, against what may be filled)."""
    needs, usable = without.memory_bytes_per_gpu["total"], cost.usable_memory(hw)
    verdict = (f"which memory forces: without it this layout needs {bytes_text(needs)} per GPU, over the "
               f"{bytes_text(usable)} usable" if needs > usable else
               f"though without it this layout would fit, at {bytes_text(needs)} per GPU")
    return (f"its largest loss is recompute {win.parallel.recompute}, {RERUN[win.parallel.recompute]} run "
            f"again in backward ({share:.0%} of the step, {seconds_text(seconds)}), {verdict}")


def _uneven_stages_text(win: cost.Prediction, model: ModelSpec, hw: HardwareSpec) -> str:
    """Where most of a pipeline's idle time is its ranks' unequal work, that, not the schedule's ramp,
    is the cause, and more microbatches do not shrink it (32 layers on 7 stages: 89%)."""
    uneven = cost.stage_imbalance(model, win.parallel, hw)
    if uneven < 0.5 * win.bubble_fraction:
        return ""
    return (f", most of it stages of unequal work ({uneven / win.bubble_fraction:.0%} of the idle time), "
            "which more microbatches do not shrink")


def flops_text(tflops: float) -> str:
    """A FLOP rate in the unit that keeps 3 digits: TFLOP/s on GPUs, GFLOP/s on a CPU."""
    return (f"{tflops:.0f} TFLOP/s" if tflops >= 10 else f"{tflops:.1f} TFLOP/s" if tflops >= 1
            else f"{tflops * 1e3:.1f} GFLOP/s")


def seconds_text(seconds: float) -> str:
    """A duration in ms below 10 s, with decimals below 100 ms (a small model's step is a fraction of
    one: "0.294 ms", "13.7 ms"), else in s (a long sequence's step takes minutes)."""
    ms = seconds * 1e3
    if ms < 100:
        return f"{ms:.{3 if ms < 1 else 2 if ms < 10 else 1}f} ms"
    return f"{ms:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def bytes_text(nbytes: float) -> str:
    """A memory size in GiB, or MiB below one GiB (the lab's models)."""
    return f"{nbytes / 2**30:,.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def why_context_parallel(win: cost.Prediction, model: ModelSpec, hw: HardwareSpec) -> str:
    """Why the winner splits its sequences: its activations per GPU against the same layout's without
    cp (does that fit?), and what the split costs in exposed communication."""
    p = win.parallel
    # the same layout on whole sequences; against a ring, its attention scores not kept either (the ring
    # keeps none), where an all-to-all's attention keeps its heads' scores as the unsplit layout does
    recompute = "selective" if p.recompute == "none" and p.cp_mode == "ring" else p.recompute
    unsplit = cost.memory_per_gpu(model, p.replace(cp=1, recompute=recompute))
    verdict = "would not fit" if unsplit["total"] > cost.usable_memory(hw) else "would fit"
    how = "K/V blocks travel a ring beside the attention" if p.cp_mode == "ring" else \
        "all-to-alls swap sequence and heads around the attention"
    exposed = win.breakdown_s.get("cp_comm_exposed", 0.0) / win.step_time_s
    do = "does" if p.global_batch == 1 else "do"
    few = (f"the batch's {count_text(p.global_batch, 'sequence')} {do} not split over the {p.dp * p.cp:,} "
           f"replicas this layout has without cp, and cp puts {p.cp} GPUs on each sequence; "
           if short_of_sequences(p.global_batch, p.dp * p.cp) else "")
    return (f"Context parallel cp {p.cp} ({p.cp_mode}): {few}each GPU holds {model.seq // p.cp:,} of each "
            f"sequence's {model.seq:,} tokens, so its activations are "
            f"{bytes_text(win.memory_bytes_per_gpu['activations'])} "
            f"where the same layout unsplit keeps {bytes_text(unsplit['activations'])} ({verdict}: "
            f"{bytes_text(unsplit['total'])} per GPU in all); {how}, {exposed:.1%} of the step exposed.")
