"""The simulator's specs refuse what cannot describe a run, with one line naming it, before the cost
model starts (exit 2 from the CLI, never a traceback), and take what a caller naturally writes."""

import dataclasses

import pytest

from paralab.cli import main
from paralab.sim import cost
from paralab.sim.hardware import PRESETS
from paralab.sim.presets import get_model
from paralab.sim.specs import ModelSpec, ParallelSpec, SpecError

H100 = PRESETS["h100"]


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "interleaved"])
def test_a_schedule_of_several_chunks_per_rank_needs_a_pipeline(schedule, capsys):
    """pp 1 has no ranks to lay chunks over: the V-shaped schedules crashed in the cost model, and
    interleaved was silently run as one stage."""
    model, p = get_model("llama3-8b"), ParallelSpec(dp=8, global_batch=64, schedule=schedule)
    assert p.problems(model) == [f"schedule {schedule} spreads model chunks over the ranks of a pipeline: "
                                 "it needs pp >= 2, got pp 1"]
    with pytest.raises(SpecError, match="needs pp >= 2"):
        cost.predict(model, p, H100)
    assert main(["simulate", "--model", "llama3-8b", "--gpus", "8", "--schedule", schedule]) == 2
    assert f"--schedule {schedule} has no effect without a pipeline (pp 1)" in capsys.readouterr().err


def test_a_one_chunk_schedule_without_a_pipeline_is_the_one_stage_whatever_its_name():
    model = get_model("llama3-8b")
    step = {s: cost.predict(model, ParallelSpec(dp=8, global_batch=64, zero=3, schedule=s), H100).step_time_s
            for s in ("naive", "gpipe", "1f1b", "zb-h1")}
    assert step == pytest.approx(dict.fromkeys(step, step["1f1b"]))


def test_fp8_gemms_are_refused_beside_an_fp32_model(capsys):
    """FP8 recipes keep 16-bit activations and weights; with fp32 the MFU was 231% (fp8 GEMMs over
    the fp32 peak)."""
    model = get_model("llama3-8b")
    assert not model.replace(fp8=True).problems()
    assert model.replace(fp8=True, dtype="fp32").problems() == [
        "fp8 GEMMs train beside 16-bit activations and weights (Transformer Engine, torchao float8), not "
        "fp32: give dtype bf16 or fp16"]
    argv = ["simulate", "--model", "llama3-8b", "--gpus", "8", "--hardware", "h100", "--fp8", "--dtype"]
    assert main([*argv, "fp32"]) == 2 and "not fp32" in capsys.readouterr().err


def test_a_stage_split_may_be_given_as_a_list():
    """The cost model's caches key on the spec, which a list field left unhashable (TypeError)."""
    model = get_model("llama3-8b")
    listed, tupled = ParallelSpec(pp=2, stage_layers=[16, 16]), ParallelSpec(pp=2, stage_layers=(16, 16))
    assert listed == tupled and hash(listed) == hash(tupled) and listed.stage_layers == (16, 16)
    assert cost.predict(model, listed, H100).step_time_s == cost.predict(model, tupled, H100).step_time_s


@pytest.mark.parametrize("split", [16, "16,16"])
def test_a_stage_split_that_is_no_list_is_a_spec_error(split):
    """A number had raised TypeError from list(); a string had been read a character a stage."""
    with pytest.raises(SpecError, match="stage_layers must be a list of layer counts, one per stage"):
        cost.predict(get_model("llama3-8b"), ParallelSpec(pp=2, stage_layers=split), H100)


def test_a_replaced_spec_is_the_one_dataclasses_would_build():
    """Specs replace their fields without dataclasses.replace's cost: the same spec, its derived fields
    derived again (a list split made a tuple, a model's MLP width from a new hidden size), its hash
    worked out anew, and a field a spec lacks refused."""
    p = ParallelSpec(pp=2, microbatches=4)
    hash(p)  # kept on the spec: a copy must not carry it to different fields
    split = p.replace(stage_layers=[10, 22], dp=2)
    assert split == dataclasses.replace(p, stage_layers=(10, 22), dp=2) and split.stage_layers == (10, 22)
    assert hash(split) == hash(ParallelSpec(dp=2, pp=2, microbatches=4, stage_layers=(10, 22))) != hash(p)
    model = get_model("gpt3-175b")
    wider = model.replace(hidden=16384, ffn=0)
    assert wider == dataclasses.replace(model, hidden=16384, ffn=0) and wider.ffn == 4 * 16384
    assert model.replace(hidden=16384).ffn == model.ffn  # given, kept (the CLI derives it afresh)
    with pytest.raises(TypeError, match="no field tensor_parallel"):
        p.replace(tensor_parallel=2)


GPT, MIXTRAL = get_model("gpt3-1.3b"), get_model("mixtral-8x7b")


@pytest.mark.parametrize(("model", "parallel", "message"), [
    (GPT, dict(dp=0, global_batch=8), "dp must be >= 1, got 0"),  # had divided by zero resolving it
    (MIXTRAL, dict(dp=8, ep=0), "ep must be >= 1, got 0"),
    (GPT, dict(dp=2, global_batch=-4), "global_batch must be >= 0 (0: what the others leave), got -4"),
    (GPT, dict(dp=2, grad_copy_bytes=float("nan")), "parallel grad_copy_bytes must be a finite number"),
    (GPT, dict(dp=2, grad_copy_bytes=float("inf")), "parallel grad_copy_bytes must be a finite number"),
    (GPT, dict(dp=2, micro_batch=1.5, microbatches=2),
     "parallel micro_batch must be a whole number, got 1.5"),
    (GPT, dict(dp=2, sequence_parallel="no"), "parallel sequence_parallel must be true or false"),
    (GPT.replace(layers=24.5), dict(dp=2), "model layers must be a whole number, got 24.5"),
    (GPT.replace(mask_bytes=-4), dict(dp=2), "model mask_bytes must be >= 0, got -4"),  # had sped the step up
    (MIXTRAL.replace(shared_experts=-1), dict(dp=8, ep=8), "model shared_experts must be >= 0, got -1"),
    (MIXTRAL.replace(capacity_factor=float("nan")), dict(dp=8, ep=8),
     "model capacity_factor must be a finite number, got nan"),  # had been read as dropless
])
def test_values_of_the_wrong_kind_or_sign_are_named_before_anything_computes_with_them(model, parallel,
                                                                                       message):
    """A degree of 0 had raised ZeroDivisionError, half a layer a TypeError; a negative mask had made the
    step faster, a fractional micro-batch a batch of 6.0 sequences, an infinite copy an infinite step."""
    with pytest.raises(SpecError) as refused:
        cost.predict(model, ParallelSpec(**parallel), H100)
    assert str(refused.value).startswith(message)


def test_a_hidden_size_of_the_wrong_kind_is_said_once_as_given():
    """Its ffn, derived from it, had been refused too, as "got '8888'"."""
    with pytest.raises(SpecError) as refused:
        cost.predict(ModelSpec(layers=2, hidden="8", heads=2, vocab=16, seq=8), ParallelSpec(), H100)
    assert str(refused.value) == "model hidden must be a finite number, got '8'"


@pytest.mark.parametrize("seq, tp, cp, message", [
    (8191, 2, 1, "sequence parallelism splits each sequence over tp: tp 2 does not divide its 8191 tokens"),
    (32772, 8, 2, "sequence parallelism splits each sequence (each cp slice) over tp: tp 8 x cp 2 = 16 does "
                  "not divide its 32772 tokens"),
])
def test_sequence_parallelism_needs_tp_to_divide_each_slice_of_the_sequence(seq, tp, cp, message, capsys):
    """It splits the sequence (each cp slice of it) over the tp ranks: 8,191 tokens over tp 2 had been
    priced as 4,095.5 a rank, exit 0."""
    model = get_model("llama3-8b").replace(seq=seq)
    p = ParallelSpec(dp=4, tp=tp, cp=cp, global_batch=4, sequence_parallel=True)
    assert message in p.problems(model)
    assert not p.replace(sequence_parallel=False).problems(model)
    assert main(["simulate", "--model", "llama3-8b", "--seq", str(seq), "--gpus", str(4 * tp * cp), "--tp",
                 str(tp), "--cp", str(cp), "--sequence-parallel", "--global-batch", "4"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
