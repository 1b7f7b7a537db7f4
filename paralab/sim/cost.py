"""The cost model: one training step's time, memory and traffic, predicted from shapes and hardware.

How a step is timed, bottom up:

1. Matmuls (the FLOPs of :mod:`paralab.sim.counting`) run at a shape-dependent share of peak: each
   dimension d costs a factor d / (d + d_half) (small GEMMs cannot fill the machine), capped by the
   roofline of their memory traffic. Elementwise work (norms, activation, softmax, dropout) is
   memory-bound: it writes each stored activation of Korthikanti et al. 2022 Table 2 once in the
   forward and reads it back, twice that in the backward.
2. Collectives cost alpha-beta on the links they cross, by the algorithm NCCL would pick
   (:func:`collective_time`): a ring (``steps x latency + wire bytes / bandwidth``), a tree for
   all-reduces across nodes (latency in log2 of the nodes), NVLink SHARP inside a node where the
   switch reduces; rings that leave a pod share its oversubscribed uplinks. Ranks are numbered as
   the spec's ``rank_order`` says (Megatron-LM's tp, dp, pp by default), so a group of stride k has
   gpus_per_node / k members per node; a group that spans nodes gets one NIC per member per node.
   Tensor-parallel collectives sit on the critical path of every layer.
3. Per-stage forward and backward durations (a chunk's layers, plus the embedding on the first stage
   and the output layer and loss on the last) drive the schedule event simulator of
   :mod:`paralab.sim.events` on the real schedule data, so bubbles come from the schedule itself.
4. The data-parallel gradient reduction overlaps the last microbatch's backward (only that one: with
   gradient accumulation the earlier ones are not final), the optimizer step is memory-bound, and
   ZeRO-1/2 all-gather the updated parameters after it.
5. A synchronous step waits for its slowest GPU: compute stretches by the expected maximum of the
   world's per-GPU speed variation (:func:`straggler_factor`).

``predict`` returns the headline numbers; ``predict_trace`` the simulated timeline as a Trace.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from statistics import NormalDist
from typing import NamedTuple

from paralab.collectives import ring_steps
from paralab.schedules import SPLIT_BACKWARD, UNIT_PASSES, dualpipev_slots, theoretical_bubble
from paralab.sim import counting, kernels, memory, moe
from paralab.sim.events import COMPUTE_KIND, RECV, SEND, Plan, builtin_plan, run_plan, simulate_schedule
from paralab.sim.specs import HardwareSpec, ModelSpec, ParallelSpec, SpecError
from paralab.trace import COMM, COMPUTE, STEP, Span, Trace

OPTIMIZER_BYTES_TOUCHED = 28  # per parameter: read grad, read/write master, m and v, write the 16-bit copy
# A context-parallel spec (cp > 1) is predicted by paralab.sim.context, which builds on this module
# and puts its predict, memory_per_gpu and step_floor here when imported (paralab.sim imports it).
CONTEXT_PARALLEL: dict = {}


# --------------------------------------------------------------------------------------- primitives


def gemm_time(hw: HardwareSpec, flops_peak: float, m: float, n: float, k: float, batch: float = 1,
              nbytes: int = 2) -> float:
    """Seconds for ``batch`` (m x k) @ (k x n) matmuls: shape-scaled peak, memory roofline, launch cost."""
    half = hw.matmul_half_dim
    efficiency = hw.matmul_max_efficiency * (m / (m + half)) * (n / (n + half)) * (k / (k + half))
    compute = 2 * batch * m * n * k / (flops_peak * efficiency)
    memory = batch * (m * k + k * n + m * n) * nbytes / hw.memory_bandwidth
    return max(compute, memory) + hw.kernel_overhead_s


# NCCL's tree all-reduce reaches 0.9 of the bus bandwidth and moves the whole payload up and down the
# tree (its tuning model, src/graph/tuning.cc: busBw * .9, algorithm bandwidth = busBw * .5)
TREE_BANDWIDTH_SHARE = 0.9 * 0.5


def collective_time(hw: HardwareSpec, op: str, payload: float, group: int, stride: int,
                    messages: int = 1) -> float:
    """Time of a collective among ``group`` ranks spaced ``stride`` apart, by the fastest algorithm.

    - ring: ``steps x latency + wire bytes / bandwidth``; of its steps, those between nodes pay the
      inter-node latency (NCCL's tuning model: nInterSteps = nodes - 1, twice for an all-reduce);
    - tree (all-reduce across nodes, NCCL's double binary tree): latency 2 (ranks per node - 1 +
      log2 nodes) hops, the payload at TREE_BANDWIDTH_SHARE of the bus bandwidth: slower for large
      payloads, far faster for small ones on many nodes (a 10k-GPU gradient bucket);
    - NVLink SHARP (all-reduce inside a node with ``nvls_bw``): one hop, the switch reduces.
    Across pods the rings share oversubscribed uplinks (:func:`pod_share`). On a machine with
    measured curves (``local``), each of the ring's steps costs one step of the same collective
    between 2 ranks on two chunks (half of an all-reduce; a whole all-gather or reduce-scatter).
    ``messages``: the payload goes as that many separate collectives, each paying the latency."""
    if group <= 1:
        return 0.0
    per_node = ranks_per_node(hw, group, stride)
    steps = ring_steps(op, group)
    wire = counting.ring_wire_bytes(op, payload, group)
    if per_node == group:  # inside one node
        curve, curve_op = measured_curve(hw, op)
        if curve:  # a ring step costs one step of the measured 2-rank collective of two chunks
            chunk = payload / messages / group
            return messages * steps * interpolate(curve, 2 * chunk) / ring_steps(curve_op, 2)
        ring = messages * steps * hw.intra_latency + wire / hw.intra_bw
        if op == "all_reduce" and hw.nvls_bw:
            return min(ring, messages * hw.intra_latency + wire / hw.nvls_bw)
        return ring
    nodes = -(-group // per_node)
    inter_steps = ring_steps(op, nodes)
    bandwidth = min(hw.intra_bw, per_node * hw.inter_bw * pod_share(hw, group, stride))
    latency = (steps - inter_steps) * hw.intra_latency + inter_steps * hw.inter_latency
    ring = messages * latency + wire / bandwidth
    if op != "all_reduce":
        return ring
    hops = 2 * ((per_node - 1) * hw.intra_latency + math.ceil(math.log2(nodes)) * hw.inter_latency)
    return min(ring, messages * hops + payload / (TREE_BANDWIDTH_SHARE * bandwidth))


def ranks_per_node(hw: HardwareSpec, group: int, stride: int) -> int:
    """Members of a group of ``group`` ranks ``stride`` apart that share a node (at least one)."""
    return max(1, min(group, hw.gpus_per_node // stride))


def measured_curve(hw: HardwareSpec, op: str) -> tuple[list, str]:
    """The measured 2-rank curve of ``op`` (``local``) and the op it measured: the all-reduce's for
    an op without its own; empty on a datasheet preset."""
    own = {"all_gather": hw.allgather_curve, "reduce_scatter": hw.reducescatter_curve}.get(op)
    return (own, op) if own else (hw.allreduce_curve, "all_reduce")


def pod_share(hw: HardwareSpec, group: int, stride: int) -> float:
    """The share of its NIC bandwidth a group's ring keeps when it leaves its pod.

    Every group of the kind runs at once (all data-parallel replicas reduce together). A ring's
    members inside one pod are contiguous, so it leaves the pod once: per GPU of the pod that is
    1/members-in-pod of a link's traffic against the 1/oversubscription each GPU's uplink share
    carries. Groups inside a pod, or with at least ``oversubscription`` members per pod, keep it all.
    """
    if not hw.pod_gpus or group * stride <= hw.pod_gpus:
        return 1.0
    members = max(1, min(group, hw.pod_gpus // stride))
    return min(1.0, members / hw.oversubscription)


@lru_cache(maxsize=256)
def expected_max(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for one)."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def straggler_factor(hw: HardwareSpec, gpus: int) -> float:
    """How much longer a synchronous step's compute takes than one GPU's: the expected slowest of
    ``gpus`` GPUs whose speeds vary with coefficient ``straggler_cv`` (1 + cv E[max of N])."""
    return 1.0 + hw.straggler_cv * expected_max(gpus)


def sync_wait(hw: HardwareSpec, seconds: float, ranks: int) -> float:
    """What a synchronisation of ``ranks`` ranks after ``seconds`` of compute waits beyond the median
    rank: the expected maximum of their jitter, ``sync_jitter x sqrt(seconds) x E[max of N]``."""
    if not hw.sync_jitter:
        return 0.0
    return hw.sync_jitter * math.sqrt(max(seconds, 0.0)) * expected_max(ranks)


def all_to_all_time(hw: HardwareSpec, payload: float, group: int, stride: int) -> float:
    """One all-to-all among ``group`` ranks ``stride`` apart, each handing it ``payload`` bytes. No
    ring: every rank sends 1/group of it to each peer directly, those in its node over NVLink and the
    rest through its own NIC, both at once, each peer costing a latency. On a machine with a measured
    send curve (``local``), one gloo send per peer."""
    if group <= 1:
        return 0.0
    per_node = ranks_per_node(hw, group, stride)
    piece = payload / group
    if hw.p2p_curve and per_node == group:
        return (group - 1) * interpolate(hw.p2p_curve, piece)
    inside, outside = (per_node - 1) * piece, (group - per_node) * piece
    latency = (group - 1) * (hw.inter_latency if outside else hw.intra_latency)
    return latency + max(inside / hw.intra_bw, outside / hw.inter_bw)


def interpolate(curve: list, nbytes: float) -> float:
    """Seconds at ``nbytes`` on a measured (bytes, seconds) curve: log-log between its points, the
    smallest's time below it, and beyond the largest the bandwidth over its last three points (one
    noisy top point must not make larger messages free), or its average rate if they are flat."""
    if nbytes <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if nbytes <= x1:
            w = math.log(nbytes / x0) / math.log(x1 / x0)
            return math.exp((1 - w) * math.log(y0) + w * math.log(y1))
    (x0, y0), (x1, y1) = curve[max(len(curve) - 3, 0)], curve[-1]
    per_byte = (y1 - y0) / (x1 - x0) if y1 > y0 else y1 / x1
    return y1 + (nbytes - x1) * per_byte


@dataclass(frozen=True)
class StageTimes:
    """Seconds per microbatch of one pipeline stage (model chunk) on one GPU.

    ``backward`` is the full backward (recompute included); zero-bubble schedules split it into
    ``backward_input`` (recompute, input gradients, tp collectives) and ``backward_weight`` (the
    weight-gradient GEMMs), which add up to it. ``tp_comm`` is the tensor-parallel share of F + B,
    ``zero_comm`` what ZeRO-2/3's per-part collectives add to F + B beyond the compute they overlap
    (``zero_waits``: what of it each pass waits, F, Bi and W; ``zero_sent``: their seconds, the
    forward's gathers, the backward's and the reduce-scatters), ``a2a`` the expert-parallel
    all-to-alls of one pass (F, or the input-gradient part of B).
    """

    forward: float
    backward_input: float
    backward_weight: float
    tp_comm: float = 0.0
    zero_waits: tuple[float, float, float] = (0.0, 0.0, 0.0)
    zero_sent: tuple[float, float, float] = (0.0, 0.0, 0.0)
    a2a: float = 0.0

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight

    @property
    def zero_comm(self) -> float:
        return sum(self.zero_waits)


@dataclass(frozen=True)
class LayerWork:
    """One transformer layer's forward on one GPU, by what limits it: GEMMs (seconds), the attention
    core's batched GEMMs (seconds, forward and backward) and the activations its non-GEMM kernels
    move (bytes, Korthikanti et al. 2022 Table 2 at the model's width, times what eager PyTorch moves
    beyond fused kernels, :func:`paralab.sim.kernels.eager_ratio`; the backward moves twice as many)."""

    linear: float
    core: float
    elementwise_bytes: float
    core_elementwise_bytes: float  # the share of the attention core (softmax, its dropout)
    core_backward: float = 0.0
    column: float = 0.0  # the column-parallel GEMMs of linear (QKV, the MLP's first): as long as their dgrad


def layer_work(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> LayerWork:
    """The per-layer pieces of :func:`stage_times` (``p`` resolved, ``hw`` one rank's: see
    :func:`per_rank`), also what calibration fits against.

    FP8 runs the linear layers' GEMMs at the fp8 peak on 1-byte operands. A fused (flash) attention
    skips the score blocks a causal mask hides (half of them) and recomputes Q K^T in backward:
    2.5 times its forward there against the standard core's 2 (five matmuls instead of four). Its
    kernel runs at the GEMMs' efficiency, or FlashAttention-2's at its measured share of the peak
    (:func:`flash2_share`).
    """
    peak = hw.peak(model.dtype)
    t, b, s, h = p.tp, p.micro_batch, model.seq, model.hidden
    tokens, nbytes = b * s, model.dtype_bytes
    mlp_in = 2 * model.ffn if model.gated_mlp else model.ffn
    heads = model.heads // t
    linear_peak, linear_bytes = (hw.peak("fp8"), 1) if model.fp8 else (peak, nbytes)

    def gemm(m_, n_, k_):
        return gemm_time(hw, linear_peak, m_, n_, k_, 1, linear_bytes)

    column = gemm(tokens, (h + 2 * model.kv_dim) / t, h) + gemm(tokens, mlp_in / t, h)
    linear = column + gemm(tokens, h, h / t) + gemm(tokens, h, model.ffn / t)
    fused = model.attention == "fused"
    if fused and model.attention_kernel == "flash2":
        core_flops = 2 * b * heads * s * s * model.head_dim  # the two matmuls, half of each skipped
        core = core_flops / (peak * flash2_share(hw, s)) + hw.kernel_overhead_s
    else:
        core = (gemm_time(hw, peak, s, s, model.head_dim, b * heads, nbytes)
                + gemm_time(hw, peak, s, model.head_dim, s, b * heads, nbytes)) * (0.5 if fused else 1.0)
    act = counting.activation_bytes_per_layer(model, b, t, p.sequence_parallel, "none")
    core_bytes = counting.attention_core_bytes(model, b) / t
    elementwise = 2 * core_bytes + 2 * (act - core_bytes) * kernels.eager_ratio(model)
    return LayerWork(linear, core, elementwise, 2 * core_bytes, (2.5 if fused else 2.0) * core, column)


def flash2_share(hw: HardwareSpec, seq: int) -> float:
    """The share of ``hw``'s peak FlashAttention-2 reaches at sequence length ``seq``: its measured
    points (``flash2_efficiency``), log-linear between them, flat beyond (HardwareSpec.problems_for
    refuses a part without them)."""
    points = sorted(hw.flash2_efficiency)
    if seq <= points[0][0]:
        return points[0][1]
    for (n0, e0), (n1, e1) in zip(points, points[1:]):
        if seq <= n1:
            return e0 + (e1 - e0) * math.log(seq / n0) / math.log(n1 / n0)
    return points[-1][1]


def per_rank(hw: HardwareSpec, world: int) -> HardwareSpec:
    """What one of ``world`` ranks gets of a machine they all share (``shared_compute``: the local
    CPU seen whole): its slice of every compute and memory rate. Already per rank: ``hw`` itself."""
    if not hw.shared_compute:
        return hw
    return dataclasses.replace(scale_rates(hw, 1 / world), shared_compute=False)


def scale_rates(hw: HardwareSpec, factor: float) -> HardwareSpec:
    """``hw`` with every compute and memory rate (FLOP/s, bytes/s) multiplied by ``factor``: the one
    list of them, for a machine shared by ranks or a core shared by threads."""
    return dataclasses.replace(
        hw, peak_flops={k: v * factor for k, v in hw.peak_flops.items()},
        memory_bandwidth=hw.memory_bandwidth * factor, elementwise_bw=hw.elementwise_bw * factor,
        elementwise_backward_bw=hw.elementwise_backward_bw * factor, optimizer_bw=hw.optimizer_bw * factor,
    )


def elementwise_bandwidth(hw: HardwareSpec, backward: bool = False) -> float:
    """Bytes/s of non-GEMM kernels: measured on the local CPU (``elementwise_bw``, and for their
    backward ``elementwise_backward_bw``), else memory-bound."""
    return (backward and hw.elementwise_backward_bw) or hw.elementwise_bw or hw.memory_bandwidth


def stage_times(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> list[StageTimes]:
    """Per-microbatch durations of every stage (pp x v of them), from the layer's GEMMs, traffic and
    collectives, stretched by the world's slowest GPU (:func:`straggler_factor`)."""
    p = parallel.resolved()
    hw = per_rank(hw, p.world_size)
    t, b, s, h = p.tp, p.micro_batch, model.seq, model.hidden
    tokens, nbytes = b * s, model.dtype_bytes
    ew_bw = elementwise_bandwidth(hw)

    def host(part: str) -> float:  # framework time per call (CPU); 0 on the GPU presets
        return hw.host_overhead_s.get(part, 0.0)

    work = layer_work(model, p, hw)
    linear, core = work.linear, work.core
    elementwise, elementwise_core = work.elementwise_bytes / ew_bw, work.core_elementwise_bytes / ew_bw
    elementwise_back = work.elementwise_bytes / elementwise_bandwidth(hw, backward=True)
    ops, payload, per_pass, passes = counting.tp_collectives(model, p)
    tp_pass = per_pass * sum(collective_time(hw, op, payload, t, p.stride("tp")) for op in ops)

    forward_compute = linear + core + elementwise + host("layer_forward")
    backward_compute = 2 * linear + work.core_backward + 2 * elementwise_back + host("layer_backward")
    # each tensor-parallel collective also waits for the slowest rank of its group (sync_wait)
    tp_forward = tp_pass + (per_pass * sync_wait(hw, forward_compute / per_pass, t) if t > 1 else 0.0)
    tp_backward = tp_pass + (per_pass * sync_wait(hw, backward_compute / per_pass, t) if t > 1 else 0.0)
    # sequence parallelism gathers the column layers' inputs again in backward, while (on a GPU) their
    # input gradients are computed
    regather = counting.sequence_regathers(model, p) * collective_time(hw, "all_gather", payload, t,
                                                                         p.stride("tp"))
    tp_backward += max(0.0, regather - work.column) if hw.overlaps_comm else regather
    forward = forward_compute + tp_forward
    selective = core + elementwise_core if model.attention == "standard" else 0.0  # fused keeps no scores
    full = counting.recompute_share(model, p) * forward
    recompute = {"none": 0.0, "selective": selective, "full": full}[p.recompute]
    weight = linear  # one weight-gradient GEMM per forward weight GEMM
    backward_input = recompute + backward_compute - weight + tp_backward
    tp_layer = tp_forward * passes["forward"] + tp_backward + (passes["backward"] - 1) * tp_forward

    blocks = counting.chunk_layers(model, p)
    moe_blocks = counting.chunk_moe_blocks(model, p)
    experts, a2a = _moe_mlp(model, p, hw)
    embed = 2 * tokens * h * nbytes / ew_bw
    logits = gemm_time(hw, hw.peak(model.dtype), tokens, model.vocab / t, h, 1, nbytes)
    loss = 3 * tokens * model.vocab / t * 4 / ew_bw  # fp32 logits: write, softmax read and write
    # tp at the ends (counting.tp_end_collectives); the output layer's input, gathered again with
    # sequence parallelism, is gathered while (on a GPU) its input gradient is computed
    tp_end = {key: sum(collective_time(hw, op, payload, t, p.stride("tp")) for op, payload in rows)
              for key, rows in counting.tp_end_collectives(model, p).items()}
    head_regather = tp_end["head_regather"]
    head_regather = max(0.0, head_regather - logits) if hw.overlaps_comm else head_regather
    tp_embed = tp_end["embed_forward"] + tp_end["embed_backward"]
    tp_head = tp_end["head_forward"] + tp_end["head_backward"] + head_regather
    slowest = straggler_factor(hw, p.world_size)
    times, alike = [], {}
    for stage, layers in enumerate(blocks):
        moe_here = moe_blocks[stage]
        f, bi, w = layers * forward, layers * backward_input, layers * weight
        f, bi, w = f + moe_here * (experts + a2a), bi + moe_here * (experts + a2a), w + moe_here * experts
        tp = layers * tp_layer
        # each part's forward and backward, in forward order, for ZeRO's part-by-part collectives
        parts = [(f / layers, (bi + w) / layers)] * layers if layers else []
        if stage == 0:
            parts.insert(0, (embed + tp_end["embed_forward"] + host("embed_forward"),
                             embed + tp_end["embed_backward"] + host("embed_backward")))
            f, bi = f + parts[0][0], bi + parts[0][1]
            tp += tp_embed
        if stage == p.chunks - 1:
            # the input gradient; the weight gradient is the logits' GEMM again
            head_input = logits + loss + tp_end["head_backward"] + head_regather + host("head_backward")
            parts.append((logits + loss + tp_end["head_forward"] + host("head_forward"), head_input + logits))
            f, bi, w = f + parts[-1][0], bi + head_input, w + logits
            tp += tp_head
        if p.pp > 1:  # a stage's pass ends in a send the neighbour waits for: it waits for the later rank
            f, bi = f + sync_wait(hw, f, 2), bi + sync_wait(hw, bi + w, 2)
        st = StageTimes(slowest * f, slowest * bi, slowest * w, slowest * tp, a2a=moe_here * a2a)
        if p.zero_in_passes:  # ZeRO-2/3 collectives per microbatch, part by part
            st = _zero_overlapped(st, model, p, hw, stage, parts, alike)
        times.append(st)
    return times


def _moe_mlp(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> tuple[float, float]:
    """What a MoE layer's MLP adds to one pass of the dense layer :func:`layer_work` times (seconds):
    the router, shared and routed experts' GEMMs in place of the dense MLP's, the routed ones on the
    hot expert's rank (``imbalance`` x an even share: E / ep experts, tokens x k x ep / E rows each, of
    the tokens the rank routes, moe.routed_tokens); and its dispatch plus combine all-to-all (stride
    tp: ep ranks are dp neighbours)."""
    if not model.experts:
        return 0.0, 0.0
    hw = per_rank(hw, p.world_size)
    peak, nbytes = hw.peak(model.dtype), model.dtype_bytes
    tokens, h, t = p.micro_batch * model.seq, model.hidden, p.tp

    def mlp(rows, width, split=1, batch=1):
        up = (2 if model.gated_mlp else 1) * width / split
        return (gemm_time(hw, peak, rows, up, h, batch, nbytes)
                + gemm_time(hw, peak, rows, h, width / split, batch, nbytes))

    local, routes = model.experts // p.ep, moe.routed_tokens(model, p.micro_batch, t, p.sequence_parallel)
    routed = mlp(routes * model.top_k * p.ep / model.experts, model.expert_ffn, batch=local)
    shared = mlp(tokens, model.expert_ffn, t, model.shared_experts) if model.shared_experts else 0.0
    router = gemm_time(hw, peak, routes, model.experts, h, 1, nbytes)
    added = router + shared + routed * moe.imbalance(model, p) - mlp(tokens, model.ffn, t)
    one = all_to_all_time(hw, moe.all_to_all_payload(model, p), p.ep, p.stride("dp"))  # dp neighbours
    return added, 2 * one * moe.imbalance(model, p)


def dp_collective_time(hw: HardwareSpec, p: ParallelSpec, op: str, params: float, experts: float,
                       nbytes: int, messages: int = 1) -> float:
    """Seconds of a data-parallel collective over ``params`` parameters of ``nbytes`` each, ``experts``
    of them routed experts: one over dp for the rest, one over the ranks holding the same experts
    (counting.dp_groups)."""
    return sum(collective_time(hw, op, n * nbytes, size, stride, messages)
               for n, size, stride in counting.dp_groups(p, params, experts))


def _zero_overlapped(st: StageTimes, model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, stage: int,
                     work: list[tuple[float, float]], alike: dict) -> StageTimes:
    """A microbatch's F and B of one stage with ZeRO-2/3's collectives part by part (:func:`part_by_part`)
    over the parts ZeRO-3 gathers whole (:func:`counting.zero_units`: the embedding, each block, the
    head; with ``fsdp_root`` the two ends as one unit, the first part's), ``work`` their forward and
    backward in that order; ``zero_comm`` keeps what the collectives add beyond the compute. The
    stage's times (stretched by stragglers and pipeline waits) are shared among the parts as their
    work is. ``alike``: the stages priced so far, by what their pricing reads (of 128 chunks, a few
    kinds)."""
    units, experts = counting.zero_units(model, p, stage), counting.zero_unit_experts(model, p, stage)
    if p.fsdp_root:  # the ends are one unit, gathered and reduce-scattered as the first part's
        units = (sum(counting.fsdp_root(model, p)), *units[1:-1], 0.0)
    scattered, scattered_experts = units, experts
    if p.zero == 2 and p.grad_buckets:  # buckets mix the parts: experts in the stage's proportion
        scattered = _filled_buckets(units, counting.zero2_bucket(model, p, counting.stage_rank(p, stage)))
        scattered_experts = tuple(r * sum(experts) / sum(units) for r in scattered)
    key = (st, tuple(work), units, experts, scattered, scattered_experts)
    if key not in alike:
        alike[key] = _priced_part_by_part(st, model, p, hw, *key[1:])
    return alike[key]


def _priced_part_by_part(st: StageTimes, model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, work: tuple,
                         units: tuple, experts: tuple, scattered: tuple,
                         scattered_experts: tuple) -> StageTimes:
    """:func:`_zero_overlapped`'s stage priced, its parts' parameters, experts and reduce-scattered
    shares given."""
    pb, gb, _ = counting.bytes_per_param(model, p)
    forward_work, backward_work = sum(f for f, _ in work), sum(b for _, b in work)

    @cache  # the blocks are alike: price each kind of part once
    def part(f: float, b: float, params: float, experts: float, scattered: float, scattered_experts: float
             ) -> tuple[tuple, tuple]:
        f, b = st.forward * f / forward_work, st.backward * b / backward_work
        # one collective per part (or bucket; its experts' over their own group): each pays the latency
        # (and on a measured curve, a small message's cost) and waits for the slowest data-parallel rank
        rs = 0.0
        if scattered:
            rs = (dp_collective_time(hw, p, "reduce_scatter", scattered, scattered_experts, gb)
                  + sync_wait(hw, b, p.dp))
        ag = 0.0
        if p.zero == 3 and params:
            ag = dp_collective_time(hw, p, "all_gather", params, experts, pb) + sync_wait(hw, f, p.dp)
        return (f, ag, 0.0), (b, ag, rs)

    priced = [part(f, b, n, e, r, re) for (f, b), n, e, r, re
              in zip(work, units, experts, scattered, scattered_experts, strict=True)]
    forward, backward = [f for f, _ in priced], [b for _, b in reversed(priced)]
    if p.fsdp_root:  # the root is still whole from the forward: its reduce-scatter alone ends the backward
        compute, _, scatter = backward[-1]
        backward[-1] = (compute, 0.0, scatter)
    sent = (sum(ag for _, ag, _ in forward), sum(ag for _, ag, _ in backward),
            sum(rs for _, _, rs in backward))
    total_f = _priced_pass(forward, p, hw)
    if p.pp > 1 and p.schedule_run in SPLIT_BACKWARD:  # one stage runs its backward whole
        # Bi gathers the parameters its input gradients need; W, run later, computes the weight
        # gradients and sends them: each pass with its own collectives
        share = st.backward_input / st.backward if st.backward else 1.0
        total_bi = _priced_pass([(c * share, ag, 0.0) for c, ag, _ in backward], p, hw)
        total_w = _priced_pass([(c * (1 - share), 0.0, rs) for c, _, rs in backward], p, hw)
    else:
        total_bi, total_w = _priced_pass(backward, p, hw) - st.backward_weight, st.backward_weight
    waits = (total_f - st.forward, total_bi - st.backward_input, total_w - st.backward_weight)
    return StageTimes(total_f, total_bi, total_w, st.tp_comm, zero_waits=waits, zero_sent=sent, a2a=st.a2a)


def _priced_pass(parts: list[tuple[float, float, float]], p: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds of a pass over ``parts`` (compute, gather, reduce-scatter): :func:`part_by_part` where
    the collectives run beside the compute; one after the other where they need its cores."""
    if hw.overlaps_comm:
        return part_by_part(parts, p.prefetch_params, hw.comm_sm_share)
    return sum(c + ag + rs for c, ag, rs in parts)


def _filled_buckets(units: tuple[float, ...], bucket: float) -> tuple[float, ...]:
    """Parameters whose gradients are reduce-scattered as each part's backward ends, in forward order,
    when ZeRO-2 reduces buckets of ``bucket`` parameters: backward runs the parts last first and fills
    the buckets in that order; a part that fills one (or several) sends them, and the first part, where
    backward ends, sends what is left."""
    out, filled, sent = [0.0] * len(units), 0.0, 0.0
    for i in reversed(range(len(units))):
        filled += units[i]
        sending = filled if i == 0 else math.floor(filled / bucket * (1 + 1e-12)) * bucket
        out[i], sent = sending - sent, sending
    return tuple(out)


def part_by_part(parts: list[tuple[float, float, float]], prefetch: bool, sm_share: float = 0.0) -> float:
    """Seconds for ``parts`` (compute, gather, reduce-scatter seconds each, in the order they run)
    whose parameters are gathered and gradients scattered, as FSDP and ZeRO-3 run them: one compute
    stream and one link that sends in the order it is asked.

    A part computes once its gather has arrived; its reduce-scatter is asked for when its compute
    ends. With ``prefetch`` the next part's gather is asked for when this part's compute starts
    (one part ahead), so it hides under the compute; without, when the compute reaches that part.
    Compute that runs while the link is busy runs at ``1 - sm_share`` of its speed
    (:func:`beside_comm`); every send a part's compute overlaps was asked for by its start, so the
    link is busy from then until its queue drains.
    """
    link = cpu = 0.0

    def send(asked: float, seconds: float) -> float:
        nonlocal link
        link = max(link, asked) + seconds
        return link

    arrived = send(0.0, parts[0][1]) if parts[0][1] else 0.0
    following_gathers = [gather for _, gather, _ in parts[1:]] + [0.0]
    for (compute, _, scatter), following in zip(parts, following_gathers, strict=True):
        start = max(cpu, arrived)
        if following and prefetch:
            arrived = send(start, following)
        cpu = start + beside_comm(compute, link - start, sm_share)
        if scatter:
            send(cpu, scatter)
        if following and not prefetch:
            arrived = send(cpu, following)
    return max(cpu, link)


def beside_comm(compute: float, busy: float, sm_share: float) -> float:
    """Seconds ``compute`` seconds of work take when a collective holds ``sm_share`` of the SMs for the
    first ``busy`` seconds: it runs at ``1 - sm_share`` of its speed until the collective ends (or
    it does), then at full speed (HardwareSpec.comm_sm_share)."""
    if not sm_share or busy <= 0:
        return compute
    return compute + sm_share * min(busy, compute / (1 - sm_share))


def p2p_time(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds from a stage's send to the next stage holding the activation (Narayanan et al. 2021).

    With tp > 1 each of the t GPUs sends 1/t of it over its own link and the receivers all-gather it
    over NVLink (their scatter/gather optimisation, ``pp_scatter_gather``; else each sends it whole);
    with sequence parallelism the activation is already split by sequence, so nothing is gathered
    (:func:`counting.pipeline_send_bytes`, :func:`counting.pipeline_gathers`). One time serves every
    hop: the mean over the pipeline's hops, of which :func:`crossing_share` go over the NIC.
    """
    p = parallel.resolved()
    act = counting.microbatch_activation_bytes(model, p)
    sent = counting.pipeline_send_bytes(model, p)
    gathers = counting.pipeline_gathers(p)
    gather = collective_time(hw, "all_gather", act, p.tp, p.stride("tp")) if gathers else 0.0
    crossing = crossing_share(p, hw.gpus_per_node)
    if hw.p2p_curve and not crossing:  # measured point-to-point times (local calibration)
        return interpolate(hw.p2p_curve, sent) + gather
    intra = hw.intra_latency + sent / hw.intra_bw
    inter = hw.inter_latency + sent / hw.inter_bw
    return crossing * inter + (1 - crossing) * intra + gather


def crossing_share(p: ParallelSpec, gpus_per_node: int) -> float:
    """The share of pipeline sends that leave their node, in the spec's rank order: each rank of a
    stage sends to its counterpart on the pipeline rank its chunk's neighbour holds
    (:func:`counting.pipeline_hops`: interleaved's wrap from the last rank to the first too),
    ``p.stride("pp")`` ranks apart per pipeline rank (t x dp in Megatron's order, t in Llama 3's, where
    each pipeline's ranks are numbered together)."""
    step = p.stride("pp")
    block = step * p.pp  # the ranks numbered as one pipeline group; the order repeats it
    if p.pp == 1 or (block <= gpus_per_node and gpus_per_node % block == 0):
        return 0.0
    if step >= gpus_per_node:
        return 1.0
    crossed = _crossings(p, gpus_per_node, counting.pipeline_hops(p))
    return sum(crossed) / len(crossed)


def crosses_nodes(hw: HardwareSpec, group: int, stride: int) -> bool:
    """Whether a group of ``group`` ranks ``stride`` apart spans more than one node (a trace draws its
    collectives as inter-node traffic, as the cost model prices them)."""
    return group * stride > hw.gpus_per_node


def pairs_cross_nodes(p: ParallelSpec, gpus_per_node: int, first: int, last: int) -> bool:
    """Whether any rank of pipeline rank ``first`` sits on another node than its counterpart (same tp,
    dp and cp place) on pipeline rank ``last``, in the spec's rank order: the tied embedding's pairs."""
    if (last - first) * p.stride("pp") >= gpus_per_node:
        return True
    return any(_crossings(p, gpus_per_node, [(first, last)]))


def _crossings(p: ParallelSpec, gpus_per_node: int, stage_pairs) -> list[bool]:
    """For every rank of pipeline rank a and its counterpart on pipeline rank b, (a, b) in
    ``stage_pairs``: whether the two sit on different nodes. The ranks numbered as one pipeline group
    (a block) repeat, so the node pattern does after ``gpus_per_node`` blocks."""
    step = p.stride("pp")
    block = step * p.pp
    starts = range(0, min(p.world_size, block * gpus_per_node), block)
    return [(s + a * step + j) // gpus_per_node != (s + b * step + j) // gpus_per_node
            for s in starts for a, b in stage_pairs for j in range(step)]


# -------------------------------------------------------------------------------------------- predict


@dataclass
class Prediction:
    """Headline numbers of one predicted step (``to_dict`` gives the ``paralab simulate --json`` keys).

    ``tflops_per_gpu`` counts hardware FLOPs (recompute included), as Narayanan et al. 2021 report it;
    ``mfu`` uses model FLOPs and ``hfu`` hardware FLOPs (Korthikanti et al. 2022, sec. 5).
    ``flops_per_step`` is the hardware count.

    ``step_time_s`` is the period (what throughput divides by), as a measured trace's step time is
    (``Trace.step_times``: the longest of the ranks' own steps, each of which tiles its rank's time).
    ``step_window_s`` is where a step lies over all ranks (``Trace.step_windows``: the first rank's
    start to the last rank's end): in the steady state a rank that ends its step early starts the
    next one early (the last stage of a pipeline, which then waits for its first input), so the
    window is the period plus the spread of the ranks' ends; without pipeline parallelism the two
    are equal.
    """

    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float
    memory_bytes_per_gpu: dict[str, float]
    comm_bytes_per_gpu: dict[str, float]
    params: int
    active_params: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    breakdown_s: dict[str, float] = field(default_factory=dict)
    parallel: ParallelSpec | None = None
    fits: bool = True
    step_window_s: float = 0.0
    pipeline_pricing: str = "simulated"  # how the schedule was priced: simulated, closed form, extended

    @property
    def flops_per_step(self) -> float:
        return self.hardware_flops_per_step

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "parallel"}
        out["flops_per_step"] = self.flops_per_step
        out["memory_bytes_per_gpu"] = {k: int(v) for k, v in self.memory_bytes_per_gpu.items()}
        out["comm_bytes_per_gpu"] = {k: int(v) for k, v in self.comm_bytes_per_gpu.items()}
        return out


def memory_per_gpu(model: ModelSpec, parallel: ParallelSpec) -> dict[str, float]:
    """Bytes per GPU at the step's peak, by kind and "total", on the fullest rank
    (:func:`paralab.sim.memory.peak_per_gpu`; a context-parallel spec's by :mod:`paralab.sim.context`)."""
    if parallel.cp > 1:
        return CONTEXT_PARALLEL["memory_per_gpu"](model, parallel)
    return memory.peak_per_gpu(model, parallel)


def check(model: ModelSpec, parallel: ParallelSpec, gpus: int | None = None,
          hw: HardwareSpec | None = None) -> ParallelSpec:
    """The resolved spec, or SpecError listing every conflict (a machine built in Python as well as a
    hardware file: a zero bandwidth would divide by zero deep in the cost model), or a spec of the
    wrong type (:func:`check_types`)."""
    check_types(model, parallel, hw, hardware_optional=True)
    problems = (machine_problems(model, hw) if hw else model.problems()) or parallel.problems(model, gpus)
    if problems:
        raise SpecError("; ".join(problems))
    return parallel.resolved()


def check_types(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec | None,
                hardware_optional: bool = False) -> None:
    """SpecError for a spec of the wrong type: a preset's name or a dict had been an AttributeError,
    and so had no hardware where a time is priced (``hardware_optional`` where only shapes are checked)."""
    given = {"model": (model, ModelSpec), "parallel": (parallel, ParallelSpec),
             "hardware": (hw, HardwareSpec)}
    for name, (spec, kind) in given.items():
        if not isinstance(spec, kind) and not (name == "hardware" and spec is None and hardware_optional):
            raise SpecError(f"{name} must be a {kind.__name__} (get_model, get_hardware and "
                            f"ParallelSpec(...) make them), got {spec!r}")


def machine_problems(model: ModelSpec, hw: HardwareSpec) -> list[str]:
    """What keeps ``hw`` from pricing ``model``, whatever the layout: either unfit to describe, or the
    two unfit together (empty when it can)."""
    return model.problems() or hw.problems() or hw.problems_for(model)


SIMULATED_PASSES = 32_768
"""The most passes (a microbatch's forward or backward through one chunk, a split backward counted
once) a prediction simulates one by one. Building, proving and running a schedule costs some tens of
microseconds an action here, so this many take 1-4 s on an idle machine. A pipeline of more is priced
by the closed form (:func:`_estimate_finish`), which at that many passes is within 1% of the simulated
step for GPipe, 1F1B, interleaved and ZB-H1. ZB-V and DualPipeV, whose closed forms miss once passes
are unequal, are simulated for as many microbatches as this holds and extended
(:func:`_extended_finish`), up to 64 stages (beyond, the budget holds fewer than 2p microbatches of
theirs and the closed form prices them)."""

EXTENDED_SCHEDULES = ("zbv", "dualpipev")
"""Schedules priced past :data:`SIMULATED_PASSES` by :func:`_extended_finish`, not the closed form:
their ramps depend on the passes' ratios in ways their closed forms do not follow. ZB-V's order is
list-scheduled for the pass times, and with full recompute's long input-gradient pass its ramp is 4
times the (p - 1) F the closed form counts at 16 stages; DualPipeV's fixed order times its ramp
unlike its closed form (+2.7% at 64 stages)."""


def pipeline_passes(p: ParallelSpec) -> int:
    """Passes in one step's schedule: each microbatch's forward and backward through each chunk (the
    zero-bubble schedules split a backward in two, DualPipeV only some: counted once)."""
    return 2 * p.chunks * p.microbatches


def predict(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec, simulate: bool = True) -> Prediction:
    """Predict one training step. ``simulate=False`` uses closed-form bubbles (fast, for the planner);
    so does a pipeline of more than :data:`SIMULATED_PASSES` passes, unless its schedule is one of
    :data:`EXTENDED_SCHEDULES` (``pipeline_pricing`` says which: simulated, closed form, extended)."""
    check_types(model, parallel, hw)  # before its cp is read
    if parallel.cp > 1:
        return CONTEXT_PARALLEL["predict"](model, parallel, hw, simulate)
    p = check(model, parallel, hw=hw)
    times = stage_times(model, p, hw)
    pricing = pipeline_pricing(p, simulate)
    finish, bubble = {"simulated": _simulated_finish, "closed form": _estimate_finish,
                      "extended": _extended_finish}[pricing](model, p, hw, times)
    return dataclasses.replace(_assemble(model, p, hw, times, finish, bubble), pipeline_pricing=pricing)


def pipeline_pricing(p: ParallelSpec, simulate: bool = True) -> str:
    """How :func:`predict` prices ``p``'s pipeline: ``simulated`` pass by pass, by the ``closed form``,
    or ``extended`` (:func:`_extended_finish`; up to 64 stages, where the budget holds 2p microbatches
    of a V schedule's two chunks per rank)."""
    p = p.resolved()  # a V schedule's two chunks per rank count in its passes
    if not simulate:
        return "closed form"
    if p.pp == 1 or pipeline_passes(p) <= SIMULATED_PASSES:
        return "simulated"
    full = SIMULATED_PASSES // (2 * p.chunks) >= 2 * p.pp  # the budget holds a full pipeline's worth
    return "extended" if p.schedule_run in EXTENDED_SCHEDULES and full else "closed form"


def predict_trace(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> Trace:
    """The simulated step as a Trace: pipeline spans, data-parallel reduction, optimizer, step windows.

    Rank r of the trace is pipeline rank r (first tensor- and data-parallel replica; the others run
    the same timeline). Tensor-parallel collectives and expert all-to-alls block the compute that
    issues them, so they are drawn inside it and marked waited out (``issue_s``; of the all-to-alls,
    what DualPipeV's slots leave exposed: :func:`_tensor_parallel_spans`, :func:`_expert_parallel_spans`):
    as in a measured run's trace, time_breakdown reads them exposed, as the prediction's breakdown
    counts them. ZeRO-2/3's per-microbatch collectives are drawn beside the passes they serve and
    marked waited out by what the prediction says they add (:func:`_zero_spans`).
    """
    if parallel.cp > 1:
        raise SpecError("the simulated step of a context-parallel run is not drawn; predict() gives its "
                        "numbers and paralab.sim.context.ring_trace one layer's ring")
    p = check(model, parallel, hw=hw)
    times = stage_times(model, p, hw)
    trace = _pipeline_trace(model, p, hw, times)
    finish = _finish_times(trace, p)
    prediction = _assemble(model, p, hw, times, finish, _pipeline_bubble(trace, p))
    spans = [s for s in trace.spans if s.lane != STEP]
    compute, waits = spans, defaultdict(lambda: (0.0, 0.0))
    if p.zero_in_passes:
        zero, waits = _zero_spans(model, p, hw, times, compute)
        spans = spans + zero
    if p.tp > 1:
        spans = spans + _tensor_parallel_spans(model, p, times, compute, waits)
    if p.ep > 1:
        spans = spans + _expert_parallel_spans(model, p, hw, times, compute, waits)
    for rank, (sync, (start, end), tails) in enumerate(_end_of_step(model, p, hw, finish)):
        reduce, after = sync["reduce"], sync["after"]
        for r, (begin, until) in zip((reduce, *after), _back_to_back(start, end, after)):
            if r.seconds:
                spans.append(Span(rank, COMM, r.op, begin, until, name="gradient reduction", step=0,
                                  bytes=int(r.wire), group_size=r.group, inter_node=r.inter))
        for tail in tails:
            spans.append(Span(rank, COMM, "all_reduce", tail.start, tail.end, name=tail.name, step=0,
                              bytes=int(counting.ring_wire_bytes("all_reduce", tail.payload, tail.group)),
                              payload_bytes=int(tail.payload), group_size=tail.group, inter_node=tail.inter,
                              group_ranks=list(tail.ranks) or None))
            end = tail.end
        end += sync["copies"]  # undrawn, as a lab trace leaves them (in backward's hooks, or untraced)
        opt_end = end + sync["optimizer"]
        spans.append(Span(rank, COMPUTE, "optimizer", end, opt_end, name="optimizer step", step=0))
        if sync["gather"][0]:
            spans.append(Span(rank, COMM, "all_gather", opt_end, opt_end + sync["gather"][0],
                              name="parameter all-gather", step=0, bytes=int(sync["gather"][1]),
                              group_size=p.dp, inter_node=sync["inter"]))
    makespan = prediction.step_time_s
    spans += [Span(r, STEP, "step", 0.0, makespan, name="step 0", step=0) for r in range(p.pp)]
    # the layout the drawn ranks are one replica's pipeline of: its tp, dp and ep groups run among ranks
    # not drawn (paralab.viz.comm names them by it, and draws none of their bytes between stages)
    replica_of = dict(dp=p.dp, tp=p.tp, pp=p.pp, ep=p.ep, micro_batch=p.micro_batch,
                      stage_layers=list(p.stage_layers) if p.stage_layers else None)
    meta = dict(trace.meta, tokens_per_step=p.global_batch * model.seq, prediction=prediction.to_dict(),
                hardware=hw.name, replica_of=replica_of)
    return Trace(spans=sorted(spans, key=lambda s: (s.start, s.rank)), meta=meta)


def _back_to_back(start: float, end: float, after: tuple[Reduction, ...]) -> list[tuple[float, float]]:
    """(start, end) of the overlapped reduction and of the ``after`` steps that follow it one after the
    other, together filling the window ``start``..``end`` (:func:`_sync_window`)."""
    end -= sum(r.seconds for r in after)
    out = [(start, end)]
    for r in after:
        out.append((end, end + r.seconds))
        end += r.seconds
    return out


def _tensor_parallel_spans(model: ModelSpec, p: ParallelSpec, times: list[StageTimes], spans: list[Span],
                           waits: dict[int, tuple[float, float]]) -> list[Span]:
    """One comm span per collective kind at the end of each forward and backward (before the ZeRO
    reduce-scatters it waits for there, ``waits``: :func:`_zero_spans`), holding what the pass sends
    (:func:`_tp_pass_sends`). Sequence parallelism's once-a-step all-reduce of the replicated
    parameters' gradients follows the gradient reduction (:func:`_end_of_step`)."""
    passes = counting.tp_collectives(model, p)[3]
    sends_of = {}  # (chunk, pass) -> what it sends: alike for every microbatch
    out = []
    for span in spans:
        phase = "backward" if span.kind in ("backward", "backward_input") else span.kind
        if span.lane != COMPUTE or phase not in passes or span.stage is None:
            continue
        seconds = times[span.stage].tp_comm * passes[phase] / sum(passes.values())
        end = span.end - waits[id(span)][1]
        if (span.stage, phase) not in sends_of:
            sends_of[span.stage, phase] = _tp_pass_sends(model, p, span.stage, phase)
        sends = sends_of[span.stage, phase]
        wire = {op: counting.ring_wire_bytes(op, payload, p.tp) for op, (_, payload) in sends.items()}
        for op, (calls, payload) in sends.items():  # the pass's seconds shared as the ops' bytes are
            start = max(span.start, end - seconds * wire[op] / sum(wire.values()))
            out.append(Span(span.rank, COMM, op, start, end, name=f"tensor parallel {op} x{calls:g}",
                            step=span.step, issue_s=end - start,  # blocking: the layer waits for its sums
                            bytes=int(wire[op]), payload_bytes=int(payload), group_size=p.tp,
                            stage=span.stage, microbatch=span.microbatch))
            end = start
    return out


def _tp_pass_sends(model: ModelSpec, p: ParallelSpec, stage: int,
                   phase: str) -> dict[str, tuple[float, float]]:
    """op -> (collectives, payload bytes) tensor parallelism blocks on in one pass of model chunk
    ``stage``: a forward pays one pass of the layer's collectives per layer (all-reduces; all-gather +
    reduce-scatter with sp), a backward the other (and the rerun forward's with full recompute, and
    sp's re-gathers); the first and last chunk add the model's ends' (counting.tp_end_collectives)."""
    ops, payload, per_pass, passes = counting.tp_collectives(model, p)
    layers = counting.chunk_layers(model, p)[stage]
    sends = {}
    for op in ops:
        calls = per_pass * layers * passes[phase]
        if phase == "backward" and op == "all_gather":
            calls += counting.sequence_regathers(model, p) * layers
        sends[op] = (calls, calls * payload)
    for op, nbytes in counting.tp_end_rows(model, p, stage == 0, stage == p.chunks - 1, (phase,)):
        calls, total = sends.get(op, (0, 0.0))
        sends[op] = (calls + 1, total + nbytes)
    return sends


def _expert_parallel_spans(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, times: list[StageTimes],
                           spans: list[Span], waits: dict[int, tuple[float, float]]) -> list[Span]:
    """The expert all-to-alls of each forward and input-gradient backward of a stage with MoE layers:
    dispatch, then combine, each half the stage's all-to-all seconds, drawn from the start of the pass,
    once the ZeRO gathers it waits for there are in (``waits``: :func:`_zero_spans`; the
    tensor-parallel collectives are drawn at its end). The pass waits out (``issue_s``) the share
    of them the prediction leaves exposed: all, except where DualPipeV's F&B slots hide some behind the
    other microbatch's compute (:func:`_hidden_all_to_alls`, spread over the rank's all-to-alls)."""
    payload = moe.all_to_all_payload(model, p)
    passes = [s for s in spans if s.lane == COMPUTE and s.kind in ("forward", "backward", "backward_input")
              and s.stage is not None and times[s.stage].a2a]
    total = defaultdict(float)
    for span in passes:
        total[span.rank] += times[span.stage].a2a
    exposed = {rank: 1 - hidden / total[rank] if total[rank] else 1.0
               for rank, hidden in enumerate(_hidden_all_to_alls(p, times))}
    inter = crosses_nodes(hw, p.ep, p.stride("dp"))  # the ep ranks are dp neighbours (:func:`_moe_mlp`)
    moe_here = counting.chunk_moe_blocks(model, p)
    out = []
    for span in passes:
        start, seconds = span.start + waits[id(span)][0], times[span.stage].a2a / 2
        calls = moe_here[span.stage]
        for name in ("dispatch", "combine"):
            out.append(Span(span.rank, COMM, "all_to_all", start, start + seconds,
                            name=f"expert parallel {name} x{calls:g}", step=span.step,
                            issue_s=seconds * exposed[span.rank],
                            bytes=int(calls * counting.ring_wire_bytes("all_to_all", payload, p.ep)),
                            payload_bytes=int(calls * payload), group_size=p.ep, stage=span.stage,
                            microbatch=span.microbatch, inter_node=inter))
            start += seconds
    return out


def _zero_spans(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, times: list[StageTimes],
                spans: list[Span]) -> tuple[list[Span], dict[int, tuple[float, float]]]:
    """ZeRO-2/3's collectives of each microbatch, a chunk's parts together: ZeRO-3 gathers the
    chunk's parameters for its forward and again for its backward (the input-gradient pass of a split
    one; FSDP's root unit only for the forward, as it keeps it), drawn from the pass's start, as
    prefetch runs them beside the compute; ZeRO-2 and 3 reduce-scatter its gradients, drawn to the
    end of the pass that makes them (the weight-gradient pass of a split one). Routed experts go over
    the dp / ep ranks holding them (:func:`counting.dp_groups`), one group after the other, as the
    link sends them, as long as the stage's pricing sends them; what the prediction says a pass waits
    for them (:func:`_zero_overlapped`, ``StageTimes.zero_waits``: the gathers and the compute they
    slow in F or Bi, the reduce-scatters' tail in W) is in its compute span, and they are marked
    waited out by as much (:func:`_waited_out`), so that time_breakdown reads it exposed, as the
    prediction counts it. Also returns, by ``id`` of each pass, the seconds waited at its start and at
    its end (0 for a pass without ZeRO's collectives)."""
    pb, gb, _ = counting.bytes_per_param(model, p)
    embed, head = counting.fsdp_root(model, p)

    @cache  # a chunk's collectives are the same for every microbatch
    def collectives(stage: int, op: str, backward: bool) -> list[tuple[float, int, float, bool]]:
        """(payload, group, seconds, between nodes) of each group's ``op`` for one microbatch: the
        seconds the stage's pricing gave them all (per part, each waiting for the slowest rank),
        shared among the groups as one collective each would take."""
        params = sum(counting.zero_units(model, p, stage))
        experts = sum(counting.zero_unit_experts(model, p, stage))
        if op == "all_gather" and backward:
            held = embed * (stage == 0) + head * (stage == p.chunks - 1)
            groups = counting.backward_gather_groups(p, params, experts, held)
        else:
            groups = counting.dp_groups(p, params, experts)
        nbytes = pb if op == "all_gather" else gb
        whole = [(n * nbytes, group, collective_time(hw, op, n * nbytes, group, stride),
                  crosses_nodes(hw, group, stride)) for n, group, stride in groups if n]
        priced = times[stage].zero_sent[2 if op == "reduce_scatter" else int(backward)]
        scale = priced / sum(seconds for _, _, seconds, _ in whole) if whole else 0.0
        return [(payload, group, seconds * scale, inter) for payload, group, seconds, inter in whole]

    out, waits = [], defaultdict(lambda: (0.0, 0.0))
    for span in spans:
        if span.lane != COMPUTE or span.stage is None or span.kind not in PASS_WAITS:
            continue
        forward, backward_input, backward_weight = PASS_WAITS[span.kind]
        ops = (["all_gather"] if p.zero == 3 and (forward or backward_input) else []) + (
            ["reduce_scatter"] if backward_weight else [])
        drawn = []  # gathers in sending order, then reduce-scatters from the last sent back
        for op in ops:
            gathered, scattered = span.start, span.end
            for payload, group, seconds, inter in collectives(span.stage, op, span.kind != "forward"):
                if op == "all_gather":
                    start, end = gathered, gathered + seconds
                    gathered = end
                else:
                    start, end = scattered - seconds, scattered
                    scattered = start
                drawn.append(Span(
                    span.rank, COMM, op, start, end, name=f"ZeRO-{p.zero} {op}", step=span.step,
                    bytes=int(counting.ring_wire_bytes(op, payload, group)), payload_bytes=int(payload),
                    group_size=group, stage=span.stage, microbatch=span.microbatch, inter_node=inter))
        waited = sum(w * counts for w, counts in zip(times[span.stage].zero_waits, PASS_WAITS[span.kind]))
        marked = _waited_out(drawn, waited)
        waits[id(span)] = (sum(s.issue_s for s in marked), sum(s.waited_s for s in marked))
        out += marked
    return out, waits


# which of StageTimes.zero_waits (F, Bi, W) each kind of pass waits out
PASS_WAITS = {"forward": (1, 0, 0), "backward": (0, 1, 1), "backward_input": (0, 1, 0),
              "backward_weight": (0, 0, 1)}


def _waited_out(drawn: list[Span], seconds: float) -> list[Span]:
    """A pass's ZeRO collectives (:func:`_zero_spans`) with ``seconds`` of them waited out: the gathers'
    first seconds, as the compute waits for parameters (all of each when nothing prefetches them),
    then the reduce-scatters' last, as the pass's end waits for its gradients to leave. What the
    prediction adds beyond their lengths (the SMs they hold slowing the compute beside them) stays
    compute in the trace."""
    out = []
    for span in drawn:
        waited = min(seconds, span.duration)
        seconds -= waited
        moment = "issue_s" if span.kind == "all_gather" else "waited_s"
        out.append(dataclasses.replace(span, **{moment: waited}))
    return out


def _plan(p: ParallelSpec, times: list[StageTimes]) -> Plan:
    """Schedules are read-only data here, so one build and proof serves every prediction of a shape.
    ZB-V is ordered for the stages' mean (F, Bi, W) (unless ``zbv_for_pass_times`` is off), in tenths
    of F so that near shapes share a build, a tenth at least."""
    name = p.schedule_run
    passes = UNIT_PASSES
    if name == "zbv" and p.zbv_for_pass_times:
        f, bi, w = _mean_passes(times)
        passes = (1.0, max(round(bi / f, 1), 0.1), max(round(w / f, 1), 0.1)) if f > 0 else UNIT_PASSES
    return builtin_plan(name, p.pp, p.microbatches, p.virtual_stages, passes)


def _mean_passes(times: list[StageTimes]) -> tuple[float, float, float]:
    """A stage's mean forward, input-gradient and weight-gradient seconds."""
    return tuple(sum(getattr(st, part) for st in times) / len(times)
                 for part in ("forward", "backward_input", "backward_weight"))


def _plan_seconds(plan: Plan, model: ModelSpec, p: ParallelSpec, hw: HardwareSpec,
                  times: list[StageTimes]) -> list[float]:
    """Per action of the plan: its compute time, or its send's latency (0 for a recv). A backward
    sharing a DualPipeV slot with a forward is shorter by what the slot hides: each pass's all-to-alls
    behind the other's compute (:func:`overlap_saving`)."""
    by_key = {(op, stage): getattr(st, op) for stage, st in enumerate(times)
              for op in ("forward", "backward", "backward_input", "backward_weight")}
    by_key[SEND], by_key[RECV] = p2p_time(model, p, hw), 0.0
    seconds = list(map(by_key.__getitem__, plan.seconds_keys))
    if plan.overlapped:
        seconds = [s - saved for s, saved in zip(seconds, _overlap_savings(plan, times))]
    return seconds


def _overlap_savings(plan: Plan, times: list[StageTimes]) -> list[float]:
    """Per action of the plan, what its F&B slot hides (:func:`overlap_saving`): 0 but for a DualPipeV
    backward that shares a slot with its rank's latest forward."""
    last_forward: dict[int, int] = {}  # rank -> stage of its latest forward
    out = []
    for a, rank, k in zip(plan.actions, plan.ranks, plan.kinds):
        saved = 0.0
        if k == COMPUTE_KIND and a.op == "forward":
            last_forward[rank] = a.stage
        elif k == COMPUTE_KIND and a.overlapped:
            saved = overlap_saving(times[last_forward[rank]], times[a.stage])
        out.append(saved)
    return out


def _hidden_all_to_alls(p: ParallelSpec, times: list[StageTimes]) -> list[float]:
    """Per pipeline rank, seconds of expert all-to-alls DualPipeV's F&B slots hide in a step: its
    slots (:func:`paralab.schedules.dualpipev_slots`, rank r holding stages r and 2p - 1 - r) times what
    each saves (:func:`overlap_saving`), exactly what the simulated order hides; zeros for the others."""
    if p.schedule_run != "dualpipev" or not any(st.a2a for st in times):
        return [0.0] * p.pp
    out = []
    for rank in range(p.pp):
        down, up = times[rank], times[2 * p.pp - 1 - rank]
        down_first, up_first = dualpipev_slots(p.pp, p.microbatches, rank)
        out.append(down_first * overlap_saving(down, up) + up_first * overlap_saving(up, down))
    return out


def overlap_saving(forward: StageTimes, backward: StageTimes) -> float:
    """Seconds an F&B slot saves over running its forward then its backward: the forward's all-to-alls
    hidden behind the backward's compute and the backward's behind the forward's (DeepSeek-V3 report,
    sec. 3.2.1), each no more than the compute there is to hide it."""
    return (min(forward.a2a, backward.backward - backward.a2a)
            + min(backward.a2a, forward.forward - forward.a2a))


def _pipeline_trace(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, times: list[StageTimes]) -> Trace:
    plan = _plan(p, times)
    seconds = dict(zip(map(id, plan.actions), _plan_seconds(plan, model, p, hw, times)))
    return simulate_schedule(plan.schedule, lambda a: seconds[id(a)], lambda a: seconds[id(a)],
                             activation_bytes=int(counting.pipeline_send_bytes(model, p)), plan=plan,
                             blocking_sends=not p.overlap_p2p)


def _simulated_finish(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, times: list[StageTimes]):
    """Finish times and bubble from the event simulator, without building spans (the fast path)."""
    plan = _plan(p, times)
    seconds = _plan_seconds(plan, model, p, hw, times)
    starts, ends = run_plan(plan, seconds, blocking_sends=not p.overlap_p2p)
    last: dict[int, tuple[float, float]] = {}
    busy, makespan = 0.0, 0.0
    for a, rank, kind, start, end in zip(plan.actions, plan.ranks, plan.kinds, starts, ends):
        if kind != COMPUTE_KIND:
            continue
        busy += end - start
        makespan = max(makespan, end)
        if a.op in ("backward", "backward_weight") and (rank not in last or end > last[rank][1]):
            last[rank] = (start, end)
    bubble = 1.0 - busy / (p.pp * makespan) if p.pp > 1 else 0.0
    return [last[r] for r in range(p.pp)], bubble


def _finish_times(trace: Trace, p: ParallelSpec) -> list[tuple[float, float]]:
    """Per pipeline rank: (start, end) of its last backward (or weight-gradient) pass."""
    last: dict[int, Span] = {}
    for s in trace.spans:
        if s.lane == COMPUTE and s.kind in ("backward", "backward_weight"):
            if s.rank not in last or s.end > last[s.rank].end:
                last[s.rank] = s
    return [(last[r].start, last[r].end) for r in range(p.pp)]


def _pipeline_bubble(trace: Trace, p: ParallelSpec) -> float:
    """Idle share of the pipeline part of the step (before the gradient reduction), over all ranks."""
    if p.pp == 1:
        return 0.0
    compute = [s for s in trace.spans if s.lane == COMPUTE]
    makespan = max(s.end for s in compute)
    return 1.0 - sum(s.duration for s in compute) / (p.pp * makespan)


def _estimate_finish(model, p: ParallelSpec, hw,
                     times: list[StageTimes]) -> tuple[list[tuple[float, float]], float]:
    """Closed-form pipeline: the slowest rank's work m times, plus the schedule's ramp (its bubble).

    With equal stages and free p2p this is exactly :func:`paralab.schedules.theoretical_bubble`:
    1F1B/GPipe ramp (p-1)(F+B), interleaved (p-1)(F+B)/v (chunks are 1/v long; with m < p one
    microbatch's trip through every chunk, p (F+B), and a chunk's F+B for each other), ZB-H1 (p-1)(F+Bi-W)
    (Qi et al. 2023; with m < p - 1 only m W fill the ramp, so a longer W never shortens it) or, with
    m < p, the gradient's trip back (m+p-1)(F+Bi) + W, naive no overlap at
    all; other schedules use their closed-form bubble, DualPipeV's on each rank's work less the
    all-to-alls its F&B slots hide (:func:`_hidden_all_to_alls`). Blocking sends (``overlap_p2p`` off)
    add each chunk's sends to other ranks, per microbatch, to its rank's work (:func:`_rank_sends`).
    """
    pp, m, name = p.pp, p.microbatches, p.schedule_run
    one_way = p2p_time(model, p, hw) if pp > 1 else 0.0
    blocking, hop = (0.0 if p.overlap_p2p else one_way), 2 * one_way
    compute = _rank_compute(p, times)
    # each rank's work per microbatch, on the mean over the step's: its compute and its blocking sends
    work = [c / m + s for c, s in zip(compute, _rank_sends(p, blocking))]
    f, bi, w = _mean_passes(times)
    f, bi = f + blocking, bi + blocking
    if name == "naive":
        makespan = m * (sum(work) + (pp - 1) * hop)
    elif name == "zb-h1":
        # with m < p the gradient's trip back up the pipeline is the longer path (theoretical_bubble)
        # each of a rank's m deferred W fills one of the ramp's p - 1 slots: no more than m of them
        makespan = max(m * max(work) + (pp - 1) * (hop + f + bi) - min(m, pp - 1) * w,
                       (m + pp - 1) * (f + bi) + w + (pp - 1) * hop)
    elif name in ("gpipe", "1f1b") or (name == "interleaved" and m >= pp):
        makespan = m * max(work) + (pp - 1) * (f + bi + w + hop)
    elif name == "interleaved":  # m < p: one microbatch's trip through all p v chunks, then a chunk each
        makespan = pp * max(work) + (pp * p.virtual_stages - 1) * hop + (m - 1) * (f + bi + w + hop)
    else:
        makespan = m * max(work) / (1.0 - theoretical_bubble(name, pp, m, p.virtual_stages)) + (pp - 1) * hop
    # idle is what is not compute, as the simulated schedule counts it: a blocking send is not busy
    bubble = 1.0 - sum(compute) / (pp * makespan) if pp > 1 else 0.0
    return [(makespan - times[0].backward, makespan)] * pp, bubble


def stage_imbalance(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> float:
    """The share of a pipeline's rank-time that unequal ranks leave idle whatever the schedule, 1 - mean
    / most of the ranks' compute: no step is shorter than its busiest rank's work, so the idle share
    (``bubble_fraction``) is at least this; the rest is the schedule's ramp and p2p waits. An uneven
    split or a heavy output layer shows here, which more microbatches do not shrink."""
    p = parallel.resolved()
    if p.pp == 1:
        return 0.0
    if p.cp > 1:
        return CONTEXT_PARALLEL["stage_imbalance"](model, p, hw)
    return imbalance(rank_compute(model, p, hw))


def imbalance(compute: list[float]) -> float:
    """1 - mean / most of the ranks' compute: the share of their time the busiest leaves the others."""
    return 1.0 - sum(compute) / (len(compute) * max(compute))


def rank_compute(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec) -> list[float]:
    """Each pipeline rank's compute in a step (:func:`_rank_compute` of the stages' times)."""
    p = parallel.resolved()
    return _rank_compute(p, stage_times(model, p, hw))


def _rank_compute(p: ParallelSpec, times: list[StageTimes]) -> list[float]:
    """Each pipeline rank's compute in a whole step: its chunks' forwards and backwards for every microbatch,
    less the all-to-alls DualPipeV's F&B slots hide (:func:`_hidden_all_to_alls`)."""
    per_microbatch = [0.0] * p.pp
    for stage, st in enumerate(times):
        per_microbatch[counting.stage_rank(p, stage)] += st.forward + st.backward
    return [p.microbatches * c - hidden for c, hidden in zip(per_microbatch, _hidden_all_to_alls(p, times))]


def _blocking_send(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds a send holds its rank: a hop's with ``overlap_p2p`` off, else nothing."""
    return p2p_time(model, p, hw) if p.pp > 1 and not p.overlap_p2p else 0.0


def _rank_sends(p: ParallelSpec, blocking: float) -> list[float]:
    """Each pipeline rank's blocking sends per microbatch, ``blocking`` seconds each
    (:func:`_blocking_send`): a chunk's activation to the next chunk and its gradient to the one
    before, where that chunk is on another rank (the V's two ends share rank 0 and its tip rank p - 1,
    which keep those hand-offs; nothing is sent past the model's ends)."""
    sends = [0.0] * p.pp
    if not blocking:  # sends beside compute (the default): nothing to count, on the planner's hot path
        return sends
    for sender, _ in counting.pipeline_hops(p):
        sends[sender] += blocking
    return sends


def _extended_finish(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec,
                     times: list[StageTimes]) -> tuple[list[tuple[float, float]], float]:
    """A pipeline past :data:`SIMULATED_PASSES`, for schedules without a closed form that holds
    (:data:`EXTENDED_SCHEDULES`): the first microbatches the budget holds are simulated, and each
    further one adds one period of the busiest rank, the pace every rank keeps once the pipeline is
    full: what that rank's compute grows by (a steady F&B slot hides its whole all-to-all, where the
    step's mean counts the warm-up's too) and its blocking sends. The budget holds at least 2p
    microbatches up to 64 stages (beyond, :func:`pipeline_pricing` takes the closed form). ZB-V's
    list-scheduled ramp is not settled at 2p: with full recompute's pass times it still grows on 16
    stages (55 F at 2p, 64 F at 4p, 67 F at 8p microbatches) and shrinks a little on 8, so the extension
    reads within about 2% of simulating every pass (16 stages at 8p: -2.0%; Megatron 1T on 64 stages:
    -0.8% at 256 microbatches, -1.3% at 512), against -4.5% for the closed form. The bubble counts
    compute alone as busy, as the simulated one does."""
    m, budget = p.microbatches, SIMULATED_PASSES // (2 * p.chunks)
    short = p.replace(microbatches=budget, global_batch=p.global_batch // m * budget)
    finish, short_bubble = _simulated_finish(model, short, hw, times)
    short_makespan = max(end for _, end in finish)
    grown = [a - b for a, b in zip(_rank_compute(p, times), _rank_compute(short, times))]
    extra = max(g + (m - budget) * s for g, s in zip(grown, _rank_sends(p, _blocking_send(model, p, hw))))
    busy = (1.0 - short_bubble) * p.pp * short_makespan + sum(grown)
    finish = [(start + extra, end + extra) for start, end in finish]
    return finish, 1.0 - busy / (p.pp * (short_makespan + extra))


def step_floor(model: ModelSpec, parallel: ParallelSpec, hw: HardwareSpec,
               slice_floor: Callable[[ModelSpec, ParallelSpec], float] | None = None) -> float:
    """Seconds no closed-form prediction of this layout undercuts (``predict(..., simulate=False)``):
    its closed-form pipeline (:func:`_estimate_finish`) without what ZeRO-2/3's per-part collectives
    add to each pass, and nothing after it (gradient reduction, optimizer). Those collectives only
    lengthen the passes, the closed form never shortens as a pass lengthens, and the step ends after
    the pipeline. A floor reads no ZeRO stage, so one serves a layout's four, and it skips
    the dearest parts of a prediction: the planner prices a layout only while its floor could still
    place it (:func:`paralab.sim.planner.plan`). A cp run's floor is its slice run's and its attention
    across the split's (:func:`paralab.sim.context.step_floor`); ``slice_floor`` prices that slice run in
    this function's place, for a caller that keeps the floors it priced (the planner's ring and
    all-to-all layouts of one shape share their slice run)."""
    if parallel.cp > 1:
        return CONTEXT_PARALLEL["step_floor"](model, parallel, hw, slice_floor)
    p = parallel.resolved().replace(zero=0)
    finish, _ = _estimate_finish(model, p, hw, stage_times(model, p, hw))
    return max(end for _, end in finish)


def _grad_syncs(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, finish) -> list[dict]:
    """Every pipeline rank's end-of-step work (:func:`_grad_sync`), its compute ending at ``finish``:
    the gradient reduction also waits for the slowest replica after that compute (:func:`sync_wait`).
    Ranks of a kind (:func:`counting.rank_kinds`) hold the same parameters, so the work is priced once
    a kind (the planner weighs every rank of thousands of layouts) and only the wait differs."""
    kinds, alike, syncs = counting.rank_kinds(model, p), {}, []
    for rank, (_, last_end) in enumerate(finish):
        if kinds[rank] not in alike:
            alike[kinds[rank]] = _grad_sync(model, p, hw, rank)
        sync = alike[kinds[rank]]
        if sync["waits"]:  # on the step that spans the replicas: a hierarchy's across nodes
            wait = sync_wait(hw, last_end, p.dp)
            if sync["after"]:
                across, *rest = sync["after"]
                sync = {**sync, "after": (across._replace(seconds=across.seconds + wait), *rest)}
            else:
                sync = {**sync, "reduce": sync["reduce"]._replace(seconds=sync["reduce"].seconds + wait)}
        syncs.append(sync)
    return syncs


class Reduction(NamedTuple):
    """One collective of the end-of-step gradient reduction: its seconds, op, wire bytes a rank sends,
    group size and whether it crosses nodes."""

    seconds: float
    op: str
    wire: float
    group: int
    inter: bool


def _grad_sync(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, rank: int) -> dict:
    """End-of-step data-parallel work of one pipeline rank: the gradient reduction that overlaps the
    backward (``reduce``, a :class:`Reduction`) and the ones a hierarchical all-reduce runs after it
    (``after``: the inter-node all-reduce and the intra-node all-gather,
    :func:`counting.hierarchical_steps`), the updated parameters' all-gather of ZeRO-1/2 (``gather``:
    seconds, wire bytes), the optimizer's time and the gradient copies' (``grad_copy_bytes`` at the
    memory bandwidth); whether the reduction waits for the slowest replica (``waits``: it is a
    synchronisation of the replicas after their compute, ZeRO-2/3's reduce-scatters being inside the
    backward)."""
    pb, gb, _ = counting.bytes_per_param(model, p)
    params, experts = counting.stage_params(model, p, rank), counting.expert_params(model, p, rank)
    groups = counting.dp_groups(p, params, experts)  # a mixture of experts' experts over dp / ep
    reduce_op = "all_reduce" if p.zero == 0 else "reduce_scatter"
    inter = crosses_nodes(hw, p.dp, p.stride("dp"))
    reduce, after = Reduction(0.0, reduce_op, 0.0, p.dp, inter), ()
    gather = (0.0, 0.0)
    messages = max(p.grad_buckets, 1)

    def over_dp(op: str, nbytes: int) -> tuple[float, float]:
        return (dp_collective_time(hw, p, op, params, experts, nbytes, messages),
                sum(counting.ring_wire_bytes(op, n * nbytes, size) for n, size, _ in groups))

    if groups and p.hierarchical_dp:
        steps = counting.hierarchical_steps(p, params * gb)
        reduce, *after = (Reduction(collective_time(hw, op, payload, size, stride, messages), op,
                                    counting.ring_wire_bytes(op, payload, size), size,
                                    crosses_nodes(hw, size, stride))
                          for _, op, payload, size, stride in steps)
    elif groups and not p.zero_in_passes:
        seconds, wire = over_dp(reduce_op, gb)
        reduce = Reduction(seconds, reduce_op, wire, p.dp, inter)
    if groups and p.zero in (1, 2):
        gather = over_dp("all_gather", pb)
    local = (params - experts) / p.dp + experts / (p.dp // p.ep) if p.zero >= 1 else params
    rank_hw = per_rank(hw, p.world_size)
    optimizer = (OPTIMIZER_BYTES_TOUCHED * local / (rank_hw.optimizer_bw or rank_hw.memory_bandwidth)
                 + hw.kernel_overhead_s)
    optimizer += counting.stage_tensors(model, p, rank) * hw.host_overhead_s.get("tensor_update", 0.0)
    copies = p.grad_copy_bytes * counting.reduced_params(groups) / rank_hw.memory_bandwidth
    overlap = p.overlap_grad_reduce and hw.overlaps_comm
    return {"reduce": reduce, "after": tuple(after), "gather": gather, "optimizer": optimizer,
            "copies": copies, "inter": inter,
            "params": params, "overlap": overlap, "sm_share": hw.comm_sm_share,
            "waits": bool(groups) and not p.zero_in_passes}


def _sync_window(p: ParallelSpec, sync: dict, last_start: float, last_end: float) -> tuple[float, float]:
    """When the gradient reduction runs: under the last backward when overlapped (and the hardware
    overlaps communication with compute), else after it.

    Overlapped reduction starts with the last backward (buckets fill from the last layer down) and
    cannot finish before that backward ends plus the last bucket's share: 1/grad_buckets of it, or
    a 1/8 tail (a few DDP buckets) when the bucket count is not given. The backward it overlaps runs
    slower by the SMs the reduction holds (:func:`beside_comm`). A hierarchical all-reduce's other two
    steps (``after``) follow, one after the other, as paralab's ddp runs them once the backward has
    ended and each bucket's reduce-scatter has landed.
    """
    seconds, tail = sync["reduce"].seconds, sum(r.seconds for r in sync["after"])
    if not seconds + tail:
        return last_end, last_end
    if sync["overlap"]:
        computed = last_start + beside_comm(last_end - last_start, seconds, sync["sm_share"])
        return last_start, max(last_start + seconds, computed + seconds / (p.grad_buckets or 8)) + tail
    return last_end, last_end + seconds + tail


class TailCollective(NamedTuple):
    """An all-reduce a rank runs between its gradient reduction and its optimizer step: when it runs,
    its payload (bytes), group size and whether it crosses nodes."""

    name: str
    start: float
    end: float
    payload: float
    group: int
    inter: bool
    ranks: tuple[int, ...] = ()  # its group's pipeline ranks, where all are the trace's (the tied pair)


def _end_of_step(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, finish) -> list[tuple]:
    """Every pipeline rank's communication after its last backward: (its :func:`_grad_sync`, the
    gradient reduction's window, the :class:`TailCollective` s that follow it), in the order Megatron-LM
    finalizes a step's gradients:

    - with sequence parallelism, the all-reduce over tp of the replicated parameters' gradients
      (:func:`counting.sequence_parallel_grad_params`, each tp rank saw its sequence slice only);
    - the first and last stages' all-reduce of a tied embedding's gradient, once both have reduced
      their gradients (:func:`counting.tied_embedding_ranks`), inside a node when every pair of ranks
      is on one (:func:`pairs_cross_nodes`).

    The optimizer step waits for them."""
    syncs = _grad_syncs(model, p, hw, finish)
    windows = [_sync_window(p, sync, *last) for last, sync in zip(finish, syncs)]
    tails: list[list[TailCollective]] = [[] for _ in windows]
    for rank, (_, end) in enumerate(windows):
        if replicated := counting.sequence_parallel_grad_params(model, p, rank):
            payload = replicated * counting.bytes_per_param(model, p)[1]
            seconds = collective_time(hw, "all_reduce", payload, p.tp, p.stride("tp"))
            tails[rank].append(TailCollective("sequence-parallel grads all-reduce", end, end + seconds,
                                              payload, p.tp, crosses_nodes(hw, p.tp, p.stride("tp"))))
    if holders := counting.tied_embedding_ranks(model, p):
        first, last = holders
        start = max(tails[r][-1].end if tails[r] else windows[r][1] for r in holders)
        inter = pairs_cross_nodes(p, hw.gpus_per_node, first, last)
        stride = max((last - first) * p.stride("pp"), hw.gpus_per_node) if inter else 1
        payload = counting.tied_embedding_payload(model, p)
        seconds = collective_time(hw, "all_reduce", payload, 2, stride)
        for rank in holders:
            tails[rank].append(TailCollective("tied embedding all-reduce", start, start + seconds, payload, 2,
                                              inter, tuple(holders)))
    return [(sync, window, tuple(tail)) for sync, window, tail in zip(syncs, windows, tails)]


def _assemble(model, p: ParallelSpec, hw: HardwareSpec, times, finish, bubble: float) -> Prediction:
    """The prediction of a step whose pipeline ends at ``finish`` (per rank). Of the expert all-to-alls
    the breakdown counts as expert-parallel time only those DualPipeV's F&B slots leave exposed
    (:func:`_hidden_all_to_alls`); the hidden ones cost nothing (the slots are shorter by them)."""
    step = 0.0
    exposed = optimizer = copies = 0.0
    first_end = math.inf
    pipeline = max(e for _, e in finish)

    def past_pipeline(start: float, end: float) -> float:
        return max(0.0, end - max(start, pipeline))

    for sync, (_, end), tails in _end_of_step(model, p, hw, finish):
        end = tails[-1].end if tails else end
        optimizer_at = end + sync["copies"]
        gather_at = optimizer_at + sync["optimizer"]
        rank_end = gather_at + sync["gather"][0]
        first_end = min(first_end, rank_end)
        if rank_end > step:
            # the step's tail, as the last rank to finish spends it after the pipeline's end: a rank
            # that ends its backward early waits for the others (the slowest replica, the tied
            # embedding's twin) before its gradients are summed, and may start its optimizer earlier
            step = rank_end
            exposed = past_pipeline(-math.inf, end) + past_pipeline(gather_at, rank_end)
            copies, optimizer = past_pipeline(end, optimizer_at), past_pipeline(optimizer_at, gather_at)
    loop = training_loop_time(model, p, hw)
    step += loop
    memory = memory_per_gpu(model, p)
    # the collectives inside the passes, on the mean pipeline rank as the compute and bubble are (an
    # uneven split's first rank may hold one block, or no expert layer)
    per_rank = p.microbatches / p.pp
    per_rank_tp = per_rank * sum(st.tp_comm for st in times)
    hidden_a2a = sum(_hidden_all_to_alls(p, times)) / p.pp
    per_rank_a2a = per_rank * sum(2 * st.a2a for st in times) - hidden_a2a  # forward and backward
    # ZeRO-2/3 collectives run inside the forward and backward passes; what they add is data-parallel time
    per_rank_zero = per_rank * sum(st.zero_comm for st in times)
    return Prediction(
        step_time_s=step,
        tokens_per_s=p.global_batch * model.seq / step,
        **flop_rates(model, p, hw, step),
        bubble_fraction=bubble,
        memory_bytes_per_gpu=memory,
        comm_bytes_per_gpu=counting.comm_bytes_per_gpu(model, p),
        params=counting.parameter_counts(model)["total"],
        active_params=counting.active_parameters(model),
        breakdown_s={
            "pipeline": pipeline,
            "compute": pipeline * (1 - bubble) - per_rank_tp - per_rank_a2a - per_rank_zero,
            "bubble": bubble * pipeline,
            "tp_comm": per_rank_tp,
            "ep_comm": per_rank_a2a,
            "dp_comm_exposed": exposed + per_rank_zero,
            "grad_copies": copies,
            "optimizer": optimizer,
            "loop": loop,
        },
        parallel=p,
        fits=memory["total"] <= usable_memory(hw),
        step_window_s=2 * step - loop - first_end,
    )


def flop_rates(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec, step: float,
               core_reruns: float = 0.0) -> dict[str, float]:
    """A step's FLOPs and what they make of the GPUs: model and hardware FLOPs (recompute counted for
    the layers it reruns, and ``core_reruns`` more forwards of each attention core: see
    :func:`paralab.sim.counting.flops_per_step`), TFLOP/s per GPU, and MFU and HFU against the rated
    peak, so that a power-capped part's lower clock shows as lower utilisation, not as a lower bar. The
    peak is the model dtype's also when its GEMMs run in FP8, as torchtitan reports its Float8 runs:
    MFU then compares with the same model's bf16 runs (and may pass what bf16 could reach)."""
    flops = counting.flops_per_step(model, p.global_batch, p.recompute, counting.recompute_share(model, p),
                                    core_reruns)
    peak = hw.datasheet_peak(model.dtype) * (1 if hw.shared_compute else p.world_size)
    return {
        "model_flops_per_step": flops["model"],
        "hardware_flops_per_step": flops["hardware"],
        "tflops_per_gpu": flops["hardware"] / step / p.world_size / 1e12,
        "mfu": flops["model"] / (step * peak),
        "hfu": flops["hardware"] / (step * peak),
    }


def training_loop_time(model: ModelSpec, p: ParallelSpec, hw: HardwareSpec) -> float:
    """Seconds per step of the training loop itself (loading the rank's batch, bookkeeping): measured
    on the local CPU, where nothing hides it; 0 on the GPU presets, where it overlaps queued kernels.
    A run that loads its batch before the step window opens (``loads_batch_in_step`` off) pays only
    the bookkeeping."""
    tokens = p.global_batch // p.dp * model.seq if p.loads_batch_in_step else 0
    return hw.host_overhead_s.get("step", 0.0) + tokens * hw.host_overhead_s.get("data_token", 0.0)


def usable_memory(hw: HardwareSpec) -> float:
    """What a plan may fill: capacity less what is held outside the allocator (``memory_reserved_bytes``:
    CUDA context, NCCL buffers, workspaces), less the allocator's fragmentation share of the rest
    (``allocator_overhead``, 10% unless the hardware says otherwise)."""
    return (hw.memory_bytes - hw.memory_reserved_bytes) * (1 - hw.allocator_overhead)
