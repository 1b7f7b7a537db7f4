"""The counting formulas against the closed forms and tables of the papers they come from."""

import pytest

from paralab.schedules import build_schedule, validate_schedule
from paralab.sim import cost, counting
from paralab.sim.presets import get_model
from paralab.sim.specs import ModelSpec, ParallelSpec
from paralab.stage_split import ends_split, megatron_split

V, S = 51200, 2048

# Narayanan et al. 2021, Table 1: (billions of parameters as printed, heads, hidden, layers)
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24),
    (18.4, 48, 6144, 40),
    (145.6, 96, 12288, 80),
    (310.1, 128, 16384, 96),
    (529.6, 128, 20480, 105),
    (1008.0, 160, 25600, 128),
]


@pytest.mark.parametrize("billions,heads,hidden,layers", MEGATRON_TABLE_1)
def test_parameters_match_megatron_eq2_and_table1(billions, heads, hidden, layers):
    model = ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=V, seq=S)
    counts = counting.parameter_counts(model)
    L, h = layers, hidden
    closed_form = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + S) / (12 * L * h))  # eq. 2
    assert counts["total"] - counts["final_norm"] == pytest.approx(closed_form, rel=1e-12)
    assert round(counts["total"] / 1e9, 1) == billions


@pytest.mark.parametrize("billions,heads,hidden,layers", MEGATRON_TABLE_1)
def test_flops_match_megatron_eq3_and_korthikanti(billions, heads, hidden, layers):
    model = ModelSpec(layers=layers, hidden=hidden, heads=heads, vocab=V, seq=S)
    B, L, h = 1536, layers, hidden
    full = counting.flops_per_step(model, B, "full")
    none = counting.flops_per_step(model, B, "none")
    selective = counting.flops_per_step(model, B, "selective")
    # Narayanan et al. 2021, eq. 3 (with recompute)
    assert (full["hardware"]
            == pytest.approx(96 * B * S * L * h**2 * (1 + S / (6 * h) + V / (16 * L * h)), rel=1e-12))
    # Korthikanti et al. 2022, sec. 5: model FLOPs, and hardware FLOPs with selective recompute
    model_flops = 72 * B * S * L * h**2 * (1 + S / (6 * h) + V / (12 * L * h))
    for counted in (none["model"], none["hardware"], full["model"], selective["model"]):
        assert counted == pytest.approx(model_flops, rel=1e-12)
    assert (selective["hardware"]
            == pytest.approx(72 * B * S * L * h**2 * (1 + S / (3 * h) + V / (12 * L * h)), rel=1e-12))


# Korthikanti et al. 2022, Table 5 (selective recompute + sequence parallelism): MFU %, HFU %.
@pytest.mark.parametrize(
    "preset,mfu,hfu",
    [("megatron-22b", 41.5, 43.7), ("megatron-175b", 51.4, 52.8), ("megatron-530b", 56.0, 57.0),
     ("megatron-1t", 56.3, 57.0)],
)
def test_hfu_over_mfu_matches_korthikanti_table5(preset, mfu, hfu):
    flops = counting.flops_per_step(get_model(preset), 1, "selective")
    ratio = flops["hardware"] / flops["model"]
    assert (hfu - 0.05) / (mfu + 0.05) <= ratio <= (hfu + 0.05) / (mfu - 0.05)  # within the table's rounding


def test_activation_memory_matches_korthikanti_table2():
    model = get_model("megatron-175b")
    s, b, h, a, t = S, 1, 12288, 96, 8
    sbh = s * b * h

    def act(**kw):
        return counting.activation_bytes_per_layer(model, b, **kw)

    assert act() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert act(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert act(tp=t, sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert act(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    assert act(tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert act(tp=t, recompute="full") == pytest.approx(2 * sbh)


def test_activation_memory_scales_with_batch_and_dtype():
    """Table 2 is linear in b; an fp32 model stores every tensor at 4 bytes, its 1-byte masks at 1."""
    model = get_model("megatron-175b")
    per_layer = counting.activation_bytes_per_layer
    for kw in ({}, {"tp": 8}, {"tp": 8, "sequence_parallel": True}, {"tp": 8, "recompute": "selective"}):
        assert per_layer(model, 4, **kw) == pytest.approx(4 * per_layer(model, 1, **kw))
    # the two dropout masks (s b h) and the attention one (a s s b), 1 byte
    masks = 2 * S * 12288 + 96 * S * S
    fp32 = model.replace(dtype="fp32")
    assert per_layer(fp32, 1) == pytest.approx(2 * per_layer(model, 1) - masks)
    no_dropout = model.replace(dropout=False)
    assert (per_layer(no_dropout.replace(dtype="fp32"), 2, tp=8)
            == pytest.approx(2 * per_layer(no_dropout, 2, tp=8)))


def test_sequence_parallel_that_keeps_the_gathered_inputs_holds_them_whole():
    """torch's DTensor keeps each column-parallel layer's gathered input (the normalised input of
    attention and of the MLP, 2 s b h each in 16 bits) where Megatron-LM keeps its 1/t slice."""
    model, b, t = get_model("megatron-175b"), 2, 8
    sliced = counting.activation_bytes_per_layer(model, b, t, True)
    gathered = counting.activation_bytes_per_layer(model, b, t, True, gathered_inputs=True)
    assert gathered - sliced == pytest.approx(2 * 2 * S * b * 12288 * (1 - 1 / t))
    assert counting.activation_bytes_per_layer(model, b, t, False, gathered_inputs=True) == \
        counting.activation_bytes_per_layer(model, b, t, False)


def test_the_ends_keep_the_embeddings_dropout_mask_the_heads_inputs_and_fp32_logits():
    """Korthikanti et al. 2022 sec. 4.3: the first stage keeps the input embedding's dropout mask, s b h
    bytes a microbatch (its output is the first layer's input, which the layer counts), the last the
    final norm's and the output layer's inputs, 2 s b h each in 16 bits, and the loss's 4 s b V bytes
    of fp32 logits; all / t with sequence parallelism (the logits / t in any case)."""
    llama = get_model("llama3-8b")  # no dropout: nothing more on the first stage
    flat = ParallelSpec(tp=2, micro_batch=2, microbatches=1)
    logits = 4 * llama.seq * 2 * llama.vocab / 2
    head = 2 * 2 * llama.seq * 2 * llama.hidden  # the final norm's input and the output layer's
    assert counting.activation_bytes_per_gpu(llama, flat) == pytest.approx(
        llama.layers * counting.activation_bytes_per_layer(llama, 2, tp=2) + head + logits)
    sequence_parallel = flat.replace(sequence_parallel=True)
    layers = llama.layers * counting.activation_bytes_per_layer(llama, 2, 2, True)
    assert counting.activation_bytes_per_gpu(llama, sequence_parallel) == pytest.approx(
        layers + head / 2 + logits)
    # with full recompute a microbatch's backward frees its head and loss before it rematerialises a
    # layer, whose input it kept already
    recomputed = flat.replace(recompute="full")
    one_input = counting.activation_bytes_per_layer(llama, 2, 2, recompute="full")
    layer = counting.activation_bytes_per_layer(llama, 2, 2) - one_input
    assert logits > layer and counting.activation_bytes_per_gpu(llama, recomputed) == pytest.approx(
        llama.layers * one_input + head + logits)
    short_vocab = llama.replace(vocab=1024)
    assert counting.activation_bytes_per_gpu(short_vocab, recomputed) == pytest.approx(
        llama.layers * one_input + layer)
    gpt = get_model("megatron-175b")  # dropout, 1-byte masks
    piped = ParallelSpec(tp=8, pp=8, microbatches=16, micro_batch=1, sequence_parallel=True)
    mask = gpt.seq * gpt.hidden / 8
    per_layer = counting.activation_bytes_per_layer(gpt, 1, 8, True)
    assert counting.activation_bytes_per_gpu(gpt, piped, 0) == pytest.approx(8 * 12 * per_layer + 8 * mask)


@pytest.mark.parametrize("schedule, last", [("1f1b", 3), ("zbv", 0)])
def test_the_last_stage_is_the_last_rank_or_in_zbv_rank_0_which_holds_both_ends(schedule, last):
    model = get_model("llama3-8b")
    spec = ParallelSpec(pp=4, microbatches=8, micro_batch=1, schedule=schedule,
                        virtual_stages=2 if schedule == "zbv" else 1)
    assert counting.last_stage_rank(spec) == last
    assert [counting.stage_rank(spec, st) for st in range(spec.pp * spec.virtual_stages)] == \
        build_schedule(schedule, 4, 8, spec.virtual_stages).stage_to_rank
    ends = model.vocab * model.hidden * (2 if last == 0 else 1)  # the output layer (and the embedding)
    assert counting.stage_params(model, spec, last) - counting.stage_params(model, spec, 1) >= ends
    chunk = model.layers // 8 if schedule == "zbv" else model.layers // 4
    stashed = counting.peak_inflight_chunks(schedule, 4, 8, spec.virtual_stages, last) * chunk
    one_mb_ends = 4 * model.seq * model.vocab + 2 * 2 * model.seq * model.hidden  # logits, head inputs
    assert counting.activation_bytes_per_gpu(model, spec, last) == pytest.approx(
        stashed * counting.activation_bytes_per_layer(model, 1) + one_mb_ends)


def test_zero_model_states_match_rajbhandari_figure1():
    # ZeRO paper, Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB
    totals = [sum(counting.model_state_bytes(7.5e9, 64, zero).values()) / 1e9 for zero in range(4)]
    assert [round(x, 1) for x in totals] == [120.0, 31.4, 16.6, 1.9]
    fp32 = counting.model_state_bytes(1e9, 1, 0, "adam-fp32")
    assert (fp32["params"], fp32["grads"], fp32["optimizer"]) == (4e9, 4e9, 8e9)


def test_llama_parameters_are_exact():
    # SwiGLU + GQA + RMSNorm + untied embeddings, counted term by term (published checkpoints' sizes)
    assert counting.parameter_counts(get_model("llama2-7b"))["total"] == 6_738_415_616
    assert counting.parameter_counts(get_model("llama3-8b"))["total"] == 8_030_261_248
    assert counting.parameter_counts(get_model("llama2-70b"))["total"] == 68_976_648_192


def test_ring_wire_bytes_per_rank_by_hand():
    """A ring all-reduce of B bytes on n ranks sends 2 (n - 1) / n x B from each rank, its halves
    (n - 1) / n x B each; a send sends B; one rank sends nothing."""
    mib = 1 << 20
    assert counting.ring_wire_bytes("all_reduce", mib, 8) == 2 * 7 * mib // 8 == 1_835_008
    assert counting.ring_wire_bytes("all_gather", mib, 8) == 7 * mib // 8 == 917_504
    assert counting.ring_wire_bytes("reduce_scatter", mib, 8) == 917_504
    assert counting.ring_wire_bytes("all_reduce", mib, 2) == mib
    assert counting.ring_wire_bytes("send", mib, 2) == mib
    assert counting.ring_wire_bytes("all_reduce", mib, 1) == 0


def test_tensor_parallel_bytes_match_narayanan():
    # Narayanan et al. 2021 sec. 3.3: tp moves 8 b s h (t-1)/t elements per layer per microbatch per GPU
    model = get_model("megatron-175b")
    p = ParallelSpec(tp=8, pp=8, microbatches=16, micro_batch=2)
    b, h, t, layers = 2, 12288, 8, 96 // 8

    def middle_rank(spec):  # the model's ends' collectives are the first and last ranks'
        return counting.wire_bytes_by_key(counting.comm_payloads(model, spec, 3))

    expected = 16 * layers * 8 * b * S * h * (t - 1) / t * 2
    assert middle_rank(p)["tp_all_reduce"] == pytest.approx(expected)
    sp = middle_rank(p.replace(sequence_parallel=True))
    # Korthikanti et al. 2022 sec. 4.2.2: the same bytes, and the backward gathers each column-parallel
    # layer's input again (2 a layer, b s h each) since only its sequence slice was kept
    again = 16 * layers * 2 * b * S * h * (t - 1) / t * 2
    assert sp["tp_all_gather"] + sp["tp_reduce_scatter"] == pytest.approx(expected + again)


@pytest.mark.parametrize(
    "name,p,m,v",
    [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 4, 1), ("1f1b", 4, 2, 1), ("interleaved", 4, 8, 2),
     ("interleaved", 4, 4, 3), ("zb-h1", 4, 8, 1), ("zb-h1", 8, 4, 1), ("zbv", 4, 8, 2), ("zbv", 4, 2, 2),
     ("interleaved", 4, 2, 2), ("interleaved", 4, 6, 2), ("interleaved", 4, 10, 3), ("dualpipev", 4, 8, 2),
     ("dualpipev", 2, 9, 2)],
)
def test_peak_inflight_matches_schedule_data_on_every_rank(name, p, m, v):
    peaks = validate_schedule(build_schedule(name, p, m, v)).peak_activations
    assert [counting.peak_inflight_chunks(name, p, m, v, rank) for rank in range(p)] == peaks


def test_no_rank_holds_more_activations_in_flight_than_an_earlier_one():
    """What lets memory_per_gpu weigh only the first rank of each kind (first_rank_of_each_kind)."""
    from paralab.schedules import SCHEDULES

    for name in SCHEDULES:
        for p in range(2, 9):
            for m in range(1, 13):
                for v in {"zbv": (2,), "dualpipev": (2,), "interleaved": (1, 2, 3)}.get(name, (1,)):
                    peaks = [counting.peak_inflight_chunks(name, p, m, v, rank) for rank in range(p)]
                    assert peaks == sorted(peaks, reverse=True), (name, p, m, v, peaks)


def test_interleaved_chunks_of_different_sizes_hold_what_the_schedule_holds():
    """Chunks of different sizes on a rank (Llama 3's split: the embedding alone, a layer a chunk, the
    head alone) fill unevenly: at the peak the first chunks hold the most microbatches and the last
    one. A rank keeps what its order holds at once, walked here over the built schedule, not the
    mean chunk times the microbatches in flight (rank 0: 12 layers' worth, not 14.25)."""
    model = ModelSpec(layers=14, hidden=1024, heads=16, dropout=False)
    p = ParallelSpec(pp=4, virtual_stages=4, schedule="interleaved", micro_batch=1, microbatches=8,
                     stage_layers=ends_split(14, 16, 0, 0)).resolved()
    layers = counting.chunk_layers(model, p)
    assert layers == [0, *[1] * 14, 0]
    per_layer = counting.activation_bytes_per_layer(model, 1, 1, False, "none")
    schedule = build_schedule("interleaved", 4, 8, 4)
    held = []
    for actions in schedule.actions[:3]:  # not the last rank: its head and loss come on top
        alive = most = 0
        for a in actions:
            alive += layers[a.stage] * ((a.op == "forward") - (a.op == "backward"))
            most = max(most, alive)
        held.append(most)
    assert held == [12, 17, 15]
    for rank, most in enumerate(held):
        assert counting.activation_bytes_per_gpu(model, p, rank) == pytest.approx(most * per_layer)


def test_ranks_alike_in_blocks_but_not_chunk_by_chunk_are_different_kinds():
    model = ModelSpec(layers=14, hidden=1024, heads=16)
    p = ParallelSpec(pp=4, virtual_stages=2, schedule="interleaved", microbatches=8,
                     stage_layers=(1, 1, 6, 1, 1, 6, 1, 1)).resolved()
    assert counting.layers_by_rank(model, p)[0] == (2, 7, 7, 2)
    assert counting.chunks_by_rank(model, p)[1:3] == (((1, 0), (6, 0)), ((6, 0), (1, 0)))
    assert counting.first_rank_of_each_kind(model, p) == [0, 1, 2, 3]


def test_the_first_rank_of_each_kind_stands_for_ranks_alike_in_blocks_and_ends():
    model = get_model("deepseek-v3")  # 61 blocks, the first 3 dense
    p = ParallelSpec(pp=8, tp=8, dp=4, ep=4, micro_batch=1, global_batch=64,
                     stage_layers=ends_split(61, 8, 5, 2)).resolved()
    layers, moe_layers = counting.layers_by_rank(model, p)
    assert (layers, moe_layers) == ((5, 9, 9, 9, 9, 9, 9, 2), (2, 9, 9, 9, 9, 9, 9, 2))
    assert counting.first_rank_of_each_kind(model, p) == [0, 1, 7]  # the first, a middle one, the last
    v = p.replace(schedule="zbv", virtual_stages=2, pp=4, dp=8, stage_layers=None, global_batch=64,
                  micro_batch=1).resolved()
    assert counting.first_rank_of_each_kind(get_model("gpt3-175b"), v) == [0, 1]  # the V: both ends on 0


def test_zero3_parts_are_the_ends_and_each_block():
    """ZeRO-3 gathers the embedding (token and position tables), each block, then the final norm and
    the output layer; GPT-3's output layer is the tied embedding, so its last part is the norm."""
    gpt = get_model("gpt3-1.3b")
    h, block = gpt.hidden, sum(counting.layer_params(gpt).values())
    parts = counting.zero_units(gpt, ParallelSpec(), 0)
    assert list(parts) == pytest.approx([(gpt.vocab + gpt.seq) * h] + [block] * gpt.layers + [2 * h])
    llama = get_model("llama3-8b")  # untied, no positions; on two stages with tp 2
    spec = ParallelSpec(pp=2, tp=2)
    first, last = (counting.zero_units(llama, spec, c) for c in (0, 1))
    table = llama.vocab * llama.hidden / 2
    assert first[0] == table and last[-1] == table + llama.hidden  # split over tp; the norm replicated
    assert len(first) == len(last) == llama.layers // 2 + 1
    assert [sum(first), sum(last)] == pytest.approx([counting.chunk_params(llama, spec, c) for c in (0, 1)])
    deepseek = get_model("deepseek-v3")  # three dense blocks, then mixtures of experts over ep 8
    spec = ParallelSpec(pp=4, ep=8, dp=8, stage_layers=(16, 15, 15, 15))
    parts = [counting.zero_units(deepseek, spec, c) for c in range(4)]
    assert parts[0][1] == parts[0][3] < parts[0][4] == parts[1][0]  # dense blocks, then MoE ones
    chunks = [counting.chunk_params(deepseek, spec, c) for c in range(4)]
    assert [sum(p) for p in parts] == pytest.approx(chunks)
    assert [counting.zero_unit_count(deepseek, spec, r) for r in range(4)] == [len(p) for p in parts]
    # at ep = dp a rank's experts are its own: the largest part it gathers or reduces is without them
    experts = [counting.zero_unit_experts(deepseek, spec, c) for c in range(4)]
    assert [counting.largest_zero_unit(deepseek, spec, r) for r in range(4)] == pytest.approx(
        [max(u - e for u, e in zip(p, x)) for p, x in zip(parts, experts)])


def test_zero_traffic_matches_rajbhandari_section_7():
    """ZeRO paper sec. 7: stages 1 and 2 move 2 Psi per step, as DDP's all-reduce; stage 3 moves 3 Psi
    (a reduce-scatter and two all-gathers, one for forward and one for backward)."""
    model, n = get_model("gpt3-1.3b"), 64
    psi = counting.stage_params(model, ParallelSpec(), 0) * 2 * (n - 1) / n  # fp16 bytes, ring share
    volume = [sum(counting.comm_bytes_per_gpu(model, ParallelSpec(dp=n, zero=z, micro_batch=1)).values())
              for z in range(4)]
    assert volume == pytest.approx([2 * psi, 2 * psi, 2 * psi, 3 * psi])
    # with 4 microbatches of accumulation ZeRO-2 reduce-scatters every microbatch (it keeps only its
    # gradient shard) and ZeRO-3 also gathers every microbatch: (m + 1) psi and 3 m psi
    accumulated = [sum(counting.comm_bytes_per_gpu(
                       model, ParallelSpec(dp=n, zero=z, micro_batch=1, microbatches=4)).values())
                   for z in range(4)]
    assert accumulated == pytest.approx([2 * psi, 2 * psi, 5 * psi, 12 * psi])


@pytest.mark.parametrize(
    "layers, pp, v, ends, expect",
    [
        (70, 12, 1, (5, 5), [5, *[6] * 10, 5]),  # BLOOM-176B as it ran (BigScience tr11 README)
        (126, 16, 1, (7, 7), [7, *[8] * 14, 7]),  # Llama 3 405B: one layer fewer on each end stage
        (126, 16, 8, (0, 0), [0, *[1] * 126, 0]),  # ... and its V=8 chunks: embedding alone, head alone
        (96, 8, 1, None, [12] * 8),
    ],
)
def test_an_uneven_pipeline_split_lays_the_layers_as_asked(layers, pp, v, ends, expect):
    model = ModelSpec(layers=layers, hidden=1024, heads=16)
    split = dict(stage_layers=ends_split(layers, pp * v, *ends)) if ends else {}
    schedule = "interleaved" if v > 1 else "1f1b"
    p = ParallelSpec(pp=pp, virtual_stages=v, schedule=schedule, microbatches=pp, **split)
    assert not p.problems(model)
    assert counting.chunk_layers(model, p) == expect
    assert sum(counting.rank_layers(model, p, r) for r in range(pp)) == layers
    # every parameter is held by exactly one pipeline rank (tp 1, untied output on the last)
    untied = model.replace(tied_embeddings=False)
    assert sum(counting.stage_params(untied, p, r) for r in range(pp)) == pytest.approx(
        counting.parameter_counts(untied)["total"])


def test_uneven_splits_are_suggested_and_checked():
    assert megatron_split(70, 12) == (5, *[6] * 10, 5) and megatron_split(126, 16) == (7, *[8] * 14, 7)
    assert megatron_split(126, 128) == (0, *[1] * 126, 0)
    assert megatron_split(7, 8) == (1, *[1] * 6, 0)  # the last stage holds only the output layer and loss
    assert megatron_split(7, 10) is None and megatron_split(96, 64) is None  # ends would outweigh the middle
    model = ModelSpec(layers=70, hidden=1024, heads=16)
    (problem,) = ParallelSpec(pp=12, microbatches=12).problems(model)
    assert "pp 12 does not divide 70 layers" in problem and "5 + 10 x 6 + 5" in problem
    (problem,) = ParallelSpec(pp=12, microbatches=12, stage_layers=ends_split(70, 12, 4, 5)).problems(model)
    assert "sum to the model's 70 layers" in problem  # 61 layers do not share evenly over 10 stages


def test_fused_attention_keeps_no_scores():
    """A flash kernel keeps Q, K, V and its output (in the Table 2 count) and each row's fp32
    log-sum-exp, 4 a s b bytes, instead of the 5 a s^2 b of softmax, mask and dropout output."""
    model = get_model("megatron-175b").replace(attention="fused")
    s, b, h, a, t = S, 2, 12288, 96, 8
    sbh = s * b * h
    per_layer = counting.activation_bytes_per_layer
    assert per_layer(model, b) == pytest.approx(34 * sbh + 4 * a * s * b)
    assert per_layer(model, b, tp=t) == pytest.approx(sbh * (10 + 24 / t) + 4 * a * s * b / t)
    sp = per_layer(model, b, tp=t, sequence_parallel=True)
    assert sp == pytest.approx(34 * sbh / t + 4 * a * s * b / t)
    assert per_layer(model, b, tp=t, recompute="selective") == per_layer(model, b, tp=t)  # nothing to drop
    standard = model.replace(attention="standard")
    assert per_layer(standard, b) - per_layer(model, b) == pytest.approx(5 * a * s * s * b - 4 * a * s * b)
    # in hardware FLOPs the causal kernel runs half the core (forward, backward, and the Q K^T it
    # recomputes in backward, half the forward again): 1.75 forwards of the whole core against 3
    core = model.layers * counting.layer_forward_flops(model, 1)["attention"]
    extra = counting.flops_per_step(model, 1)["hardware"] - counting.flops_per_step(standard, 1)["hardware"]
    assert extra == pytest.approx((0.5 * (3 + 0.5) - 3) * core)
    assert counting.flops_per_step(model, 1)["model"] == counting.flops_per_step(standard, 1)["model"]


def test_parallel_blocks_share_one_norm_and_one_tensor_parallel_reduction():
    model = get_model("megatron-175b")
    parallel = model.replace(parallel_blocks=True)
    sbh, e = S * 12288, 2
    assert counting.layer_params(model)["norms"] == 2 * counting.layer_params(parallel)["norms"]
    # one norm input and one normalised input fewer (2 bytes each)
    saved = counting.activation_bytes_per_layer(model) - counting.activation_bytes_per_layer(parallel)
    assert saved == 2 * e * sbh
    p = ParallelSpec(tp=8, pp=4, microbatches=4, micro_batch=1)  # rank 1: the layers' collectives alone
    serial, side_by_side = (counting.wire_bytes_by_key(counting.comm_payloads(m, p, 1))["tp_all_reduce"]
                            for m in (model, parallel))
    assert serial == 2 * side_by_side


def test_fsdp_fp32_shards_are_the_master_weights():
    """PyTorch FSDP's mixed precision keeps each shard in fp32 as the optimizer's weights and gathers
    it in bf16: 4 + 4 + 8 bytes a parameter of the shard where a 16-bit shard beside an fp32 master
    copy keeps 2 + 4 + 12 (with fp32 gradients) or 2 + 2 + 12; what is gathered and reduced keeps the
    16-bit parameter and the reduce dtype's bytes."""
    model = get_model("gpt3-1.3b")
    for fp32_grads, master_copy in ((True, (2, 4, 12)), (False, (2, 2, 12))):
        p = ParallelSpec(dp=8, zero=3, fp32_grads=fp32_grads)
        assert counting.shard_bytes_per_param(model, p) == master_copy
        fsdp = p.replace(fp32_shards=True)
        assert counting.shard_bytes_per_param(model, fsdp) == (4, 4, 8)
        assert counting.bytes_per_param(model, fsdp) == counting.bytes_per_param(model, p)
        states = counting.model_state_bytes(1.0, 8, 3, counting.shard_bytes_per_param(model, fsdp))
        assert states == {"params": 4 / 8, "grads": 4 / 8, "optimizer": 8 / 8}
    p = ParallelSpec(dp=8, zero=3, micro_batch=1, fp32_grads=True)
    held, fsdp = cost.memory_per_gpu(model, p), cost.memory_per_gpu(model, p.replace(fp32_shards=True))
    shard = counting.stage_params(model, p, 0) / 8
    assert held["total"] - fsdp["total"] == pytest.approx(2 * shard)  # 18 bytes a parameter, now 16
    assert fsdp["optimizer"] == pytest.approx(8 * shard)
    moved = [counting.comm_bytes_per_gpu(model, spec) for spec in (p, p.replace(fp32_shards=True))]
    assert moved[0] == moved[1]


@pytest.mark.parametrize("change, model, missing", [
    (dict(zero=2), "gpt3-1.3b", "needs zero 3, got zero 2"),
    ({}, "small", "needs mixed-precision Adam, got adam-fp32"),
    (dict(zero=1), "small", "needs zero 3, got zero 1; mixed-precision Adam, got adam-fp32"),
])
def test_fp32_shards_need_zero_3_and_16_bit_weights_and_say_which_is_missing(change, model, missing):
    """Only what is missing is named: "got zero 0, adam-mixed" had listed a condition already met."""
    spec = ParallelSpec(dp=8, zero=3, micro_batch=1, global_batch=8, fp32_shards=True).replace(**change)
    assert [problem for problem in spec.problems(get_model(model)) if "fp32_shards" in problem] == [
        f"fp32_shards (FSDP's fp32 shards as the master weights) {missing}"]


def test_fp32_gradients_and_megatrons_distributed_optimizer():
    """Megatron-LM's distributed optimizer docs: bf16 parameters with fp32 gradients take 18 bytes per
    parameter, 6 + 12/d with the distributed optimizer (ZeRO-1 over d data-parallel ranks)."""
    model = get_model("gpt3-1.3b")
    for zero, d, expect in ((0, 8, 18), (1, 8, 6 + 12 / 8), (1, 64, 6 + 12 / 64)):
        p = ParallelSpec(dp=d, zero=zero, fp32_grads=True)
        states = counting.model_state_bytes(1.0, d, zero, counting.bytes_per_param(model, p))
        assert sum(states.values()) == expect
    p = ParallelSpec(dp=8, zero=1, micro_batch=1)
    plain, fp32 = (counting.comm_bytes_per_gpu(model, p.replace(fp32_grads=f))["zero_reduce_scatter"]
                   for f in (False, True))
    assert fp32 == 2 * plain  # the gradients travel in fp32 too


def test_recomputing_some_layers_keeps_the_others_whole():
    model = get_model("llama3-8b")
    full, half, none = (ParallelSpec(micro_batch=1, recompute=r, recompute_layers=k)
                        for r, k in (("full", 0), ("full", 16), ("none", 0)))  # fmt: skip
    acts = [counting.activation_bytes_per_gpu(model, p) for p in (full, half, none)]
    assert acts[0] < acts[1] < acts[2]
    extra = [counting.flops_per_step(model, 1, p.recompute, counting.recompute_share(model, p))["hardware"] -
             counting.flops_per_step(model, 1)["hardware"] for p in (full, half)]  # fmt: skip
    assert extra[1] == pytest.approx(extra[0] / 2)
    assert ParallelSpec(recompute_layers=4).problems(model)  # only with full recompute
    # Megatron-LM's block method recomputes that many layers of every model chunk: 2 of each chunk's 4
    interleaved = ParallelSpec(pp=4, virtual_stages=2, schedule="interleaved", recompute="full",
                               recompute_layers=2, microbatches=8)
    assert counting.recompute_share(model, interleaved) == pytest.approx(0.5)


def test_a_spec_keeps_its_hash_and_hashes_as_its_equals_do():
    """Specs key the simulator's caches and keep their hash once worked out; a copy, a pickle or a
    replace is hashed afresh (a string's hash differs from one process to the next)."""
    import copy
    import pickle

    model = get_model("llama3-405b")
    p = ParallelSpec(pp=16, virtual_stages=8, schedule="interleaved", stage_layers=ends_split(126, 128, 0, 0))
    assert hash(p) == hash(ParallelSpec(**{f: getattr(p, f) for f in p.__dataclass_fields__}))
    assert hash(model) == hash(get_model("llama3-405b").replace())
    for copied in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert copied == p and "_hash" not in copied.__dict__ and hash(copied) == hash(p)
    assert p.replace(pp=8) != p and hash(p.replace(pp=8)) != hash(p)


def test_wire_bytes_per_gpu_are_the_busiest_ranks_with_an_uneven_split():
    """A split with a light first rank reports the traffic of a full one (mirror splits had read 3 and
    7 layers' tensor-parallel all-reduces; DeepSeek-V3 with one layer on the first rank, no all-to-all)."""
    model = get_model("gpt3-1.3b")
    light_first, light_last = ((3, 7, 7, 7), (7, 7, 7, 3))
    wire = [counting.comm_bytes_per_gpu(model, ParallelSpec(tp=2, pp=4, stage_layers=split, microbatches=8))
            for split in (light_first, light_last)]
    middle = counting.comm_payloads(model, ParallelSpec(tp=2, pp=4, microbatches=8), 1)  # 6 layers, no end
    per_layer = counting.wire_bytes_by_key(middle)["tp_all_reduce"] / 6
    ends = counting.tp_end_collectives(model, ParallelSpec(tp=2, pp=4, microbatches=8).resolved())
    end = {key: 8 * sum(counting.ring_wire_bytes(op, n, 2) for op, n in rows) for key, rows in ends.items()}
    head = end["head_forward"] + end["head_backward"]
    assert wire[0]["tp_all_reduce"] == pytest.approx(7 * per_layer + head)
    assert wire[1]["tp_all_reduce"] == pytest.approx(7 * per_layer + end["embed_forward"])
    moe = get_model("deepseek-v3")  # three dense layers first: the first rank's one layer has no experts
    spec = ParallelSpec(dp=128, pp=16, ep=64, stage_layers=(1,) + (4,) * 15, microbatches=16)
    assert counting.wire_bytes_by_key(counting.comm_payloads(moe, spec, 0))["ep_all_to_all"] == 0
    assert counting.comm_bytes_per_gpu(moe, spec)["ep_all_to_all"] > 0



@pytest.mark.parametrize("schedule, embed_rank, head_rank", [("1f1b", 0, 3), ("zbv", 0, 0)])
def test_tensor_parallel_ends_are_counted_on_the_ranks_that_hold_them(schedule, embed_rank, head_rank):
    """The embedding's collectives on the first stage's rank, the output layer's and the loss's on the
    last's (rank 0 in a V), none on a middle rank; with sequence parallelism each rank also sums the
    gradients of the replicated parameters it holds, once a step."""
    model = get_model("gpt3-1.3b")
    p = ParallelSpec(tp=8, pp=4, dp=1, schedule=schedule, global_batch=8, sequence_parallel=True).resolved()
    act, tokens = p.micro_batch * model.seq * model.hidden * model.dtype_bytes, p.micro_batch * model.seq
    embed = [("all_gather", act), ("reduce_scatter", act)]
    loss = [("all_reduce", 4 * tokens)] * 3  # three fp32 numbers a token
    head = [("all_gather", act), ("all_gather", act), ("reduce_scatter", act)] + loss

    def end_rows(rank):  # once a microbatch: the layers' collectives come 2 x 2 x 6 layers a microbatch
        rows = counting.comm_payloads(model, p, rank)
        return sorted((op, payload) for family, op, payload, _, count in rows
                      if family == "tp" and count == p.microbatches)

    for rank in range(p.pp):
        expected = (embed if rank == embed_rank else []) + (head if rank == head_rank else [])
        assert end_rows(rank) == sorted(expected), rank
    once = [row for row in counting.comm_payloads(model, p, 1) if row[0] == "tp" and row[4] == 1]
    replicated = counting.rank_layers(model, p, 1) * counting.replicated_layer_params(model)
    assert once == [("tp", "all_reduce", replicated * counting.bytes_per_param(model, p)[1], 8, 1)]


@pytest.mark.parametrize("schedule, pp, v, per_microbatch", [
    ("1f1b", 2, 1, [1, 1]), ("1f1b", 4, 1, [1, 2, 2, 1]), ("interleaved", 2, 2, [3, 3]),
    ("dualpipev", 4, 2, [2, 4, 4, 2])])
def test_each_pipeline_rank_counts_the_sends_it_makes(schedule, pp, v, per_microbatch):
    """A rank sends where its chunks' neighbours sit: the ends of a 1F1B pipeline one way, interleaved's
    ranks wrapping round, the V's ends only inward (every rank had been counted a middle rank's 2v)."""
    model = get_model("gpt3-1.3b")
    p = ParallelSpec(pp=pp, virtual_stages=v, schedule=schedule, microbatches=8, global_batch=8).resolved()
    sends = [[count for family, _, _, _, count in counting.comm_payloads(model, p, rank) if family == "pp"]
             for rank in range(pp)]
    assert sends == [[8 * n] for n in per_microbatch]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("schedule, pp, v", [("1f1b", 1, 1), ("1f1b", 4, 1), ("interleaved", 4, 2),
                                             ("zbv", 4, 2)])
def test_each_chunk_grades_its_own_parameters_and_a_tied_embedding_comes_with_the_head(schedule, pp, v, tied):
    """A rank's chunks grade, between them, every parameter it holds, each in its own backward, and
    the first block (with the embeddings on the first stage) last. A tied embedding held beside the
    head (no pipeline, or the V's first rank holding both ends) is graded by the head's chunk, its
    first stage's last grades then the positions alone."""
    model = get_model("gpt3-1.3b").replace(tied_embeddings=tied)
    p = ParallelSpec(pp=pp, virtual_stages=v, schedule=schedule, microbatches=8).resolved()
    block = counting._params_of(model, p, 1, 0, False, False)
    counts = counting.parameter_counts(model)
    for rank in range(pp):
        chunks = counting.graded_chunks(model, p, rank)
        held = [s for s in range(p.chunks) if counting.stage_rank(p, s) == rank]
        assert [stage for stage, *_ in chunks] == held
        assert sum(n for _, n, _, _ in chunks) == pytest.approx(counting.stage_params(model, p, rank))
        for stage, params, last, by_input_pass in chunks:
            # Bi: the norms, and the embeddings and final norm on the ends; never more than the chunk
            ends = (stage == 0) * (counts["positions"] + (0 if tied and rank == counting.last_stage_rank(p)
                                                           else counts["embedding"]))
            ends += (stage == p.chunks - 1) * counts["final_norm"]
            layers = counting.chunk_layers(model, p)[stage]
            assert by_input_pass == layers * counting.layer_params(model)["norms"] + ends <= params
            head_here = tied and rank == counting.stage_rank(p, 0) == counting.last_stage_rank(p)
            if stage == 0:
                assert last == block + counts["positions"] + (0 if head_here else counts["embedding"])
                assert params == pytest.approx(counting.chunk_params(model, p, 0)
                                               - (counts["embedding"] if head_here and p.chunks > 1 else 0))
            else:
                assert last == block


@pytest.mark.parametrize("options", [
    dict(pp=1), dict(pp=4, schedule="1f1b"), dict(pp=2, schedule="interleaved", virtual_stages=2),
    dict(pp=2, schedule="zbv"), dict(pp=1, fsdp_root=True)])
def test_a_ranks_zero_units_are_its_parts_in_forward_order(options):
    """The parts a rank gathers one by one, in forward order: as many as it holds, the largest the one
    it holds whole at once, the embedding first on the first stage and the last part last on the
    last (FSDP's root keeps both ends apart)."""
    model = get_model("gpt3-1.3b")
    p = ParallelSpec(dp=8, zero=3, microbatches=8, **options).resolved()
    for rank in range(p.pp):
        parts = counting.rank_zero_units(model, p, rank)
        assert len(parts) == counting.zero_unit_count(model, p, rank)
        assert max(parts) == counting.largest_zero_unit(model, p, rank)
    embed, head, block, _ = counting._part_sizes(model, p)
    first = counting.rank_zero_units(model, p, 0)
    last = counting.rank_zero_units(model, p, counting.last_stage_rank(p))
    if p.fsdp_root:
        assert set(first) == {block}
    else:
        assert first[0] == embed and last[-1] == head


def test_the_ends_are_held_only_with_the_last_stages_microbatches():
    """The V's first rank holds the first stage and the last: microbatches in flight on the first
    stage alone keep no loss and no head inputs, one on the last stage keeps them."""
    model = get_model("gpt3-1.3b")
    p = ParallelSpec(pp=4, schedule="zbv", microbatches=8).resolved()
    assert counting.last_stage_rank(p) == 0
    first_only, last_only = (counting.activation_bytes_per_gpu(model, p, 0, held)
                             for held in ((1, 0), (0, 1)))
    logits = model.seq * p.micro_batch * model.vocab
    assert last_only - first_only >= counting.loss_bytes_per_logit(model, p.tp) * logits
