"""ZeRO stages 1-3 against single-device training, against torch's FSDP2, and against the paper's
memory and communication accounting.

Every run is launched once (module fixture) and checked by several tests, so the file stays short on
two cores. SGD runs check final parameters, Adam runs check losses (see tests/test_data_parallel.py
for why), memory (fp32 Adam is the accounting the paper's formulas assume) and traced bytes.
"""

import dataclasses

import pytest

import paralab
from paralab import ConfigError, RunConfig
from paralab.layout import resolve_layout
from tests.conftest import assert_close_rel, assert_same_params

STEPS, BATCH = 3, 8
STAGES = ("zero1", "zero2", "zero3")
SIZES = (2, 4)
LR = {"adam": 3e-3, "sgd": 0.05}
BUCKET_MB = 0.2  # several zero2 buckets on the tiny model


def launch(strategy, world_size, optimizer, **extra):
    return paralab.run(strategy, world_size, steps=STEPS, global_batch=BATCH, optimizer=optimizer,
                       lr=LR[optimizer], bucket_mb=BUCKET_MB, collect_state=True, **extra)


@pytest.fixture(scope="module")
def runs():
    out = {("single", 1, opt): launch("single", 1, opt) for opt in LR}
    for n in SIZES:
        for stage in STAGES:
            for opt in LR:
                out[(stage, n, opt)] = launch(stage, n, opt)
    out[("torch_fsdp", 2, "adam")] = launch("torch_fsdp", 2, "adam")
    for opt in LR:
        out[("zero3 prefetch", 2, opt)] = launch("zero3", 2, opt, zero_prefetch=True)
    return out


@pytest.mark.parametrize("world_size", SIZES)
@pytest.mark.parametrize("stage", STAGES)
def test_same_losses_and_parameters_as_single_device(runs, stage, world_size, no_leftover_ranks):
    for opt in LR:
        run, reference = runs[(stage, world_size, opt)], runs[("single", 1, opt)]
        assert_close_rel(run.losses, reference.losses, what=f"{stage} x{world_size} {opt} losses")
    sgd, reference = runs[(stage, world_size, "sgd")], runs[("single", 1, "sgd")]
    assert_same_params(sgd.params, reference.params)
    assert_same_params(sgd.grads, reference.grads, atol=1e-7)


# a dropless mixture of experts without the balancing loss (a nonlinear function of the whole batch's
# routing, which each replica would compute over its own slice)
MOE = {**dataclasses.asdict(paralab.MODEL_PRESETS["tiny-moe"]), "aux_loss": 0.0}


@pytest.fixture(scope="module")
def moe_single():
    return launch("single", 1, "sgd", model=MOE)


@pytest.mark.parametrize("stage", STAGES)
def test_a_mixture_of_experts_sharded_by_zero_trains_as_on_one_device(moe_single, stage, no_leftover_ranks):
    """Experts are parameters like any other to ZeRO: sharded, reduced and gathered, their weights and
    gradients end as one device's (MoE had run only under dp and ep)."""
    run = launch(stage, 2, "sgd", model=MOE)
    assert run.config.model.experts == 4
    assert_close_rel(run.losses, moe_single.losses, what=f"{stage} MoE losses")
    assert_same_params(run.params, moe_single.params)
    assert_same_params(run.grads, moe_single.grads, atol=1e-7)


def test_zero3_matches_torch_fsdp2(runs, no_leftover_ranks):
    ours, torchs = runs[("zero3", 2, "adam")], runs[("torch_fsdp", 2, "adam")]
    assert_close_rel(ours.losses, torchs.losses, what="zero3 vs FSDP2 losses")
    assert_same_params(ours.grads, torchs.grads, atol=1e-7)


@pytest.mark.parametrize("world_size", SIZES)
def test_model_state_bytes_follow_the_paper(runs, world_size, no_leftover_ranks):
    """Stage 1: 4P + 4P + 8P/Nd; stage 2: 4P + (4P + 8P)/Nd; stage 3: 16P/Nd, from the tensors held
    at the end of the run. Padding each unit to a multiple of Nd adds under Nd elements per unit."""
    n = world_size
    P = paralab.MODEL_PRESETS["tiny"].param_count()
    expected = {
        "zero1": {"params": 4 * P, "grads": 4 * P, "optimizer": 8 * P / n},
        "zero2": {"params": 4 * P, "grads": 4 * P / n, "optimizer": 8 * P / n},
        "zero3": {"params": 4 * P / n, "grads": 4 * P / n, "optimizer": 8 * P / n},
    }
    for stage in STAGES:
        for rank_result in runs[(stage, n, "adam")].rank_results:
            zero = rank_result["zero"]
            assert zero["param_count"] == P
            slack = 8 * n * len(zero["units"])  # bytes: padding of every unit, 8 bytes per Adam element
            for kind, bytes_ in expected[stage].items():
                measured = rank_result["memory"]["final"][kind]
                assert abs(measured - bytes_) <= slack, (
                    f"{stage} x{n} rank {rank_result['rank']} {kind}: {measured} vs {bytes_:.0f}")


def test_zero3_notes_the_parts_it_gathers(runs, no_leftover_ranks):
    """The resident shard is 4P/Nd, but while a part is gathered its full parameters are held too:
    the memory counters in the trace must show it."""
    run = runs[("zero3", 4, "adam")]
    for rank_result in run.rank_results:
        rank = rank_result["rank"]
        resident = rank_result["memory"]["final"]["params"]
        peak = max(c.value for c in run.trace.counters if c.rank == rank and c.name == "memory.params")
        assert peak > resident
        assert run.summary["memory_by_kind"][rank]["params"] >= resident


@pytest.mark.parametrize("world_size", SIZES)
def test_communication_per_rank_follows_the_paper(runs, world_size, no_leftover_ranks):
    """Wire bytes per rank per step (ring accounting, paralab.comm): DDP's all-reduce moves
    2 (n-1)/n x 4P (tests/test_data_parallel.py checks ddp's traced bytes against it); zero1 and zero2
    the same as a reduce-scatter plus an all-gather; zero3 1.5x that (parameters all-gathered twice).
    Padding and integer rounding allow a few bytes per call."""
    n = world_size
    P = paralab.MODEL_PRESETS["tiny"].param_count()
    ddp_bytes = 2 * (n - 1) / n * 4 * P
    factor = {"zero1": 1.0, "zero2": 1.0, "zero3": 1.5}
    for strategy, f in factor.items():
        run = runs[(strategy, n, "adam")]
        for rank in range(n):
            spans = run.trace.select(lane="comm", rank=rank)
            per_step = sum(s.bytes for s in spans) / STEPS
            calls = len(spans) / STEPS
            tolerance = 4 * n * calls
            assert abs(per_step - f * ddp_bytes) <= tolerance, (
                f"{strategy} x{n} rank {rank}: {per_step} vs {f * ddp_bytes}")
    kinds = {s.kind for s in runs[("zero3", n, "adam")].trace.select(lane="comm")}
    assert kinds == {"all_gather", "reduce_scatter"}


def test_zero2_reduce_scatters_during_backward(runs, no_leftover_ranks):
    trace = runs[("zero2", 2, "adam")].trace
    for rank in (0, 1):
        for step in range(STEPS):
            backward = [s for s in trace.select(kind="backward", rank=rank) if s.step == step][0]
            scatters = [s for s in trace.select(kind="reduce_scatter", rank=rank) if s.step == step]
            assert len(scatters) > 1, "a small bucket cap must give several buckets"
            assert min(s.start for s in scatters) < backward.end, "no reduce-scatter started during backward"


@pytest.mark.parametrize("strategy", [*STAGES, "torch_fsdp"])
@pytest.mark.parametrize("option, value, advice",
                         [("pp", 2, "hybrid"), ("tp", 2, "hybrid"), ("dp", 1, "hybrid")])
def test_refuses_what_it_cannot_do_before_starting(strategy, option, value, advice):
    cfg = RunConfig.build("tiny", strategy=strategy, world_size=2, global_batch=8, **{option: value})
    with pytest.raises(ConfigError, match=f"{option}={value}.*{advice}"):
        resolve_layout(cfg)


def test_zero3_prefetch_trains_as_one_device_with_the_same_bytes(runs, no_leftover_ranks):
    """Gathering ahead changes when the parameters arrive, not what they are or how many bytes move."""
    for opt in LR:
        ahead, reference = runs[("zero3 prefetch", 2, opt)], runs[("single", 1, opt)]
        assert_close_rel(ahead.losses, reference.losses, what=f"zero3 prefetch {opt} losses")
        assert ahead.summary["comm_bytes"] == runs[("zero3", 2, opt)].summary["comm_bytes"]
    sgd = runs[("zero3 prefetch", 2, "sgd")]
    assert_same_params(sgd.params, runs[("single", 1, "sgd")].params)
    assert_same_params(sgd.grads, runs[("single", 1, "sgd")].grads, atol=1e-7)


def _gathers(run, rank: int, step: int, phase: str) -> list:
    spans = [s for s in run.trace.select(kind="all_gather", rank=rank)
             if s.step == step and s.name.startswith(phase)]
    return sorted(spans, key=lambda s: s.start)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_zero3_prefetch_puts_the_next_gather_in_flight_before_waiting(runs, phase, no_leftover_ranks):
    """Without prefetch each part's gather is launched after the previous one was waited for (and the
    previous part has computed); with it, the next part's gather is launched before the current one is
    waited for, so it is in flight while the current part computes: consecutive gathers overlap in the
    trace. Each forward part is gathered once, each backward one once, in pass order either way."""
    parts = runs[("zero3", 2, "adam")].rank_results[0]["zero"]["units"]
    order = parts if phase == "forward" else parts[::-1]
    for prefetch, key in ((False, "zero3"), (True, "zero3 prefetch")):
        run = runs[(key, 2, "adam")]
        for rank in (0, 1):
            for step in range(STEPS):
                spans = _gathers(run, rank, step, phase)
                assert [s.name for s in spans] == [f"{phase} gather {p}" for p in order]
                overlapping = [b.start < a.end for a, b in zip(spans, spans[1:])]
                assert all(overlapping) if prefetch else not any(overlapping), (key, rank, step, overlapping)


def test_zero3_prefetch_holds_a_second_part_at_its_peak(runs, no_leftover_ranks):
    """The price of gathering ahead: two parts' full parameters at once instead of one."""
    waited, ahead = runs[("zero3", 2, "adam")], runs[("zero3 prefetch", 2, "adam")]
    for rank in (0, 1):
        assert (ahead.summary["memory_by_kind"][rank]["params"]
                > waited.summary["memory_by_kind"][rank]["params"])
        assert ahead.rank_results[rank]["memory"]["final"] == waited.rank_results[rank]["memory"]["final"]


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "hybrid"])
def test_zero_prefetch_is_a_zero3_option(strategy):
    cfg = RunConfig.build("tiny", strategy=strategy, world_size=2, global_batch=8, zero_prefetch=True)
    with pytest.raises(ConfigError, match="zero_prefetch .*zero3 option"):
        resolve_layout(cfg)


def test_fp32_parameters_reduced_in_bf16_train_as_ddp_does(no_leftover_ranks):
    """Halving the reduction's bytes (reduce_dtype bf16 under fp32 parameters): each stage's shard
    gradient comes back in fp32 for the optimizer, and the run steps the same parameters as ddp
    reducing in bf16 (the stages had kept it in bf16 beside the shard, where fp32 SGD never read it)."""
    common = dict(steps=STEPS, global_batch=BATCH, optimizer="sgd", lr=LR["sgd"], bucket_mb=BUCKET_MB,
                  collect_state=True, reduce_dtype="bf16")
    ddp = paralab.run("ddp", 2, **common)
    runs = {stage: paralab.run(stage, 2, **common) for stage in STAGES}
    runs |= {f"hybrid zero={z}": paralab.run("hybrid", 2, dp=2, zero=z, **common) for z in (1, 2)}
    for name, run in runs.items():
        assert_close_rel(run.losses, ddp.losses, what=f"{name} losses")
        assert_same_params(run.params, ddp.params, atol=1e-6)
    # and ddp reducing in bf16 trains what one device trains, within bf16's rounding, on half the bytes
    single = paralab.run("single", 1, steps=STEPS, global_batch=BATCH, optimizer="sgd", lr=LR["sgd"],
                         collect_state=True)
    assert_close_rel(ddp.losses, single.losses, rel=1e-2, what="ddp reducing in bf16 vs one device")
    assert_same_params(ddp.params, single.params, rel=1e-2, atol=1e-4)
    params = ddp.config.model.param_count()
    assert ddp.summary["comm_payload_bytes"]["all_reduce"] == 2 * 2 * params  # 2 ranks x 2 bytes each
