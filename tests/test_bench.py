"""paralab.bench: interleaved comparisons report one median per round and ratios to the first variant."""

import statistics
from types import SimpleNamespace

import pytest

from paralab import cli
from paralab.bench import Variant, compare
from paralab.config import ConfigError


def test_compare_interleaves_and_reports_ratios(no_leftover_ranks):
    result = compare([Variant.of(strategy="ddp"), Variant.of("naive", strategy="dp")], rounds=2,
                     common=dict(world_size=2, steps=2, global_batch=4))
    assert [len(result.step_times[k]) for k in ("ddp", "naive")] == [2, 2]
    assert result.ratio("ddp") == 1.0
    assert result.ratio("naive") == pytest.approx(
        statistics.median(a / b for a, b in zip(result.step_times["naive"], result.step_times["ddp"])))
    table = result.table().splitlines()
    assert len(table) == 4 and table[2].startswith("| ddp |") and "1.000x" in table[2]
    assert result.summaries["naive"]["strategy"] == "dp"


def test_rounds_interleave_the_variants_and_each_keeps_the_median_of_its_rounds(monkeypatch):
    """A, B, B, A, A, B: a slow spell of the machine falls on both variants, not on one, and neither
    always runs first. Each round's figure is that run's median step; the variant's is the median over
    rounds (not the mean, not the last), and its ratio the median of the rounds' ratios (3, 3, 2.5),
    not the ratio of the medians (5 / 2)."""
    times = {"ddp": iter([1.0, 3.0, 2.0]), "dp": iter([3.0, 9.0, 5.0])}
    calls = []

    def fake_run(**options):
        calls.append((options["strategy"], options["steps"]))
        return SimpleNamespace(summary={"strategy": options["strategy"],
                                        "step_time_s": next(times[options["strategy"]])})

    monkeypatch.setattr("paralab.run", fake_run)
    result = compare([Variant.of(strategy="ddp"), Variant.of("naive", strategy="dp")], rounds=3,
                     common=dict(steps=7))
    assert calls == [("ddp", 7), ("dp", 7), ("dp", 7), ("ddp", 7), ("ddp", 7), ("dp", 7)]
    assert result.step_times == {"ddp": [1.0, 3.0, 2.0], "naive": [3.0, 9.0, 5.0]}
    assert (result.median("ddp"), result.median("naive")) == (2.0, 5.0)
    assert result.ratio("naive") == 3.0 and result.ratio("ddp", reference="naive") == pytest.approx(1 / 3)
    assert "| naive | 5.0000 | 3 | 3.000x | 2.500-3.000x |" in result.table()  # its spread said too


def test_duplicate_labels_a_lone_variant_and_one_step_runs_are_refused(monkeypatch):
    monkeypatch.setattr("paralab.run", lambda *a, **k: pytest.fail("a run was about to start"))
    with pytest.raises(ValueError, match="labels must differ"):
        compare([Variant.of(strategy="ddp"), Variant.of(strategy="ddp")], rounds=1)
    with pytest.raises(ConfigError, match="two variants or more"):  # had run it, 1.000x over itself
        compare([Variant.of(strategy="ddp")], rounds=1)
    with pytest.raises(ConfigError, match="--steps must be >= 2"):  # the benchmark scripts call compare too
        compare([Variant.of(strategy="ddp"), Variant.of(strategy="dp", steps=1)], rounds=1)


@pytest.mark.parametrize("argv, message", [
    (["--variants", "ddp", "nope"], "unknown strategy"),
    (["--variants", "ddp", "--rounds", "0"], "--rounds must be >= 1"),  # had failed with StatisticsError
    (["--variants", "ddp", "ddp"], "variant labels must differ"),  # had failed with a traceback
    (["--variants", "ddp", "dp", "--steps", "1"], "--steps must be >= 2 in a comparison"),  # warm-up alone
])
def test_bench_cli_refuses_bad_input_before_running(monkeypatch, capsys, argv, message):
    monkeypatch.setattr("paralab.run", lambda *a, **k: pytest.fail("a run was about to start"))
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_offers_the_oversubscription_its_refusal_names(monkeypatch, capsys):
    """A world beyond the machine is refused with '--oversubscribe' as the way on: bench had no such
    flag. Given, it reaches every run."""
    monkeypatch.setattr("paralab.run", lambda *a, **k: pytest.fail("a run was about to start"))
    assert cli.main(["bench", "--variants", "ddp", "--world-size", "512", "--global-batch", "512"]) == 2
    assert "--oversubscribe" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr("paralab.bench.compare", lambda variants, rounds, common: seen.append(common) or
                        SimpleNamespace(table=lambda: ""))
    assert cli.main(["bench", "--variants", "ddp", "--world-size", "512", "--global-batch", "512",
                     "--oversubscribe"]) == 0
    assert seen[0]["oversubscribe"] is True


def test_bench_takes_the_layout_its_variants_share(monkeypatch, capsys):
    """`pp torch_pp` had been refused for 1 microbatch on 2 stages, naming a --microbatches bench did not
    take: the layout flags reach every run, and each variant is checked with them before any starts."""
    seen = []
    monkeypatch.setattr("paralab.bench.compare", lambda variants, rounds, common: seen.append(common) or
                        SimpleNamespace(table=lambda: ""))
    assert cli.main(["bench", "--variants", "pp", "torch_pp", "--microbatches", "4"]) == 0
    assert seen[0]["microbatches"] == 4 and "schedule" not in seen[0]
    monkeypatch.setattr("paralab.run", lambda *a, **k: pytest.fail("a run was about to start"))
    assert cli.main(["bench", "--variants", "pp", "torch_pp"]) == 2
    assert "microbatches >= stages" in capsys.readouterr().err


def test_every_benchmark_flag_says_what_it_does():
    """A reader of ``--help`` had met --world-sizes, --factors and a dozen more with no word on them."""
    import ast
    from pathlib import Path

    silent = []
    for script in sorted((Path(__file__).resolve().parent.parent / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
                    and not any(k.arg == "help" for k in node.keywords)):
                silent.append(f"{script.name}: {node.args[0].value}")
    assert not silent, silent
