"""Exact counts behind the cost model: parameters, FLOPs, memory and bytes on the wire.

Every function says which paper its formula comes from. For GPT shapes they reduce exactly to the
published closed forms (the tests check that); for Llama shapes (SwiGLU, GQA, RMSNorm, RoPE, untied
embeddings) the same term-by-term counting is applied to the extra matrices, so nothing is
approximated by "12 l h^2".

Conventions: ``b`` micro-batch size (sequences), ``s`` sequence length, ``h`` hidden, ``a`` heads,
``l`` layers, ``V`` vocabulary, ``t`` tensor-parallel degree. A FLOP is a multiply or an add, so a
matmul of (m x k) by (k x n) costs 2mkn.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from itertools import accumulate

from paralab.schedules import (
    BACKWARD,
    COMPUTE_OPS,
    FORWARD,
    V_SHAPED,
    build_schedule,
    interleaved_order,
    interleaved_round,
    peak_held,
)
from paralab.sim import moe
from paralab.sim.specs import ModelSpec, ParallelSpec
from paralab.stage_split import layers_per_stage
from paralab.wire import ring_wire_bytes

# ------------------------------------------------------------------------------------------ parameters


def layer_params(model: ModelSpec) -> dict[str, int]:
    """Parameters of one transformer layer, by part (see :func:`_layer_params`)."""
    return dict(_layer_params(model))


@lru_cache(maxsize=256)  # asked for a million times in planning a 16k-GPU run; a copy is handed out
def _layer_params(model: ModelSpec) -> tuple[tuple[str, int], ...]:
    """Parameters of one transformer layer, by part.

    GPT (Narayanan et al. 2021, eq. 2): QKV 3h^2 + 3h, output projection h^2 + h, MLP 8h^2 + 5h, two
    LayerNorms 4h: 12h^2 + 13h. GQA narrows K and V to kv_heads x head_dim; a gated MLP has three
    matrices (gate, up, down); RMSNorm has one vector per norm; parallel blocks have one norm.
    """
    h, kv = model.hidden, model.kv_dim
    bias = 1 if model.biases else 0
    return (
        ("attention", h * (h + 2 * kv) + bias * (h + 2 * kv) + h * h + bias * h),
        ("mlp", moe.ffn_params(model, model.ffn)),
        ("norms", norms_per_layer(model) * model.norm_params * h),
    )


def norms_per_layer(model: ModelSpec) -> int:
    """Pre-norm layers normalise before attention and before the MLP; parallel blocks (GPT-J, PaLM)
    feed both from one norm."""
    return 1 if model.parallel_blocks else 2


def parameter_counts(model: ModelSpec) -> dict[str, int]:
    """All parameters by part; ``total`` is their sum (see :func:`_parameter_counts`)."""
    return dict(_parameter_counts(model))


@lru_cache(maxsize=256)
def _parameter_counts(model: ModelSpec) -> tuple[tuple[str, int], ...]:
    """All parameters by part; ``total`` is their sum.

    Narayanan et al. 2021, eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), i.e. layers, the
    token embedding V h (tied with the output layer) and learned positions s h. The paper leaves out
    the final norm; it is counted here as ``final_norm`` so ``total`` is the real model, and
    ``total - final_norm`` is the paper's P. A mixture of experts counts every expert
    (:func:`active_parameters`: those a token meets).
    """
    h = model.hidden
    counts = {
        "embedding": model.vocab * h,
        "positions": (model.position_rows or model.seq) * h if model.learned_positions else 0,
        "layers": model.layers * sum(layer_params(model).values()) + moe.extra_layer_params(model),
        "output": 0 if model.tied_embeddings else model.vocab * h + (model.vocab if model.output_bias else 0),
        "final_norm": model.norm_params * h,
    }
    counts["total"] = sum(counts.values())
    return tuple(counts.items())


def active_parameters(model: ModelSpec) -> int:
    """Parameters one token meets: all of a dense model; of a mixture of experts, the router, top_k
    routed experts and the shared ones in each MoE layer (Mixtral 8x7B: 12.9B of 46.7B)."""
    return (parameter_counts(model)["total"] - moe.extra_layer_params(model)
            + moe.extra_layer_params(model, active=True))


def replicated_layer_params(model: ModelSpec) -> int:
    """Parameters of one layer that every tensor-parallel rank holds whole: the norms and the biases of
    the row-parallel output projections (attention and MLP), which are added after the all-reduce
    (Shoeybi et al. 2019, sec. 3)."""
    return layer_params(model)["norms"] + (2 * model.hidden if model.biases else 0)


def last_stage_rank(parallel: ParallelSpec) -> int:
    """The pipeline rank that holds the last stage (output layer and loss): pp - 1, or rank 0 in the V
    of ZB-V and DualPipeV, which puts the first and the last chunk on the same rank (Qi et al. 2024)."""
    return 0 if parallel.schedule in V_SHAPED and parallel.pp > 1 else parallel.pp - 1


def tied_embedding_ranks(model: ModelSpec, parallel: ParallelSpec) -> tuple[int, ...]:
    """The pipeline ranks that hold a copy of a tied embedding, (first stage's, last stage's): the input
    embedding and the output layer. They sum the two copies' gradients once a step, after the
    data-parallel reduction and before the optimizer step (Megatron-LM's ``finalize_model_grads``;
    Shoeybi et al. 2019). None when one rank holds both, or the embedding is not tied."""
    first, last = stage_rank(parallel, 0), last_stage_rank(parallel)
    return (first, last) if model.tied_embeddings and first != last else ()


def tied_embedding_payload(model: ModelSpec, parallel: ParallelSpec) -> float:
    """Bytes of the tied embedding's gradient that one GPU all-reduces with its twin: its vocabulary
    slice, in the gradients' dtype (fp32 with ``fp32_grads``, Megatron-LM's main_grad)."""
    return parameter_counts(model)["embedding"] / parallel.tp * bytes_per_param(model, parallel)[1]


def stage_rank(parallel: ParallelSpec, stage: int) -> int:
    """The pipeline rank of model chunk ``stage``: round robin (interleaved), or down and back up the V."""
    return _chunk_rank(stage, parallel.pp, _v_shaped(parallel))


def _v_shaped(parallel: ParallelSpec) -> bool:
    return parallel.schedule in V_SHAPED and parallel.pp > 1


def pipeline_hops(parallel: ParallelSpec) -> list[tuple[int, int]]:
    """(sending pipeline rank, receiving pipeline rank) of every send one microbatch makes: each
    chunk's activation to the next chunk and its gradient back, where the two sit on different ranks
    (interleaved wraps from the last rank to the first; the V keeps its tip on one rank)."""
    ranks = [stage_rank(parallel, chunk) for chunk in range(parallel.chunks)]
    forward = [(a, b) for a, b in zip(ranks, ranks[1:]) if a != b]
    return forward + [(b, a) for a, b in forward]


def _chunk_rank(stage: int, pp: int, v_shaped: bool) -> int:
    return (stage if stage < pp else 2 * pp - 1 - stage) if v_shaped else stage % pp


def chunk_layers(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """Blocks of every model chunk (pp x v of them, in model order): even, or ``stage_layers``
    (paralab.stage_split, the executor's rule; Megatron-LM's first/last stage layers are one such)."""
    return layers_per_stage(model.layers, parallel.chunks, parallel.stage_layers)


def moe_blocks(model: ModelSpec, first: int, count: int) -> int:
    """How many of blocks first .. first + count - 1 have a mixture of experts for an MLP: those from
    ``model.dense_layers`` on."""
    return max(0, min(count, first + count - model.dense_layers)) if model.experts else 0


def chunk_moe_blocks(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """How many of each model chunk's blocks (:func:`chunk_layers`) have a mixture of experts (in one
    pass: the planner asks it of layouts of tens of thousands of chunks)."""
    layers = chunk_layers(model, parallel)
    return [moe_blocks(model, first, count) for first, count in zip(accumulate(layers, initial=0), layers)]


def rank_layers(model: ModelSpec, parallel: ParallelSpec, rank: int, moe_only: bool = False) -> int:
    """Blocks on pipeline rank ``rank``, over all its chunks (``moe_only``: those whose MLP is a
    mixture of experts)."""
    layers, moe_layers = layers_by_rank(model, parallel)
    return (moe_layers if moe_only else layers)[rank]


def layers_by_rank(model: ModelSpec, parallel: ParallelSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Blocks and MoE blocks of every pipeline rank, in one pass over the chunks: the planner weighs
    every rank of thousands of layouts, and a pass per rank made it quadratic in pp x v."""
    return _blocks_by_rank(model, parallel.pp, parallel.chunks, parallel.stage_layers, _v_shaped(parallel))


def chunks_by_rank(model: ModelSpec, parallel: ParallelSpec) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(blocks, MoE blocks) of each chunk of every pipeline rank, in model order."""
    return _chunks_by_rank(model, parallel.pp, parallel.chunks, parallel.stage_layers, _v_shaped(parallel))


@lru_cache(maxsize=1024)
def _chunks_by_rank(model: ModelSpec, pp: int, chunks: int, stage_layers: tuple[int, ...] | None,
                    v_shaped: bool) -> tuple[tuple[tuple[int, int], ...], ...]:
    """:func:`chunks_by_rank` from what it reads, in one pass: thousands of layouts share a few
    pipeline shapes."""
    held: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    first = 0
    for stage, count in enumerate(layers_per_stage(model.layers, chunks, stage_layers)):
        held[_chunk_rank(stage, pp, v_shaped)].append((count, moe_blocks(model, first, count)))
        first += count
    return tuple(map(tuple, held))


@lru_cache(maxsize=1024)
def _blocks_by_rank(model: ModelSpec, pp: int, chunks: int, stage_layers: tuple[int, ...] | None,
                    v_shaped: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`layers_by_rank` from what it reads."""
    held = _chunks_by_rank(model, pp, chunks, stage_layers, v_shaped)
    return (tuple(sum(n for n, _ in rank) for rank in held),
            tuple(sum(moe for _, moe in rank) for rank in held))


@lru_cache(maxsize=1024)
def _interleaved_peak(pp: int, microbatches: int, virtual_stages: int, rank: int,
                      chunk_bytes: tuple[float, ...]) -> float:
    """The most bytes rank ``rank`` of the interleaved schedule holds at once when its chunks keep
    ``chunk_bytes`` each (in model order) per microbatch: its own order walked, since the chunks fill
    unevenly (the last rank's last chunk holds one microbatch at the peak, its first chunks the most)
    and the mean per chunk is then off (Llama 3's last rank: 113 layers' worth, not 99)."""
    order = interleaved_order(pp, microbatches, virtual_stages, rank)
    return peak_held(order, lambda stage: chunk_bytes[stage // pp])


def rank_kinds(model: ModelSpec, parallel: ParallelSpec) -> list[tuple]:
    """Each pipeline rank's kind: ranks are alike when their chunks hold as many blocks and MoE blocks,
    chunk by chunk, and they hold the same ends (rank 0 the first stage, in every schedule; the last
    stage's rank). Alike ranks hold the same parameters, so the same gradients to reduce and optimizer
    work, and the same activations per chunk; an uneven split of 128 chunks over 16 ranks has about
    four kinds."""
    chunks, last = chunks_by_rank(model, parallel), last_stage_rank(parallel)
    return [(chunks[rank], rank == 0, rank == last) for rank in range(parallel.pp)]


def first_rank_of_each_kind(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """The first pipeline rank of each kind (:func:`rank_kinds`). Alike ranks differ only in the
    activations in flight, which never grow with the rank (:func:`peak_inflight_chunks`; nor, over the
    same chunks, what an interleaved order holds at once: a later rank's warm-up is a shorter prefix of
    the same order): the first of a kind holds the most of its kind, so the fullest rank is among
    these."""
    kinds = {}
    for rank, kind in enumerate(rank_kinds(model, parallel)):
        kinds.setdefault(kind, rank)
    return list(kinds.values())


def expert_params(model: ModelSpec, parallel: ParallelSpec, rank: int) -> float:
    """Routed-expert parameters one GPU of pipeline rank ``rank`` holds: E / ep of each MoE layer's."""
    return moe.expert_params_per_gpu(model, parallel, rank_layers(model, parallel, rank, moe_only=True))


def chunk_params(model: ModelSpec, parallel: ParallelSpec, chunk: int) -> float:
    """Parameters one GPU holds of model chunk ``chunk`` (before ZeRO sharding)."""
    layers = chunk_layers(model, parallel)
    first = sum(layers[:chunk])
    return _params_of(model, parallel, layers[chunk], moe_blocks(model, first, layers[chunk]), chunk == 0,
                      chunk == parallel.chunks - 1)


def zero_units(model: ModelSpec, parallel: ParallelSpec, chunk: int) -> tuple[float, ...]:
    """Parameters one GPU holds of each part of model chunk ``chunk`` that ZeRO-3 gathers whole, in
    forward order: the embedding (with learned positions) on the first chunk, each block, the final
    norm and the output layer on the last (only the norm when the output layer is the tied embedding
    on the same rank).

    A part computes only once its gather has arrived, so these, not equal slices of the chunk, are
    what a step waits for: paralab's ``zero3`` gathers exactly these parts and DeepSpeed's ZeRO-3
    each submodule. PyTorch FSDP wrapped block by block and then whole keeps the two ends in its
    root unit instead (``ParallelSpec.fsdp_root``); these stay the modules' own parts, and the cost
    model gives the root's collectives to the first (:func:`fsdp_root`).
    """
    return _chunk_parts(model, parallel, chunk, *_part_sizes(model, parallel))


def zero_unit_experts(model: ModelSpec, parallel: ParallelSpec, chunk: int) -> tuple[float, ...]:
    """Of each part :func:`zero_units` lists, the routed-expert parameters one GPU holds (their
    collectives run over the dp / ep ranks holding the same experts, the rest over dp)."""
    per_block = moe.expert_params_per_gpu(model, parallel, 1) if model.experts else 0.0
    return _chunk_parts(model, parallel, chunk, 0.0, 0.0, 0.0, per_block)


def _chunk_parts(model: ModelSpec, parallel: ParallelSpec, chunk: int, embed: float, head: float,
                 dense: float, moe_block: float) -> tuple[float, ...]:
    """A value for each of chunk ``chunk``'s parts, in forward order, given the embedding's, the last
    part's, a dense block's and a MoE block's."""
    layers = chunk_layers(model, parallel)
    moe_here = moe_blocks(model, sum(layers[:chunk]), layers[chunk])  # the chunk's last: MoE follows dense
    blocks = (dense,) * (layers[chunk] - moe_here) + (moe_block,) * moe_here
    return (embed,) * (chunk == 0) + blocks + (head,) * (chunk == parallel.chunks - 1)


def dp_groups(parallel: ParallelSpec, params: float, experts: float) -> list[tuple[float, int, int]]:
    """(parameters, group size, rank stride) of each data-parallel collective over ``params``
    parameters of which ``experts`` are routed experts: the rest over dp, the experts over the dp / ep
    ranks that hold the same ones (every ep-th rank of a dp group), in that order; groups of one rank
    left out."""
    groups = ((params - experts, parallel.dp, parallel.stride("dp")),
              (experts, parallel.dp // parallel.ep, parallel.stride("dp") * parallel.ep))
    return [(n, size, stride) for n, size, stride in groups if n and size > 1]


def reduced_params(groups: list[tuple[float, int, int]]) -> float:
    """Parameters whose gradients are reduced across data-parallel ranks, from their
    :func:`dp_groups`: all but routed experts that no other rank holds (ep = dp)."""
    return sum(n for n, _, _ in groups)


def hierarchical_steps(parallel: ParallelSpec, payload: float) -> list[tuple[str, str, float, int, int]]:
    """(family, op, payload bytes, group size, rank stride) of the three collectives a hierarchical
    all-reduce of ``payload`` bytes over dp runs (``hierarchical_dp`` = L ranks a node, N nodes): the
    reduce-scatter among the node's L ranks, the all-reduce of each rank's 1/L shard among the N ranks
    of its local index (one on each node, so each uses its own NIC), the all-gather among the L. The
    bytes crossing nodes shrink L-fold against a flat ring's; the bytes inside the node are an
    all-reduce's."""
    local, stride = parallel.hierarchical_dp, parallel.stride("dp")
    return [("dp_intra", "reduce_scatter", payload, local, stride),
            ("dp_inter", "all_reduce", payload / local, parallel.dp // local, stride * local),
            ("dp_intra", "all_gather", payload, local, stride)]


def backward_gather_groups(parallel: ParallelSpec, params: float, experts: float,
                           held: float) -> list[tuple[float, int, int]]:
    """:func:`dp_groups` as ZeRO-3 gathers for a backward: ``held`` parameters of FSDP's root unit
    (:func:`fsdp_root`), kept whole since the forward, are dense, so the first group, the dense one,
    gathers that many fewer."""
    return [(n - held if i == 0 else n, size, stride)
            for i, (n, size, stride) in enumerate(dp_groups(parallel, params, experts))]


def largest_zero_unit(model: ModelSpec, parallel: ParallelSpec, rank: int) -> float:
    """The largest part (:func:`zero_units`) on pipeline rank ``rank``: what ZeRO-2/3 hold whole at
    once (of the blocks alone beside FSDP's root unit, which is held whole throughout), a block's
    routed experts only where dp / ep ranks shard them (at ep = dp each rank's own are whole already:
    neither gathered nor reduced)."""
    return _rank_parts(model, parallel)[rank][1]


def rank_zero_units(model: ModelSpec, parallel: ParallelSpec, rank: int,
                    experts: bool = False) -> tuple[float, ...]:
    """Parameters of every part (:func:`zero_units`) pipeline rank ``rank`` gathers one by one, in
    forward order over its chunks (blocks alone beside FSDP's root unit): a backward reduce-scatters
    them last first. ``experts``: of each, its routed experts' (:func:`zero_unit_experts`)."""
    parts: list[float] = []
    for stage in (s for s in range(parallel.chunks) if stage_rank(parallel, s) == rank):
        units = (zero_unit_experts if experts else zero_units)(model, parallel, stage)
        if parallel.fsdp_root:  # the ends are the root's
            units = units[stage == 0 : len(units) - (stage == parallel.chunks - 1)]
        parts.extend(units)
    return tuple(parts)


def zero_unit_count(model: ModelSpec, parallel: ParallelSpec, rank: int) -> int:
    """How many parts (:func:`zero_units`) pipeline rank ``rank`` holds over all its chunks (blocks
    alone beside FSDP's root unit)."""
    return _rank_parts(model, parallel)[rank][0]


def zero2_bucket(model: ModelSpec, parallel: ParallelSpec, rank: int) -> float:
    """Parameters of one bucket of a ZeRO-2 that reduces ``grad_buckets`` of them: the rank's share."""
    return stage_params(model, parallel, rank) / parallel.grad_buckets


def fsdp_root(model: ModelSpec, parallel: ParallelSpec) -> tuple[float, float]:
    """Parameters one GPU holds of the embedding and of the last part (final norm, output layer) in
    FSDP's root unit (``ParallelSpec.fsdp_root``: whole from the forward's first gather to the
    backward's end); (0, 0) without one."""
    return _part_sizes(model, parallel)[:2] if parallel.fsdp_root else (0.0, 0.0)


@lru_cache(maxsize=1024)
def _rank_parts(model: ModelSpec, parallel: ParallelSpec) -> tuple[tuple[int, float], ...]:
    """(count, largest) of every rank's parts, from the ranks' block counts in one pass (the planner
    asks it of every rank of every layout)."""
    embed, head, dense, moe_block = _part_sizes(model, parallel)
    if model.experts and parallel.dp // parallel.ep <= 1:  # a block's routed experts, on no other data-
        moe_block -= moe.expert_params_per_gpu(model, parallel, 1)  # parallel rank, are not gathered
    layers, moe_layers = layers_by_rank(model, parallel)
    # FSDP's root unit is held whole apart from the parts gathered one by one (fsdp_root)
    first, last = (-1, -1) if parallel.fsdp_root else (stage_rank(parallel, 0), last_stage_rank(parallel))
    return tuple(
        (layers[rank] + (rank == first) + (rank == last),
         max(embed if rank == first else 0.0, head if rank == last else 0.0,
             dense if layers[rank] > moe_layers[rank] else 0.0, moe_block if moe_layers[rank] else 0.0))
        for rank in range(parallel.pp)
    )  # fmt: skip


@lru_cache(maxsize=1024)
def _part_sizes(model: ModelSpec, parallel: ParallelSpec) -> tuple[float, float, float, float]:
    """Parameters one GPU holds of the embedding part, the last part (final norm and output layer),
    a dense block and a mixture-of-experts block."""
    def part(layers: int, moe_layers: int, first: bool, last: bool) -> float:
        return _params_of(model, parallel, layers, moe_layers, first, last)

    moe_block = part(1, 1, False, False) if model.experts else 0.0
    return part(0, 0, True, False), part(0, 0, False, True), part(1, 0, False, False), moe_block


def stage_params(model: ModelSpec, parallel: ParallelSpec, rank: int) -> float:
    """Parameters one GPU of pipeline rank ``rank`` holds (before ZeRO sharding): its chunks'."""
    return _params_of(model, parallel, rank_layers(model, parallel, rank),
                      rank_layers(model, parallel, rank, moe_only=True), rank == stage_rank(parallel, 0),
                      rank == last_stage_rank(parallel))


def graded_chunks(model: ModelSpec, parallel: ParallelSpec,
                  rank: int) -> tuple[tuple[int, float, float, float], ...]:
    """(stage, parameters, parameters graded last, parameters graded by a split backward's Bi) of each
    model chunk pipeline rank ``rank`` holds, in model order: a chunk's backward makes its parameters'
    gradients, the last its first block's and, on the first stage, the embeddings before it. A tied
    embedding held with the head on one rank has its gradient from the head's backward on, so it
    counts with the last chunk's, and the first stage's last only the positions. A chunk without
    blocks (an uneven split's) grades none last. A zero-bubble schedule's Bi makes the gradients of
    what is not a linear layer's weight (the norms, the embeddings), W the rest (the linear layers'
    weight gradients are what it defers), but with sequence parallelism the column-parallel
    layers' (QKV, a dense MLP's first, an untied output layer), which gather their inputs again in
    Bi and make their weight gradients there (tensor parallelism's row biases, made in Bi too, are
    left with W, and so is a tied output layer's, which :func:`weight_pass_bytes` does not keep the
    inputs of: paralab's models tie none)."""
    layers, counts = chunk_layers(model, parallel), parameter_counts(model)
    tied_here = model.tied_embeddings and stage_rank(parallel, 0) == rank == last_stage_rank(parallel)
    embedding = counts["embedding"] / parallel.tp
    embeddings = counts["positions"] + (0 if tied_here else embedding)
    chunks = []
    for stage in (s for s in range(parallel.chunks) if stage_rank(parallel, s) == rank):
        params = chunk_params(model, parallel, stage)
        if tied_here:
            params += embedding * ((stage == parallel.chunks - 1) - (stage == 0))
        last = 0.0
        if layers[stage]:
            last = _params_of(model, parallel, 1, moe_blocks(model, sum(layers[:stage]), 1), False, False)
            if stage == 0:
                last += embeddings
        by_input_pass = (layers[stage] * layer_params(model)["norms"] + (stage == 0) * embeddings
                         + (stage == parallel.chunks - 1) * counts["final_norm"])
        if parallel.sequence_parallel:
            moe_here = moe_blocks(model, sum(layers[:stage]), layers[stage])
            attention, mlp = _column_params(model)
            by_input_pass += (layers[stage] * attention + (layers[stage] - moe_here) * mlp
                              + (stage == parallel.chunks - 1) * counts["output"]) / parallel.tp
        chunks.append((stage, params, last, by_input_pass))
    return tuple(chunks)


def _column_params(model: ModelSpec) -> tuple[int, int]:
    """Parameters of one layer's column-parallel linear layers, with their biases: attention's QKV,
    and a dense MLP's first (gate and up when gated)."""
    bias = 1 if model.biases else 0
    qkv, mlp_in = model.hidden + 2 * model.kv_dim, (2 if model.gated_mlp else 1) * model.ffn
    return (model.hidden + bias) * qkv, (model.hidden + bias) * mlp_in


def rank_passes(parallel: ParallelSpec, rank: int) -> tuple[tuple[str, int], ...]:
    """(op, stage) of every compute pass pipeline rank ``rank`` runs in a step, in order: its
    schedule's (ZB-V's order found for equal passes, the one the lab's ranks run), or, without a
    pipeline, a forward and a backward per microbatch."""
    if parallel.pp == 1:
        return ((FORWARD, 0), (BACKWARD, 0)) * parallel.microbatches
    return _rank_passes(parallel.schedule, parallel.pp, parallel.microbatches, parallel.virtual_stages)[rank]


@lru_cache(maxsize=64)
def _rank_passes(schedule: str, pp: int, microbatches: int,
                 virtual_stages: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    built = build_schedule(schedule, pp, microbatches, virtual_stages)
    return tuple(tuple((a.op, a.stage) for a in actions if a.op in COMPUTE_OPS) for actions in built.actions)


def block_params(model: ModelSpec, parallel: ParallelSpec, rank: int) -> float:
    """Parameters one GPU of pipeline rank ``rank`` holds of its transformer blocks alone: what FP8
    GEMMs keep a 1-byte copy of (Transformer Engine and torchtitan's Float8 leave the embedding and
    the output layer in 16 bits)."""
    return _params_of(model, parallel, rank_layers(model, parallel, rank),
                      rank_layers(model, parallel, rank, moe_only=True), False, False)


def _params_of(model: ModelSpec, parallel: ParallelSpec, layers: int, moe_layers: int, first: bool,
               last: bool) -> float:
    """Parameters one GPU holds of ``layers`` blocks (``moe_layers`` of them mixtures of experts), and
    of the ends when it holds them.

    Inside a layer the matrices and column-parallel biases are split over the tp ranks and the norms
    and row-parallel biases are replicated. The first chunk also holds the vocabulary-parallel
    embedding and the (replicated) positions, the last the final norm (replicated) and the output
    layer, or a second copy of the tied embedding when that is on another rank, as Megatron-LM does
    (Shoeybi et al. 2019). A MoE layer's MLP is its router (replicated), shared experts (split over
    tp) and E / ep routed experts (experts are not split over tp here).
    """
    counts = parameter_counts(model)
    replicated = layers * replicated_layer_params(model)
    split = layers * sum(layer_params(model).values()) - replicated
    if moe_layers:
        mlp = moe.moe_mlp_params(model)
        replicated += moe_layers * mlp["router"]
        split += moe_layers * (mlp["shared"] - layer_params(model)["mlp"])
    if first:
        split += counts["embedding"]
        replicated += counts["positions"]
    if last:
        split += counts["output"] or (counts["embedding"] if last_stage_rank(parallel) != 0 else 0)
        replicated += counts["final_norm"]
    return split / parallel.tp + replicated + moe.expert_params_per_gpu(model, parallel, moe_layers)


def stage_tensors(model: ModelSpec, parallel: ParallelSpec, rank: int) -> int:
    """Parameter tensors (not elements) on pipeline rank ``rank``: what a per-tensor optimizer loops over.

    A GPT layer has a fused QKV, an output projection and two MLP matrices (three gated), each with a
    bias when ``biases``, plus ``norm_params`` vectors per norm; the first rank adds the token (and
    position) embedding, the last the final norm and the output layer (weight, and bias if any).
    """
    matrices, bias = 3 if model.gated_mlp else 2, 2 if model.biases else 1
    per_layer = (2 + matrices) * bias + norms_per_layer(model) * model.norm_params
    total = per_layer * rank_layers(model, parallel, rank)
    experts_here = model.experts // parallel.ep + model.shared_experts
    total += rank_layers(model, parallel, rank, moe_only=True) * (1 + (experts_here - 1) * matrices * bias)
    if rank == 0:
        total += 1 + (1 if model.learned_positions else 0)
    if rank == last_stage_rank(parallel):
        total += model.norm_params + (0 if model.tied_embeddings else 1 + (1 if model.output_bias else 0))
    return total


# ----------------------------------------------------------------------------------------------- FLOPs


def layer_forward_flops(model: ModelSpec, sequences: float = 1) -> dict[str, float]:
    """Forward FLOPs of one layer for ``sequences`` sequences, by part (matmuls only).

    Narayanan et al. 2021, Appendix: a GPT layer's forward costs 24 B s h^2 (the four weight matmuls)
    + 4 B s^2 h (Q K^T and attention-weighted V). With GQA the K/V projections shrink; a gated MLP
    adds one ffn-wide matmul.
    """
    tokens = sequences * model.seq
    h, kv, f = model.hidden, model.kv_dim, model.ffn
    mlp_matrices = 3 if model.gated_mlp else 2
    return {
        "linear": 2 * tokens * (h * (h + 2 * kv) + h * h + mlp_matrices * h * f),
        "attention": 4 * tokens * model.seq * h,
    }


def logits_forward_flops(model: ModelSpec, sequences: float = 1) -> float:
    """Forward FLOPs of the output layer: 2 B s h V (Narayanan et al. 2021, Appendix)."""
    return 2 * sequences * model.seq * model.hidden * model.vocab


def recompute_share(model: ModelSpec, p: ParallelSpec) -> float:
    """The share of layers full recompute reruns: all, or ``recompute_layers`` of each model chunk's
    (Megatron-LM's block method counts them per pipeline stage, virtual stages included)."""
    if p.recompute != "full":
        return 0.0
    return min(1.0, p.recompute_layers * p.chunks / model.layers) if p.recompute_layers else 1.0


def layers_left_whole(model: ModelSpec, p: ParallelSpec, rank: int) -> int:
    """Layers at the end of each of ``rank``'s chunks that full recompute leaves whole, keeping all a
    layer keeps (Megatron-LM's block method reruns a chunk's first ``recompute_layers``): the ones a
    microbatch's backward reaches, and frees, first. 0 when every layer is recomputed."""
    if recompute_share(model, p) in (0.0, 1.0):
        return 0
    return max(0, round(rank_layers(model, p, rank) / p.chunks_per_rank) - p.recompute_layers)


def flops_per_step(model: ModelSpec, sequences: float, recompute: str = "none",
                   share: float = 1.0, core_reruns: float = 0.0) -> dict[str, float]:
    """Model FLOPs (what the math needs) and hardware FLOPs (what runs, recompute included).

    Backward costs twice the forward (Narayanan et al. 2021), so model FLOPs are 3 x forward:
    72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for GPT (Korthikanti et al. 2022, eq. for model FLOPs).
    Full recompute runs every layer's forward again: 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    (Narayanan et al. 2021, eq. 3). Selective recompute, as Korthikanti et al. 2022 account it
    (sec. 5, giving the HFU of their Table 5), adds 72 B s l h^2 x s/(6h): hardware FLOPs
    72 B s l h^2 (1 + s/(3h) + V/(12 l h)). A fused (flash) attention recomputes Q K^T in its
    backward (five matmuls instead of four, Dao 2023): half the attention core's forward again; it
    keeps nothing that selective recompute could drop, and, causal, it computes only the unmasked
    half of the score blocks: hardware FLOPs count what runs, so with such a kernel HFU can read below
    MFU, whose convention counts the whole s x s square (Narayanan et al. 2021). ``share``: the share
    of layers full recompute reruns (:func:`recompute_share`). ``core_reruns``: forwards of each
    layer's attention core, as it runs, that a layout computes beyond these (context parallelism's:
    :func:`paralab.sim.context.core_reruns`), so that hardware FLOPs count what the step's time prices.
    """
    layer = layer_forward_flops(model, sequences)
    fused = model.attention == "fused"
    experts, logits = moe.extra_forward_flops(model, sequences), logits_forward_flops(model, sequences)
    model_flops = 3 * (model.layers * (layer["linear"] + layer["attention"]) + experts + logits)
    core_run = (0.5 if fused else 1.0) * layer["attention"]  # the attention core's forward as it runs
    forward_run = model.layers * (layer["linear"] + core_run) + experts
    hardware = 3 * (forward_run + logits) + (0.5 * model.layers * core_run if fused else 0.0)
    selective = 0.0 if fused else 3 * model.layers * layer["attention"]
    hardware += {"none": 0.0, "full": share * forward_run, "selective": selective}[recompute]
    hardware += core_reruns * model.layers * core_run
    return {"model": model_flops, "hardware": hardware}


# ---------------------------------------------------------------------------------------------- memory


def activation_bytes_per_layer(
    model: ModelSpec, micro_batch: int = 1, tp: int = 1, sequence_parallel: bool = False,
    recompute: str = "none", gathered_inputs: bool = False
) -> float:
    """Bytes one layer keeps for backward on one GPU (activations in the model's dtype, dropout masks
    of ``model.mask_bytes``).

    Korthikanti et al. 2022, Table 2 (per layer, 16-bit activations):
      no parallelism            s b h (34 + 5 a s / h)
      tensor parallel           s b h (10 + 24/t + 5 a s / (h t))
      tensor + sequence par.    s b h (34/t + 5 a s / (h t))
      + selective recompute     drops the 5 a s / h attention-core term
      full recompute            2 s b h (the layer input only; / t with sequence parallelism)
    The 34 is the sum of the stored tensors: attention 11 (input 2, Q 2, K 2, V 2, projection input
    2, dropout mask 1), MLP 19 (input 2, activation input 8, activation output 8, mask 1), norms 4;
    the 5 a s / h is softmax output 2, its dropout mask 1 and dropout output 2. Without dropout
    (Llama) the masks and dropout output are gone; with GQA K and V are kv_dim wide; a gated MLP
    keeps gate, up and product (2 bytes each) of width ffn. An fp32 model keeps 4 bytes where the
    table counts 2 (the lab's CPU models). A fused (flash) attention keeps no s x s tensor, only each
    row's fp32 log-sum-exp, 4 a s b bytes (its dropout mask is regenerated from the seed); parallel
    blocks keep one norm input and one normalised input, which attention and MLP share. With
    ``gathered_inputs`` sequence parallelism leaves the column-parallel layers' inputs (the normalised
    ones) whole, as torch's DTensor keeps them (``ParallelSpec.sp_keeps_gathered_inputs``).
    """
    s, b, h, t, e = model.seq, micro_batch, model.hidden, tp, model.dtype_bytes
    sbh = s * b * h
    if recompute == "full":
        return e * sbh / (t if sequence_parallel else 1)
    mask = model.mask_bytes if model.dropout else 0
    kv = 2 * s * b * model.kv_dim
    # not split by tp: norm inputs, attention and MLP inputs (one shared with parallel blocks), the
    # two dropout masks
    norms = norms_per_layer(model)
    column_inputs = norms * e * sbh
    replicated = norms * e * sbh + column_inputs + 2 * mask * sbh
    ffn_stored = (3 if model.gated_mlp else 2) * e * s * b * model.ffn
    split = e * sbh + e * kv + e * sbh + ffn_stored  # Q, K and V, projection input, MLP inner tensors
    if model.math_sdpa and model.dtype == "fp32" and b == 1 and recompute == "none":
        split += e * sbh + e * kv / 2  # Q's and K's share of the QKV output that V's view keeps alive
    core = attention_core_bytes(model, b, recompute)
    if sequence_parallel and gathered_inputs:
        return (replicated - column_inputs) / t + column_inputs + (split + core) / t
    return (replicated / (t if sequence_parallel else 1)) + (split + core) / t


def weight_pass_bytes_per_layer(model: ModelSpec, micro_batch: int = 1, tp: int = 1,
                                sequence_parallel: bool = False) -> float:
    """Bytes a zero-bubble schedule's Bi keeps of one dense layer for its deferred W, on one GPU: each
    linear layer's input and its output's gradient (W is one GEMM per layer, dW = dY^T X), in the
    model's dtype, where the stash it replaces kept every tensor autograd saved (softmax, dropout
    masks, activation-function inputs). Per token: the normalised inputs of the column-parallel
    layers (h each, one shared by parallel blocks) and their outputs' gradients (Q, K and V, h + 2
    kv_dim, and the MLP's first, ffn, twice gated, / t), the row-parallel layers' inputs ((h + ffn)
    / t) and their outputs' gradients (h each, whole before the all-reduce or reduce-scatter). With
    sequence parallelism a column-parallel layer gathers its input again in Bi and makes its weight
    gradient there (paralab's tp, Megatron-LM), so only the row-parallel layers' are kept."""
    h, f, t = model.hidden, model.ffn, tp
    rows = (h + f) / t + 2 * h
    columns = norms_per_layer(model) * h + (h + 2 * model.kv_dim + (2 if model.gated_mlp else 1) * f) / t
    per_token = rows + (0 if sequence_parallel else columns)
    return model.dtype_bytes * model.seq * micro_batch * per_token


def weight_pass_bytes(model: ModelSpec, parallel: ParallelSpec, stage: int) -> float | None:
    """Bytes a zero-bubble Bi keeps of one microbatch of model chunk ``stage`` for its deferred W, on
    one GPU: its dense layers' (:func:`weight_pass_bytes_per_layer`), a mixture-of-experts layer's
    whole stash (its experts' routed inputs and gradients are not counted apart), and on the last
    chunk the output layer's input and the logits' gradient (V / t wide; none with sequence
    parallelism, whose column-parallel head makes its weight gradient in Bi). None under full
    recompute, which keeps no layer's inputs to defer W with."""
    p = parallel.resolved()
    if p.recompute == "full":
        return None
    layers, moe_layers = chunk_layers(model, p)[stage], chunk_moe_blocks(model, p)[stage]
    dense = weight_pass_bytes_per_layer(model, p.micro_batch, p.tp, p.sequence_parallel)
    moe_stash = (activation_bytes_per_layer(model, p.micro_batch, p.tp, p.sequence_parallel, p.recompute,
                                            gathered_inputs=p.sp_keeps_gathered_inputs)
                 + moe_layer_extra_bytes(model, p))
    head = 0.0
    if stage == p.chunks - 1 and not p.sequence_parallel:
        head = model.dtype_bytes * model.seq * p.micro_batch * (model.hidden + model.vocab / p.tp)
    return (layers - moe_layers) * dense + moe_layers * moe_stash + head


def attention_core_bytes(model: ModelSpec, micro_batch: int = 1, recompute: str = "none") -> float:
    """What the attention core keeps for backward, on one GPU without tensor parallelism: the s x s
    softmax output, its dropout mask and output (Korthikanti et al. 2022, Table 2: 5 a s^2 b with
    16-bit activations), none under selective recompute; a fused kernel's 4 a s b of fp32 row
    statistics instead."""
    a, s, b = model.heads, model.seq, micro_batch
    if model.attention == "fused":
        return 4 * a * s * b
    if recompute == "selective":
        return 0.0
    mask = model.mask_bytes if model.dropout else 0
    return (model.dtype_bytes + (mask + model.dtype_bytes if mask else 0)) * a * s * s * b


def peak_inflight_chunks(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1,
                         rank: int = 0) -> int:
    """Most (chunk, microbatch) activations pipeline rank ``rank`` holds at once.

    GPipe keeps all m (Huang et al. 2019); 1F1B its warm-up p - rank plus none (Narayanan et al.
    2021), so p on the first rank; the interleaved schedule's warm-up 2(p - rank - 1) + (v-1)p plus
    one, on the first rank Korthikanti et al.'s (2022, sec. 4.2.3) factor 1 + (p-1)/(p v) over 1F1B
    in layers (where p does not divide m, the schedule's round g in place of p); ZB-H1 and ZB-V keep
    1F1B's first-rank peak on every rank (Qi et al. 2023, 2024; a deferred W holds its inputs; the V
    counts its 2 chunks); DualPipeV holds 2p + 1 chunks, PP + 1 in the DeepSeek-V3 report's stages
    (Table 2). The first rank holds the most in all.
    """
    p, m, v = pp, microbatches, virtual_stages
    if p == 1 or schedule == "naive":
        return 1
    if schedule == "gpipe":
        return m
    if schedule == "interleaved":
        return min(m * v, 2 * (p - rank - 1) + (v - 1) * interleaved_round(p, m) + 1)
    if schedule == "zbv":
        return min(2 * m, 2 * p)
    if schedule == "dualpipev":
        return min(2 * m, 2 * p + 1)
    if schedule == "zb-h1":
        return min(m, p)
    return min(m, p - rank)


# microbatches in flight on a pipeline rank: that many of its mean chunk, so many on each of its chunks,
# or None for its schedule's most
Inflight = int | tuple[int, ...] | None


def activation_bytes_per_gpu(model: ModelSpec, parallel: ParallelSpec, rank: int = 0,
                             inflight: Inflight = None) -> float:
    """Activation bytes at the peak on pipeline rank ``rank``, or with ``inflight`` (chunk, microbatch)
    activations held instead of the schedule's most (:func:`peak_inflight_chunks`): that many of the
    rank's mean chunk, or, a tuple, so many microbatches on each of its chunks (in model order), each
    chunk's own (where an uneven split's chunks differ).

    Per-layer bytes (Korthikanti et al. 2022, Table 2) x layers per chunk x chunks in flight (where the
    interleaved schedule's chunks on a rank differ, the most its order holds at once), plus, on
    the first rank, the input embedding's dropout mask per microbatch in flight (s b h mask bytes, / t
    with sequence parallelism; Korthikanti et al. sec. 4.3: the embedding's output is the first
    layer's input, counted there) and, on the last stage's rank, the head's inputs
    (:func:`head_input_bytes`) and what the cross-entropy keeps, 4 s b V / t with a fused kernel
    (Korthikanti et al. sec. 4.3; :func:`loss_bytes_per_logit`), one microbatch's at a time, all m
    under GPipe, plus, with recompute, what one layer rematerialises during its backward (full: the
    layer, less its input, kept already; selective: the attention core's s x s tensors, less what the
    layer saved after the core, which its backward has freed by then: more wherever 5as/h passes ~24);
    on the last stage that comes after the microbatch's head and loss are freed, so the fuller of the
    two counts.
    """
    p = parallel.resolved()
    asked, at_peak, held = inflight, inflight is None, inflight if isinstance(inflight, tuple) else None
    if at_peak:
        inflight = peak_inflight_chunks(p.schedule, p.pp, p.microbatches, p.virtual_stages, rank)
    elif held is not None:
        inflight = sum(held)

    def per_layer_kept(recompute: str) -> float:
        return activation_bytes_per_layer(model, p.micro_batch, p.tp, p.sequence_parallel, recompute,
                                          gathered_inputs=p.sp_keeps_gathered_inputs)

    per_layer = per_layer_kept(p.recompute)
    share = recompute_share(model, p)
    if p.recompute == "full" and share < 1:  # the layers not recomputed keep everything
        kept = per_layer_kept("none")
        per_layer = share * per_layer + (1 - share) * kept
    per_moe_layer = moe_layer_extra_bytes(model, p)
    chunk_bytes = tuple(layers * per_layer + moe_layers * per_moe_layer
                        for layers, moe_layers in chunks_by_rank(model, p)[rank])
    total = held_of_chunks(p, rank, asked, chunk_bytes)
    sbh = model.seq * p.micro_batch * model.hidden
    ends, rematerialised = backward_transients(model, p)
    if rank == 0 and model.dropout:
        mask = model.mask_bytes * sbh / (p.tp if p.sequence_parallel else 1)
        total += mask * (held[0] if held is not None else min(inflight, p.microbatches))  # the first stage's
    if rank == last_stage_rank(p) and (held is None or held[-1]):  # the last stage's microbatches in flight
        logits_inflight = min(inflight, p.microbatches) if p.schedule == "gpipe" and p.pp > 1 else 1
        total += ends * (logits_inflight - 1)
    else:
        ends = 0.0
    # a microbatch's backward frees its ends before it recomputes anything, so the fuller of the two
    return total + max(ends, rematerialised)


def held_of_chunks(p: ParallelSpec, rank: int, inflight: Inflight, chunk_bytes: tuple[float, ...]) -> float:
    """What pipeline rank ``rank`` of the resolved ``p`` holds at once of its chunks, each keeping
    ``chunk_bytes`` (in model order) per microbatch, with ``inflight`` microbatches in flight
    (:data:`Inflight`; None: the schedule's most, walked where an interleaved rank's chunks differ)."""
    if isinstance(inflight, tuple):
        return sum(n * chunk for n, chunk in zip(inflight, chunk_bytes, strict=True))
    if inflight is None:
        if p.schedule == "interleaved" and len(set(chunk_bytes)) > 1:
            return _interleaved_peak(p.pp, p.microbatches, p.virtual_stages, rank, chunk_bytes)
        inflight = peak_inflight_chunks(p.schedule, p.pp, p.microbatches, p.virtual_stages, rank)
    return inflight * sum(chunk_bytes) / len(chunk_bytes)


def layers_held(model: ModelSpec, parallel: ParallelSpec, rank: int = 0, inflight: Inflight = None) -> float:
    """Layers' worth of one microbatch that pipeline rank ``rank`` holds at once, as
    :func:`activation_bytes_per_gpu` counts its stash: what a tensor every layer keeps costs the rank."""
    p = parallel.resolved()
    layers = tuple(float(blocks) for blocks, _ in chunks_by_rank(model, p)[rank])
    return held_of_chunks(p, rank, inflight, layers)


def moe_layer_extra_bytes(model: ModelSpec, parallel: ParallelSpec) -> float:
    """What a mixture-of-experts layer keeps of a microbatch beyond a dense layer's: k copies of each
    token at its experts (:func:`moe.extra_activation_bytes`), none under full recompute, which keeps
    the layer's input alone."""
    if parallel.recompute == "full":
        return 0.0
    return moe.extra_activation_bytes(model, parallel.micro_batch, parallel.tp, parallel.sequence_parallel)


def backward_transients(model: ModelSpec, parallel: ParallelSpec) -> tuple[float, float]:
    """What a microbatch's backward holds beside the stash of the microbatches in flight, one after the
    other: its ends (the head's inputs, :func:`head_input_bytes`, and what the cross-entropy keeps,
    4 s b V / t with a fused kernel, Korthikanti et al. sec. 4.3, :func:`loss_bytes_per_logit`), held
    on the last stage until the head's backward frees them, then what recompute rematerialises of a
    layer (full: the layer, less its input, kept already; selective: the attention core's s x s
    tensors, less what the layer saved after the core, which its backward has freed by then: more
    wherever 5as/h passes about 24, as GPT-3 175B's 80 at 2,048 tokens does)."""
    p = parallel.resolved()

    def per_layer_kept(recompute: str) -> float:
        return activation_bytes_per_layer(model, p.micro_batch, p.tp, p.sequence_parallel, recompute,
                                          gathered_inputs=p.sp_keeps_gathered_inputs)

    logits = model.seq * p.micro_batch * model.vocab / p.tp
    head = head_input_bytes(model, p.micro_batch, p.tp, p.sequence_parallel, p.sp_keeps_gathered_inputs)
    ends = loss_bytes_per_logit(model, p.tp) * logits + head  # one microbatch's
    rematerialised = per_layer_kept("none") - per_layer_kept(p.recompute)
    if p.recompute == "selective":
        inputs = attention_input_bytes(model, p.micro_batch, p.tp, p.sequence_parallel,
                                       p.sp_keeps_gathered_inputs)
        core = attention_core_bytes(model, p.micro_batch, "selective") / p.tp
        rematerialised -= per_layer_kept("selective") - inputs - core
    return ends, max(0.0, rematerialised)  # a transient below the stash leaves its peak before it


def attention_input_bytes(model: ModelSpec, micro_batch: int = 1, tp: int = 1,
                          sequence_parallel: bool = False, gathered_inputs: bool = False) -> float:
    """What a layer saves for backward before its attention core (Korthikanti et al. 2022, Table 2):
    the first norm's input and the QKV projection's input (replicated without sequence parallelism;
    the latter whole with ``gathered_inputs``), and Q, K and V (split over tp). The rest of the layer
    comes after the core, and its backward frees it before it reaches the core."""
    s, b, h, t, e = model.seq, micro_batch, model.hidden, tp, model.dtype_bytes
    sbh = s * b * h
    norm_input = e * sbh / (t if sequence_parallel else 1)
    qkv_input = e * sbh / (t if sequence_parallel and not gathered_inputs else 1)
    return norm_input + qkv_input + (e * sbh + e * 2 * s * b * model.kv_dim) / t


def head_input_bytes(model: ModelSpec, micro_batch: int = 1, tp: int = 1, sequence_parallel: bool = False,
                     gathered_inputs: bool = False) -> float:
    """What the head keeps for backward: the final norm's input and the output layer's (the normalised
    one), s b h each in the model's dtype, / t with sequence parallelism (Korthikanti et al. 2022,
    sec. 4.3: 4 s b h / t in 16 bits); the output layer's whole with ``gathered_inputs``."""
    sbh = model.seq * micro_batch * model.hidden * model.dtype_bytes
    if not sequence_parallel:
        return 2 * sbh
    return sbh / tp + (sbh if gathered_inputs else sbh / tp)


def loss_bytes_per_logit(model: ModelSpec, tp: int = 1) -> int:
    """Bytes per logit the cross-entropy holds at its peak, which lies in its backward; the training
    loop has dropped the model's 16-bit logits by then (torchtitan's deletes them before backward,
    and nothing autograd keeps holds them):

    - fused (Megatron-LM's vocabulary-parallel kernel, Korthikanti et al. 2022 sec. 4.3): the fp32
      logits, which its backward turns into their gradient in place, 4;
    - PyTorch's cross-entropy on upcast logits (tp 1): the fp32 log-softmax it saved, the gradient
      the NLL loss hands it and the one it returns, 4 + 4 + 4;
    - PyTorch's loss parallel (tp > 1, ``torch.distributed.tensor.parallel.loss_parallel``), whose
      backward builds the target's one-hot gradient beside the saved log-softmax, then
      ``(one_hot + exp(x)) * grad``: at most four fp32 tensors at once, 16.

    tests/test_activation_memory.py measures the last two on torch's own code."""
    if model.fused_loss:
        return 4
    return 16 if tp > 1 else 12


OPTIMIZER_BYTES = {
    # bytes per parameter: (params, grads, optimizer states)
    "adam-mixed": (2, 2, 12),  # fp16/bf16 params and grads; fp32 master copy, momentum, variance
    "adam-fp32": (4, 4, 8),  # fp32 params and grads; momentum, variance
}


def autograd_grad_bytes(model: ModelSpec, p: ParallelSpec) -> int:
    """Bytes of a gradient as autograd writes it: the optimizer's gradient dtype, before any fp32
    copy or accumulation (``fp32_grads``) a reduction makes of it."""
    return OPTIMIZER_BYTES[p.optimizer_for(model)][1]


def bytes_per_param(model: ModelSpec, p: ParallelSpec) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter of this run: the optimizer's, with
    gradients kept in fp32 when ``fp32_grads`` (Megatron-LM's main_grad; Llama 3's FSDP accumulates
    and reduce-scatters in fp32 too)."""
    pb, _, ob = OPTIMIZER_BYTES[p.optimizer_for(model)]
    return pb, 4 if p.fp32_grads else autograd_grad_bytes(model, p), ob


FP32_SHARD_BYTES = (4, 4, 8)  # an fp32 shard (the master weights), its fp32 gradient, Adam's two moments


def shard_bytes_per_param(model: ModelSpec, p: ParallelSpec) -> tuple[int, int, int]:
    """(parameter, gradient, optimizer-state) bytes per parameter the model states keep between steps:
    :func:`bytes_per_param`'s, or FP32_SHARD_BYTES where the shards are the master weights
    (``fp32_shards``); what is gathered, reduced or computed keeps :func:`bytes_per_param`'s."""
    return FP32_SHARD_BYTES if p.fp32_shards else bytes_per_param(model, p)


def model_state_bytes(params: float, dp: int, zero: int,
                      optimizer: str | tuple = "adam-mixed") -> dict[str, float]:
    """Parameter, gradient and optimizer bytes per GPU under ZeRO stage 0..3 (``optimizer``: a name of
    OPTIMIZER_BYTES or a (param, grad, state) bytes tuple, see :func:`bytes_per_param`).

    Rajbhandari et al. 2020, sec. 5 and Figure 1: mixed-precision Adam holds 2 + 2 + K bytes per
    parameter with K = 12; stage 1 (P_os) shards the optimizer states over N_d, stage 2 (P_os+g)
    the gradients too, stage 3 (P_os+g+p) the parameters too. Example (their Figure 1): 7.5B
    parameters, N_d = 64: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB. Megatron-LM's distributed optimizer is
    stage 1 with fp32 gradients: 6 + 12/N_d bytes per parameter (its docs' table).
    """
    pb, gb, ob = OPTIMIZER_BYTES[optimizer] if isinstance(optimizer, str) else optimizer
    return {
        "params": params * pb / (dp if zero >= 3 else 1),
        "grads": params * gb / (dp if zero >= 2 else 1),
        "optimizer": params * ob / (dp if zero >= 1 else 1),
    }


# ------------------------------------------------------------------------------------- communication


def tp_collectives(model: ModelSpec, p: ParallelSpec) -> tuple[tuple[str, ...], float, int, dict[str, float]]:
    """What tensor parallelism blocks on in a layer: its collective ops, their payload b s h, how many
    each pass issues, and the passes. Each pass (forward, backward, and the forward rerun by full
    recompute) issues two all-reduces (Shoeybi et al. 2019) or, with sequence parallelism, two
    all-gathers and two reduce-scatters of the same bytes (Korthikanti et al. 2022, sec. 4.2.2);
    parallel blocks sum attention and MLP before one all-reduce, so one (Chowdhery et al. 2022)."""
    ops = ("all_gather", "reduce_scatter") if p.sequence_parallel else ("all_reduce",)
    passes = {"forward": 1, "backward": 1 + recompute_share(model, p)}
    per_pass = 1 if model.parallel_blocks else 2
    return ops, microbatch_activation_bytes(model, p), per_pass, passes


def microbatch_activation_bytes(model: ModelSpec, p: ParallelSpec) -> float:
    """b s h in the model's dtype: one microbatch's activation between layers, what tensor parallelism's
    collectives and a pipeline's sends carry (whole or in part)."""
    return p.micro_batch * model.seq * model.hidden * model.dtype_bytes


def pipeline_send_bytes(model: ModelSpec, p: ParallelSpec) -> float:
    """Bytes one GPU sends per pipeline hop (an activation forward, its gradient back): b s h, or with
    tp > 1 a t-th of it, split by sequence under sequence parallelism or scattered over the t GPUs
    (``pp_scatter_gather``, gathered again on the other side: :func:`pipeline_gathers`)."""
    act = microbatch_activation_bytes(model, p)
    return act / p.tp if p.sequence_parallel or p.pp_scatter_gather else act


def pipeline_gathers(p: ParallelSpec) -> bool:
    """Whether each pipeline receive is all-gathered over tp (Megatron-LM's scatter/gather: the t GPUs
    of a stage each sent a t-th of the activation, and the receivers need it whole). Not with sequence
    parallelism, whose activations between stages are split by sequence anyway."""
    return p.pp > 1 and p.tp > 1 and p.pp_scatter_gather and not p.sequence_parallel


def tp_end_collectives(model: ModelSpec, p: ParallelSpec) -> dict[str, tuple[tuple[str, float], ...]]:
    """(op, payload bytes) of the collectives tensor parallelism adds at the model's ends, per
    microbatch, by pass (Megatron-LM; paralab's tp): the vocabulary-parallel embedding sums its partial
    lookups of b s h (an all-reduce, or with sequence parallelism a reduce-scatter whose backward
    gathers the gradient); the output layer's input operator all-reduces its gradient in backward (with
    sequence parallelism it gathers its input in the forward, reduce-scatters that gradient and, keeping
    only its slice, gathers the input again: ``head_regather``); the vocabulary-parallel cross-entropy
    all-reduces three fp32 numbers per token (max logit, sum of exponentials, target logit)."""
    none = {key: () for key in ("embed_forward", "embed_backward", "head_forward", "head_backward",
                                "head_regather")}
    if p.tp == 1:
        return none
    act = microbatch_activation_bytes(model, p)
    loss = (("all_reduce", p.micro_batch * model.seq * 4),) * 3
    if not p.sequence_parallel:
        return {**none, "embed_forward": (("all_reduce", act),), "head_forward": loss,
                "head_backward": (("all_reduce", act),)}
    return {"embed_forward": (("reduce_scatter", act),), "embed_backward": (("all_gather", act),),
            "head_forward": (("all_gather", act), *loss), "head_backward": (("reduce_scatter", act),),
            "head_regather": () if p.sp_keeps_gathered_inputs else (("all_gather", act),)}


# which of tp_end_collectives' rows each pass holds: (the first chunk's, the last chunk's)
TP_END_PASSES = {"forward": (("embed_forward",), ("head_forward",)),
                 "backward": (("embed_backward",), ("head_backward", "head_regather"))}


def tp_end_rows(model: ModelSpec, p: ParallelSpec, first: bool, last: bool,
                phases: tuple[str, ...] = ("forward", "backward")) -> list[tuple[str, float]]:
    """(op, payload bytes) of the ends' collectives (:func:`tp_end_collectives`) one microbatch's
    ``phases`` issue on a GPU holding the model's first chunk, its last, both or neither."""
    ends = tp_end_collectives(model, p)
    return [row for end, holds in enumerate((first, last)) if holds for phase in phases
            for key in TP_END_PASSES[phase][end] for row in ends[key]]


def sequence_parallel_grad_params(model: ModelSpec, p: ParallelSpec, rank: int) -> int:
    """Parameters of pipeline rank ``rank`` whose gradients sequence parallelism all-reduces over tp
    once a step (Korthikanti et al. 2022; paralab's tp): the replicated ones (norms, row-parallel
    biases, learned positions on the first stage, the final norm on the last) each saw only this rank's
    slice of the sequence."""
    if not p.sequence_parallel or p.tp == 1:
        return 0
    counts = parameter_counts(model)
    return (rank_layers(model, p, rank) * replicated_layer_params(model)
            + counts["positions"] * (rank == stage_rank(p, 0))
            + counts["final_norm"] * (rank == last_stage_rank(p)))


def sequence_regathers(model: ModelSpec, p: ParallelSpec) -> int:
    """All-gathers of b s h a layer's backward adds with sequence parallelism: each column-parallel
    layer keeps only its input's sequence slice and gathers it again for its weight gradient
    (Korthikanti et al. 2022, sec. 4.2.2; the 34 s b h / t they store a layer assumes it): QKV's and
    the MLP's first layer's, one where parallel blocks share their input."""
    if not p.sequence_parallel or p.tp == 1 or p.sp_keeps_gathered_inputs:
        return 0
    return 1 if model.parallel_blocks else 2


def comm_payloads(model: ModelSpec, parallel: ParallelSpec,
                  rank: int = 0) -> list[tuple[str, str, float, int, float]]:
    """Every collective one GPU of pipeline rank ``rank`` issues per step.

    Rows of (family, op, payload bytes, group size, count per step), family one of tp, pp, embedding,
    dp (dp_intra, dp_inter), zero, ep:
    - tp (Shoeybi et al. 2019): per layer and microbatch, 2 all-reduces of b s h in the forward and 2
      in the backward (+2 when full recompute reruns the forward); with sequence parallelism each
      all-reduce becomes an all-gather plus a reduce-scatter of the same tensor (Korthikanti et al.
      2022, sec. 4.2.2), same wire bytes, and the backward gathers each column-parallel layer's input
      again (:func:`sequence_regathers`); the ends' collectives (:func:`tp_end_collectives`) on the
      first and last stage; with sequence parallelism the replicated parameters' gradients once a step
      (:func:`sequence_parallel_grad_params`, in the reduced gradients' dtype: paralab's tp widens them
      to its fp32 reduce dtype, so a 16-bit tp run without dp sends twice the row's bytes).
    - pp (Narayanan et al. 2021): per microbatch, each activation the rank's chunks send forward and
      each gradient they send back to a chunk on another rank (:func:`pipeline_hops`), b s h each, or
      b s h / t with their scatter/gather optimisation (tp > 1) or sequence parallelism
      (:func:`pipeline_send_bytes`); with scatter/gather, each receive all-gathered over tp
      (:func:`pipeline_gathers`).
    - embedding: with a tied embedding, the first stage's all-reduce of its gradient with the last
      stage's (:func:`tied_embedding_ranks`), once a step.
    - dp / zero (Rajbhandari et al. 2020, sec. 7): stage 0 all-reduces the gradients once per step
      (hierarchically, families dp_intra and dp_inter: :func:`hierarchical_steps`);
      stage 1 reduce-scatters gradients and all-gathers updated parameters (same volume); stage 2
      must reduce-scatter every microbatch's gradients, since it keeps only its shard; stage 3 also
      all-gathers the parameters for every microbatch's forward and again for its backward. A mixture of
      experts reduces its routed experts over the dp / ep ranks that hold the same ones.
    - ep (paralab.sim.moe): per MoE layer and microbatch, dispatch and combine all-to-alls in the
      forward and again in the backward, tokens x k x h each.
    """
    p = parallel.resolved()
    m, t = p.microbatches, p.tp
    layers = rank_layers(model, p, rank)
    rows: list[tuple[str, str, float, int, float]] = []
    if t > 1:
        ops, payload, per_pass, passes = tp_collectives(model, p)
        rows += [("tp", op, payload, t, per_pass * sum(passes.values()) * layers * m) for op in ops]
        if regathers := sequence_regathers(model, p):
            rows.append(("tp", "all_gather", payload, t, regathers * layers * m))
        ends = tp_end_rows(model, p, rank == stage_rank(p, 0), rank == last_stage_rank(p))
        rows += [("tp", op, end_payload, t, m) for op, end_payload in ends]
        if replicated := sequence_parallel_grad_params(model, p, rank):
            rows.append(("tp", "all_reduce", replicated * bytes_per_param(model, p)[1], t, 1))
    if p.pp > 1:  # the sends this rank makes, each microbatch (its chunks' neighbours on other ranks)
        hops = pipeline_hops(p)
        sends = sum(sender == rank for sender, _ in hops)
        rows.append(("pp", "send", pipeline_send_bytes(model, p), 2, sends * m))
        if pipeline_gathers(p):  # ... and what it receives, gathered whole over its tp group
            receives = sum(receiver == rank for _, receiver in hops)
            rows.append(("pp", "all_gather", microbatch_activation_bytes(model, p), t, receives * m))
    if rank in tied_embedding_ranks(model, p):
        rows.append(("embedding", "all_reduce", tied_embedding_payload(model, p), 2, 1))
    if p.ep > 1:  # dispatch and combine, forward and backward, per MoE layer and microbatch
        moe_here = rank_layers(model, p, rank, moe_only=True)
        rows.append(("ep", "all_to_all", moe.all_to_all_payload(model, p), p.ep, 4 * moe_here * m))
    pb, gb, _ = bytes_per_param(model, p)
    params, experts = stage_params(model, p, rank), expert_params(model, p, rank)
    groups = dp_groups(p, params, experts)
    if p.zero == 0 and p.hierarchical_dp:
        return rows + [(family, op, payload, size, 1) for n, _, _ in groups
                       for family, op, payload, size, _ in hierarchical_steps(p, n * gb)]
    if p.zero == 0:
        return rows + [("dp", "all_reduce", n * gb, group, 1) for n, group, _ in groups]
    per_step = m if p.zero_in_passes else 1  # ZeRO-2/3 reduce every microbatch's gradients
    rows += [("zero", "reduce_scatter", n * gb, group, per_step) for n, group, _ in groups]
    if p.zero < 3:  # the updated shards, once a step
        return rows + [("zero", "all_gather", n * pb, group, 1) for n, group, _ in groups]
    embed, head = fsdp_root(model, p)
    held = embed * (rank == stage_rank(p, 0)) + head * (rank == last_stage_rank(p))
    backward = backward_gather_groups(p, params, experts, held)
    return rows + [("zero", "all_gather", n * pb, group, m)  # every microbatch's forward and backward
                   for n, group, _ in groups + backward if n]


def comm_bytes_per_gpu(model: ModelSpec, parallel: ParallelSpec) -> dict[str, float]:
    """Wire bytes per step the busiest GPU sends, keyed ``family_op`` (e.g. tp_all_reduce)."""
    p = parallel.resolved()
    return busiest_wire_bytes(model, p, lambda rank: comm_payloads(model, p, rank))


def busiest_wire_bytes(model: ModelSpec, parallel: ParallelSpec,
                       rows_of: Callable[[int], list]) -> dict[str, float]:
    """Wire bytes by key of the pipeline rank whose collectives (``rows_of(rank)``, as
    :func:`comm_payloads` gives them) send the most in all, of the first of each kind (ranks alike
    send alike). With an uneven split that need not be the first rank, which may hold a single block
    (DeepSeek-V3's splits)."""
    by_rank = (wire_bytes_by_key(rows_of(rank)) for rank in first_rank_of_each_kind(model, parallel))
    return max(by_rank, key=lambda wire: sum(wire.values()))


def wire_bytes_by_key(rows) -> dict[str, float]:
    """Wire bytes per step of :func:`comm_payloads`' rows (or paralab.sim.context's), keyed ``family_op``."""
    out: dict[str, float] = {}
    for family, op, payload, group, count in rows:
        key = f"{family}_{op}"
        out[key] = out.get(key, 0.0) + count * ring_wire_bytes(op, payload, group)
    return out
