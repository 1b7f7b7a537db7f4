"""Context parallelism in the simulator: its traffic, the ring's hidden and exposed hops, memory,
the planner's choice for long sequences, and the refusals (paralab.sim.context)."""

from __future__ import annotations

import json

import pytest

from paralab.sim import context, cost, counting, planner
from paralab.sim.hardware import get_hardware
from paralab.sim.presets import get_model
from paralab.sim.specs import ParallelSpec, SpecError
from paralab.strategies.sequence_split import imbalance

H100 = get_hardware("h100")
LLAMA = get_model("llama3-8b")


def spec(**options) -> ParallelSpec:
    return ParallelSpec(**{"tp": 1, "global_batch": 1, "micro_batch": 1, **options})


def test_wire_bytes_per_gpu_ring_and_all_to_all():
    """Ring: 3cp-2 hops per layer and microbatch (cp-1 K/V forward; cp-1 K/V and cp dK/dV backward),
    each the slice's K and V. All-to-all: q, k, v and output forward and their gradients backward,
    (cp-1)/cp of each."""
    model, cp = LLAMA.replace(seq=32768), 4
    slice_tokens, e = 32768 // cp, model.dtype_bytes
    ring = context.comm_bytes_per_gpu(model, spec(cp=cp))
    assert ring["cp_send"] == model.layers * (3 * cp - 2) * 2 * slice_tokens * model.kv_dim * e
    assert "dp_all_reduce" in ring  # the slice run's traffic beside the split's
    ulysses = context.comm_bytes_per_gpu(model, spec(cp=cp, cp_mode="alltoall", tp=2))
    widths = 2 * (2 * model.hidden + 2 * model.kv_dim) / 2  # q, k, v, out; both passes; half the heads
    assert ulysses["cp_all_to_all"] == pytest.approx(model.layers * widths * slice_tokens * e * (cp - 1) / cp)


def test_the_ring_hides_a_hop_shorter_than_its_step_and_exposes_a_longer_one():
    compute = [[1.0] * 4 for _ in range(4)]
    hidden = context.ring_steps(compute, hop=0.5)
    assert hidden.makespan == pytest.approx(4.0) and hidden.busy == pytest.approx(4.0)
    exposed = context.ring_steps(compute, hop=2.0)
    assert exposed.makespan == pytest.approx(3 * 2.0 + 1.0)  # three hops, then the last block
    backward = context.ring_steps(compute, hop=0.5, backward=True)
    assert backward.makespan == pytest.approx(4 * 2.0 + 0.5)  # every block twice, then dK/dV home
    assert all(len(h) == 3 + 4 for h in backward.hops), "3 K/V hops and 4 dK/dV hops per rank"


def test_a_contiguous_split_waits_for_its_slowest_rank():
    model = LLAMA.replace(seq=65536)
    zigzag = cost.predict(model, spec(cp=4, tp=8), H100)
    contiguous = cost.predict(model, spec(cp=4, tp=8, cp_split="contiguous"), H100)
    assert contiguous.step_time_s > zigzag.step_time_s
    rows = context.ring_step_compute(model, spec(cp=4, tp=8, cp_split="contiguous").resolved(), H100)
    assert max(map(sum, rows)) / min(map(sum, rows)) == pytest.approx(imbalance(4, "contiguous", model.seq))


@pytest.mark.parametrize("attention", ["fused", "standard"])
def test_selective_recompute_reruns_the_rings_forward_hops_and_all(attention):
    """Selective recompute checkpoints the attention core, fused or not (the lab's cp runs measure the
    hops sent again: tests/test_context.py), so a ring's forward runs twice. The unsplit model prices
    no rerun of a fused core: the step pays the whole ring forward again a layer (the step time had
    counted none of it, while the bytes counted the hops)."""
    model = LLAMA.replace(seq=16384, attention=attention)
    specs = {recompute: spec(dp=2, cp=4, global_batch=2, recompute=recompute)
             for recompute in ("none", "selective", "full")}
    runs = {recompute: cost.predict(model, p, H100) for recompute, p in specs.items()}
    assert runs["selective"].comm_bytes_per_gpu["cp_send"] == runs["full"].comm_bytes_per_gpu["cp_send"] > (
        runs["none"].comm_bytes_per_gpu["cp_send"])
    if attention == "fused":
        forward, _ = context.ring_passes(model, specs["selective"].resolved(), H100)
        assert runs["selective"].step_time_s - runs["none"].step_time_s == pytest.approx(
            model.layers * forward.makespan, rel=1e-9)


def test_selective_recompute_reruns_the_all_to_alls_attention_and_its_q_k_v_not_its_output():
    """Over a fused kernel the slice run prices no rerun: the step pays, a layer, the all-to-all's
    attention forward again and its q, k and v all-to-alls, not the output's (nothing kept needs it)."""
    model = LLAMA.replace(seq=16384, attention="fused")
    specs = {recompute: spec(dp=2, cp=4, cp_mode="alltoall", global_batch=2, recompute=recompute).resolved()
             for recompute in ("none", "selective")}
    none, selective = (cost.predict(model, p, H100) for p in specs.values())
    p = specs["selective"]
    attention, _ = context.ulysses_times(model, p, H100)
    output = cost.collective_time(H100, "all_to_all", context.alltoall_payloads(model, p)[-1], p.cp, p.tp)
    rerun = attention + context.alltoall_time(model, p, H100) - output
    assert selective.step_time_s - none.step_time_s == pytest.approx(model.layers * rerun, rel=1e-9)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("attention", ["fused", "standard"])
def test_splitting_the_sequence_never_beats_not_splitting_it(attention, recompute):
    """At the same tokens per GPU, context parallelism only adds (traffic, smaller kernels). Over a
    fused kernel, ring and all-to-all compute the same attention, so they differ by about the
    all-to-all's exposed traffic; over a standard core the ring's backward recomputes each tile's
    scores, which the all-to-all keeps (or, under recompute, rebuilds once), so the ring pays one
    ring forward a layer more, whatever the recompute. (The ring's backward had been charged 2 x its
    forward against fused attention's 2.5, the all-to-all's attention the whole s x s square a causal
    fused kernel halves, and selective recompute's rerun of the split attention nothing.)"""
    model = LLAMA.replace(seq=16384, attention=attention)
    unsplit = cost.predict(model, spec(dp=8, global_batch=8, recompute=recompute), H100)
    for cp in (2, 4):
        specs = {mode: spec(dp=8 // cp, cp=cp, cp_mode=mode, global_batch=8 // cp, recompute=recompute)
                 for mode in ("ring", "alltoall")}
        runs = {mode: cost.predict(model, p, H100) for mode, p in specs.items()}
        for run in runs.values():
            assert run.step_time_s > unsplit.step_time_s / cp
        ring, alltoall = runs["ring"], runs["alltoall"]
        recomputed_tiles = 0.0
        if attention == "standard":
            forward, _ = context.ring_passes(model, specs["ring"].resolved(), H100)
            recomputed_tiles = model.layers * forward.makespan
        assert abs(alltoall.step_time_s + recomputed_tiles - ring.step_time_s) <= (
            alltoall.breakdown_s["cp_comm_exposed"] + 0.02 * ring.step_time_s)


@pytest.mark.parametrize("options", [dict(pp=4, stage_layers=(14, 6, 6, 6)), dict(recompute="full")])
def test_twice_the_gpus_on_split_sequences_are_less_than_twice_as_fast(options):
    """What a split adds to attention runs on the slowest stage's layers (the 1F1B critical path; the
    mean stage's had made cp 2 on twice the GPUs 2.18x as fast), and again where full recompute reruns
    the forward (2.13x when it did not)."""
    model = LLAMA.replace(seq=65536)
    unsplit = cost.predict(model, spec(global_batch=8, **options), H100)
    split = cost.predict(model, spec(global_batch=8, cp=2, **options), H100)
    assert split.step_time_s > unsplit.step_time_s / 2


@pytest.mark.parametrize("mode", ["ring", "alltoall"])
def test_the_passes_parts_add_up_with_the_split(mode):
    """What the split adds to the passes is attention's compute and its exposed traffic: the
    attention had been added to the passes but not to compute."""
    model = LLAMA.replace(seq=131072)
    b = cost.predict(model, spec(cp=8, cp_mode=mode, recompute="full"), H100).breakdown_s
    assert b["cp_comm_exposed"] > 0
    assert b["pipeline"] == pytest.approx(b["compute"] + b["bubble"] + b["cp_comm_exposed"])


@pytest.mark.parametrize("pp", [1, 4])
def test_the_step_window_holds_the_attention_the_split_adds(pp):
    """A measured step window is the step plus the spread of the ranks' ends: equal to the step
    without a pipeline, never shorter. The split's attention had been added to the step but not to
    the window (0.78 s against a 0.91 s step for Llama 3 8B on dp 2 x cp 4)."""
    asked = spec(dp=2, cp=4, pp=pp, global_batch=8)
    prediction = cost.predict(LLAMA, asked, H100)
    if pp == 1:
        assert prediction.step_window_s == pytest.approx(prediction.step_time_s, rel=1e-12)
    else:
        assert prediction.step_window_s > prediction.step_time_s
    # the window is the slice run's, plus exactly what the split adds to the step (a pipeline's spread
    # of the ranks' ends had kept "window > step" true without the attention)
    base = cost.predict(*context.slice_run(LLAMA, asked), H100)
    assert prediction.step_window_s == pytest.approx(
        base.step_window_s + prediction.step_time_s - base.step_time_s, rel=1e-12)


@pytest.mark.parametrize(("schedule", "v", "passes"),
                         [("1f1b", 1, 8 + 3), ("interleaved", 2, 8 + 3 / 2), ("naive", 1, 4 * 8)])
def test_the_attention_a_split_adds_runs_through_the_schedules_bubble(schedule, v, passes):
    """Each microbatch's passes over a rank's 8 layers, stretched by the schedule's bubble: m + p - 1
    under 1F1B, m + (p - 1) / v interleaved, p m naive (1F1B's count had been taken for every one);
    the stretch is bubble, the rest compute and exposed traffic."""
    model, layers = LLAMA.replace(seq=65536), 8
    p = spec(pp=4, cp=2, global_batch=8, microbatches=8, schedule=schedule, virtual_stages=v)
    pred = cost.predict(model, p, H100)
    base = cost.predict(*context.slice_run(model, p), H100)
    (forward, backward), _ = context.layer_extra(model, p, H100)
    assert pred.step_time_s - base.step_time_s == pytest.approx(passes * layers * (forward + backward))
    b = pred.breakdown_s
    assert b["pipeline"] == pytest.approx(b["compute"] + b["bubble"] + b["cp_comm_exposed"])
    assert pred.bubble_fraction == pytest.approx(b["bubble"] / b["pipeline"])


def test_long_blocks_hide_the_ring_and_small_ones_expose_it():
    long_run = cost.predict(LLAMA.replace(seq=131072), spec(cp=16, tp=8), H100)
    assert long_run.breakdown_s["cp_comm_exposed"] / long_run.step_time_s < 0.01
    short = cost.predict(LLAMA.replace(seq=4096), spec(cp=32, tp=1), H100)  # 128-token slices, 4 nodes
    assert short.breakdown_s["cp_comm_exposed"] / short.step_time_s > 0.05


def test_activations_per_gpu_fall_as_one_over_cp():
    """The ring keeps no attention scores: against the unsplit model without them (selective
    recompute drops exactly those), activations are 1/cp; all-to-all keeps 1/cp of the scores."""
    model = LLAMA.replace(seq=32768)
    unsplit = cost.memory_per_gpu(model, spec(recompute="selective"))["activations"]
    scores = cost.memory_per_gpu(model, spec())["activations"] - unsplit
    for cp in (2, 4, 8):
        ring = cost.memory_per_gpu(model, spec(cp=cp))
        assert ring["activations"] == pytest.approx(unsplit / cp)
        assert ring["params"] == cost.memory_per_gpu(model, spec())["params"], "the model states are whole"
        ulysses = cost.memory_per_gpu(model, spec(cp=cp, cp_mode="alltoall"))["activations"]
        assert ulysses == pytest.approx((unsplit + scores) / cp)


def test_an_all_to_all_keeps_its_heads_scores_over_the_whole_sequence():
    """Standard attention, nothing recomputed: an all-to-all rank keeps a/cp heads' s x s scores and
    s/cp tokens of everything else (Korthikanti et al.'s 34 s b h + 5 a s^2 b a layer, over cp), and
    the loss's share of s/cp tokens: 1/cp of the unsplit model's activations. Its scores had been read
    from the slice's totals under two recompute policies, whose backward transients differ too: 4% low
    at 4 layers of 32k tokens on cp 8."""
    model = get_model("gpt3-1.3b").replace(layers=4, seq=32768, attention="standard")
    unsplit = cost.memory_per_gpu(model, spec())["activations"]
    for cp in (2, 8):
        alltoall = cost.memory_per_gpu(model, spec(cp=cp, cp_mode="alltoall"))["activations"]
        assert alltoall == pytest.approx(unsplit / cp)


def test_an_all_to_all_that_replicates_kv_heads_keeps_the_replicas_for_backward():
    """Llama 3 8B at tp 4 x cp 4: 2 KV heads a tp rank, each sent to two cp ranks; the fused core keeps
    its whole-sequence K and V, twice the slice's, in every layer it does not recompute. Without
    replicas (tp 1: 8 KV heads over cp 4) a fused all-to-all keeps what the ring keeps."""
    model = LLAMA.replace(seq=32768)
    def activations(mode: str, **options) -> float:
        return cost.memory_per_gpu(model, spec(cp=4, cp_mode=mode, **options))["activations"]

    slice_kv = 2 * 32768 // 4 * model.head_dim * 2 * model.dtype_bytes  # K and V, 2 heads a tp rank
    assert activations("alltoall", tp=4) - activations("ring", tp=4) == pytest.approx(model.layers * slice_kv)
    selective = dict(tp=4, recompute="selective")
    assert activations("alltoall", **selective) == activations("ring", **selective)
    assert activations("alltoall") == activations("ring")
    half = dict(tp=4, recompute="full", recompute_layers=model.layers // 2)
    assert activations("alltoall", **half) - activations("ring", **half) == pytest.approx(
        model.layers // 2 * slice_kv)


def test_zero_units_on_the_wire_free_layers_of_the_slice():
    """While ZeRO's unit gradients are on the wire, the backward has freed the layers they belong to:
    layers of the slice a cp rank holds (under full recompute, each layer's input: 2 bytes x s/cp x h),
    not of the whole sequence, which had read the moment two layers too light."""
    model, cp, filled = LLAMA.replace(seq=32768), 2, 2
    def activations(in_flight: int) -> float:
        return cost.memory_per_gpu(model, spec(dp=2, cp=cp, global_batch=2, zero=3, recompute="full",
                                               reduce_scatters_in_flight=in_flight))["activations"]

    layer = 2 * model.seq // cp * model.hidden
    assert activations(filled) == pytest.approx(activations(0) - filled * layer)


def test_layers_full_recompute_leaves_whole_keep_their_scores_as_cp_does():
    """Recomputing half the layers halves the scores the stash keeps: the ring keeps none of them
    (it had added them back, reading more than no recompute at all), all-to-all cp times the slice's."""
    model = LLAMA.replace(seq=32768, attention="standard")
    def activations(mode: str, **recompute) -> float:
        return cost.memory_per_gpu(model, spec(cp=2, cp_mode=mode, **recompute))["activations"]

    half = dict(recompute="full", recompute_layers=model.layers // 2)
    assert activations("ring", recompute="full") < activations("ring", **half) < activations("ring")
    assert activations("alltoall", **half) - activations("ring", **half) == pytest.approx(
        (activations("alltoall") - activations("ring")) / 2)


def test_a_cp_runs_mfu_is_against_the_rated_peak_and_counts_only_the_layers_recomputed():
    """As every other run's: a power cap slows the step, not the peak MFU divides by; recomputing 8 of
    32 layers adds a quarter of full recompute's FLOPs, not all of them."""
    import dataclasses

    from paralab.sim import counting

    capped = dataclasses.replace(H100, power_limit_w=500)
    model = LLAMA.replace(seq=32768)
    p = spec(cp=4, dp=2, global_batch=2, recompute="full", recompute_layers=8)
    for hw in (H100, capped):
        run = cost.predict(model, p, hw, simulate=False)
        flops = counting.flops_per_step(model, p.global_batch, "full", share=0.25)
        assert run.hardware_flops_per_step == pytest.approx(flops["hardware"])
        assert run.mfu == pytest.approx(flops["model"] / (run.step_time_s * 8 * H100.datasheet_peak("bf16")))
    assert cost.predict(model, p, capped, False).step_time_s > cost.predict(model, p, H100, False).step_time_s


def test_hardware_flops_count_the_attention_the_split_prices():
    """A cp step's time prices what counting.flops_per_step of the unsplit run does not count: selective
    recompute reruns a fused core across the split, and a ring step reruns a standard core's forward in
    backward. Hardware FLOPs had left both out: 131,072 tokens on cp 8 stepped 6.88 -> 8.22 s under
    selective recompute at 1.7332e17 FLOPs either way (HFU 0.398 -> 0.333), and a standard core's ring
    counted the all-to-all's FLOPs though it runs one forward a layer more."""
    model = LLAMA.replace(seq=131072)
    p = spec(tp=8, sequence_parallel=True, cp=8, global_batch=8)
    none, selective = (cost.predict(model, p.replace(recompute=r), H100, simulate=False)
                       for r in ("none", "selective"))
    causal_half = 4 * 8 * model.seq**2 * model.hidden / 2  # one fused core's forward over 8 sequences
    assert selective.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(
        model.layers * causal_half)
    assert selective.hfu == pytest.approx(none.hfu, rel=0.02)
    standard = LLAMA.replace(seq=32768, attention="standard")
    for recompute in ("none", "selective"):
        ring, alltoall = (cost.predict(standard, spec(tp=2, sequence_parallel=True, cp=4, cp_mode=mode,
                                                      recompute=recompute), H100, simulate=False)
                          for mode in ("ring", "alltoall"))
        whole_square = 4 * standard.seq**2 * standard.hidden  # one standard core's forward, one sequence
        assert ring.hardware_flops_per_step - alltoall.hardware_flops_per_step == pytest.approx(
            standard.layers * whole_square)


def test_the_planner_takes_cp_for_long_sequences_and_says_why():
    model = LLAMA.replace(seq=131072)
    ranked = planner.plan(model, 64, H100, global_batch=8, top=3)
    assert ranked and ranked[0].parallel.cp > 1
    sentences = planner.explain(ranked, model, H100)
    why = f"Context parallel cp {ranked[0].parallel.cp}"
    assert any(s.startswith(why) and "would not fit" in s for s in sentences), sentences
    assert any(c.cp > 1 for c in planner.candidates(LLAMA.replace(seq=16384), 64, H100, 64))
    assert all(c.cp == 1 for c in planner.candidates(LLAMA, 64, H100, 64)), "8,192 tokens are not long"


def test_the_planner_takes_cp_for_a_batch_that_does_not_split_over_the_replicas():
    """8 sequences of 8,192 tokens on 1,024 H100s: without cp the GPUs no sequence reached went to a
    16-stage pipeline, 93% idle, at 432,594 tokens/s (the plan then); tp 4 x pp 8 x cp 8 x dp 4 runs
    1.01M. A batch that does not split over a layout's replicas brings cp into the search, and the
    explanation says why; 1,000 sequences on 1,024 GPUs too (31% faster than the plan without cp)."""
    ranked = planner.plan(LLAMA, 1024, H100, global_batch=8, top=2)
    win = ranked[0]
    assert win.parallel.cp > 1 and win.tokens_per_s > 2 * 443_655
    why = next(s for s in planner.explain(ranked, LLAMA, H100) if s.startswith("Context parallel"))
    assert "the batch's 8 sequences do not split over the " in why and "GPUs on each sequence" in why
    assert any(c.cp > 1 for c in planner.candidates(LLAMA, 1024, H100, 1000))
    assert all(c.cp == 1 for c in planner.candidates(LLAMA, 1024, H100, 1024)), "1,024 split over 1,024"


@pytest.mark.parametrize("options, message", [
    (dict(cp=16, cp_mode="alltoall", tp=4), r"heads per tp rank \(8\) divisible by 16$"),
    # 8 KV heads divide 64: only the query heads are named (both had been, the KV heads as failing too)
    (dict(cp=64, cp_mode="alltoall"), r"needs the heads per tp rank \(32\) divisible by 64$"),
    (dict(cp=3), r"sequence \(8192\) divisible by 6"),
])
def test_specs_that_cannot_split_are_refused(options, message):
    with pytest.raises(SpecError, match=message):
        cost.predict(LLAMA, spec(**options), H100)
    assert spec().problems(LLAMA.replace(seq=8191)) == [], "without cp any sequence length runs"


def test_ulysses_replicates_kv_heads_fewer_than_cp_and_sends_the_replicas():
    """Grouped-query attention with fewer KV heads per tp rank than cp: each is replicated cp / k times
    before the all-to-all (DeepSpeed-Ulysses', verl's), so every cp rank receives the head its queries
    read; K and V then travel cp / k times the bytes. Llama 3 8B's 8 KV heads at tp 4 are 2 a rank: cp 4
    sends each twice, where tp 1 (8 a rank) sends them once. KV heads that neither divide cp nor are
    divided by it are refused."""
    model = LLAMA.replace(seq=32768)
    slice_bytes = 32768 // 4 * model.dtype_bytes  # one sequence's slice, a byte a token per unit of width
    q, k, v, out = context.alltoall_payloads(model, spec(cp=4, cp_mode="alltoall", tp=4).resolved())
    assert q == out == slice_bytes * model.hidden / 4
    assert k == v == slice_bytes * 4 * model.head_dim, "each of the 4 cp ranks gets one KV head"
    _, k1, _, _ = context.alltoall_payloads(model, spec(cp=4, cp_mode="alltoall").resolved())
    assert k1 == slice_bytes * model.kv_dim, "8 KV heads split over cp 4: none replicated"
    assert cost.predict(model, spec(cp=4, cp_mode="alltoall", tp=4), H100).tokens_per_s > 0
    odd = model.replace(hidden=3072, heads=24, kv_heads=6)
    with pytest.raises(SpecError, match=r"KV heads \(6\) divisible by 4 or dividing it"):
        cost.predict(odd, spec(cp=4, cp_mode="alltoall"), H100)
    assert any(c.cp_mode == "alltoall" and (model.kv_heads // c.tp) < c.cp
               for c in planner.candidates(model.replace(seq=131072), 1024, H100, 1024)), "planned too"


def test_simulate_takes_cp_and_the_timeline_is_refused_not_faked(capsys):
    from paralab import cli

    code = cli.main(["simulate", "--model", "llama3-8b", "--seq", "131072", "--gpus", "128", "--tp", "8",
                     "--cp", "16", "--global-batch", "1", "--hardware", "h100", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["cp"] == 16 and out["comm_bytes_per_gpu"]["cp_send"] > 0 and out["fits"]
    with pytest.raises(SpecError, match="not drawn"):
        cost.predict_trace(LLAMA, spec(cp=2), H100)
    trace = context.ring_trace(LLAMA, spec(cp=4, tp=8), H100)
    assert {s.kind for s in trace.spans} == {"forward", "backward", "send"} and trace.ranks == [0, 1, 2, 3]


def test_context_parallel_traffic_is_the_busiest_pipeline_ranks():
    """The split's hops follow each rank's layers: BLOOM's 4 + 11 x 6 on 12 stages had counted 70 // 12
    = 5 layers' hops on every rank, beside the busiest rank's other traffic."""
    model = get_model("bloom-176b").replace(seq=8192)
    uneven = ParallelSpec(dp=2, pp=12, cp=2, stage_layers=(4,) + (6,) * 11, microbatches=4)
    per_layer = context.comm_bytes_per_gpu(model.replace(layers=12), ParallelSpec(dp=2, pp=12, cp=2,
                                                                                  microbatches=4))["cp_send"]
    assert context.comm_bytes_per_gpu(model, uneven)["cp_send"] == pytest.approx(6 * per_layer)
    first, busiest = (counting.wire_bytes_by_key(context.comm_payloads(model, uneven, rank))["cp_send"]
                      for rank in (0, 1))
    assert first == pytest.approx(4 * per_layer) and busiest == pytest.approx(6 * per_layer)


@pytest.mark.parametrize("mode", ["ring", "alltoall"])
def test_the_cp_explanation_weighs_the_unsplit_layout_as_the_split_one_keeps_its_scores(mode):
    """An all-to-all's attention keeps its heads' scores over the whole sequence, as the unsplit layout
    does: the explanation had priced that layout with selective recompute (as against a ring, which
    keeps none), and said gpt3-175b's cp 2 winner raised its activations from 19.5 to 32.1 GiB."""
    model = LLAMA.replace(attention="standard")
    win = cost.predict(model, spec(cp=2, cp_mode=mode, recompute="none"), H100)
    scores_kept, scores_dropped = (cost.memory_per_gpu(model, win.parallel.replace(cp=1, recompute=r))[
        "activations"] for r in ("none", "selective"))
    assert scores_dropped < scores_kept  # the two weighings differ: the test tells them apart
    why = planner.why_context_parallel(win, model, H100)
    unsplit = scores_dropped if mode == "ring" else scores_kept
    assert f"unsplit keeps {planner.bytes_text(unsplit)} (" in why, why


@pytest.mark.parametrize("parallel, said", [
    (ParallelSpec(tp=8, cp=2, dp=1, global_batch=1),
     "the batch's 1 sequence does not split over the 2 replicas this layout has without cp, and cp puts 2"),
    (ParallelSpec(tp=8, cp=128, dp=8, global_batch=8),
     "the batch's 8 sequences do not split over the 1,024 replicas this layout has without cp, and cp "
     "puts 128"),
])
def test_the_context_parallel_sentence_counts_its_sequences_and_replicas_in_words_and_thousands(parallel,
                                                                                              said):
    """It had said "the batch's 1 sequence do not split over the 1024 replicas..., so cp puts...": the
    batch is one reason a layout takes cp, not the reason for its degree."""
    model = LLAMA.replace(seq=131072)
    why = planner.why_context_parallel(cost.predict(model, parallel, H100), model, H100)
    assert said in why, why
