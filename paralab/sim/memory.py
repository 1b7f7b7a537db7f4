"""The memory model: bytes per GPU at a step's peak, by kind, as a measured run reports them.

A rank's peak is the fullest of the moments it may peak at, each a sum of what is held then: the model
states (:func:`counting.model_state_bytes`, sharded as ZeRO says), the stash of microbatches in flight
(:func:`counting.activation_bytes_per_gpu`), and what exists only for a moment: ZeRO-2/3's whole unit
gradients and gathered parts, DDP's bucket copies, torch FSDP2's copy-outs. The moments are found by
walking what the rank does (its passes in order, :func:`counting.rank_passes`; a backward part by part;
buckets as they fill), not by one closed form, because where the peak falls depends on the schedule and
the ZeRO stage together; the walks' docstrings name the measured runs that shaped them.

:func:`paralab.sim.cost.memory_per_gpu` is the entry point: it hands context-parallel specs to
:mod:`paralab.sim.context`, which prices its slices with :func:`peak_per_gpu`.
"""

from __future__ import annotations

from collections.abc import Callable

from paralab.schedules import BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, SPLIT_BACKWARD
from paralab.sim import counting
from paralab.sim.specs import ModelSpec, ParallelSpec


def peak_per_gpu(model: ModelSpec, parallel: ParallelSpec,
                 activations: Callable[[int, counting.Inflight], float] | None = None,
                 layer_kept: Callable[[str], float] | None = None) -> dict[str, float]:
    """Bytes per GPU at the peak, on the fullest pipeline rank: model states (ZeRO) plus activations,
    plus what ZeRO-2/3 hold unsharded for a moment. With an even split the end ranks are the fullest
    (the first stashes the most microbatches, the last keeps the logits); with an uneven split a rank
    beside an end can be, so the first rank of each kind is weighed
    (:func:`counting.first_rank_of_each_kind`). ``activations(rank, inflight)``: what a rank keeps with
    that many microbatches in flight (:data:`counting.Inflight`), and ``layer_kept(recompute)`` what
    one layer keeps of one microbatch under a recompute policy, where they are not the model's own
    counts (context parallel's slices)."""
    p = parallel.resolved()
    ranks = counting.first_rank_of_each_kind(model, p)
    return max((rank_peak(model, p, rank, activations, layer_kept) for rank in ranks),
               key=lambda m: m["total"])


def rank_peak(model: ModelSpec, p: ParallelSpec, rank: int,
                 activations: Callable[[int, counting.Inflight], float] | None = None,
                 layer_kept: Callable[[str], float] | None = None) -> dict[str, float]:
    """The kinds at the fullest of the moments a rank may peak at, as a measured run reports them.

    Held throughout: the model states (ZeRO's shards), FP8 GEMMs' 1-byte copy of the blocks' weights,
    ZeRO-3's gathered parts (two with prefetch: the one computing and the next) and its root. Some
    moments add what exists only then: the stash of microbatches in flight at its peak, with or
    without gradients (:func:`_along_the_passes`); ZeRO-2/3's whole unit gradients inside
    backward (:func:`_while_units_reduce`; a ZeRO-2 that accumulates holds every unit's from the first
    backward on); DDP's bucket copies (:func:`_while_buckets_fill`). A
    mixture of experts' routed experts are sharded over the dp / ep ranks that hold them."""
    def kept(inflight: counting.Inflight = None) -> float:
        if activations is not None:
            return activations(rank, inflight)
        return counting.activation_bytes_per_gpu(model, p, rank, inflight)

    if layer_kept is None:
        def layer_kept(recompute: str) -> float:
            return counting.activation_bytes_per_layer(model, p.micro_batch, p.tp, p.sequence_parallel,
                                                       recompute, gathered_inputs=p.sp_keeps_gathered_inputs)

    shard = counting.shard_bytes_per_param(model, p)
    params = counting.stage_params(model, p, rank)
    experts = counting.expert_params(model, p, rank)
    states = counting.model_state_bytes(params - experts, p.dp, p.zero, shard)
    for kind, nbytes in counting.model_state_bytes(experts, p.dp // p.ep, p.zero, shard).items():
        states[kind] += nbytes
    if model.fp8:
        states["params"] += counting.block_params(model, p, rank) / (p.dp if p.zero >= 3 else 1)
    states["activations"] = kept()
    pb, gb, _ = counting.bytes_per_param(model, p)
    fsdp = p.zero >= 2 and p.grads_set_to_none  # torch's FSDP: it gathers and reduces on one GPU too
    gathered = 0.0  # ZeRO-3's parts gathered at once (two with prefetch), beside its root held whole
    if p.zero == 3 and (p.dp > 1 or fsdp):
        embed, head = counting.fsdp_root(model, p)
        states["params"] += (embed + head) * pb
        gathered = counting.largest_zero_unit(model, p, rank) * (2 if p.prefetch_params else 1) * pb
    if fsdp:  # the walk weighs the parts it gathers one by one
        moments = _as_fsdp_reduces(model, p, rank, states, pb if p.zero == 3 else 0.0, layer_kept)
        return _fullest([{**states, "grads": 0.0}, *moments])  # the forward's end: none gathered, no shard
    states["params"] += gathered
    if p.zero == 2 and p.zero_accumulates and p.microbatches > 1 and p.dp > 1:
        # every unit's full-size buffer, made at its first gradient, kept until the step's last backward
        # reduce-scatters it, beside the shard's gradient
        buffers = counting.reduced_params(counting.dp_groups(p, params, experts)) * gb
        return _fullest([{**states, "grads": states["grads"] + buffers}])
    if p.zero >= 2 and p.dp > 1:
        return _fullest([states, *_while_units_reduce(model, p, rank, states, gb, layer_kept, kept)])
    buckets = copies = 0.0
    if p.zero == 0 and p.dp > 1 and p.grad_buckets:
        reduced = counting.reduced_params(counting.dp_groups(p, params, experts))
        own, buckets, copies = _gradients_reduced_from_copies(model, p, params, reduced, gb)
        states["grads"] = own + buckets
    moments = [states]
    if p.grads_set_to_none:
        chunks = counting.graded_chunks(model, p, rank)
        # what a deferred W waits with, where the activations are the model's own counts (a context-
        # parallel slice's are not: its microbatches are held whole until W)
        weight_pass = ({stage: counting.weight_pass_bytes(model, p, stage) for stage, *_ in chunks}
                       if activations is None else {})
        moments = _along_the_passes(p, rank, states, buckets, kept, layer_kept, chunks, weight_pass)
    if copies:
        made = p.grads_set_to_none and p.microbatches * p.chunks_per_rank == 1  # by the buckets' backward
        last_w = None  # what a zero-bubble rank's last W reads, where the activations are the model's own
        if p.pp > 1 and p.schedule_run in SPLIT_BACKWARD and activations is None:
            last_op, last_stage = counting.rank_passes(p, rank)[-1]
            last_w = counting.weight_pass_bytes(model, p, last_stage) if last_op == BACKWARD_WEIGHT else None
        moments += _while_buckets_fill(p, states, copies, own if made else 0.0, kept, last_w)
    return _fullest(moments)


def _fullest(moments: list[dict[str, float]]) -> dict[str, float]:
    peak = max(moments, key=lambda kinds: sum(kinds.values()))
    return {**peak, "total": sum(peak.values())}


def _as_fsdp_reduces(model: ModelSpec, p: ParallelSpec, rank: int, held: dict[str, float], pb: float,
                     layer_kept: Callable[[str], float]) -> list[dict[str, float]]:
    """ZeRO-2/3 as torch's FSDP2 runs a step's backwards where gradients are set to None between steps
    (``grads_set_to_none``: the lab's torch_fsdp). ``held``: the kinds at the stash's peak, with the
    shards' gradients and no part gathered; ``pb``: bytes a gathered parameter takes (0: none is
    gathered, ZeRO-2); ``layer_kept(recompute)``: what a layer keeps of a microbatch.

    A part's weights are copied out of a flat all-gather output, both held until the copy-out ends
    (over more than one GPU). Autograd makes the part's gradients tensor by tensor, in its own dtype,
    while it frees the part's activations (no flat buffer is made at the first, as paralab's ZeRO
    makes one). Once the part's last has come, FSDP copies them into one reduce-scatter input, in the
    reduce dtype, and frees them; the shard that reduce-scatter makes is the shard's gradient (added
    into it from the second microbatch on), so none exists before its part first lands. FSDP keeps
    the last ``reduce_scatters_in_flight`` inputs until a later part's reduce-scatter needs their
    place, and lets them go as each backward ends. Once a part's weights are copied out, FSDP2
    all-gathers the next part's (its backward prefetch, a default on every device). So the moments,
    part by part in backward order (the rank's parts, :func:`counting.rank_zero_units`, last first):
    its copy-out (its weights twice, beside the inputs kept, the shards made and the stash less the
    parts before); its compute's start (its weights and the next part's flat output, with the head's
    ends, :func:`counting.backward_transients`, or what recompute rematerialises of a block); and its
    end (its whole gradient too, the part's activations freed: a block's and its routed experts'; the
    embedding's dropout mask is left in, which errs high). Along a part gradients grow as activations
    shrink, so its fullest moment is at an end. FSDP's root unit (``fsdp_root``) holds the output
    layer's whole gradient from the backward's start on. The first backward is walked, and, where a
    step has more, a later one, which starts with every shard made (a pipeline's chunks are taken as
    one backward of all the rank's parts); and the step's end."""
    parts = counting.rank_zero_units(model, p, rank)
    experts = counting.rank_zero_units(model, p, rank, experts=True)
    has_embedding = rank == counting.stage_rank(p, 0) and not p.fsdp_root
    has_head = rank == counting.last_stage_rank(p) and not p.fsdp_root
    ends, rematerialised = counting.backward_transients(model, p)
    ends = ends if rank == counting.last_stage_rank(p) else 0.0
    stash = held["activations"] - max(ends, rematerialised)  # the microbatch's, its transients apart
    routed = counting.moe_layer_extra_bytes(model, p)
    left_whole = counting.layers_left_whole(model, p, rank)
    autograd_bytes = counting.autograd_grad_bytes(model, p)
    gb, shard_gb = counting.bytes_per_param(model, p)[1], counting.shard_bytes_per_param(model, p)[1]
    embed, head = counting.fsdp_root(model, p)
    root = (embed if model.tied_embeddings else head) * autograd_bytes  # whole until the root reduces
    copies = 2 if p.dp > 1 else 1  # a part's weights and the flat output they are copied out of
    moments, made = [], 0.0

    def walk(later: bool) -> None:
        nonlocal made
        freed, blocks, inputs = 0.0, 0, []  # inputs: the parts whose reduce-scatter input FSDP keeps
        for k in range(len(parts) - 1, -1, -1):  # the forward's last part first
            head_part, block = has_head and k == len(parts) - 1, not (has_embedding and k == 0)
            grads = made + sum(inputs) * gb + root
            moments.append({**held, "params": held["params"] + copies * parts[k] * pb,
                            "grads": grads, "activations": stash + (ends if head_part else 0.0) - freed})
            following = parts[k - 1] * pb if copies > 1 and k else 0.0  # prefetched: its flat output
            at = {**held, "params": held["params"] + parts[k] * pb + following}
            transient = ends if head_part else rematerialised if block else 0.0
            moments.append({**at, "grads": grads, "activations": stash + transient - freed})
            if block and not head_part:
                freed += layer_kept("none" if blocks < left_whole else p.recompute)
                freed += routed if experts[k] else 0.0
                blocks += 1
            moments.append({**at, "grads": grads + parts[k] * autograd_bytes,
                            "activations": max(0.0, stash - freed)})
            inputs.append(parts[k])
            if not later:  # the shard the reduce-scatter makes; later ones are added into it
                made += parts[k] / p.dp * shard_gb
            if len(inputs) > p.reduce_scatters_in_flight:
                inputs.pop(0)

    walk(later=False)
    if p.microbatches * p.chunks_per_rank > 1:
        moments.append({**held, "grads": made})  # a later forward's end: every shard made
        walk(later=True)
    return [*moments, {**held, "grads": made + (embed + head) / p.dp * shard_gb, "activations": 0.0}]


def _while_units_reduce(model: ModelSpec, p: ParallelSpec, rank: int, stashed: dict[str, float],
                        gb: float, layer_kept: Callable[[str], float],
                        kept: Callable[[counting.Inflight], float]) -> list[dict[str, float]]:
    """ZeRO-2/3 inside a microbatch's backward: whole unit gradients beside the shards, and with
    ZeRO-3 the output layer's, whole in autograd's dtype from the backward's start to the root's
    reduce-scatter (an untied embedding's comes once activations are freed; a tied one is the output
    layer, the last part then holding only the final norm).

    A unit (:func:`_zero_units`) holds its whole gradient from its first gradient on, while its layers'
    activations are still held, and each of the ``reduce_scatters_in_flight`` units on the wire also
    the shard it lands in. So the moments: the k-th unit filling beside the k - 1 before it on the
    wire (for k up to one more than may be in flight, after which the gradients held stop growing as
    the activations go on shrinking), the backward having freed those units' layers (a layer each,
    fewer than a bucket of several layers frees; the layers partial full recompute left whole first,
    :func:`counting.layers_left_whole`); and the backward's end, its activations freed, with the last
    units still on the wire (more only where the rank has no more units than may be in flight: one
    bucket's whole gradient and the shard it lands in, measured on the lab's ZeRO-2, which had read 8%
    over the sum of both moments under full recompute). A rank with more than one backward a step
    starts each later one with the last units of the one before still on the wire (they land only as
    new units need their place), so its first unit (the forward's last part) fills beside as many as
    may be in flight (the forward's first parts), of however many backwards before, and the stash
    (the lab's ZeRO-2 with 2 microbatches had read 24% under its measured peak without it: two whole
    buckets and their shards at once; with 4, where two backwards before each leave their bucket, 21%
    under with one). ``gb``: bytes a gradient element is reduced in; ``layer_kept(recompute)``: what a
    layer keeps of a microbatch; ``kept(inflight)``: what the rank keeps with that many microbatches in
    flight.

    On the last stage's rank the first unit fills once the loss is freed, while the logits' gradient
    the output layer reads, as large, is held: the meter counts no gradient of an activation, so the
    lab's ZeRO-3 reads 2-4% over with 1 or 2 microbatches."""
    units, unit = _zero_units(model, p, rank)
    flight = min(units, p.reduce_scatters_in_flight)  # of one backward's
    backwards = p.microbatches * p.chunks_per_rank
    # on the wire as a later backward starts, and at the step's end: the lab lands a unit only when a
    # new one needs its place, so one bucket reduced per microbatch leaves as many as may be in flight
    carried = min(p.reduce_scatters_in_flight, units * (backwards - 1))
    at_the_end = min(p.reduce_scatters_in_flight, units * backwards)
    grads = stashed["grads"]
    if p.zero == 3:
        embed, head = counting.fsdp_root(model, p)
        grads += (embed if model.tied_embeddings else head) * counting.autograd_grad_bytes(model, p)
    on_the_wire = unit * (1 + 1 / p.dp) * gb  # a unit's whole gradient and the shard it lands in
    moments = []
    for sent in range(min(units, flight + 1)):  # units on the wire as the next one fills
        whole = min(sent, counting.layers_left_whole(model, p, rank))
        freed = whole * layer_kept("none") + (sent - whole) * layer_kept(p.recompute)
        moments.append({**stashed, "grads": grads + unit * gb + sent * on_the_wire,
                        "activations": max(0.0, stashed["activations"] - freed)})
    if carried:  # a later backward's first unit beside the last ones of the backward before
        if p.zero == 2 and p.grad_buckets:
            first, last = unit, carried * unit
        else:  # parts: the backward's first is the forward's last, its last the forward's first
            parts = counting.rank_zero_units(model, p, rank)
            first, last = parts[-1], sum(parts[k % len(parts)] for k in range(carried))
        moments.append({**stashed, "grads": grads + first * gb + last * (1 + 1 / p.dp) * gb})
    if units > p.reduce_scatters_in_flight:  # the end holds no more on the wire than the last fill
        return moments
    after = max(0.0, stashed["activations"] - kept(1))  # other microbatches in flight
    return [*moments, {**stashed, "grads": grads + at_the_end * on_the_wire, "activations": after}]


def _along_the_passes(p: ParallelSpec, rank: int, stashed: dict[str, float], kept_grads: float,
                      kept: Callable[[counting.Inflight], float], layer_kept: Callable[[str], float],
                      chunks: tuple[tuple[int, float, float, float], ...],
                      weight_pass: dict[int, float | None]) -> list[dict[str, float]]:
    """The moments a rank may peak at where gradients are set to None between steps
    (``grads_set_to_none``), walking its passes (:func:`counting.rank_passes`): a chunk's gradients
    exist from its first backward on (a zero-bubble schedule's Bi the norms' and embeddings', its
    deferred W the rest), but for ``kept_grads`` bytes held all the same (torch DDP's buckets).
    ``chunks``: the rank's (stage, parameters, parameters graded last, by Bi)
    (:func:`counting.graded_chunks`); ``kept(held)``: the activations of so
    many microbatches in flight on each of the rank's chunks.

    After each forward, the microbatches in flight on each chunk (each chunk's own, where an uneven
    split's differ) beside the gradients made so far: the stash's peak is reached first without
    gradients, and again beside them where forwards follow a backward (1F1B and its kin with more
    microbatches than they keep in flight; accumulation without pipelines). After each backward, one
    microbatch fewer beside one more chunk's gradients (GPipe, one microbatch, and a rank of several
    chunks whose chunks' first backwards come apart: interleaved with few microbatches holds its first
    chunk's stash beside its last chunk's gradients alone; every gradient from the first backward on
    had read 8% over the lab's pp 2 x v 2 with 2 microbatches). A zero-bubble Bi frees its
    microbatch's stash, all but what its deferred W reads (``weight_pass[stage]``,
    :func:`counting.weight_pass_bytes`; where it is None or missing the stash is held until W): the
    lab's ZB-V with dropout had read 12% over its measured peak, and with sequence parallelism 9%.

    And inside a chunk's first full backward, as it reaches the chunk's first block: every gradient
    made so far but that block's and, on the first stage, the embeddings' (made after it), beside the
    block's activations (its input and what recompute rematerialises), the other microbatches in
    flight and their one transient, taken as this block's rematerialisation. Low by what it leaves
    out: on the first rank the embedding's dropout mask (s b h mask bytes, which a context-parallel
    slice would divide); on GPipe's last rank the smaller of a rematerialisation and a loss, both
    held; under selective recompute the attention core's rematerialisation. Along a backward the
    gradients grow a block at a time as the stash shrinks a block at a time, so its fullest moment is
    at an end: the first block, or the last, the stash's own but for the gradients made before that
    block is rematerialised (the head's, in place of the loss it has freed; under selective recompute
    also the block's own after its attention core), not weighed: 1.2% of the lab's tiny model's
    measured peak at 256 tokens under selective recompute. The first block's outweighs the backward's
    end when a block's activations outweigh its gradients (full recompute on a small model, long
    sequences): the lab's tiny model under full recompute on two tensor-parallel ranks had read 10%
    under its measured peak without it. A zero-bubble schedule's deferred weight gradients come
    later, so it is not weighed there.

    Gradients are priced as a share of the rank's own (``stashed``'s less ``kept_grads``), by
    parameters: whatever bytes a gradient is kept in."""
    stages = [stage for stage, *_ in chunks]
    params = {stage: n for stage, n, _, _ in chunks}
    graded_last = {stage: n for stage, _, n, _ in chunks}
    by_input_pass = {stage: n for stage, _, _, n in chunks}
    per_param = (stashed["grads"] - kept_grads) / (sum(params.values()) or 1)
    held, made = dict.fromkeys(stages, 0), dict.fromkeys(stages, 0.0)  # made: parameters graded
    waiting = dict.fromkeys(stages, 0)  # microbatches between their Bi and their W

    def at(less: float = 0.0, extra: float = 0.0) -> dict[str, float]:
        inflight = tuple(held[stage] for stage in stages)
        for_w = sum(waiting[stage] * weight_pass[stage] for stage in stages if waiting[stage])
        return {**stashed, "grads": kept_grads + (sum(made.values()) - less) * per_param,
                "activations": (kept(inflight) if any(inflight) else 0.0) + for_w + extra}

    moments = []
    for op, stage in counting.rank_passes(p, rank):
        if op == FORWARD:
            held[stage] += 1
            moments.append(at())
        elif op == BACKWARD_INPUT:  # the norms' and embeddings' gradients; W makes the rest
            if weight_pass.get(stage) is not None:  # autograd frees the stash as Bi goes: what W reads
                held[stage], waiting[stage] = held[stage] - 1, waiting[stage] + 1
            made[stage] = max(made[stage], by_input_pass[stage])
            moments.append(at())
        else:  # the pass that makes weight gradients and frees
            first = made[stage] < params[stage]
            made[stage] = params[stage]
            if op == BACKWARD_WEIGHT:  # its gradients, made before the inputs it read are freed
                moments.append(at())
            if op == BACKWARD_WEIGHT and waiting[stage]:
                waiting[stage] -= 1
            else:
                held[stage] -= 1
            moments.append(at())
            if first and op == BACKWARD and graded_last[stage]:
                block = layer_kept(p.recompute)
                if not any(held.values()) and p.recompute == "full":  # the one transient: this block's
                    block += layer_kept("none") - layer_kept("full")
                moments.append(at(less=graded_last[stage], extra=block))
    return moments


def _while_buckets_fill(p: ParallelSpec, stashed: dict[str, float], copies: float, made: float,
                        kept: Callable[[counting.Inflight], float],
                        last_w: float | None = None) -> list[dict[str, float]]:
    """The moments a rank whose gradient reduction copies the gradients (``copies`` bytes) may peak at
    while its buckets fill, beside the stash's (``stashed``: the kinds at the activations' peak).

    The buckets fill during the backward of the step's last microbatch, from the last layer down, and
    their copies are held until the reduction ends, while autograd frees that microbatch's activations
    as its backward goes. On a pipeline rank of one chunk (GPipe, 1F1B) only that microbatch is held
    then: when the k-th of B buckets fills, k/B of the copies are held beside about 1 - k/B of its
    activations, a sum linear in k, so the fullest such moment is the first bucket's or the last's. The
    same holds on a rank of several chunks (interleaved) whose gradients make one bucket: it fills with
    the step's last gradient, in the rank's last pass. A zero-bubble rank's last pass is a deferred W,
    which holds what its weight gradients read until it ends (``last_w``,
    :func:`counting.weight_pass_bytes`; where None, its microbatch's activations, counted whole: they
    had read 1.3% over the lab's dp 2 x pp 2 ZB-V). With several buckets on several chunks, some fill
    while other chunks still hold microbatches: the stash and every copy at once, an upper bound.
    ``made``: bytes of gradients the same backward makes as it goes (the step's only one, with
    gradients set to None), k/B of them by the k-th bucket."""
    buckets, name = p.grad_buckets, p.schedule_run
    if p.pp > 1 and name not in ("gpipe", "1f1b") and buckets > 1:
        return [{**stashed, "grads": stashed["grads"] + copies}]
    microbatch = kept(1)
    if p.pp > 1 and name in SPLIT_BACKWARD:  # held to the end
        held = microbatch if last_w is None else last_w
        return [{**stashed, "grads": stashed["grads"] - made + (made + copies) * k / buckets,
                 "activations": held} for k in (1, buckets)]
    return [{**stashed, "grads": stashed["grads"] - made + (made + copies) * k / buckets,
             "activations": microbatch * (1 - k / buckets)} for k in (1, buckets)]


def _zero_units(model: ModelSpec, p: ParallelSpec, rank: int) -> tuple[int, float]:
    """How many units ZeRO-2/3 reduce-scatter on rank ``rank``, and the parameters of the largest: the
    rank's parts (:func:`counting.largest_zero_unit`: a block, or an end when that is larger; a block
    beside FSDP's root unit), or, for a ZeRO-2 that reduces buckets, its buckets."""
    if p.zero == 2 and p.grad_buckets:
        return p.grad_buckets, counting.zero2_bucket(model, p, rank)
    return counting.zero_unit_count(model, p, rank), counting.largest_zero_unit(model, p, rank)


def _gradients_reduced_from_copies(model: ModelSpec, p: ParallelSpec, params: float, reduced: float,
                                   reduce_bytes: int) -> tuple[float, float, float]:
    """Gradient bytes of a data-parallel run that reduces copies of its gradients, tensor by tensor or
    bucket by bucket (``grad_buckets``), where Megatron-LM reduces its one contiguous buffer: autograd's
    gradients, the buckets kept through the step, and the copies made as the buckets fill, of the
    ``reduced`` ones. Autograd's stay in the optimizer's gradient dtype. paralab's ddp makes a flat
    copy of every gradient in the dtype it is reduced in as a bucket fills, held until backward ends;
    torch's DDP (``buckets_in_grad_dtype``; gradient_as_bucket_view=False, whose docs put what views
    save at the total gradient size) allocates its buckets in the gradients' dtype when it is built,
    and a hook that reduces in a wider dtype widens each on the wire. Naive dp's copy is one tensor at
    a time, not counted."""
    own = counting.autograd_grad_bytes(model, p)
    if not p.overlap_grad_reduce:
        return params * own, 0.0, 0.0
    if not p.buckets_in_grad_dtype:
        return params * own, 0.0, reduced * reduce_bytes
    return params * own, reduced * own, (reduced * reduce_bytes if reduce_bytes > own else 0.0)
