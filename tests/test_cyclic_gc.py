"""The cyclic collector is paused around the simulator's large computations and given back as found."""

import gc

import pytest

from paralab.cyclic_gc import without_cyclic_gc
from paralab.sim import events, planner
from paralab.sim.hardware import get_hardware
from paralab.sim.presets import get_model


@pytest.fixture
def collector_on():
    was_on = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was_on else gc.disable)()


def test_the_collector_is_paused_inside_and_on_again_after_a_return_or_a_raise(collector_on):
    seen = []

    @without_cyclic_gc
    def inner():
        seen.append(("inner", gc.isenabled()))

    @without_cyclic_gc
    def outer(fail: bool):
        inner()
        seen.append(("outer after inner", gc.isenabled()))  # the inner call leaves it to the outer
        if fail:
            raise ValueError("boom")

    outer(False)
    assert seen == [("inner", False), ("outer after inner", False)] and gc.isenabled()
    with pytest.raises(ValueError, match="boom"):
        outer(True)
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off(collector_on):
    gc.disable()
    without_cyclic_gc(lambda: None)()
    assert not gc.isenabled()


def test_a_plan_prices_and_builds_its_schedules_with_the_collector_paused(collector_on, monkeypatch):
    """Each layout a plan prices and each schedule it proves runs with the collector paused (it walked
    every cached schedule at each full collection: 16-27% of planning 405B on 16,384 GPUs),
    and the plan gives it back on. One prediction's schedule (paralab simulate) is built alike."""
    priced, built = [], []
    monkeypatch.setattr(planner.cost, "predict", _watched(planner.cost.predict, priced))
    monkeypatch.setattr(events, "validated_schedule", _watched(events.validated_schedule, built))
    events.builtin_plan.cache_clear()
    rows = planner.plan(get_model("gpt3-13b"), 64, get_hardware("a100"), top=3)
    assert rows and priced and built and not any(priced + built)
    assert gc.isenabled()
    before = len(built)
    events.builtin_plan("1f1b", 4, 7)
    assert built[before:] == [False] and gc.isenabled()


def test_plan_explains_with_the_collector_paused_but_measures_a_local_machine_with_it_on(
        collector_on, monkeypatch, capsys):
    """The explanation after a plan runs while the plan's schedules are alive, paused too; measuring the
    `local` machine times the training loop as runs have it, collector on (its figures are cached for
    every later command)."""
    from paralab.cli import main
    from paralab.sim import cli as sim_cli

    explained, measured = [], []
    monkeypatch.setattr(planner, "explain", _watched(planner.explain, explained))
    monkeypatch.setattr(sim_cli, "_hardware", _watched(sim_cli._hardware, measured))
    assert main(["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--hardware", "a100", "--top", "2"]) == 0
    assert "Winner:" in capsys.readouterr().out
    assert (measured, explained) == ([True], [False]) and gc.isenabled()


def _watched(function, states: list):
    """``function``, noting whether the collector is on at each call."""
    def watched(*args, **kwargs):
        states.append(gc.isenabled())
        return function(*args, **kwargs)
    return watched
