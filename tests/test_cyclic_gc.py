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


def test_a_plan_builds_its_schedules_with_the_collector_paused_and_gives_it_back(collector_on, monkeypatch):
    """Each schedule a plan proves is built with the collector paused (it walked every cached schedule at
    each full collection: half of planning 405B on 16,384 GPUs), and the plan gives it back on."""
    states, build = [], events.validated_schedule

    def watched(*args):
        states.append(gc.isenabled())
        return build(*args)

    monkeypatch.setattr(events, "validated_schedule", watched)
    events.builtin_plan.cache_clear()
    rows = planner.plan(get_model("gpt3-13b"), 64, get_hardware("a100"), top=3)
    assert rows and states and not any(states)
    assert gc.isenabled()
    events.builtin_plan("1f1b", 4, 7)  # one prediction's schedule (paralab simulate) alike
    assert states[-1] is False and gc.isenabled()
