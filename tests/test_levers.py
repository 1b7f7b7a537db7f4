"""The training levers on every strategy: mixed precision, activation recomputation and gradient
accumulation, each against the run that does without it."""

from __future__ import annotations

import json

import pytest
import torch

import paralab
from paralab import ConfigError
from paralab.config import FP16_LOSS_SCALE
from paralab.models.gpt import GPT
from paralab.runtime import launch as launch_module
from tests.conftest import assert_close_rel, assert_same_params

MODEL = dict(layers=4, hidden=64, heads=4, vocab=128, seq_len=32)
BATCH = 8
# every strategy, at the smallest world that exercises it, with what its shape needs
STRATEGIES = {
    "dp": (2, {}), "ddp": (2, {}), "tp": (2, {}), "mp": (2, {}), "pp": (2, dict(microbatches=2)),
    "zero1": (2, {}), "zero2": (2, dict(bucket_mb=0.05)), "zero3": (2, {}),
    "hybrid": (4, dict(tp=2, pp=2, microbatches=2)),
    "torch_ddp": (2, {}), "torch_fsdp": (2, {}), "torch_tp": (2, {}), "torch_pp": (2, dict(microbatches=2)),
    "cp": (2, {}),
    # a mixture of experts, dropless, without the balancing loss (a nonlinear function of the batch's
    # routing, which accumulation would split)
    "ep": (2, dict(model={**MODEL, "experts": 4, "top_k": 2, "aux_loss": 0.0})),
}
STATELESS = ("torch_tp", "torch_hybrid")  # DTensor names differ from GPT's: losses only


def run(strategy, steps=2, **options):
    world, shape = STRATEGIES[strategy] if strategy in STRATEGIES else (1, {})
    return paralab.run(strategy, world, steps=steps, global_batch=BATCH,
                       **{"model": MODEL, **shape, **options})


# ------------------------------------------------------------------------------------- precision
@pytest.fixture(scope="module")
def single():
    """The single-device losses of a strategy's model in a dtype, run once each."""
    cache: dict = {}

    def losses(strategy: str, dtype: str) -> list[float]:
        model = STRATEGIES[strategy][1].get("model", MODEL)
        key = (repr(model), dtype)
        if key not in cache:
            cache[key] = run("single", steps=8, dtype=dtype, model=model).losses
        return cache[key]

    return losses


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_low_precision_matches_single_device_in_that_dtype_and_tracks_fp32(strategy, dtype, single,
                                                                           no_leftover_ranks):
    """Same-dtype single device within the dtype's tolerance (different reduction orders round
    differently); fp32 within 1% over 8 steps (the model learns the same thing)."""
    if strategy == "torch_fsdp" and dtype == "fp16":
        pytest.skip("torch_fsdp refuses fp16 (tested below)")
    options = {}
    if strategy == "torch_pp" and dtype == "fp16":
        # torch's pipelining averages microbatch gradients after backward, so its fp16 gradients are m x
        # paralab's: at the same first loss scale step 3 overflows and is skipped, as it should be. A
        # scale m times smaller puts the same numbers in fp16 as the other strategies do.
        options["loss_scale"] = FP16_LOSS_SCALE / STRATEGIES["torch_pp"][1]["microbatches"]
    result = run(strategy, steps=8, dtype=dtype, **options)
    assert result.summary["skipped_steps"] == []
    tolerance = {"bf16": 1e-2, "fp16": 2e-3}[dtype]
    assert_close_rel(result.losses, single(strategy, dtype), rel=tolerance,
                     what=f"{strategy} {dtype} vs single {dtype}")
    assert_close_rel(result.losses, single(strategy, "fp32"), rel=1e-2, what=f"{strategy} {dtype} vs fp32")
    assert result.summary["dtype"] == dtype


def test_mixed_precision_keeps_fp32_master_weights_and_16_bit_parameters():
    """Model states per parameter: 2 (weights) + 2 (gradients) + 12 (fp32 master, momentum, variance)."""
    result = run("single", steps=1, dtype="bf16")
    final = result.rank_results[0]["memory"]["final"]
    params = paralab.ModelConfig(**MODEL).param_count()
    assert final["params"] == 2 * params and final["optimizer"] == 12 * params


def test_an_fp16_overflow_skips_the_step_lowers_the_scale_and_is_reported(no_leftover_ranks):
    """A loss scale of 2^40 overflows fp16 gradients: every step is skipped (the weights stay the
    initial ones) and the scale halves each time; the trace marks each overflow."""
    result = run("dp", steps=3, dtype="fp16", loss_scale=2.0**40, optimizer="sgd", lr=0.1, collect_state=True)
    assert result.summary["skipped_steps"] == [0, 1, 2]
    assert result.summary["loss_scale"] == 2.0**37
    marks = [s for s in result.trace.spans if s.kind == "overflow"]
    assert len(marks) == 3 * 2 and "loss scale" in marks[0].name
    initial = GPT(paralab.ModelConfig(**MODEL), seed=0).to(torch.float16)
    for name, param in initial.named_parameters():
        assert torch.equal(result.params[name], param.detach()), (
            f"{name} changed though every step overflowed")


def test_after_overflows_training_resumes_at_the_lowered_scale_as_on_one_device(no_leftover_ranks):
    """2^20 overflows the first two steps' fp16 gradients; at 2^18 the others train, and data parallel
    skips the same steps and then trains the same weights as one device."""
    runs = [run(s, steps=6, dtype="fp16", loss_scale=2.0**20, optimizer="sgd", lr=0.1, collect_state=True)
            for s in ("single", "dp")]
    for result in runs:
        assert result.summary["skipped_steps"] == [0, 1] and result.summary["loss_scale"] == 2.0**18
    single, dp = runs
    assert_close_rel(dp.losses, single.losses, rel=2e-3, what="dp fp16 after overflows vs single")
    assert_same_params(dp.params, single.params, rel=2e-3, atol=1e-4)
    initial = GPT(paralab.ModelConfig(**MODEL), seed=0).to(torch.float16)
    assert not torch.equal(dp.params["head.lm.weight"], initial.head.lm.weight.detach()), "nothing trained"


# ------------------------------------------------------------------------------------- recomputation
@pytest.fixture(scope="module")
def plain():
    """Every strategy with SGD, no recomputation, one batch per step: the reference of the levers."""
    return {s: run(s, optimizer="sgd", lr=0.05, collect_state=s not in STATELESS) for s in STRATEGIES}


@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_recomputation_changes_nothing_but_memory_and_time(strategy, mode, plain, no_leftover_ranks):
    result = run(strategy, optimizer="sgd", lr=0.05, collect_state=strategy not in STATELESS, recompute=mode)
    reference = plain[strategy]
    assert_close_rel(result.losses, reference.losses, rel=1e-6, what=f"{strategy} recompute={mode}")
    if strategy not in STATELESS:
        assert_same_params(result.params, reference.params, atol=1e-6)
        assert_same_params(result.grads, reference.grads, atol=1e-6)
    recomputed = [s for s in result.trace.spans if s.kind == "recompute"]
    assert recomputed, "the second forward of each recomputed block is a span of its own"
    layers_per_rank = MODEL["layers"] // (result.summary["pp"] or 1)
    per_step = len([s for s in recomputed if s.rank == 0 and s.step == 0])
    assert per_step == layers_per_rank * result.summary["accumulate"], per_step


@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("strategy", ["tp", "hybrid"])
def test_recomputation_drops_the_elements_the_forward_dropped(strategy, mode, no_leftover_ranks):
    """With dropout, under tensor and sequence parallelism (each rank's heads and sequence slice drop
    from its own stream), and in a 1F1B pipeline whose forwards draw between a microbatch's forward
    and its recomputation: the same weights and gradients as the run that keeps every activation."""
    common = dict(optimizer="sgd", lr=0.05, collect_state=True, sequence_parallel=True,
                  model={**MODEL, "dropout": 0.2})
    if strategy == "hybrid":
        common.update(microbatches=4, schedule="1f1b")
    kept, recomputed = run(strategy, **common), run(strategy, recompute=mode, **common)
    assert_close_rel(recomputed.losses, kept.losses, rel=1e-6, what=f"{strategy} dropout recompute={mode}")
    assert_same_params(recomputed.params, kept.params, atol=1e-6)
    assert_same_params(recomputed.grads, kept.grads, atol=1e-6)


# ------------------------------------------------------------------------------------- accumulation
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_k_microbatches_of_b_equal_one_batch_of_k_times_b(strategy, plain, no_leftover_ranks):
    k = 2 if strategy in ("pp", "hybrid", "torch_pp") else 4  # pipelines: 4 microbatches against 2
    if strategy == "mp":
        pytest.skip("mp is the naive schedule over one batch (it refuses microbatches; "
                    "tested in test_pipeline)")
    result = run(strategy, optimizer="sgd", lr=0.05, collect_state=strategy not in STATELESS,
                 microbatches=k * (2 if strategy in ("pp", "hybrid", "torch_pp") else 1))
    reference = plain[strategy]
    assert_close_rel(result.losses, reference.losses, rel=1e-5, what=f"{strategy} accumulate")
    if strategy not in STATELESS:
        assert_same_params(result.params, reference.params, atol=1e-6)


def _bytes_per_step(result, kind):
    return result.summary["comm_bytes"].get(kind, 0)


def test_ddp_reduces_once_per_step_whatever_the_accumulation(plain, no_leftover_ranks):
    accumulated = run("ddp", optimizer="sgd", lr=0.05, microbatches=4)
    assert _bytes_per_step(accumulated, "all_reduce") == _bytes_per_step(plain["ddp"], "all_reduce") > 0


def test_zero_traffic_under_accumulation_follows_the_paper(plain, no_leftover_ranks):
    """With m microbatches per step (psi = the model's gradient or parameter bytes): ZeRO-1 reduces
    once (2 psi), ZeRO-2 reduce-scatters every microbatch ((m + 1) psi), ZeRO-3 gathers twice and
    reduce-scatters every microbatch (3 m psi)."""
    m = 4
    for strategy, scatter, gather in (("zero1", 1, 1), ("zero2", m, 1), ("zero3", m, m)):
        accumulated = run(strategy, optimizer="sgd", lr=0.05, microbatches=m)
        one = plain[strategy]
        assert (_bytes_per_step(accumulated, "reduce_scatter")
                == scatter * _bytes_per_step(one, "reduce_scatter"))
        assert _bytes_per_step(accumulated, "all_gather") == gather * _bytes_per_step(one, "all_gather")


# ------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("options, message", [
    (dict(strategy="pp", world_size=2, schedule="zb-h1", microbatches=2, recompute="full"),
     r"zb-h1 splits.*full recomputation with naive, gpipe, 1f1b, interleaved$"),  # naive had been left out
    (dict(strategy="torch_fsdp", world_size=2, dtype="fp16"), r"torch_fsdp runs bf16"),
    (dict(strategy="ddp", world_size=2, microbatches=3),
     r"does not split into dp=2 replicas x 3 microbatches"),
    (dict(strategy="ddp", world_size=2, dtype="fp8"), r"dtype must be one of"),
    (dict(strategy="ddp", world_size=2, recompute="half"), r"recompute must be one of"),
    # "" is "not asked for" only where a field says so (cp_mode, cp_split): an empty dtype had passed
    (dict(strategy="ddp", world_size=2, dtype=""), r"dtype must be one of"),
    (dict(strategy="ddp", world_size=2, recompute=""), r"recompute must be one of"),
    (dict(strategy="ddp", world_size=2, model=dict(attention="flash"), global_batch=8),
     r"attention must be one of"),
])
def test_levers_a_run_cannot_honour_are_refused_before_any_process(monkeypatch, options, message):
    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=message):
        paralab.run(**{"global_batch": BATCH, **options})


def test_a_dtype_this_machine_cannot_train_in_is_refused_before_any_process(monkeypatch):
    from paralab import precision

    monkeypatch.setattr(launch_module, "_context", lambda: pytest.fail("a process was about to start"))
    monkeypatch.setattr(precision, "dtype_supported", lambda name, device: name == "fp32")
    with pytest.raises(ConfigError, match=r"dtype='bf16' does not train on cpu"):
        paralab.run("ddp", 2, dtype="bf16")


def test_elastic_training_stays_fp32():
    from paralab.elastic.config import ElasticConfig

    with pytest.raises(ConfigError, match="elastic training runs fp32"):
        ElasticConfig.build("tiny", dtype="bf16").validate()


def test_the_levers_are_flags_and_keys_of_the_run_json(capsys, no_leftover_ranks):
    from paralab import cli

    code = cli.main(["run", "--strategy", "ddp", "--world-size", "2", "--steps", "2", "--dtype", "bf16",
                     "--recompute", "selective", "--accumulate", "2", "--attention", "math", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert {k: summary[k] for k in ("dtype", "reduce_dtype", "recompute", "accumulate", "attention")} == \
        {"dtype": "bf16", "reduce_dtype": "fp32", "recompute": "selective", "accumulate": 2,
         "attention": "math"}
