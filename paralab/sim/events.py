"""Discrete-event simulation of a pipeline schedule: the same action lists, modelled durations.

The simulator walks the global order that :func:`paralab.schedules.validate_schedule` proved valid,
so every action is timed after everything it waits for. Each rank runs one action at a time:

- a compute starts when the rank is free and its inputs exist, and takes ``compute_time(action)``;
- a send is issued when the rank reaches it and does not hold the rank (buffered, like ``isend``);
  its tensor lands on the peer ``p2p_time(action)`` later;
- a recv holds the rank from when it is reached until the tensor has landed:
  it completes at max(recv issued, send issued + p2p time).

The result is a :class:`paralab.trace.Trace` shaped like a measured one (compute, comm and step
lanes), so every figure can draw, and compare, either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from paralab.schedules import (
    RECV_BACKWARD,
    RECV_FORWARD,
    SEND_BACKWARD,
    SEND_FORWARD,
    Action,
    Key,
    Schedule,
    dependencies_of,
    key_of,
    validate_schedule,
)
from paralab.trace import COMM, COMPUTE, STEP, Span, Trace

Seconds = float | Callable[[Action], float]


def simulate_schedule(
    schedule: Schedule,
    compute_time: Callable[[Action], float] | Mapping[str, float],
    p2p_time: Seconds = 0.0,
    step: int = 0,
    t0: float = 0.0,
    activation_bytes: int = 0,
) -> Trace:
    """Time one training step of ``schedule`` and return it as a Trace.

    ``compute_time`` maps a compute action to seconds: a callable, or a dict by op such as
    ``{"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}``. ``p2p_time`` is
    the latency from a send's start to when the receiver can use the tensor (seconds, or a callable
    of the send action). ``activation_bytes`` is the size of each activation or gradient sent:
    a send puts it on the wire, a recv puts nothing (its payload is still the tensor).
    The step window is t0..makespan on every rank, so idle time at either end counts as bubble.
    """
    duration = _as_callable(compute_time, "compute_time")
    latency = _as_callable(p2p_time, "p2p_time")
    free_at = [t0] * schedule.stages  # when each rank can start its next action
    finished: dict[Key, float] = {}  # compute: when it ends; send: when its tensor lands on the peer
    spans: list[Span] = []
    waits_for = dependencies_of(schedule)
    for rank, index in validate_schedule(schedule).order:
        action = schedule.actions[rank][index]
        ready = max([free_at[rank]] + [finished[d] for d in waits_for(action)])
        if action.op in (RECV_FORWARD, RECV_BACKWARD):
            # blocking: the rank is held from reaching the recv until the tensor has landed
            span = _comm_span(action, rank, "recv", free_at[rank], ready, 0, activation_bytes, step)
            finished[key_of(action)] = free_at[rank] = ready
        elif action.op in (SEND_FORWARD, SEND_BACKWARD):
            # buffered: the transfer runs on while the rank goes on to its next action
            landed = ready + latency(action)
            span = _comm_span(action, rank, "send", ready, landed, activation_bytes, activation_bytes, step)
            finished[key_of(action)] = landed
        else:
            span = _compute_span(action, rank, ready, duration(action), step)
            finished[key_of(action)] = free_at[rank] = span.end
        spans.append(span)
    makespan = max(free_at + [s.end for s in spans])
    spans += [
        Span(rank, STEP, "step", t0, makespan, name=f"step {step}", step=step) for rank in schedule.ranks
    ]
    meta = {
        "source": "simulated",
        "schedule": schedule.name,
        "stages": schedule.stages,
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
    if callable(value):
        return value
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
        name=str(action).replace("@", " "),  # F3 s1
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
        name=str(action),
        bytes=wire,
        payload_bytes=payload,
        peer=action.peer,
        step=step,
        microbatch=action.microbatch,
        stage=action.stage,
    )
