"""Pipeline schedules as data: every schedule validates, has the memory and bubble its paper claims,
and the validator catches broken schedules with messages that name the rank and the action."""

import pytest

from paralab import schedules
from paralab.schedules import (
    SCHEDULES,
    UNIT_PASSES,
    Action,
    Schedule,
    ScheduleError,
    _zbv_list_order,
    build_schedule,
    theoretical_bubble,
    validate_schedule,
)
from paralab.sim.events import simulate_schedule, simulated_bubble

# Megatron's convention: a full backward costs two forwards; the zero-bubble split is F = Bi = W.
TIMES = {"forward": 1.0, "backward": 2.0, "backward_input": 1.0, "backward_weight": 1.0}


def shapes(name):
    """(p, m, v) combinations a schedule supports among p in {2, 4}, m in {1, 2, 4, 6, 8} (interleaved
    runs them all: m below p, and m = 6 that 4 does not divide)."""
    v = 2 if name in ("interleaved", "zbv", "dualpipev") else 1
    for p in (2, 4):
        for m in (1, 2, 4, 6, 8):
            if name != "dualpipev" or m >= 2 * p:
                yield p, m, v


ALL = [(name, p, m, v) for name in SCHEDULES for p, m, v in shapes(name)]


def find(schedule, rank, text):
    return next(i for i, a in enumerate(schedule.actions[rank]) if str(a) == text)


# ------------------------------------------------------------------------------------ valid schedules
@pytest.mark.parametrize(("name", "p", "m", "v"), ALL)
def test_every_schedule_validates(name, p, m, v):
    schedule = build_schedule(name, p, m, v)
    report = validate_schedule(schedule)
    assert (schedule.pp, schedule.microbatches, schedule.virtual_stages) == (p, m, v)
    assert len(schedule.stage_to_rank) == schedule.num_stages == p * v
    assert sorted(report.order) == sorted(
        (r, i) for r in schedule.ranks for i in range(len(schedule.actions[r]))
    )
    computes = [a for acts in schedule.actions for a in acts if a.is_compute]
    # a forward and a backward per (stage, microbatch), and a W where the backward is split
    assert len(computes) == 2 * p * v * m + len(schedule.split_backwards)
    assert schedule.is_split_backward == (name in ("zb-h1", "zbv", "dualpipev"))
    if name in ("zb-h1", "zbv"):
        assert len(schedule.split_backwards) == p * v * m


@pytest.mark.parametrize(("name", "p", "m", "v"), ALL)
def test_order_respects_each_rank_list(name, p, m, v):
    schedule = build_schedule(name, p, m, v)
    order = validate_schedule(schedule).order
    for rank in schedule.ranks:
        assert [i for r, i in order if r == rank] == list(range(len(schedule.actions[rank])))


def slot_at(actions, i):
    """The computes of the slot starting at compute i: it alone, or an F and the overlapped B after it."""
    return actions[i:i + 2] if i + 1 < len(actions) and actions[i + 1].overlapped else actions[i:i + 1]


@pytest.mark.parametrize(("name", "p", "m", "v"), ALL)
def test_recv_right_before_and_send_right_after_compute(name, p, m, v):
    """Receives come right before the slot that consumes them, sends right after the slot that made
    them (a slot: one compute, or DualPipeV's F&B pair, which receives both inputs first)."""
    schedule = build_schedule(name, p, m, v)
    for rank, actions in enumerate(schedule.actions):
        for i, a in enumerate(actions):
            if a.op.startswith("recv"):
                j = next(k for k in range(i, len(actions)) if actions[k].is_compute)
                assert all(b.op.startswith("recv") for b in actions[i:j])
                assert (a.stage, a.microbatch) in [(c.stage, c.microbatch) for c in slot_at(actions, j)]
            if a.op.startswith("send"):
                j = next(k for k in range(i, -1, -1) if actions[k].is_compute and not actions[k].overlapped)
                assert all(b.op.startswith("send") for b in actions[j + len(slot_at(actions, j)):i])
                assert (a.stage, a.microbatch) in [(c.stage, c.microbatch) for c in slot_at(actions, j)]
                assert a.peer != rank


@pytest.mark.parametrize(("p", "m", "v"),
                         [(4, 1, 2), (4, 3, 2), (4, 6, 2), (4, 10, 3), (3, 5, 2), (5, 12, 2)])
def test_interleaved_runs_microbatch_counts_the_stages_do_not_divide(p, m, v):
    """torch's relaxation of Megatron's rule: rounds of m / max(1, m // p) microbatches. The closed form
    holds for every such shape; with m >= p it is Megatron's (p - 1) / (v m + p - 1)."""
    schedule = build_schedule("interleaved", p, m, v)
    validate_schedule(schedule)
    assert (simulated_bubble(schedule, TIMES)
            == pytest.approx(theoretical_bubble("interleaved", p, m, v), abs=1e-9))
    if m >= p:
        assert theoretical_bubble("interleaved", p, m, v) == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaved_places_stage_s_on_rank_s_mod_p():
    schedule = build_schedule("interleaved", 4, 8, 2)
    assert schedule.stage_to_rank == [0, 1, 2, 3, 0, 1, 2, 3]
    assert schedule.stages_on(1) == [1, 5]


def test_zbv_is_a_v_with_local_handover_at_the_tip():
    p = 4
    schedule = build_schedule("zbv", p, 8)
    assert schedule.virtual_stages == 2
    assert schedule.stage_to_rank == [0, 1, 2, 3, 3, 2, 1, 0]
    assert schedule.stage_to_rank[-1] == 0  # the loss is on rank 0, where the batch came in
    tip = [a for a in schedule.actions[p - 1] if not a.is_compute and a.stage in (p - 1, p)]
    # stage p-1 only sends backward (to rank p-2) and receives forward; stage p the mirror image
    assert {a.op for a in tip if a.stage == p - 1} == {"recv_forward", "send_backward"}
    assert {a.op for a in tip if a.stage == p} == {"send_forward", "recv_backward"}


# ------------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 8), (4, 2), (4, 8)])
def test_peak_activations(p, m):
    gpipe = validate_schedule(build_schedule("gpipe", p, m)).peak_activations
    one_f_one_b = validate_schedule(build_schedule("1f1b", p, m)).peak_activations
    zb_h1 = validate_schedule(build_schedule("zb-h1", p, m)).peak_activations
    assert gpipe == [m] * p
    assert one_f_one_b == [min(p - rank, m) for rank in range(p)]
    # ZB-H1 keeps 1F1B's peak: no rank holds more than the first rank does in 1F1B.
    assert max(zb_h1) == max(one_f_one_b)
    assert all(peak <= p for peak in zb_h1)


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 8), (4, 4), (4, 8)])
def test_interleaved_warm_up_is_megatrons(p, m):
    v = 2
    peaks = validate_schedule(build_schedule("interleaved", p, m, v)).peak_activations
    assert peaks == [min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v) for rank in range(p)]


def test_zbv_holds_first_rank_1f1b_memory_in_half_size_chunks():
    p = 4
    peaks = validate_schedule(build_schedule("zbv", p, 8)).peak_activations
    assert max(peaks) == 2 * p  # 2p chunks of half a rank's layers = 1F1B's p whole activations


# ------------------------------------------------------------------------------------------- bubbles
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m", "v"), list(shapes("gpipe")))
def test_gpipe_and_1f1b_bubble_is_exact(name, p, m, v):
    assert simulated_bubble(build_schedule(name, p, m), TIMES) == pytest.approx(
        (p - 1) / (m + p - 1), abs=1e-9
    )


@pytest.mark.parametrize(("name", "p", "m", "v"), [c for c in ALL if c[0] != "zbv" or c[2] >= c[1]])
def test_simulated_bubble_matches_the_closed_form(name, p, m, v):
    simulated = simulated_bubble(build_schedule(name, p, m, v), TIMES)
    assert simulated == pytest.approx(theoretical_bubble(name, p, m, v), abs=1e-9)


@pytest.mark.parametrize("times", [(1.0, 1.5, 0.5), (1.0, 1.2, 0.8), (1.0, 0.8, 1.4)])
def test_zbv_ordered_for_its_pass_times_is_valid_and_beats_the_unit_time_order(times):
    """Passes of unequal length (a Bi longer than its W, as recompute makes it) leave gaps in the order
    found for equal ones (a bubble stuck near 18-33% whatever m); the order found for the real times
    closes most of them (Qi et al. 2024 order with profiled times). List scheduling is a heuristic:
    where W is the longer pass the two orders are within half a point."""
    f, bi, w = times
    real = {"forward": f, "backward_input": bi, "backward_weight": w, "backward": bi + w}
    for p, m in ((4, 8), (4, 16), (8, 32)):
        fitted = build_schedule("zbv", p, m, pass_times=times)
        validate_schedule(fitted)
        unit_bubble = simulated_bubble(build_schedule("zbv", p, m), real)
        fitted_bubble = simulated_bubble(fitted, real)
        assert fitted_bubble < (0.7 * unit_bubble if bi > w else unit_bubble + 0.005)


@pytest.mark.parametrize(("m", "times"), [(64, (1.0, 1.1, 0.7)), (9, (1.0, 1.4, 0.6))])
def test_zbv_keeps_the_fastest_of_its_rules_and_beats_zb_h1(m, times):
    """8 ranks, Bi and W of unequal length. With 64 microbatches a Bi-first order let chunk 0's
    forwards fill a rank's 2p limit and hold up the V's return; with 9 the last microbatch waited at
    the tip for the others' backwards: 12.7% and 36.8% of the step idled, more than ZB-H1's 5.2% and
    31.8%. The forward-first rules idle less than ZB-H1, in 1F1B's memory."""
    f, bi, w = times
    real = {"forward": f, "backward_input": bi, "backward_weight": w, "backward": bi + w}
    zbv = build_schedule("zbv", 8, m, pass_times=times)
    assert max(validate_schedule(zbv).peak_activations) <= 2 * 8
    assert simulated_bubble(zbv, real) < simulated_bubble(build_schedule("zb-h1", 8, m), real)


@pytest.mark.parametrize("times", [(1.0, 1.9, 0.1), (1.0, 1.5, 0.2), (1.0, 1.9, 0.3)])
def test_zbv_pass_times_that_stall_a_search_get_an_order(times, monkeypatch):
    """On two ranks a W much shorter than Bi lets rank 0 fill its limit with stage 0's forwards, which
    stage 3's forward on the same rank then cannot pass: the Bi-first search stalls (it had raised a
    ValueError out of min() that `paralab simulate --schedule zbv --pp 2` showed as a traceback). The
    forward-first ones find an order; were all to stall, the equal-times order would serve."""
    stalled = [m for m in (4, 8, 16) if _zbv_list_order(2, m, [0, 1, 1, 0], times, False, 0) is None]
    assert stalled
    for m in (4, 8, 16):
        validate_schedule(build_schedule("zbv", 2, m, pass_times=times))
    monkeypatch.setattr(schedules, "_zbv_list_order", lambda *args: None)
    with pytest.raises(AssertionError, match="stalled"):
        build_schedule("zbv", 2, 8)
    monkeypatch.undo()
    equal = build_schedule("zbv", 2, 8).actions
    monkeypatch.setattr(schedules, "_zbv_list_order", lambda p, m, ranks, passes, *rule: (
        None if passes != UNIT_PASSES else _zbv_list_order(p, m, ranks, passes, *rule)))
    assert build_schedule("zbv", 2, 8, pass_times=times).actions == equal


@pytest.mark.parametrize("times", [(1.0, 1.0, 0.0), (1.0, -1.0, 1.0), (1.0, 1.0), (1.0, float("inf"), 1.0)])
def test_pass_times_that_are_not_three_positive_times_are_refused(times):
    with pytest.raises(ScheduleError, match="pass_times must be three positive times"):
        build_schedule("zbv", 4, 8, pass_times=times)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 2)])
def test_zbv_closed_form_is_a_lower_bound_for_few_microbatches(p, m):
    simulated = simulated_bubble(build_schedule("zbv", p, m), TIMES)
    assert simulated >= theoretical_bubble("zbv", p, m) - 1e-9


@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 8), (4, 4), (4, 8)])
def test_interleaving_shrinks_the_bubble_by_about_one_over_v(p, m):
    v = 2
    plain = simulated_bubble(build_schedule("1f1b", p, m), TIMES)
    interleaved = simulated_bubble(build_schedule("interleaved", p, m, v), TIMES)
    assert interleaved < plain
    # bubble time over ideal time is (p-1)/m for 1F1B and (p-1)/(v m) interleaved (Narayanan et al.)
    assert interleaved / (1 - interleaved) == pytest.approx(plain / (1 - plain) / v)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 8), (4, 2), (4, 4), (4, 8)])
def test_zero_bubble_beats_1f1b(p, m):
    assert simulated_bubble(build_schedule("zb-h1", p, m), TIMES) < simulated_bubble(
        build_schedule("1f1b", p, m), TIMES
    )


def test_zb_h1_bubble_is_a_third_of_1f1b_in_ramp_time():
    p, m = 4, 8
    trace_1f1b = simulate_schedule(build_schedule("1f1b", p, m), TIMES)
    trace_zb = simulate_schedule(build_schedule("zb-h1", p, m), TIMES)
    work = 3 * m  # per rank, in forward times
    assert trace_1f1b.step_times()[0] - work == pytest.approx(3 * (p - 1))
    assert trace_zb.step_times()[0] - work == pytest.approx(p - 1)


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (4, 1), (4, 8)])
def test_naive_runs_one_rank_at_a_time(p, m):
    trace = simulate_schedule(build_schedule("naive", p, m), TIMES)
    spans = sorted(trace.select(lane="compute"), key=lambda s: s.start)
    for before, after in zip(spans, spans[1:]):
        assert after.start >= before.end - 1e-12
    assert trace.bubble_fraction() == pytest.approx((p - 1) / p)


def test_theoretical_bubble_formulas():
    assert theoretical_bubble("naive", 4, 1) == pytest.approx(3 / 4)
    assert theoretical_bubble("gpipe", 4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble("interleaved", 4, 8, 2) == pytest.approx(3 / 19)
    assert theoretical_bubble("zb-h1", 4, 8) == pytest.approx(3 / 27)
    assert theoretical_bubble("zbv", 4, 8) == pytest.approx(3 / 51)
    assert theoretical_bubble("1f1b", 1, 8) == 0.0


# ---------------------------------------------------------------------------------- broken schedules
def one_f_one_b():
    """p=2, m=2: rank 0 = F0 sF0 F1 sF1 rB0 B0 rB1 B1; rank 1 = rF0 F0 B0 sB0 rF1 F1 B1 sB1."""
    return build_schedule("1f1b", 2, 2)


def test_rejects_a_missing_backward():
    schedule = one_f_one_b()
    del schedule.actions[0][find(schedule, 0, "B1@s0")]
    with pytest.raises(ScheduleError, match=r"rank 0: missing backward B1@s0"):
        validate_schedule(schedule)


def test_rejects_a_recv_without_its_send():
    schedule = one_f_one_b()
    del schedule.actions[0][find(schedule, 0, "send_forward F1@s0")]
    with pytest.raises(ScheduleError) as err:
        validate_schedule(schedule)
    assert str(err.value) == "rank 1: recv_forward F1@s1 has no matching send_forward on rank 0"


def test_rejects_a_send_without_its_recv():
    schedule = one_f_one_b()
    del schedule.actions[0][find(schedule, 0, "recv_backward B0@s0")]
    with pytest.raises(
        ScheduleError, match=r"rank 1: send_backward B0@s1 has no matching recv_backward on rank 0"
    ):
        validate_schedule(schedule)


def test_rejects_a_compute_whose_remote_input_is_never_received():
    schedule = one_f_one_b()
    del schedule.actions[0][find(schedule, 0, "send_forward F1@s0")]
    del schedule.actions[1][find(schedule, 1, "recv_forward F1@s1")]
    with pytest.raises(
        ScheduleError, match=r"rank 0: F1@s0 needs send_forward F1@s0, which rank 0 never issues"
    ):
        validate_schedule(schedule)


def test_rejects_a_deadlock_and_names_every_waiting_rank():
    schedule = one_f_one_b()
    rank0 = schedule.actions[0]
    # rank 0 now waits for microbatch 0's gradient before it has sent microbatch 0's activation
    rank0.insert(1, rank0.pop(find(schedule, 0, "recv_backward B0@s0")))
    with pytest.raises(ScheduleError) as err:
        validate_schedule(schedule)
    assert str(err.value) == (
        "deadlock: rank 0 waits at recv_backward B0@s0 for send_backward B0@s1 on rank 1; "
        "rank 1 waits at recv_forward F0@s1 for send_forward F0@s0 on rank 0"
    )


def test_rejects_a_send_before_the_compute_that_makes_its_tensor():
    schedule = one_f_one_b()
    rank0 = schedule.actions[0]
    rank0[0], rank0[1] = rank0[1], rank0[0]
    with pytest.raises(
        ScheduleError, match=r"rank 0: send_forward F0@s0 waits for F0@s0, which comes after it on rank 0"
    ):
        validate_schedule(schedule)


def test_rejects_a_compute_that_runs_before_its_recv():
    schedule = one_f_one_b()
    rank1 = schedule.actions[1]
    rank1[0], rank1[1] = rank1[1], rank1[0]  # F0@s1 before recv_forward F0@s1
    with pytest.raises(
        ScheduleError, match=r"rank 1: F0@s1 waits for recv_forward F0@s1, which comes after it on rank 1"
    ):
        validate_schedule(schedule)


def test_rejects_a_weight_gradient_before_its_input_gradient():
    schedule = build_schedule("zb-h1", 2, 2)
    rank1 = schedule.actions[1]
    bi, w = find(schedule, 1, "Bi0@s1"), find(schedule, 1, "W0@s1")
    rank1[bi], rank1[w] = rank1[w], rank1[bi]
    with pytest.raises(
        ScheduleError, match=r"rank 1: W0@s1 waits for Bi0@s1, which comes after it on rank 1"
    ):
        validate_schedule(schedule)


def test_rejects_duplicates_misplaced_actions_wrong_peers_and_mixed_backwards():
    schedule = one_f_one_b()
    schedule.actions[0].append(Action("forward", 0, 1))
    with pytest.raises(ScheduleError, match=r"rank 0: F1@s0 appears 2 times"):
        validate_schedule(schedule)

    schedule = one_f_one_b()
    schedule.actions[1].append(Action("forward", 0, 1))
    with pytest.raises(ScheduleError, match=r"rank 1: F1@s0 belongs to rank 0"):
        validate_schedule(schedule)

    schedule = one_f_one_b()
    i = find(schedule, 0, "send_forward F0@s0")
    schedule.actions[0][i] = Action("send_forward", 0, 0, peer=0)
    with pytest.raises(
        ScheduleError, match=r"rank 0: send_forward F0@s0 names peer 0, but stage 1 is on rank 1"
    ):
        validate_schedule(schedule)

    schedule = build_schedule("zbv", 2, 2)  # stages 1 and 2 both live on rank 1
    schedule.actions[1].insert(find(schedule, 1, "F0@s1") + 1, Action("send_forward", 1, 0, peer=1))
    with pytest.raises(ScheduleError, match=r"rank 1: send_forward F0@s1 talks to stage 2 on the same rank"):
        validate_schedule(schedule)

    schedule = build_schedule("zb-h1", 2, 2)
    i = find(schedule, 0, "W1@s0")
    schedule.actions[0][i] = Action("backward", 0, 1)
    with pytest.raises(ScheduleError, match=r"rank 0: B1@s0 mixes a full backward"):
        validate_schedule(schedule)


def test_rejects_a_schedule_with_the_wrong_number_of_ranks():
    schedule = one_f_one_b()
    broken = Schedule(schedule.name, 2, 2, 1, schedule.stage_to_rank, schedule.actions[:1])
    with pytest.raises(ScheduleError, match="one action list per rank"):
        validate_schedule(broken)


# ------------------------------------------------------------------------------------- bad arguments
def test_unknown_schedule_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown pipeline schedule 'pipedream'.*gpipe, 1f1b, interleaved"):
        build_schedule("pipedream", 2, 4)
    with pytest.raises(ValueError, match="choose one of"):
        theoretical_bubble("pipedream", 2, 4)


def test_interleaved_needs_equal_rounds_and_several_chunks():
    with pytest.raises(
        ValueError, match=r"max\(1, m // stages\) = 2 equal rounds: 9 % 2 != 0; microbatch counts that fit: "
                          r"\[5, 6, 7, 8, 10, 12\]"
    ):
        build_schedule("interleaved", 4, 9, 2)
    with pytest.raises(ValueError, match="virtual_stages >= 2"):
        build_schedule("interleaved", 4, 8, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("1f1b", 0, 4), "stages must be an integer >= 1, got 0"),
        (("1f1b", 2, 0), "microbatches must be an integer >= 1, got 0"),
        (("gpipe", 2, 4, 0), "virtual_stages must be an integer >= 1, got 0"),
        (("gpipe", 2, 4, 2),
         "gpipe has one stage per rank; virtual_stages=2 needs interleaved, zbv or dualpipev"),
        (("zbv", 2, 4, 3), "zbv always runs 2 chunks per rank"),
    ],
)
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        build_schedule(*args)


def test_action_names_and_ops():
    assert str(Action("forward", 1, 3)) == "F3@s1"
    assert str(Action("backward_input", 1, 3)) == "Bi3@s1"
    assert str(Action("backward_weight", 1, 3)) == "W3@s1"
    assert str(Action("recv_backward", 0, 2, peer=1)) == "recv_backward B2@s0"
    with pytest.raises(ValueError, match="unknown action op 'fwd'"):
        Action("fwd", 0, 0)


# ------------------------------------------------------------------------------------------ DualPipeV
@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 9), (3, 6), (4, 8), (4, 13), (8, 16)])
def test_dualpipev_bubble_at_unit_times_is_the_papers(p, m):
    """DeepSeek-V3's Table 2: DualPipe idles (PP/2 - 1)(F&B + B - 3W) per device, PP stages on PP/2
    devices (DualPipeV): (p - 1)(F&B + B - 3W) here, in chunk times, on every rank."""
    trace = simulate_schedule(build_schedule("dualpipev", p, m), TIMES)
    f, b, w = TIMES["forward"], TIMES["backward"], TIMES["backward_weight"]
    makespan = trace.step_times()[0]
    for rank in trace.ranks:
        assert makespan - trace.busy_time(rank) == pytest.approx((p - 1) * ((f + b) + b - 3 * w))
    assert simulated_bubble(build_schedule("dualpipev", p, m), TIMES) == pytest.approx(
        theoretical_bubble("dualpipev", p, m))


@pytest.mark.parametrize("saving", [0.5, 1.0])
@pytest.mark.parametrize(("p", "m"), [(2, 6), (4, 8), (4, 12)])
def test_dualpipev_slots_that_hide_communication_shrink_its_bubble_as_the_formula_says(p, m, saving):
    """With F&B shorter than F + B (what a slot hides), the busiest ranks idle exactly (p - 1)(F&B + B - 3W);
    ranks with fewer overlapped slots work longer and idle less."""
    schedule = build_schedule("dualpipev", p, m)
    trace = simulate_schedule(schedule, TIMES, overlap_saving=saving)
    f, b, w = TIMES["forward"], TIMES["backward"], TIMES["backward_weight"]
    idle = [trace.step_times()[0] - trace.busy_time(rank) for rank in trace.ranks]
    assert max(idle) == pytest.approx((p - 1) * ((f + b - saving) + b - 3 * w))
    slots = [sum(a.overlapped for a in actions) for actions in schedule.actions]
    assert idle == pytest.approx([max(idle) - saving * (max(slots) - n) for n in slots])


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 10)])
def test_dualpipev_shape_memory_and_slots(p, m):
    schedule = build_schedule("dualpipev", p, m)
    assert schedule.stage_to_rank == list(range(p)) + list(reversed(range(p)))
    report = validate_schedule(schedule)
    # DeepSeek-V3's Table 2: PP + 1 chunk activations per device (2p stages on p ranks)
    assert report.peak_activations == [2 * p + 1] * p
    keys = {(a.stage, a.microbatch) for acts in schedule.actions for a in acts if a.op == "backward"}
    assert keys and schedule.split_backwards and not keys & schedule.split_backwards  # mixed, never both
    for rank, actions in enumerate(schedule.actions):
        computes = [a for a in actions if a.is_compute]
        for i, a in enumerate(computes):
            if a.overlapped:  # F&B: a forward of one chunk, a full backward of the other, two microbatches
                before = computes[i - 1]
                assert a.op == "backward" and before.op == "forward" and before.stage != a.stage
                assert before.microbatch != a.microbatch
        slots = sum(a.overlapped for a in actions)
        assert slots == 2 * m - 3 * p + rank + 1 - (rank == p - 1)


def test_dualpipev_needs_twice_as_many_microbatches_as_ranks():
    with pytest.raises(ValueError,
                       match=r"dualpipev needs at least as many microbatches as stages \(2 x pp = 8\)"):
        build_schedule("dualpipev", 4, 6)


def test_the_validator_accepts_full_and_split_backwards_in_one_schedule_but_not_for_one_pass():
    """Each (stage, microbatch) is run whole (B) or split (Bi, W): a 1F1B whose last backwards are split,
    as a zero-bubble cool-down would, is valid; a pass both ways, or with Bi and no W, is not."""
    schedule = one_f_one_b()
    for rank, text in ((0, "B1@s0"), (1, "B1@s1")):
        i = find(schedule, rank, text)
        b = schedule.actions[rank][i]
        schedule.actions[rank][i:i + 1] = [Action("backward_input", b.stage, 1),
                                           Action("backward_weight", b.stage, 1)]
    assert validate_schedule(schedule).peak_activations == [2, 1]
    assert simulated_bubble(schedule, TIMES) > 0
    del schedule.actions[1][find(schedule, 1, "W1@s1")]
    with pytest.raises(ScheduleError, match=r"rank 1: missing backward_weight W1@s1"):
        validate_schedule(schedule)


def test_dualpipev_is_torchs_order():
    """paralab's DualPipeV runs, rank by rank, the order torch.distributed.pipelining's ScheduleDualPipeV
    computes (its overlapped F&B as a forward then an overlapped full backward)."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not hasattr(schedules, "ScheduleDualPipeV"):
        pytest.skip("this torch has no ScheduleDualPipeV")
    ops = {"FORWARD": "forward", "FULL_BACKWARD": "backward", "BACKWARD_INPUT": "backward_input",
           "BACKWARD_WEIGHT": "backward_weight"}
    for p, m in ((2, 4), (4, 8), (4, 11)):
        ours = build_schedule("dualpipev", p, m)
        for rank in range(p):
            fake = type("Shape", (), {"pp_group_size": p, "_n_microbatches": m})()
            theirs = []
            for a in schedules.ScheduleDualPipeV._calculate_single_rank_operations(fake, rank):
                for sub, overlapped in ((a.sub_actions[0], False), (a.sub_actions[1], True)) \
                        if a.sub_actions else ((a, False),):
                    theirs.append((ops[sub.computation_type.name], sub.stage_index,
                                   sub.microbatch_index, overlapped))
            mine = [(a.op, a.stage, a.microbatch, a.overlapped) for a in ours.actions[rank] if a.is_compute]
            assert mine == theirs, f"p={p} m={m} rank {rank}"


def test_dualpipev_slots_count_the_orders_overlapped_backwards():
    """The cost model's closed form of DualPipeV's F&B slots, pair by pair, against the order."""
    from paralab.schedules import dualpipev_slots

    for p in range(2, 9):
        for m in range(2 * p, 5 * p + 2):
            schedule = build_schedule("dualpipev", p, m)
            for rank, actions in enumerate(schedule.actions):
                down, up = rank, 2 * p - 1 - rank
                overlapped = [a.stage for a in actions if a.overlapped]
                assert (overlapped.count(up), overlapped.count(down)) == dualpipev_slots(p, m, rank)
