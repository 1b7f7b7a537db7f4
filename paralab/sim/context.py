"""Context parallelism in the simulator: what splitting every sequence over cp GPUs costs and saves.

Every part of a layer but attention works token by token, so a cp run is, attention aside, a
data-parallel run over dp x cp replicas whose sequences are s / cp tokens long (:func:`slice_run`):
its linear layers, norms, MLP, loss and their activations see a slice; the gradients are averaged,
and ZeRO shards, over dp x cp. :func:`predict` predicts that run with the cost model, then adds
what attention adds:

- compute: a rank's queries meet every key of the sequence, so its attention core (QK^T, PV and
  the softmax traffic) is cp times the slice's; a contiguous split gives the ranks unequal shares
  of the causal work (paralab.strategies.sequence_split), and the ring waits for the slowest;
- communication. Ring: per layer and microbatch, cp-1 K/V hops forward, cp-1 K/V and cp dK/dV hops
  backward (2 x the slice's K or V each), every hop beside one step's attention; :func:`ring_steps`
  runs the ring step by step, so a hop is hidden while its step computes longer than it travels
  and exposed when the block is too small or the link too slow. All-to-all (Ulysses): q, k, v and
  the output forward, their gradients backward, each (cp-1)/cp of the slice's tensor, blocking (K
  and V replicated where the KV heads are fewer than cp: :func:`~paralab.sim.specs.ulysses_kv_heads`);
- memory: the ring keeps no attention scores (its tiles are recomputed in backward, as a
  flash-attention kernel does); the all-to-all's attention keeps its scores for heads / cp heads of
  the whole sequence, 1/cp of what the unsplit model keeps, and K and V replicas where it made them.

Model states are the whole model's: the slice run keeps the whole learned position table
(``position_rows``), which every cp rank holds and all-reduces, though its slice reads only its rows.
With a pipeline the extra attention time is added to each microbatch's passes over the slowest
rank's layers, stretched by the schedule's closed-form bubble (m + p - 1 passes of a stage under
1F1B, m + (p - 1) / v of a rank's under the interleaved schedule, p m under the naive one).
Recompute reruns attention across the split, its traffic included: full recompute with the rest of a
layer's forward, selective recompute alone (:func:`attention_rerun`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cached_property, lru_cache

from paralab.schedules import theoretical_bubble
from paralab.sim import cost, counting, memory  # cost hands cp > 1 here (cost.CONTEXT_PARALLEL, below)
from paralab.sim.specs import HardwareSpec, ModelSpec, ParallelSpec, ulysses_kv_heads
from paralab.strategies.sequence_split import ring_source, step_tiles
from paralab.trace import COMM, COMPUTE, Span, Trace

# tokens from which the planner considers cp (Llama 3: cp 16 at 131,072, none at 8,192); below, only for a
# batch that does not split over the replicas (planner.short_of_sequences)
LONG_SEQUENCE = 16384
CP_DEGREES = (2, 4, 8, 16, 32)


@lru_cache(maxsize=4096)
def slice_run(model: ModelSpec, parallel: ParallelSpec) -> tuple[ModelSpec, ParallelSpec]:
    """The data-parallel run a cp run is for everything but attention: dp x cp replicas, each with
    the same sequences per microbatch, s / cp tokens long, and the whole position table (kept per spec:
    a prediction asks it of its memory, its attention and its time)."""
    p = parallel.resolved()
    return (model.replace(seq=model.seq // p.cp, position_rows=model.position_rows or model.seq),
            p.replace(dp=p.dp * p.cp, cp=1, global_batch=p.global_batch * p.cp))


def hop_bytes(model: ModelSpec, p: ParallelSpec) -> float:
    """One ring hop: the K and V of a slice (this tp rank's heads)."""
    return 2 * p.micro_batch * model.seq // p.cp * model.kv_dim / p.tp * model.dtype_bytes


def alltoall_payloads(model: ModelSpec, p: ParallelSpec) -> list[float]:
    """The four tensors of a layer's forward all-to-alls (q, k, v, output), the slice's, this tp rank's
    heads (K and V replicated where they are fewer than cp: :func:`~paralab.sim.specs.ulysses_kv_heads`);
    backward sends their gradients, the same sizes."""
    token_bytes = p.micro_batch * model.seq // p.cp * model.dtype_bytes / p.tp
    kv = ulysses_kv_heads(model, p.tp, p.cp) * p.tp * model.head_dim  # kv_dim where none is replicated
    return [token_bytes * width for width in (model.hidden, kv, kv, model.hidden)]


def kv_replica_bytes(model: ModelSpec, p: ParallelSpec) -> float:
    """What one layer's all-to-all attention keeps of one microbatch beyond the slice's K and V, where
    it replicated the KV heads (:func:`~paralab.sim.specs.ulysses_kv_heads`): the core keeps its
    whole-sequence K and V for backward, cp / k times the slice's (Llama 3 405B at tp 8 x cp 16, 131,072
    tokens, sequence parallel: a tenth more activations). 0 for the ring. A layer recompute reruns
    rebuilds its replicas in backward, one layer's worth beside the peak, which is not counted."""
    if p.cp_mode != "alltoall":
        return 0.0
    replicated = ulysses_kv_heads(model, p.tp, p.cp) - model.kv_heads // p.tp
    return 2 * p.micro_batch * model.seq // p.cp * model.head_dim * replicated * model.dtype_bytes


def comm_payloads(model: ModelSpec, parallel: ParallelSpec,
                  rank: int = 0) -> list[tuple[str, str, float, int, float]]:
    """What one GPU of pipeline rank ``rank`` sends per step for context parallelism, as
    counting.comm_payloads' rows (family cp, op, payload, group size, count per step); the rest of its
    traffic is the slice run's. Ring: per layer and microbatch 3 cp - 2 hops to the ring's next rank
    (cp - 1 K/V forward, cp - 1 K/V and cp dK/dV backward); all-to-all: each of the four tensors
    forward and its gradient backward. Recompute sends a forward's again in backward: a layer full
    recompute reruns, all of it; selective recompute reruns the attention core, the split included
    (:func:`attention_rerun`): the ring's K/V hops, the all-to-alls of q, k and v (not the output's:
    nothing kept needs it)."""
    p = parallel.resolved()
    passes = counting.rank_layers(model, p, rank) * p.microbatches
    full = counting.recompute_share(model, p)  # of the layers, those whose forward runs twice
    core = attention_rerun(model, p)
    if p.cp_mode == "ring":
        return [("cp", "send", hop_bytes(model, p), p.cp, passes * (3 * p.cp - 2 + core * (p.cp - 1)))]
    q, k, v, out = alltoall_payloads(model, p)
    return ([("cp", "all_to_all", payload, p.cp, passes * (2 + core)) for payload in (q, k, v)]
            + [("cp", "all_to_all", out, p.cp, passes * (2 + full))])


def attention_rerun(model: ModelSpec, p: ParallelSpec) -> float:
    """Of the layers, those whose attention across the split runs again before their backward: every
    one under selective recompute, which checkpoints the attention core, fused or not (as paralab's
    recompute and Megatron-LM's core_attn recompute do), those full recompute reruns otherwise."""
    return 1.0 if p.recompute == "selective" else counting.recompute_share(model, p)


def gpu_payloads(model: ModelSpec, parallel: ParallelSpec,
                 rank: int = 0) -> list[tuple[str, str, float, int, float]]:
    """Every collective one GPU of pipeline rank ``rank`` issues per step: the slice run's
    (counting.comm_payloads) and the split's (:func:`comm_payloads`)."""
    return counting.comm_payloads(*slice_run(model, parallel), rank) + comm_payloads(model, parallel, rank)


def comm_bytes_per_gpu(model: ModelSpec, parallel: ParallelSpec) -> dict[str, float]:
    """Wire bytes per step the busiest GPU sends, keyed as counting's: the slice run's traffic and the
    split's (cp_send or cp_all_to_all), on the pipeline rank that sends the most of them in all."""
    p = parallel.resolved()
    return counting.busiest_wire_bytes(model, p, lambda rank: gpu_payloads(model, p, rank))


# ------------------------------------------------------------------------------------------- time
def _link_time(hw: HardwareSpec, nbytes: float, inter: bool) -> float:
    if hw.p2p_curve and not inter:
        return cost.interpolate(hw.p2p_curve, nbytes)
    return (hw.inter_latency + nbytes / hw.inter_bw) if inter else (hw.intra_latency + nbytes / hw.intra_bw)


def hop_time(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds for one K/V block to reach the next rank: its cp group is tp x cp consecutive ranks,
    inside a node when they fit."""
    return _link_time(hw, hop_bytes(model, p), p.tp * p.cp > hw.gpus_per_node)


def attention_times(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core on one rank of ``p`` (resolved, cp 1)
    and its softmax traffic, as the cost model's layer counts them (cost.layer_work: a fused kernel
    skips the causally masked half and takes 2.5 x its forward in backward, the standard core 2 x; a
    forward selective recompute reruns is :func:`attention_rerun`'s)."""
    rank_hw = cost.per_rank(hw, p.world_size)
    work = cost.layer_work(model, p, rank_hw)
    traffic = work.core_elementwise_bytes
    forward = work.core + traffic / cost.elementwise_bandwidth(rank_hw)
    backward = work.core_backward + 2 * traffic / cost.elementwise_bandwidth(rank_hw, backward=True)
    return forward, backward


def block_times(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, ring: bool = False
                ) -> tuple[float, float]:
    """(forward, backward) seconds of one (s/cp x s/cp) attention block on one rank: the slice run's
    attention (:func:`attention_times`); with ``ring`` as a ring step computes it, which reruns a
    standard core's forward in backward (:func:`ring_rescores`)."""
    sm, sp = slice_run(model, p)
    forward, backward = attention_times(sm, sp.resolved(), hw)
    return forward, backward + (forward if ring and ring_rescores(model) else 0.0)


def ring_rescores(model: ModelSpec) -> bool:
    """Whether a ring step's backward reruns its tile's attention forward whatever the run's recompute:
    over a standard core, whose scores ring_attention.py keeps none of; a fused kernel's backward
    recomputes them anyway, inside the 2.5 forwards it is priced at."""
    return model.attention == "standard"


def reruns_fused_core(model: ModelSpec, p: ParallelSpec) -> bool:
    """Whether selective recompute reruns a fused core: across the split it does (the attention is
    checkpointed, :func:`attention_rerun`), where the unsplit model's fused core keeps nothing to
    drop and is neither timed nor counted again (cost.layer_work, counting.flops_per_step)."""
    return p.recompute == "selective" and model.attention != "standard"


def core_reruns(model: ModelSpec, p: ParallelSpec) -> float:
    """Forwards of each layer's attention core (as it runs: a causal fused kernel's half square) that a
    cp run computes beyond what counting.flops_per_step counts of the unsplit run, as its time prices
    them: a ring step's rerun of a standard core in backward, and selective recompute's rerun of a
    fused core. Hardware FLOPs had left both out (HFU fell as the step grew)."""
    return float(p.cp_mode == "ring" and ring_rescores(model)) + float(reruns_fused_core(model, p))


def ring_step_compute(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> list[list[float]]:
    """Forward seconds of each rank's attention at each ring step, [rank][step]: a block's time scaled
    by the query-key pairs of that step's tiles over the mean (so a balanced ring spends one block
    per step, cp blocks in all, and a contiguous split loads the later ranks)."""
    block, _ = block_times(model, p, hw, ring=True)
    return [[block * share for share in row] for row in _pair_shares(p.cp, p.cp_split, model.seq)]


@lru_cache(maxsize=64)
def _pair_shares(cp: int, split: str, seq: int) -> tuple[tuple[float, ...], ...]:
    """[rank][step] query-key pairs of a ring step's tiles over the mean: the same for every layout the
    planner weighs at one cp (it asks thousands), so counted once."""
    chunk = seq // (2 * cp)
    pairs = [[sum(t.pairs for t in step_tiles(r, ring_source(r, j, cp), cp, split, chunk)) for j in range(cp)]
             for r in range(cp)]
    mean = sum(map(sum, pairs)) / cp**2
    return tuple(tuple(x / mean for x in row) for row in pairs)


@dataclasses.dataclass
class RingSteps:
    """One layer's ring, forward or backward, step by step: per rank the attention and hop spans
    (start, end) and when it finishes."""

    compute: list[list[tuple[float, float]]]
    hops: list[list[tuple[float, float, str]]]
    finish: list[float]

    @property
    def makespan(self) -> float:
        return max(self.finish)

    @cached_property  # a cached ring serves thousands of the planner's layouts
    def busy(self) -> float:
        """The busiest rank's attention seconds: what the layer costs with every hop hidden."""
        return max(sum(e - s for s, e in spans) for spans in self.compute)


def ring_steps(compute: list[list[float]], hop: float, backward: bool = False,
               backward_ratio: float = 2.0) -> RingSteps:
    """Run the ring of ``compute[rank][step]`` forward seconds with hops of ``hop`` seconds, as
    ring_attention.py runs it: a rank posts its block's send, computes, then waits for the block from
    the rank before it and for its own send. Backward a step computes ``backward_ratio`` times the
    forward (the block's backward over its forward, :func:`block_times`), then waits
    for the block's dK/dV accumulator (sent by the rank before when it finished its step) and passes
    it on; the last pass brings each block's home. A rank's link to the next sends one message at a
    time, in the order they were posted (backward, K/V and dK/dV share it)."""
    n = len(compute)
    hop = hop if n > 1 else 0.0
    factor = backward_ratio if backward else 1.0
    spans: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    hops: list[list[tuple[float, float, str]]] = [[] for _ in range(n)]
    link = [0.0] * n  # when each rank's link to the next is free
    ready = [0.0] * n  # when each rank may start its next step
    accumulator = [0.0] * n  # when the dK/dV accumulator it needs next has arrived (and its own has left)

    def send(rank: int, at: float, what: str) -> float:
        link[rank] = max(at, link[rank]) + hop
        hops[rank].append((link[rank] - hop, link[rank], what))
        return link[rank]

    for j in range(n):
        kv_arrived, acc_arrived = list(ready), list(accumulator)
        for r in range(n):
            start = ready[r]
            end = start + factor * compute[r][j]
            spans[r].append((start, end))
            if j < n - 1:
                landed = send(r, start, "kv")  # the next rank's block for step j + 1, and our own send done
                kv_arrived[(r + 1) % n] = max(kv_arrived[(r + 1) % n], landed)
                kv_arrived[r] = max(kv_arrived[r], landed)
            if backward:
                end = max(end, accumulator[r])
                landed = send(r, end, "dkv")
                acc_arrived[(r + 1) % n] = max(acc_arrived[(r + 1) % n], landed)
                acc_arrived[r] = max(acc_arrived[r], landed)
            kv_arrived[r] = max(kv_arrived[r], end)
        ready, accumulator = kv_arrived, acc_arrived
    finish = [max(ready[r], accumulator[r]) for r in range(n)]
    return RingSteps(spans, hops, finish)


def alltoall_time(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds of a layer's four forward all-to-alls (backward: the same again), over cp ranks spaced
    tp apart."""
    return sum(cost.collective_time(hw, "all_to_all", b, p.cp, p.tp) for b in alltoall_payloads(model, p))


def ulysses_times(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> tuple[float, float]:
    """(forward, backward) seconds of the all-to-all's attention: heads / (tp x cp) heads over the whole
    sequence, the layer's attention as if tensor parallel over tp x cp ranks (:func:`attention_times`;
    a rerun forward is :func:`attention_rerun`'s)."""
    return attention_times(model, p.replace(tp=p.tp * p.cp, cp=1), hw)


def layer_extra(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec
                ) -> tuple[tuple[float, float], tuple[float, float]]:
    """((forward, backward) extra seconds, (forward, backward) exposed communication seconds) of one
    layer and microbatch beyond the slice run's: attention across the split and its traffic. The
    backward's is beyond the slice's without the forward selective recompute reruns there: the split
    attention's rerun replaces it (:func:`attention_rerun`)."""
    p = parallel.resolved()
    block, block_backward = block_times(model, p, hw)
    if p.cp_mode == "ring":
        forward, backward = ring_passes(model, p, hw)
        return ((forward.makespan - block, backward.makespan - block_backward),
                (forward.makespan - forward.busy, backward.makespan - backward.busy))
    comm = alltoall_time(model, p, hw)  # each way
    forward, backward = ulysses_times(model, p, hw)
    return (forward - block + comm, backward - block_backward + comm), (comm, comm)


def ring_passes(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> tuple[RingSteps, RingSteps]:
    """One layer's ring forward and backward on the cp ranks of one group (:func:`ring_steps`; shared
    between layouts alike in what the ring reads: treat as read-only)."""
    block, block_backward = block_times(model, p, hw, ring=True)
    return _ring_passes(p.cp, p.cp_split, model.seq, block, block_backward, hop_time(model, p, hw))


@lru_cache(maxsize=1024)
def _ring_passes(cp: int, split: str, seq: int, block: float, block_backward: float, hop: float
                 ) -> tuple[RingSteps, RingSteps]:
    """:func:`ring_passes` from what it depends on: layouts the planner weighs differ mostly elsewhere
    (dp, pp, ZeRO, microbatches), and running the ring step by step is most of a cp prediction."""
    compute = [[block * share for share in row] for row in _pair_shares(cp, split, seq)]
    return ring_steps(compute, hop), ring_steps(compute, hop, backward=True,
                                                backward_ratio=block_backward / block)


# ------------------------------------------------------------------------------------------- predict
def memory_per_gpu(model: ModelSpec, parallel: ParallelSpec) -> dict[str, float]:
    """The whole model's states over dp x cp replicas, the slice's activations, attention's kept as
    the module docstring says."""
    return dict(_memory_per_gpu(model, parallel))


@lru_cache(maxsize=4096)
def _memory_per_gpu(model: ModelSpec, parallel: ParallelSpec) -> tuple[tuple[str, float], ...]:
    """:func:`memory_per_gpu`, kept per spec: the planner asks it of a layout to check that it fits and
    again to predict it."""
    sm, sp = slice_run(model, parallel)

    def slice_layer(recompute: str) -> float:  # what a layer of the slice keeps under ``recompute``
        return counting.activation_bytes_per_layer(sm, sp.micro_batch, sp.tp, sp.sequence_parallel, recompute,
                                                   sp.sp_keeps_gathered_inputs)

    def slice_rank(recompute: str, rank: int, inflight: counting.Inflight) -> float:
        return counting.activation_bytes_per_gpu(sm, sp.replace(recompute=recompute), rank, inflight)

    # the share of the stashed layers that keep their scores (partial full recompute keeps them whole),
    # and with them the K and V replicas an all-to-all's core keeps
    keeping = {"none": 1.0, "selective": 0.0, "full": 1 - counting.recompute_share(sm, sp)}[sp.recompute]
    replicas = kv_replica_bytes(model, parallel.resolved())
    layer_scores = slice_layer("none") - slice_layer("selective")
    ring = parallel.cp_mode == "ring"

    def activations(rank: int, inflight: counting.Inflight) -> float:
        kept = slice_rank(sp.recompute, rank, inflight)
        if ring:  # what selective keeps: no scores, and in backward one layer's rebuilt (a ring's tiles)
            rebuilt = slice_rank("none", rank, inflight) - slice_rank("selective", rank, inflight)
            return kept - keeping * rebuilt
        # an all-to-all rank keeps its heads' scores over the whole sequence, cp times the slice's in each
        # layer held (taken per layer: the ranks' totals under two policies also differ by their backward
        # transients, which cp - 1 times over had read 4% low at 4 layers of 32k tokens on cp 8)
        held = counting.layers_held(sm, sp, rank, inflight)
        return kept + keeping * held * ((parallel.cp - 1) * layer_scores + replicas)

    def layer_kept(recompute: str) -> float:  # a layer of the slice
        keeps = 1.0 if recompute == "none" else 0.0
        scores = keeps * layer_scores
        return slice_layer(recompute) + (-scores if ring else (parallel.cp - 1) * scores + keeps * replicas)

    return tuple(memory.peak_per_gpu(model, sp, activations, layer_kept).items())


def predict(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec, simulate: bool = True
            ) -> cost.Prediction:
    """Predict one step of a cp run (cost.predict hands cp > 1 here): the slice run's prediction, with
    every layer's attention across the split and its exposed traffic added (module docstring)."""
    p = cost.check(model, parallel)
    sm, sp = slice_run(model, p)
    base = cost.predict(sm, sp, hw, simulate)
    extra, exposed, work, passes = _split_attention(model, p, hw)
    added = passes * extra
    step = base.step_time_s + added
    memory = memory_per_gpu(model, p)
    pipeline = base.breakdown_s["pipeline"] + added
    bubble = base.breakdown_s["bubble"] + (passes - work) * extra
    breakdown = dict(base.breakdown_s, pipeline=pipeline, bubble=bubble,
                     compute=base.breakdown_s["compute"] + work * (extra - exposed),
                     cp_comm_exposed=work * exposed)
    return dataclasses.replace(
        base, step_time_s=step, step_window_s=base.step_window_s + added,
        tokens_per_s=p.global_batch * model.seq / step,
        **cost.flop_rates(model, p, hw, step, core_reruns(model, p)), memory_bytes_per_gpu=memory,
        comm_bytes_per_gpu=comm_bytes_per_gpu(model, p),
        params=counting.parameter_counts(model)["total"], breakdown_s=breakdown, parallel=p,
        bubble_fraction=bubble / pipeline if pipeline else 0.0,
        fits=memory["total"] <= cost.usable_memory(hw),
    )


def _split_attention(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> tuple[float, float, int, float]:
    """What attention across the split adds to a step: (seconds per layer and microbatch, of them
    exposed communication, the slowest pipeline rank's layer passes, those passes stretched by the
    schedule's bubble). Recompute runs the attention's forward, split and all, again
    (:func:`attention_rerun`; under selective recompute the all-to-alls but the output's). The slice
    run prices its block's rerun where it reruns the core (cost.layer_work), but not a fused core's
    under selective recompute (it keeps nothing the unsplit model would drop): that block is added."""
    (forward, backward), (forward_exposed, backward_exposed) = layer_extra(model, p, hw)
    rerun = attention_rerun(model, p)
    unsent = unpriced = 0.0  # of the forward's exposed all-to-alls, those a rerun core does not send again
    if p.recompute == "selective":
        if p.cp_mode != "ring":
            unsent = cost.collective_time(hw, "all_to_all", alltoall_payloads(model, p)[-1], p.cp, p.tp)
        if reruns_fused_core(model, p):
            unpriced = block_times(model, p, hw)[0]
    extra = forward + rerun * (forward + unpriced - unsent) + backward
    exposed = forward_exposed + rerun * (forward_exposed - unsent) + backward_exposed
    work = max(counting.layers_by_rank(model, p)[0]) * p.microbatches
    passes = work / (1 - theoretical_bubble(p.schedule, p.pp, p.microbatches, p.virtual_stages))
    return extra, exposed, work, passes


def step_floor(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec,
               slice_floor: Callable[[ModelSpec, ParallelSpec], float] | None = None) -> float:
    """:func:`paralab.sim.cost.step_floor` of a cp run: the slice run's (``slice_floor``'s where given),
    plus what :func:`predict` adds to the slice run's step for the attention across the split."""
    p = parallel.resolved()
    sm, sp = slice_run(model, p)
    extra, _, _, passes = _split_attention(model, p, hw)
    return (slice_floor(sm, sp) if slice_floor else cost.step_floor(sm, sp, hw)) + passes * extra


def stage_imbalance(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> float:
    """cost.stage_imbalance of a cp run: the slice run's ranks' compute, each with its layers' compute
    of attention across the split (its exposed traffic is not compute, as :func:`predict` counts it)."""
    p = cost.check(model, parallel)
    compute = cost.rank_compute(*slice_run(model, p), hw)
    extra, exposed, _, _ = _split_attention(model, p, hw)
    layers = counting.layers_by_rank(model, p)[0]
    return cost.imbalance([c + n * p.microbatches * (extra - exposed) for c, n in zip(compute, layers)])


cost.CONTEXT_PARALLEL.update(predict=predict, memory_per_gpu=memory_per_gpu, step_floor=step_floor,
                             stage_imbalance=stage_imbalance)


def ring_trace(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> Trace:
    """One layer's ring, forward then backward, on the cp ranks of one group, as a Trace: each step's
    attention on the compute lane (kind forward or backward), each hop (K/V, dK/dV) on the comm lane,
    so hidden and exposed hops show (paralab.viz.timeline draws it)."""
    p = cost.check(model, parallel)
    hop = hop_time(model, p, hw)
    spans: list[Span] = []
    offset = 0.0
    for phase, steps in zip(("forward", "backward"), ring_passes(model, p, hw)):
        for rank in range(p.cp):
            for j, (start, end) in enumerate(steps.compute[rank]):
                spans.append(Span(rank, COMPUTE, phase, offset + start, offset + end,
                                  name=f"attention, ring step {j}", step=0))
            for start, end, what in steps.hops[rank]:
                spans.append(Span(rank, COMM, "send", offset + start, offset + end, name=f"{what} ({phase})",
                                  bytes=int(hop_bytes(model, p)), peer=(rank + 1) % p.cp, step=0))
        offset += steps.makespan
    meta = {"source": "simulated", "strategy": "cp", "world_size": p.cp, "cp": p.cp, "cp_mode": "ring",
            "cp_split": p.cp_split, "hop_s": hop, "block_s": block_times(model, p, hw)[0]}
    return Trace(spans=sorted(spans, key=lambda s: (s.start, s.rank)), meta=meta)
