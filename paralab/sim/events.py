"""Discrete-event simulation of a pipeline schedule: the same action lists, modelled durations.

The simulator walks the global order that :func:`paralab.schedules.validate_schedule` proved valid,
so every action is timed after everything it waits for. Each rank runs one action at a time:

- a compute starts when the rank is free and its inputs exist, and takes ``compute_time(action)``;
- a send is issued when the rank reaches it and does not hold the rank (buffered, like ``isend``);
  its tensor lands on the peer ``p2p_time(action)`` later; with ``blocking_sends`` it holds the
  rank until then (a schedule that waits for each exchange, as Megatron-LM's and DeepSpeed's
  pipeline engines did before they overlapped point-to-point communication);
- a recv holds the rank from when it is reached until the tensor has landed:
  it completes at max(recv issued, send issued + p2p time);
- a backward that shares a slot with the forward before it (``Action.overlapped``, DualPipeV's F&B)
  is ``overlap_saving(action)`` shorter: the communication one pass hides behind the other's compute.

The result is a :class:`paralab.trace.Trace` shaped like a measured one (compute, comm and step
lanes), so every figure can draw, and compare, either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from paralab.config import finite_number
from paralab.cyclic_gc import without_cyclic_gc
from paralab.schedules import (
    RECV_BACKWARD,
    RECV_FORWARD,
    SEND_BACKWARD,
    SEND_FORWARD,
    UNIT_PASSES,
    Action,
    Schedule,
    ScheduleReport,
    validate_schedule,
    validated_schedule,
)
from paralab.trace import COMM, COMPUTE, STEP, Span, Trace

Seconds = float | Callable[[Action], float]


RECV, SEND, COMPUTE_KIND = 0, 1, 2
_KIND = {RECV_FORWARD: RECV, RECV_BACKWARD: RECV, SEND_FORWARD: SEND, SEND_BACKWARD: SEND}


@dataclass(frozen=True)
class Plan:
    """A schedule flattened for timing: its actions in one valid global order, dependencies as indices.

    Proving the order (which also resolves every dependency to the position of what it waits for) is
    the expensive part of a simulation and depends only on the schedule, so built-in schedules are
    compiled once per shape (:func:`builtin_plan`) and each prediction is a single pass over lists.
    """

    schedule: Schedule
    actions: list[Action]
    ranks: list[int]
    kinds: list[int]  # RECV, SEND or COMPUTE_KIND
    deps: list[tuple[int, ...]]  # positions (earlier in the order) each action waits for
    # per action, what its seconds are looked up by: (op, stage) for a compute, else its kind; a
    # prediction times a plan of tens of thousands of actions with one table look-up each
    seconds_keys: list[tuple[str, int] | int]
    overlapped: bool  # whether any backward shares a slot with a forward (DualPipeV's F&B)


def compile_schedule(schedule: Schedule, report: ScheduleReport | None = None) -> Plan:
    """Flatten ``schedule`` into a :class:`Plan` along the order its proof found (``report``, from
    :func:`validate_schedule`; validated here when not given)."""
    if report is None:
        report = validate_schedule(schedule)
    if report.proved is not schedule.actions or len(report.waits) != len(report.order):
        raise ValueError("compile_schedule needs validate_schedule's report of this schedule (its order "
                         "and what each action waits for)")
    actions = [schedule.actions[rank][index] for rank, index in report.order]
    ranks = [rank for rank, _ in report.order]
    kinds = [_KIND.get(action.op, COMPUTE_KIND) for action in actions]
    seconds_keys = [(a.op, a.stage) if k == COMPUTE_KIND else k for a, k in zip(actions, kinds)]
    overlapped = any(a.overlapped for a in actions)
    return Plan(schedule, actions, ranks, kinds, report.waits, seconds_keys, overlapped)


@lru_cache(maxsize=32)
@without_cyclic_gc
def builtin_plan(name: str, stages: int, microbatches: int, virtual_stages: int = 1,
                 pass_times: tuple[float, float, float] = UNIT_PASSES) -> Plan:
    """The compiled plan of a built-in schedule, built and proved once per shape (read-only)."""
    schedule, report = validated_schedule(name, stages, microbatches, virtual_stages, pass_times)
    return compile_schedule(schedule, report)


def run_plan(plan: Plan, seconds: list[float], t0: float = 0.0,
             blocking_sends: bool = False) -> tuple[list[float], list[float]]:
    """Start and end of every action of ``plan``; ``seconds[i]`` is action i's compute time, or its
    send's latency (ignored for a recv). The rules are those of the module docstring."""
    free_at = [t0] * plan.schedule.pp
    finished = [0.0] * len(plan.actions)  # compute: its end; send: when its tensor lands
    starts = [0.0] * len(plan.actions)
    for i, (rank, kind, deps) in enumerate(zip(plan.ranks, plan.kinds, plan.deps)):
        free = free_at[rank]
        ready = free
        for d in deps:
            if finished[d] > ready:
                ready = finished[d]
        if kind == RECV:  # blocking: held from reaching the recv until the tensor has landed
            starts[i], finished[i] = free, ready
            free_at[rank] = ready
        elif kind == SEND:  # buffered: the transfer runs on while the rank goes on (unless blocking)
            starts[i], finished[i] = ready, ready + seconds[i]
            if blocking_sends:
                free_at[rank] = finished[i]
        else:
            starts[i] = ready
            finished[i] = free_at[rank] = ready + seconds[i]
    return starts, finished


def plan_seconds(plan: Plan, compute_time: Callable[[Action], float], p2p_time: Callable[[Action], float],
                 overlap_saving: Callable[[Action], float] = lambda a: 0.0) -> list[float]:
    """Per action of ``plan``: compute seconds (an overlapped backward less what its slot hides), a
    send's latency, or 0 for a recv."""
    return [
        (max(compute_time(a) - (overlap_saving(a) if a.overlapped else 0.0), 0.0) if k == COMPUTE_KIND
         else p2p_time(a) if k == SEND else 0.0)
        for a, k in zip(plan.actions, plan.kinds)
    ]


def simulate_schedule(
    schedule: Schedule,
    compute_time: Callable[[Action], float] | Mapping[str, float],
    p2p_time: Seconds = 0.0,
    step: int = 0,
    t0: float = 0.0,
    activation_bytes: int = 0,
    plan: Plan | None = None,
    overlap_saving: Seconds = 0.0,
    blocking_sends: bool = False,
) -> Trace:
    """Time one training step of ``schedule`` and return it as a Trace.

    ``compute_time`` maps a compute action to seconds: a callable, or a dict by op such as
    ``{"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}``. ``p2p_time`` is
    the latency from a send's start to when the receiver can use the tensor (seconds, or a callable
    of the send action). ``activation_bytes`` is the size of each activation or gradient sent:
    a send puts it on the wire, a recv puts nothing (its payload is still the tensor).
    ``plan``: the schedule already compiled (:func:`builtin_plan`), to skip validating it again.
    ``overlap_saving``: seconds an overlapped F&B slot saves (seconds, or a callable of its backward).
    ``blocking_sends``: a send holds its rank until its tensor has landed.
    The step window is t0..makespan on every rank, so idle time at either end counts as bubble.
    """
    plan = plan or compile_schedule(schedule)
    seconds = plan_seconds(plan, _as_callable(compute_time, "compute_time"),
                           _as_callable(p2p_time, "p2p_time"), _as_callable(overlap_saving, "overlap_saving"))
    starts, ends = run_plan(plan, seconds, t0, blocking_sends)
    spans: list[Span] = []
    for action, rank, kind, start, end in zip(plan.actions, plan.ranks, plan.kinds, starts, ends):
        if kind == RECV:
            spans.append(_comm_span(action, rank, "recv", start, end, 0, activation_bytes, step))
        elif kind == SEND:
            spans.append(_comm_span(action, rank, "send", start, end, activation_bytes,
                                    activation_bytes, step))
        else:
            spans.append(_compute_span(action, rank, start, end - start, step))
    makespan = max([t0, *ends])
    spans += [
        Span(rank, STEP, "step", t0, makespan, name=f"step {step}", step=step) for rank in schedule.ranks
    ]
    meta = {
        "source": "simulated",
        "schedule": schedule.name,
        "stages": schedule.pp,
        "microbatches": schedule.microbatches,
        "virtual_stages": schedule.virtual_stages,
    }
    return Trace(spans=sorted(spans, key=lambda s: (s.start, s.rank)), meta=meta)


def simulated_bubble(
    schedule: Schedule, compute_time: Callable[[Action], float] | Mapping[str, float], p2p_time: Seconds = 0.0
) -> float:
    """Idle fraction of one simulated step (Trace.bubble_fraction over its single step)."""
    return simulate_schedule(schedule, compute_time, p2p_time).bubble_fraction()


def _as_callable(value, label: str) -> Callable[[Action], float]:
    """``value`` as seconds by action. Times given as numbers must be finite and >= 0: a negative or
    NaN time had timed a step all the same (a bubble of 0.08 or 0 where the schedule's is 0.2)."""
    if callable(value):
        return value
    for seconds in value.values() if isinstance(value, Mapping) else [value]:
        if not (finite_number(seconds) and seconds >= 0):
            raise ValueError(f"{label} must be seconds, finite and >= 0, got {value!r}")
    if isinstance(value, Mapping):

        def by_op(action: Action) -> float:
            if action.op not in value:
                raise KeyError(
                    f"{label} has no time for {action.op!r} (needed by {action}); give one of {sorted(value)}"
                )
            return float(value[action.op])

        return by_op
    constant = float(value)
    return lambda action: constant


def _compute_span(action: Action, rank: int, start: float, seconds: float, step: int) -> Span:
    return Span(
        rank,
        COMPUTE,
        action.op,
        start,
        start + seconds,
        name=action.label,  # F3 s1
        step=step,
        microbatch=action.microbatch,
        stage=action.stage,
    )


def _comm_span(
    action: Action, rank: int, kind: str, start: float, end: float, wire: int, payload: int, step: int
) -> Span:
    return Span(
        rank,
        COMM,
        kind,
        start,
        end,
        name=f"{kind} {action.label}",  # "send F3 s1", as a measured run names it
        bytes=wire,
        payload_bytes=payload,
        peer=action.peer,
        step=step,
        microbatch=action.microbatch,
        stage=action.stage,
    )
