"""Published training runs beyond Narayanan et al. 2021 and Korthikanti et al. 2022 (paralab.sim.published):
throughput within 20% each and 10% on average, memory where the source states it, scaling losses
within a third of the published ones. Runs the model does not reproduce are marked with the reason,
and their tests expect the miss (so an improvement asks for the docs to be updated)."""

import dataclasses
import functools
from pathlib import Path

import pytest

from paralab.sim import published
from paralab.sim.hardware import PRESETS

RUNS = published.RUNS
COVERED = [r for r in RUNS if not r.known_miss]


def error(run) -> float:
    (compared,) = published.compare([run])
    return compared.error


def ident(run) -> str:
    return f"{run.label} @{run.gpus} {run.hardware.name}"


@pytest.mark.parametrize("run", RUNS, ids=ident)
def test_each_published_run_within_20_percent(run):
    e = error(run)
    if run.known_miss:
        assert abs(e) > published.BOUND, (
            f"{ident(run)} is now within 20% ({e:+.1%}): drop its known_miss and update the docs"
        )
    else:
        assert abs(e) < published.BOUND, f"{ident(run)}: predicted {e:+.1%} against {run.source}"


def test_mean_absolute_error_within_10_percent():
    errors = [abs(error(r)) for r in COVERED]
    assert sum(errors) / len(errors) < 0.10
    assert len(COVERED) >= 10


def test_the_runs_span_what_the_issue_asks():
    assert len({r.organisation for r in RUNS}) >= 4
    assert {r.hardware.name for r in RUNS} >= {"a100", "h100"}
    params = [r.predict().params for r in RUNS]
    assert min(params) < 8e9 and max(params) > 500e9
    assert any(r.parallel.zero >= 1 for r in RUNS) and any(r.parallel.zero == 0 for r in RUNS)
    assert min(r.gpus for r in RUNS) == 8 and max(r.gpus for r in RUNS) > 10_000



def test_the_doc_prints_the_tables_as_the_model_computes_them():
    """docs/simulator.md's comparison is what ``python benchmarks/bench_sim_published.py`` prints now: a
    change to the model that moves a prediction, an error or a scaling loss asks for the doc to follow."""
    doc = (Path(__file__).parents[1] / "docs" / "simulator.md").read_text()
    compared = published.compare()
    lines = [*published.runs_table(compared), *published.mean_errors(compared),
             *published.scaling_table(compared)]
    stale = [line for line in lines if line not in doc]
    assert not stale, "docs/simulator.md lacks, as the model now computes them:\n" + "\n".join(stale)

# what a run's machine may differ in from its preset: what its source states of the machine
STATED = {
    "name",
    "inter_bw",
    "pod_gpus",
    "oversubscription",
    "memory_bytes",
    "memory_bandwidth",
    "power_limit_w",
}


@pytest.mark.parametrize("run", RUNS, ids=ident)
def test_no_constant_is_fitted_to_a_run(run):
    preset = next(p for p in PRESETS.values() if p.peak_flops == run.hardware.peak_flops)
    changed = {
        f.name for f in dataclasses.fields(preset) if getattr(preset, f.name) != getattr(run.hardware, f.name)
    }
    assert changed <= STATED


MEMORY = [r for r in RUNS if r.fits is not None or r.memory_gib is not None]


@pytest.mark.parametrize("run", MEMORY, ids=ident)
def test_memory_agrees_where_the_source_states_it(run):
    prediction = run.predict()
    gib = prediction.memory_bytes_per_gpu["total"] / 2**30
    agrees = (run.fits is None or prediction.fits == run.fits) and (
        run.memory_gib is None or abs(gib / run.memory_gib - 1) < 0.15
    )
    assert agrees != bool(run.memory_miss), (
        f"{ident(run)}: {gib:.1f} GiB, fits {prediction.fits}; {run.memory_miss}"
    )


@functools.cache
def series() -> dict[str, published.Scaling]:
    return {s.name: s for s in published.scaling()}


@pytest.mark.parametrize("name, miss", [(s[0], s[3]) for s in published.SCALING],
                         ids=[s[0] for s in published.SCALING])
def test_the_loss_from_the_fewest_to_the_most_gpus_is_within_a_third(name, miss):
    scaling = series()[name]
    loss, predicted = scaling.loss(predicted=False), scaling.loss(predicted=True)
    assert loss > 0.01
    assert (abs(predicted - loss) <= loss / 3) != bool(miss), (
        f"{name}: published {loss:.1%}, predicted {predicted:.1%}"
    )


def test_a_scaling_series_holds_every_count_between_and_starts_whole(monkeypatch):
    megascale = series()["MegaScale 175B, Megatron-LM, batch 768"]
    assert megascale.gpus == [256, 512, 768, 1024]
    assert megascale.kept(predicted=False)[0] == megascale.kept(predicted=True)[0] == 1.0
    # tokens/s of the whole job: 39.3k on 256 GPUs, 132.7k on 1,024 (per GPU 153.5 and 129.6)
    assert megascale.loss(predicted=False) == pytest.approx(1 - 132.7 / 4 / 39.3)
    monkeypatch.setattr(published, "SCALING", [(megascale.name, 256, 2048, "")])
    with pytest.raises(ValueError, match="both 256 and 2048"):
        published.scaling(list(megascale.points))
    mpt = [r for r in RUNS if r.label == "MPT-7b, FSDP"]  # 8 A100s and 8 H100s: one label, two machines
    monkeypatch.setattr(published, "SCALING", [("MPT-7b, FSDP", 8, 8, "")])
    with pytest.raises(ValueError, match=r"more than one compared run on the same GPU count: \[8, 8\]"):
        published.scaling(published.compare(mpt))


def test_mpt_runs_as_its_config_trains_it():
    """llm-foundry's MPT config defaults attn, resid and emb pdrop to 0, and torch's dropout at p = 0
    returns its input: no dropout kernel, no mask kept. Composer runs the block eager."""
    mpt = [r for r in RUNS if r.label.startswith("MPT-")]
    assert len(mpt) == 20
    assert all(not r.model.dropout and r.model.kernels == "eager" for r in mpt)


def test_mpt_rows_read_as_if_fsdp_hid_no_collective():
    """What docs/simulator.md says of the MPT misses: priced without FSDP's prefetch (each gather asked
    for when the compute reaches its part), every MPT row (8 to 512 GPUs) comes within 13%, while
    torchtitan's FSDP2 rows on 64 A100s, within 2% with prefetch, fall more than 5% short without it.
    Evidence about how MosaicML's runs hid their collectives, not a setting of the model: the rows
    keep FSDP's prefetch."""

    def error_without_prefetch(run):
        run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, prefetch_params=False))
        return run.predicted(run.predict()) / run.published - 1

    mpt = [r for r in RUNS if r.label.startswith("MPT-")]
    titan_a100 = [r for r in RUNS if r.label.startswith("torchtitan") and r.hardware is PRESETS["a100"]]
    assert len(mpt) == 20 and len(titan_a100) == 4 and all(r.parallel.prefetch_params for r in mpt)
    assert all(abs(error_without_prefetch(r)) < 0.13 for r in mpt)
    assert all(error_without_prefetch(r) < -0.05 for r in titan_a100)
