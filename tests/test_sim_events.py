"""The event simulator: one span per action, one action at a time per rank, every dependency honoured
in time, p2p latency paid by the receiver, and bubbles that shrink as microbatches grow."""

import pytest

from paralab import sim
from paralab.schedules import SCHEDULES, ScheduleReport, build_schedule, validate_schedule
from paralab.sim.events import compile_schedule, simulate_schedule, simulated_bubble
from paralab.trace import Trace

TIMES = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}
CASES = [
    ("naive", 2, 2),
    ("gpipe", 4, 2),
    ("1f1b", 4, 8),
    ("interleaved", 2, 4),
    ("zb-h1", 4, 8),
    ("zbv", 4, 8),
]


def build(name, p, m):
    return build_schedule(name, p, m, 2 if name == "interleaved" else 1)


def compute_by_key(trace):
    return {(s.kind, s.stage, s.microbatch): s for s in trace.select(lane="compute")}


@pytest.mark.parametrize(("name", "p", "m"), CASES)
def test_one_compute_span_per_compute_action(name, p, m):
    schedule = build(name, p, m)
    trace = simulate_schedule(schedule, TIMES)
    expected = sorted(
        (r, a.op, a.stage, a.microbatch) for r in schedule.ranks for a in schedule.actions[r] if a.is_compute
    )
    got = sorted((s.rank, s.kind, s.stage, s.microbatch) for s in trace.select(lane="compute"))
    assert got == expected
    comm = [a for acts in schedule.actions for a in acts if not a.is_compute]
    assert len(trace.select(lane="comm")) == len(comm)
    # named as a measured run names its sends and receives ("send_forward F7@s0" beside "send F7 s0")
    letter = {"forward": "F", "backward": "B"}
    assert sorted(s.name for s in trace.select(lane="comm")) == sorted(
        f"{a.op.split('_')[0]} {letter[a.op.split('_')[1]]}{a.microbatch} s{a.stage}" for a in comm)


@pytest.mark.parametrize(("name", "p", "m"), CASES)
def test_no_two_compute_spans_overlap_on_a_rank(name, p, m):
    trace = simulate_schedule(build(name, p, m), TIMES, p2p_time=0.25)
    for rank in trace.ranks:
        spans = sorted(trace.select(lane="compute", rank=rank), key=lambda s: s.start)
        for before, after in zip(spans, spans[1:]):
            assert after.start >= before.end - 1e-12


@pytest.mark.parametrize(("name", "p", "m"), CASES)
@pytest.mark.parametrize("latency", [0.0, 0.3])
def test_every_dependency_is_respected_in_time(name, p, m, latency):
    schedule = build(name, p, m)
    spans = compute_by_key(simulate_schedule(schedule, TIMES, p2p_time=latency))
    grad = "backward_input" if schedule.is_split_backward else "backward"
    last = schedule.num_stages - 1

    def ready(kind, stage, mb, consumer_stage):
        remote = schedule.stage_to_rank[stage] != schedule.stage_to_rank[consumer_stage]
        return spans[(kind, stage, mb)].end + (latency if remote else 0.0)

    for (kind, s, mb), span in spans.items():
        needs = []
        if kind == "forward" and s > 0:
            needs.append(ready("forward", s - 1, mb, s))
        if kind in ("backward", "backward_input"):
            needs.append(ready("forward", s, mb, s))
            if s < last:
                needs.append(ready(grad, s + 1, mb, s))
        if kind == "backward_weight":
            needs.append(ready("backward_input", s, mb, s))
        assert all(span.start >= t - 1e-9 for t in needs), (kind, s, mb)


def test_p2p_latency_delays_the_receiver_not_the_sender():
    schedule = build_schedule("1f1b", 2, 2)  # rank 0: F0 send F1 send ...; rank 1 waits for F0
    fast = compute_by_key(simulate_schedule(schedule, TIMES))
    slow_trace = simulate_schedule(schedule, TIMES, p2p_time=0.5)
    slow = compute_by_key(slow_trace)
    assert fast[("forward", 1, 0)].start == pytest.approx(1.0)
    assert slow[("forward", 1, 0)].start == pytest.approx(1.5)  # receiver waits for the transfer
    assert slow[("forward", 0, 1)].start == pytest.approx(1.0)  # sender goes straight on
    recv = next(s for s in slow_trace.select(lane="comm", kind="recv", rank=1) if s.microbatch == 0)
    assert (recv.start, recv.end) == pytest.approx((0.0, 1.5))
    # one hop down and one hop back on the critical path
    assert slow_trace.step_times()[0] == pytest.approx(
        simulate_schedule(schedule, TIMES).step_times()[0] + 1.0
    )


def test_a_recv_holds_its_rank_until_the_tensor_lands():
    schedule = build_schedule("1f1b", 2, 2)  # rank 1: rF0 F0 B0 sB0 rF1 F1 B1 sB1
    rank1 = schedule.actions[1]
    rank1.insert(2, rank1.pop(4))  # receive microbatch 1 early, before B0
    slow_f1 = lambda a: (5.0 if (a.op, a.stage, a.microbatch) == ("forward", 0, 1)  # noqa: E731
                         else TIMES[a.op])
    spans = compute_by_key(simulate_schedule(schedule, slow_f1))
    assert spans[("forward", 1, 0)].end == pytest.approx(2.0)
    assert spans[("backward", 1, 0)].start == pytest.approx(6.0)  # F1 on rank 0 ends at 1 + 5


def test_p2p_time_may_depend_on_the_action():
    schedule = build_schedule("gpipe", 2, 1)
    trace = simulate_schedule(schedule, TIMES, p2p_time=lambda a: 0.5 if a.op == "send_forward" else 0.0)
    spans = compute_by_key(trace)
    assert spans[("forward", 1, 0)].start == pytest.approx(1.5)
    assert spans[("backward", 0, 0)].start == pytest.approx(spans[("backward", 1, 0)].end)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1", "zbv"])
def test_bubble_falls_as_microbatches_rise(name):
    bubbles = [simulated_bubble(build_schedule(name, 4, m), TIMES) for m in (1, 2, 4, 8, 16)]
    assert all(later < earlier for earlier, later in zip(bubbles, bubbles[1:])), bubbles


def test_trace_shape_meta_and_step_window():
    schedule = build_schedule("1f1b", 4, 8)
    trace = simulate_schedule(schedule, TIMES, step=3, t0=10.0)
    assert trace.meta == {
        "source": "simulated",
        "schedule": "1f1b",
        "stages": 4,
        "microbatches": 8,
        "virtual_stages": 1,
    }
    steps = trace.select(lane="step")
    assert len(steps) == 4 and {s.kind for s in steps} == {"step"}
    makespan = max(s.end for s in trace.spans if s.lane != "step")
    assert {(s.start, s.end, s.step) for s in steps} == {(10.0, makespan, 3)}
    assert min(s.start for s in trace.select(lane="compute")) == 10.0
    f31 = next(
        s for s in trace.select(lane="compute") if (s.kind, s.stage, s.microbatch) == ("forward", 1, 3)
    )
    assert f31.name == "F3 s1" and f31.step == 3 and f31.rank == 1
    assert Trace.from_dict(trace.to_dict()).spans == trace.spans


def test_send_and_recv_bytes():
    schedule = build_schedule("1f1b", 2, 4)
    trace = simulate_schedule(schedule, TIMES, activation_bytes=1000)
    sends, recvs = trace.select(lane="comm", kind="send"), trace.select(lane="comm", kind="recv")
    assert len(sends) == len(recvs) == 2 * 4  # each microbatch: activation down, gradient up
    assert all(s.bytes == s.payload_bytes == 1000 and s.peer == 1 - s.rank for s in sends)
    assert all(s.bytes == 0 and s.payload_bytes == 1000 for s in recvs)
    assert trace.comm_bytes() == {"recv": 0, "send": 8000}


def test_compute_time_may_be_a_callable_and_a_missing_op_is_named():
    schedule = build_schedule("1f1b", 2, 2)
    trace = simulate_schedule(schedule, lambda a: 2.0 if a.stage == 1 else 1.0)
    assert {s.duration for s in trace.select(lane="compute", rank=1)} == {2.0}
    with pytest.raises(KeyError, match="no time for 'backward'"):
        simulate_schedule(schedule, {"forward": 1.0})


@pytest.mark.parametrize("times, p2p, said", [
    ({"forward": 1, "backward": 2}, -1.0, "p2p_time"),  # had read a bubble of 0.08 where 1f1b's is 0.2
    ({"forward": 1, "backward": 2}, float("nan"), "p2p_time"),  # had read 0
    ({"forward": -1.0, "backward": 2}, 0.0, "compute_time"),
    ({"forward": True, "backward": 2}, 0.0, "compute_time"),
])
def test_times_that_are_no_seconds_are_refused(times, p2p, said):
    with pytest.raises(ValueError, match=rf"{said} must be seconds, finite and >= 0, got "):
        simulated_bubble(build_schedule("1f1b", 2, 4), times, p2p)


def test_a_plan_is_compiled_only_from_its_own_schedules_proof():
    """A report without what each action waits for (or of another schedule) would time nothing."""
    schedule = build_schedule("1f1b", 2, 4)
    report = validate_schedule(schedule)
    assert len(compile_schedule(schedule, report).deps) == len(report.order)
    for wrong in (ScheduleReport(report.peak_activations, report.order, proved=schedule.actions),
                  validate_schedule(build_schedule("1f1b", 2, 2)),
                  validate_schedule(build_schedule("gpipe", 2, 4))):  # as many actions, other waits
        with pytest.raises(ValueError, match="validate_schedule's report of this schedule"):
            compile_schedule(schedule, wrong)


def test_simulated_bubble_is_the_trace_bubble_and_is_exported():
    schedule = build_schedule("gpipe", 4, 4)
    assert sim.simulate_schedule is simulate_schedule
    assert simulated_bubble(schedule, TIMES) == simulate_schedule(schedule, TIMES).bubble_fraction()


def test_every_schedule_simulates():
    for name in SCHEDULES:
        trace = simulate_schedule(build(name, 2, 4), TIMES)
        assert trace.meta["schedule"] == name
        assert 0.0 < trace.bubble_fraction() < 1.0
