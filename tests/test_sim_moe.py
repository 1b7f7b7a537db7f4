"""The simulator's mixture of experts, DualPipeV and uneven stages: parameters and active parameters
against the papers, FLOPs by active parameters, expert memory and all-to-all bytes against closed
forms, the all-to-all inside and across nodes, load imbalance, ep in the planner, and uneven splits."""

from __future__ import annotations

import pytest

from paralab.config import MODEL_PRESETS, RunConfig
from paralab.sim import cost, counting, moe, planner
from paralab.sim.bridge import specs_from_run
from paralab.sim.hardware import get_hardware
from paralab.sim.presets import MODELS, get_model
from paralab.sim.specs import ModelSpec, ParallelSpec
from paralab.stage_split import balanced_split

H100 = get_hardware("h100")


# ------------------------------------------------------------------------------------------- presets
def test_mixtral_has_the_papers_total_and_active_parameters():
    """Jiang et al. 2024: 46.7B parameters, 12.9B used per token."""
    m = get_model("mixtral-8x7b")
    assert counting.parameter_counts(m)["total"] / 1e9 == pytest.approx(46.7, abs=0.05)
    assert counting.active_parameters(m) / 1e9 == pytest.approx(12.9, abs=0.05)
    assert "Jiang et al. 2024" in m.source


def test_the_passes_parts_add_up_with_expert_all_to_alls():
    """The forward and backward passes are compute, the bubble and the communication inside them:
    the all-to-alls had been counted in compute as well as on their own line."""
    pred = cost.predict(get_model("mixtral-8x7b"), ParallelSpec(dp=8, ep=8, tp=2, global_batch=16), H100)
    b = pred.breakdown_s
    assert b["ep_comm"] > 0
    assert b["pipeline"] == pytest.approx(b["compute"] + b["bubble"] + b["tp_comm"] + b["ep_comm"])


def test_deepseek_v3_like_shape_is_within_a_few_percent_of_the_report():
    """DeepSeek-V3 report: 671B parameters, 37B activated (ours models MLA as MHA, see presets)."""
    m = get_model("deepseek-v3")
    assert counting.parameter_counts(m)["total"] / 671e9 == pytest.approx(1.0, abs=0.01)
    assert counting.active_parameters(m) / 37e9 == pytest.approx(1.0, abs=0.06)
    assert (m.experts, m.top_k, m.shared_experts, m.dense_layers, m.expert_ffn) == (256, 8, 1, 3, 2048)


@pytest.mark.parametrize("name", ["tiny-moe", "small-moe"])
def test_the_lab_moe_presets_count_as_the_real_model(name):
    spec = MODELS[name]
    assert counting.parameter_counts(spec)["total"] == MODEL_PRESETS[name].param_count()
    cfg = MODEL_PRESETS[name]
    ffn = 2 * cfg.hidden * cfg.ffn + cfg.ffn + cfg.hidden
    assert (counting.active_parameters(spec)
            == cfg.param_count() - cfg.layers * (cfg.experts - cfg.top_k) * ffn)


# ------------------------------------------------------------------------------------------- counting
def test_flops_follow_active_parameters_not_all_experts():
    """Eight experts of width f/2, two per token, cost what a dense MLP of width f costs, plus the router
    (2 x h x E per token per layer, x3 for forward and backward)."""
    dense = ModelSpec(layers=4, hidden=512, heads=8, ffn=2048, vocab=1000, seq=256)
    sparse = dense.replace(experts=8, top_k=2, expert_ffn=1024)
    router = 3 * 2 * 8 * 256 * 4 * 512 * 8
    assert counting.flops_per_step(sparse, 8)["model"] == counting.flops_per_step(dense, 8)["model"] + router
    assert counting.parameter_counts(sparse)["total"] > 3 * counting.parameter_counts(dense)["layers"] / 2


def test_expert_parallel_divides_the_experts_each_gpu_holds_and_reduces_them_over_dp_over_ep():
    m = get_model("mixtral-8x7b")
    per_layer = moe.moe_mlp_params(m)["experts"]
    one = counting.stage_params(m, ParallelSpec(dp=8), 0)
    for ep in (2, 4, 8):
        assert one - counting.stage_params(m, ParallelSpec(dp=8, ep=ep), 0) == pytest.approx(
            m.layers * per_layer * (1 - 1 / ep))
    # ZeRO-1: ep = 8 holds an eighth of the experts whole, ep = 1 all of them with their Adam states over
    # 8 ranks: the same optimizer bytes, 7/8 fewer expert parameter and gradient bytes (bf16)
    zero1 = [cost.memory_per_gpu(m, ParallelSpec(dp=8, ep=ep, zero=1, micro_batch=1)) for ep in (1, 8)]
    assert zero1[0]["optimizer"] == pytest.approx(zero1[1]["optimizer"])
    assert zero1[0]["params"] - zero1[1]["params"] == pytest.approx(2 * m.layers * per_layer * 7 / 8)
    rows = {(f, op, group): payload
            for f, op, payload, group, _ in counting.comm_payloads(m, ParallelSpec(dp=8, ep=4))}
    # bf16 grads, dp/ep = 2
    assert rows[("dp", "all_reduce", 2)] == pytest.approx(m.layers * per_layer / 4 * 2)


def test_zero_3_gathers_a_blocks_experts_only_where_data_parallel_ranks_share_them():
    """ZeRO-3's prefetch holds a second part gathered, so turning it off frees the largest part: at ep 4
    of dp 8 the MoE block, its E / ep routed experts sharded over dp / ep ranks and gathered with it; at
    ep = dp, where each rank holds its experts alone and gathers none, the output layer (32,000 x 4,096,
    and the final norm), which the block without its experts is smaller than (its experts had been
    counted gathered, 0.35 GB more at Mixtral's, twice with prefetch)."""
    m = get_model("mixtral-8x7b")

    def freed_without_prefetch(ep: int) -> float:
        spec = ParallelSpec(dp=8, ep=ep, zero=3, micro_batch=1)
        both, one = (cost.memory_per_gpu(m, spec.replace(prefetch_params=prefetch))["params"]
                     for prefetch in (True, False))
        return both - one

    block = (counting.stage_params(m, ParallelSpec(ep=4), 0)  # one block's parameters on a GPU at ep 4
             - counting.stage_params(m.replace(layers=m.layers - 1), ParallelSpec(ep=4), 0))
    assert freed_without_prefetch(4) == pytest.approx(2 * block)  # bf16
    assert block - moe.moe_mlp_params(m)["experts"] / 4 < m.vocab * m.hidden  # the block without experts
    assert freed_without_prefetch(8) == pytest.approx(2 * m.vocab * m.hidden, rel=1e-4)  # the norm's 4,096


def test_without_sequence_parallel_every_tensor_parallel_rank_keeps_the_tokens_it_routes():
    """Memory follows the all-to-all: without sequence parallelism each tp rank dispatches all the
    microbatch's tokens (all_to_all_payload), so it keeps k copies of all of them at its experts."""
    m = get_model("mixtral-8x7b")
    whole = moe.extra_activation_bytes(m, 1, 1)
    sliced, unsliced = (moe.extra_activation_bytes(m, 1, 2, sp) for sp in (True, False))
    assert sliced == pytest.approx(whole / 2)
    half = m.seq / 2  # bf16, a gated MLP (3 inner tensors), 8 experts' fp32 logits
    copies_of_the_other_half = m.top_k * half * (2 * 2 * m.hidden + 3 * 2 * m.expert_ffn) + 4 * half * 8
    assert unsliced - sliced == pytest.approx(copies_of_the_other_half)
    assert moe.all_to_all_payload(m, ParallelSpec(tp=2)) == 2 * moe.all_to_all_payload(
        m, ParallelSpec(tp=2, sequence_parallel=True))


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_the_gradient_sync_is_timed_on_the_bytes_it_reports(zero):
    """The end-of-step collectives are priced on the wire bytes comm_bytes_per_gpu reports: the experts
    over dp / ep (nothing at ep = dp), not every parameter over dp. ZeRO's optimizer steps the same
    Adam bytes whatever ep (as memory_per_gpu holds them): an eighth of every expert at ep 1, every
    expert of an eighth at ep 8."""
    m, h100 = get_model("mixtral-8x7b"), get_hardware("h100")
    optimizer = set()
    for ep in (1, 2, 8):
        p = ParallelSpec(dp=8, ep=ep, zero=zero, micro_batch=1, global_batch=8).resolved()
        sync, wire = cost._grad_sync(m, p, h100, 0), counting.comm_bytes_per_gpu(m, p)
        if zero < 2:  # ZeRO-2 reduce-scatters part by part inside backward
            reduced = wire["dp_all_reduce" if zero == 0 else "zero_reduce_scatter"]
            assert sync["reduce"][2] == pytest.approx(reduced)
        assert sync["gather"][1] == pytest.approx(wire.get("zero_all_gather", 0.0))
        optimizer.add(round(sync["optimizer"], 12))
    assert len(optimizer) == 1 or zero == 0


@pytest.mark.parametrize("ep, tp, sp", [(2, 1, False), (8, 1, False), (4, 2, True)])
def test_all_to_all_bytes_are_tokens_times_k_times_hidden(ep, tp, sp):
    """Dispatch and combine, forward and backward: 4 all-to-alls per MoE layer and microbatch, each of a
    rank's b s k h bytes (its slice with sequence parallel), (ep - 1)/ep of them sent away."""
    m = get_model("mixtral-8x7b")
    p = ParallelSpec(dp=8, tp=tp, ep=ep, micro_batch=2, microbatches=3, sequence_parallel=sp)
    payload = 2 * m.seq / (tp if sp else 1) * m.top_k * m.hidden * 2
    assert (counting.comm_bytes_per_gpu(m, p)["ep_all_to_all"]
            == pytest.approx(4 * m.layers * 3 * payload * (ep - 1) / ep))


def test_an_all_to_all_that_leaves_the_node_costs_the_nic():
    payload = 64e6
    inside = cost.all_to_all_time(H100, payload, group=8, stride=1)  # 8 neighbours: one node
    across = cost.all_to_all_time(H100, payload, group=8, stride=2)  # every other rank: 4 per node
    assert inside == pytest.approx(7 * H100.intra_latency + payload * 7 / 8 / H100.intra_bw)
    assert across == pytest.approx(7 * H100.inter_latency + payload * 4 / 8 / H100.inter_bw)
    assert across > 4 * inside and cost.all_to_all_time(H100, payload, 1, 1) == 0.0


def test_load_imbalance_slows_the_step_up_to_the_capacity():
    m = get_model("mixtral-8x7b")
    p = ParallelSpec(dp=8, ep=8, micro_batch=1, microbatches=4)
    steps = [cost.predict(m, p.replace(expert_imbalance=f), H100).step_time_s for f in (1.0, 1.5, 2.0)]
    assert steps[0] < steps[1] < steps[2]
    # the hot expert's rank computes and sends imbalance x its even share: both parts grow in proportion
    # (a step that grew by the all-to-all alone had passed the line above)
    parts = [cost._moe_mlp(m, p.replace(expert_imbalance=f).resolved(), H100) for f in (1.0, 1.5, 2.0)]
    assert parts[2][1] == pytest.approx(2 * parts[0][1])
    slope = parts[1][0] - parts[0][0]
    assert slope > 0 and parts[2][0] - parts[0][0] == pytest.approx(2 * slope)
    capped = m.replace(capacity_factor=1.25)
    assert cost.predict(capped, p.replace(expert_imbalance=2.0), H100).step_time_s == pytest.approx(
        cost.predict(capped, p.replace(expert_imbalance=1.25), H100).step_time_s)
    # the busiest expert takes at most every token: E / k = 4 times the mean for 8 experts, top-2 (a
    # slip of 15 for 1.5 had priced a step many times over)
    assert p.replace(expert_imbalance=4.0).problems(m) == []
    assert "at most every token, 8 experts / top-2 = 4 times" in " ".join(
        p.replace(expert_imbalance=4.5).problems(m))


# ------------------------------------------------------------------------------------------- schedules
def test_dualpipev_hides_the_all_to_all_that_1f1b_and_zbv_wait_for():
    m = get_model("mixtral-8x7b")
    p = ParallelSpec(dp=8, tp=2, pp=4, ep=8, global_batch=256, micro_batch=1, sequence_parallel=True)
    steps = {s: cost.predict(m, p.replace(schedule=s), H100) for s in ("1f1b", "zbv", "dualpipev")}
    assert steps["dualpipev"].step_time_s < min(steps["1f1b"].step_time_s, steps["zbv"].step_time_s)
    assert (steps["dualpipev"].memory_bytes_per_gpu["activations"]
            > steps["1f1b"].memory_bytes_per_gpu["activations"])
    times = cost.stage_times(m, p.replace(schedule="dualpipev"), H100)
    f, b = times[0], times[-1]
    assert f.a2a > 0 and cost.overlap_saving(f, b) == pytest.approx(2 * f.a2a)  # both hide fully here
    # the breakdown: what the slots hide is compute's time, not the all-to-alls' (compute had read 17% low)
    dualpipev, one_f_one_b = steps["dualpipev"].breakdown_s, steps["1f1b"].breakdown_s
    assert dualpipev["compute"] == pytest.approx(one_f_one_b["compute"], rel=0.02)
    assert dualpipev["ep_comm"] < 0.5 * one_f_one_b["ep_comm"]
    traced = cost.predict_trace(m, p.replace(schedule="dualpipev"), H100).meta["prediction"]["breakdown_s"]
    assert traced["ep_comm"] == pytest.approx(dualpipev["ep_comm"])


def test_dualpipev_of_a_dense_model_has_a_smaller_bubble_than_1f1b_and_twice_the_chunks():
    m = ModelSpec(layers=16, hidden=1024, heads=16, vocab=1024, seq=512)
    p = ParallelSpec(pp=4, schedule="dualpipev", microbatches=8, micro_batch=1)
    assert p.resolved().virtual_stages == 2 and counting.last_stage_rank(p) == 0
    assert (0 < cost.predict(m, p, H100).bubble_fraction
            < cost.predict(m, p.replace(schedule="1f1b"), H100).bubble_fraction)
    assert "at least as many microbatches as stages" in "; ".join(p.replace(microbatches=6).problems(m))


def test_uneven_stages_in_the_simulator_lighter_ends_pay_for_the_loss():
    """Llama 3 8B (vocabulary 128k) on 8 stages: the last stage's output layer and loss cost more than a
    block; a split with lighter first and last stages beats the even one, and every stage's times
    follow its blocks."""
    m, hw = get_model("llama3-8b"), H100
    even = ParallelSpec(pp=8, global_batch=64, micro_batch=1)
    lighter = even.replace(stage_layers=tuple(balanced_split(32, 8, first=0.5, last=2)))
    assert cost.predict(m, lighter, hw).step_time_s < 0.95 * cost.predict(m, even, hw).step_time_s
    times = cost.stage_times(m, lighter, hw)
    per_block = times[3].forward / lighter.stage_layers[3]
    assert times[4].forward == pytest.approx(per_block * lighter.stage_layers[4])
    assert counting.stage_params(m, lighter, 1) > counting.stage_params(m, even, 1)
    assert ("must give each of the 8 stages"
            in "; ".join(even.replace(stage_layers=(4,) * 7 + (5,)).problems(m)))


def test_interleaved_with_microbatches_the_stages_do_not_divide_is_simulated():
    m = get_model("gpt3-1.3b")
    p = ParallelSpec(pp=4, virtual_stages=2, schedule="interleaved", microbatches=6, micro_batch=1)
    assert p.problems(m) == []
    interleaved = cost.predict(m, p, H100)
    assert interleaved.pipeline_pricing == "simulated"
    assert (0 < interleaved.bubble_fraction
            < cost.predict(m, p.replace(schedule="1f1b", virtual_stages=1), H100).bubble_fraction)


# ------------------------------------------------------------------------------------------- planner
def test_the_planner_shards_experts_when_they_do_not_fit_otherwise():
    m = get_model("mixtral-8x7b")
    ranked = planner.plan(m, 64, H100, 256, top=5)
    assert ranked and all(r.parallel.ep > 1 for r in ranked)
    assert "(ep " in planner.describe(ranked[0].parallel)
    assert any(s.schedule == "dualpipev" for s in planner.candidates(m, 64, H100, 256))
    dense = get_model("llama2-7b")
    assert all(s.ep == 1 for s in planner.candidates(dense, 16, H100, 64))


def test_bad_expert_splits_are_refused_with_the_numbers():
    m = get_model("mixtral-8x7b")
    assert "ep 3 must divide dp 8" in "; ".join(ParallelSpec(dp=8, ep=3).problems(m))
    assert "ep 16 does not divide the 8 experts" in "; ".join(ParallelSpec(dp=16, ep=16).problems(m))
    assert ("shards experts, but llama2-7b is dense"
            in "; ".join(ParallelSpec(dp=2, ep=2).problems(get_model("llama2-7b"))))
    assert "top_k 9 must be in 1..8" in "; ".join(m.replace(top_k=9).problems())


def test_the_bridge_carries_ep_and_stage_layers_into_the_prediction():
    model, parallel = specs_from_run(RunConfig.build("tiny-moe", strategy="hybrid", world_size=4, pp=2, ep=2,
                                                     microbatches=2, stage_layers=[1, 3]))
    assert (parallel.ep, parallel.stage_layers, model.experts, model.top_k) == (2, (1, 3), 4, 2)
    assert counting.comm_bytes_per_gpu(model, parallel)["ep_all_to_all"] > 0


def test_with_sequence_parallel_a_tensor_parallel_rank_computes_the_experts_of_its_slice():
    """Time follows the tokens a rank routes, as the all-to-all and the memory count them: with
    sequence parallelism a tp rank's experts see its slice, so the MoE step is faster than without."""
    m, h100 = get_model("mixtral-8x7b"), get_hardware("h100")
    spec = ParallelSpec(tp=2, dp=8, ep=8, micro_batch=1, global_batch=8)
    work = {sp: cost._moe_mlp(m, spec.replace(sequence_parallel=sp).resolved(), h100)[0]
            for sp in (False, True)}
    # half the rows for its experts' GEMMs, most of the layer's time: not the router's small saving alone
    # (experts sized on the sequence's tokens had still read faster, 3.208 against 3.213 ms)
    assert moe.routed_tokens(m, 1, 2, True) == moe.routed_tokens(m, 1, 2, False) / 2
    assert work[True] < 0.5 * work[False]


@pytest.mark.parametrize("capacity", [0.1, 0.5])
def test_a_capacity_below_one_counts_only_the_tokens_its_experts_compute(capacity):
    """Below 1 every expert drops tokens: the step computes capacity x the routed copies, and so do its
    FLOPs. MFU had counted every copy against the shorter step: 1.43 at a capacity of 0.1."""
    mixtral = get_model("mixtral-8x7b")
    spec = ParallelSpec(dp=8, ep=8, micro_batch=1, microbatches=1)
    dropless, capped = (cost.predict(mixtral.replace(capacity_factor=c), spec, H100) for c in (0.0, capacity))
    # forward and backward, 2 FLOPs a weight, 8 sequences, every layer's top_k experts of 3 matrices
    expert = 3 * mixtral.hidden * mixtral.expert_ffn
    routed = 3 * 2 * mixtral.seq * 8 * mixtral.layers * mixtral.top_k * expert
    dropped = dropless.model_flops_per_step - capped.model_flops_per_step
    assert dropped == pytest.approx((1 - capacity) * routed)
    assert capped.mfu <= H100.matmul_max_efficiency and capped.mfu < dropless.mfu
