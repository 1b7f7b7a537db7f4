"""paralab.bench: interleaved comparisons report one median per round and ratios to the first variant."""

import pytest

from paralab import cli
from paralab.bench import Variant, compare


def test_compare_interleaves_and_reports_ratios(no_leftover_ranks):
    result = compare([Variant.of(strategy="ddp"), Variant.of("naive", strategy="dp")], rounds=2,
                     common=dict(world_size=2, steps=2, global_batch=4))
    assert [len(result.step_times[k]) for k in ("ddp", "naive")] == [2, 2]
    assert result.ratio("ddp") == 1.0
    assert result.ratio("naive") == pytest.approx(result.median("naive") / result.median("ddp"))
    table = result.table().splitlines()
    assert len(table) == 4 and table[2].startswith("| ddp |") and "1.000x" in table[2]
    assert result.summaries["naive"]["strategy"] == "dp"


def test_duplicate_labels_are_refused():
    with pytest.raises(ValueError, match="labels must differ"):
        compare([Variant.of(strategy="ddp"), Variant.of(strategy="ddp")], rounds=1)


@pytest.mark.parametrize("argv, message", [
    (["--variants", "ddp", "nope"], "unknown strategy"),
    (["--variants", "ddp", "--rounds", "0"], "--rounds must be >= 1"),  # had failed with StatisticsError
    (["--variants", "ddp", "ddp"], "variant labels must differ"),  # had failed with a traceback
])
def test_bench_cli_refuses_bad_input_before_running(monkeypatch, capsys, argv, message):
    monkeypatch.setattr("paralab.run", lambda *a, **k: pytest.fail("a run was about to start"))
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
