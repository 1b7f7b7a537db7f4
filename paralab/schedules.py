"""Pipeline schedules as data: one list of actions per rank, a validator, and closed-form bubbles.

A schedule says, for every rank, in which order it runs forwards, backwards and the point-to-point
sends and receives that carry activations down the pipeline and gradients back up. The same lists
are run three ways: by the executor on real ranks (paralab.strategies.pipeline), by the event
simulator with modelled durations (paralab.sim.events), and by :func:`validate_schedule`, which
proves that they are complete, respect every data dependency and cannot deadlock.

Vocabulary. The model is cut into ``S = p x v`` *stages* (p ranks, v virtual stages or "model chunks"
per rank); ``stage_to_rank`` says where each stage lives. A *microbatch* is one of the m slices of
the batch. ``F`` is a forward, ``B`` a full backward (input and weight gradients), and zero-bubble
schedules split it into ``Bi`` (backward_input, the gradient for the stage's input, which the
previous stage waits for) and ``W`` (backward_weight, the weight gradient nobody waits for).

Communication model. Sends never block (they are buffered, like ``isend``); a receive blocks until
the matching send has been issued. Each compute action that needs another rank's data is preceded,
in its rank's list, by the receive, and each output that another rank needs is followed by the send.
Stages that follow each other on the same rank (zbv) hand over locally, without send or receive.
Under this model a schedule is deadlock-free exactly when the per-rank orders admit a global order
in which every action comes after what it waits for, which is what the validator searches for.

Sources: GPipe (Huang et al., 2019); PipeDream-Flush / 1F1B and the interleaved schedule (Narayanan
et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2021);
zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023), the V-shape schedule
(Qi et al., "Pipeline Parallelism with Controllable Memory", 2024) and DualPipeV, the V-placed half of
DeepSeek-V3's DualPipe (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, sec. 3.2.1).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

FORWARD, BACKWARD = "forward", "backward"
BACKWARD_INPUT, BACKWARD_WEIGHT = "backward_input", "backward_weight"
SEND_FORWARD, RECV_FORWARD = "send_forward", "recv_forward"
SEND_BACKWARD, RECV_BACKWARD = "send_backward", "recv_backward"
COMPUTE_OPS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
COMM_OPS = (SEND_FORWARD, RECV_FORWARD, SEND_BACKWARD, RECV_BACKWARD)
OPS = COMPUTE_OPS + COMM_OPS

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev")
V_SHAPED = ("zbv", "dualpipev")  # two chunks per rank, placed down the ranks and back up
SPLIT_BACKWARD = ("zb-h1", "zbv", "dualpipev")  # backwards split into Bi and a deferred W
DEFAULT_SCHEDULE = "1f1b"  # what a pipeline runs when no schedule is named
UNIT_PASSES = (1.0, 1.0, 1.0)  # a chunk's (F, Bi, W) times that ZB-V's order assumes unless told

# a pass is named by its letter, microbatch and stage: "F3 s1"
PASS_LETTERS = {FORWARD: "F", BACKWARD: "B", BACKWARD_INPUT: "Bi", BACKWARD_WEIGHT: "W"}


def pass_label(letter: str, microbatch: int, stage: int | None = None) -> str:
    """How a trace labels a pass or a transfer: "F3 s1", microbatch 3's forward on stage 1 ("F3" where
    the stage is not known)."""
    return f"{letter}{microbatch}" + (f" s{stage}" if stage is not None else "")
# A send matches the receive of the neighbouring stage: (op on the peer, stage offset).
_COUNTERPART = {
    SEND_FORWARD: (RECV_FORWARD, +1),
    RECV_FORWARD: (SEND_FORWARD, -1),
    SEND_BACKWARD: (RECV_BACKWARD, -1),
    RECV_BACKWARD: (SEND_BACKWARD, +1),
}
Key = tuple[str, int, int]  # (op, stage, microbatch): names one action of a complete schedule
Crossing = tuple[str, int]  # (op, peer rank) of the recv or send that carries a pass's data across ranks


class ScheduleError(ValueError):
    """A schedule that is incomplete, breaks a dependency, has unmatched send/recv, or deadlocks."""


@dataclass(frozen=True)
class Action:
    """One step of one rank: a compute on ``stage`` for ``microbatch``, or a send/recv with ``peer``.

    Send and receive actions carry the *local* stage they serve: ``send_forward`` the stage that
    produced the activation, ``recv_forward`` the stage that consumes it (so ``send_forward`` of stage
    s pairs with ``recv_forward`` of stage s+1 on the peer, and the backward pair the other way).

    ``overlapped``: a backward that shares one slot with the forward right before it on its rank
    (DualPipeV's F&B): the slot waits for both inputs, and one pass's communication can hide behind
    the other's compute. It runs after that forward, so the order, and every proof, is unchanged.
    """

    op: str
    stage: int
    microbatch: int
    peer: int | None = None
    overlapped: bool = False

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown action op {self.op!r}; choose one of: {', '.join(OPS)}")

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @property
    def label(self) -> str:
        """"F3 s1": the pass (a send's or receive's direction), the microbatch and the stage, as a
        trace names the action's span, measured or simulated ("send F3 s1" for a send)."""
        return pass_label(self._letter, self.microbatch, self.stage)

    @property
    def _letter(self) -> str:
        if self.is_compute:
            return PASS_LETTERS[self.op]
        return "F" if self.op.endswith("forward") else "B"

    def __str__(self) -> str:
        said = f"{self._letter}{self.microbatch}@s{self.stage}"
        return said if self.is_compute else f"{self.op} {said}"


@dataclass
class Schedule:
    """Per-rank action lists plus the shape they were built for: ``pp`` ranks, ``microbatches``,
    ``virtual_stages`` chunks per rank (so ``num_stages`` = pp x virtual_stages stages)."""

    name: str
    pp: int
    microbatches: int
    virtual_stages: int
    stage_to_rank: list[int]
    actions: list[list[Action]]

    @property
    def ranks(self) -> list[int]:
        return list(range(self.pp))

    @property
    def num_stages(self) -> int:
        """S = p x v: the number of model pieces, each on one rank."""
        return self.pp * self.virtual_stages

    @property
    def is_split_backward(self) -> bool:
        """True when any backward is split into Bi (input grad) then W (weight grad): zero-bubble
        schedules, and DualPipeV, which splits some and runs the others whole."""
        return bool(self.split_backwards)

    @property
    def split_backwards(self) -> set[tuple[int, int]]:
        """The (stage, microbatch) pairs whose backward is split into Bi and W."""
        return {(a.stage, a.microbatch) for acts in self.actions for a in acts if a.op == BACKWARD_INPUT}

    def stages_on(self, rank: int) -> list[int]:
        """The global stages (model chunks) that live on ``rank``, in model order."""
        return [s for s, r in enumerate(self.stage_to_rank) if r == rank]


@dataclass
class ScheduleReport:
    """What :func:`validate_schedule` proved.

    ``peak_activations[r]``: the most (stage, microbatch) activations rank r holds at once. An
    activation is stored by its forward and released when the last pass that reads it ends: the full
    backward, or, for split schedules, the weight-gradient pass W (W multiplies the stored input by the
    output gradient, so the input must survive B; Qi et al. 2023, Table 1 — B does free part of the
    memory, which this whole-activation count does not credit).
    ``order``: every (rank, index into that rank's list) in one valid global execution order.
    ``waits``: for each entry of ``order``, the positions in ``order`` of the actions it waits for.
    ``proved``: the action lists proved (the schedule's own, not a copy), which ``order`` indexes.
    """

    peak_activations: list[int]
    order: list[tuple[int, int]] = field(default_factory=list)
    waits: list[tuple[int, ...]] = field(default_factory=list)
    proved: list[list[Action]] | None = field(default=None, repr=False)


# ---------------------------------------------------------------------------------------------- build
def build_schedule(name: str, pp: int, microbatches: int, virtual_stages: int = 1,
                   pass_times: tuple[float, float, float] = UNIT_PASSES) -> Schedule:
    """Build the named schedule for ``pp`` ranks and ``microbatches`` microbatches.

    ``naive``: layer-wise model parallelism, one microbatch through the whole model and back before
    the next, so exactly one rank works at any time. ``gpipe``: all forwards, then all backwards.
    ``1f1b``: PipeDream-Flush. ``interleaved``: Megatron's 1F1B over v model chunks per rank (in rounds
    of p microbatches, or of m / max(1, m // p) when p does not divide m).
    ``zb-h1``: zero-bubble H1, 1F1B memory with split backward. ``zbv``: the V-shape zero-bubble
    schedule with two chunks per rank, ordered for a chunk's (F, Bi, W) durations ``pass_times``
    (equal by default; the simulator passes its own, as Qi et al. order it with profiled times).
    ``dualpipev``: DeepSeek's DualPipeV on the same V, a forward and a backward of two microbatches
    sharing each steady-state slot (needs microbatches >= 2 pp).
    """
    _check_shape_args(name, pp, microbatches, virtual_stages)
    if len(pass_times) != 3 or not all(isinstance(t, int | float) and 0 < t < math.inf for t in pass_times):
        raise ScheduleError(f"pass_times must be three positive times (F, Bi, W), got {pass_times}")
    p, m = pp, microbatches
    if name == "interleaved":
        v = virtual_stages
        stage_to_rank = [s % p for s in range(p * v)]
        compute = [interleaved_order(p, m, v, r) for r in range(p)]
    elif name in V_SHAPED:
        v = 2
        stage_to_rank = list(range(p)) + list(reversed(range(p)))
        compute = (_zbv(p, m, stage_to_rank, pass_times) if name == "zbv"
                   else [_dualpipev(p, m, r) for r in range(p)])
    else:
        v = 1
        stage_to_rank = list(range(p))
        builder = {"naive": _naive, "gpipe": _gpipe, "1f1b": _one_f_one_b, "zb-h1": _zb_h1}[name]
        compute = [builder(p, m, r) for r in range(p)]
    actions = [_with_p2p(order, stage_to_rank) for order in compute]
    return Schedule(name, p, m, v, stage_to_rank, actions)


def chunks_per_rank(name: str, virtual_stages: int = 1) -> int:
    """Model chunks each rank holds under schedule ``name``: the V-shaped ones (zbv, dualpipev) always
    two, interleaved the ``virtual_stages`` asked for, every other schedule one."""
    return 2 if name in V_SHAPED else virtual_stages


def shape_problems(name: str, pp: int, microbatches: int, virtual_stages: int = 1,
                   sequences: int | None = None) -> list[str]:
    """Every reason schedule ``name`` cannot be built for ``pp`` ranks, ``microbatches`` and
    ``virtual_stages`` chunks per rank (empty when it can). The one statement of the schedules'
    shape rules: the builder, the run configuration, the simulator and the widgets all ask it. The
    counts a refusal suggests also divide ``sequences`` (a replica's step), when given: a batch of 10
    had been offered 3, 4 and 6, each then refused for it."""
    if name not in SCHEDULES:
        return [f"unknown pipeline schedule {name!r}; choose one of: {', '.join(SCHEDULES)}"]
    out = [f"{label} must be an integer >= 1, got {value!r}"
           for label, value in (("stages", pp), ("microbatches", microbatches),
                                ("virtual_stages", virtual_stages))
           if not isinstance(value, int) or value < 1]
    if out:
        return out
    if name == "interleaved":
        if virtual_stages < 2:
            out.append("interleaved needs virtual_stages >= 2 (with one chunk per rank it is 1f1b)")
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            candidates = (range(max(1, microbatches - pp), microbatches + pp + 1) if sequences is None
                          else [k for k in range(1, sequences + 1) if sequences % k == 0])
            fits = [k for k in candidates if k % max(1, k // pp) == 0]
            out.append(f"interleaved runs the microbatches in max(1, m // stages) = {rounds} equal rounds: "
                       f"{microbatches} % {rounds} != 0; microbatch counts that fit: {fits}")
    elif name in V_SHAPED:
        if virtual_stages not in (1, 2):
            out.append(f"{name} always runs 2 chunks per rank; virtual_stages must be 2 (or 1), "
                       f"got {virtual_stages}")
        if name == "dualpipev" and microbatches < 2 * pp:
            out.append(f"dualpipev needs at least as many microbatches as stages (2 x pp = {2 * pp}), got "
                       f"{microbatches}: its warm-up fills both arms of the V "
                       "before the first overlapped slot")
    elif virtual_stages != 1:
        *others, last = ("interleaved", *V_SHAPED)
        out.append(f"{name} has one stage per rank; virtual_stages={virtual_stages} needs "
                   f"{', '.join(others)} or {last}")
    return out


def _check_shape_args(name: str, pp: int, microbatches: int, virtual_stages: int) -> None:
    problems = shape_problems(name, pp, microbatches, virtual_stages)
    if problems:
        raise ValueError(problems[0])


def _naive(p: int, m: int, rank: int) -> list[Action]:
    """Each microbatch's forward then backward: the next forward waits for the whole round trip."""
    return [Action(op, rank, i) for i in range(m) for op in (FORWARD, BACKWARD)]


def _gpipe(p: int, m: int, rank: int) -> list[Action]:
    """GPipe: every forward, then every backward, so all m activations are held at the peak."""
    return [Action(FORWARD, rank, i) for i in range(m)] + [Action(BACKWARD, rank, i) for i in range(m)]


def _one_f_one_b(p: int, m: int, rank: int) -> list[Action]:
    """PipeDream-Flush: a rank holds at most p - rank activations instead of GPipe's m."""
    # warm-up: fill the pipeline so the last stage can start its first backward.
    warmup = min(p - rank - 1, m)
    order = [Action(FORWARD, rank, i) for i in range(warmup)]
    for i in range(m - warmup):
        # steady: one forward, one backward; each backward frees the activation of its microbatch.
        order += [Action(FORWARD, rank, warmup + i), Action(BACKWARD, rank, i)]
    # cool-down: drain the backwards still owed to the microbatches in flight.
    order += [Action(BACKWARD, rank, i) for i in range(m - warmup, m)]
    return order


def interleaved_round(pp: int, microbatches: int) -> int:
    """Microbatches that go through the chunks together in the interleaved schedule: the stages (p),
    Megatron's round, when they divide the microbatches; else the microbatches split into
    max(1, m // p) equal rounds (torch's relaxation: m = 1, 2, p - 1, 10 on 4 ranks all run)."""
    return microbatches // max(1, microbatches // pp)


def interleaved_order(p: int, m: int, v: int, rank: int) -> list[Action]:
    """Megatron's interleaved 1F1B: rank r holds stages r, r + p, ..., r + (v-1)p.

    Microbatches go through the chunks in rounds of g (:func:`interleaved_round`, p when p divides m):
    the k-th forward of a rank runs chunk (k // g) % v on microbatch (k // gv) g + k % g, and
    backwards visit the chunks in reverse. The warm-up is longer than 1F1B's, 2(p - rank - 1) + (v - 1)g
    forwards: microbatch 0 must pass through all v chunks of every rank before the first backward can
    start, on the last chunk.
    """
    total, g = m * v, interleaved_round(p, m)

    def action(op: str, k: int) -> Action:
        chunk = (k // g) % v
        if op == BACKWARD:
            chunk = v - 1 - chunk
        return Action(op, chunk * p + rank, (k // (g * v)) * g + k % g)

    warmup = min(2 * (p - rank - 1) + (v - 1) * g, total)
    order = [action(FORWARD, k) for k in range(warmup)]  # warm-up
    for k in range(total - warmup):  # steady: one forward, one backward
        order += [action(FORWARD, warmup + k), action(BACKWARD, k)]
    order += [action(BACKWARD, k) for k in range(total - warmup, total)]  # cool-down
    return order


def _zb_h1(p: int, m: int, rank: int) -> list[Action]:
    """Zero-bubble H1 (Qi et al. 2023): 1F1B with the backward split into Bi and W.

    Bi is all the previous stage waits for, so it runs as early as 1F1B's backward would and the
    gradient races up the pipeline; W is deferred. Rank r runs the W of microbatch j after the Bi of
    j + r: the last rank defers the most, so its final Bi (which the whole cool-down waits on) comes
    early, and every rank ends with its deferred Ws filling what was 1F1B's cool-down bubble. Each
    rank holds at most p microbatches between F and W, the first rank's 1F1B peak.
    """
    warmup = min(p - rank, m)  # 1F1B's warm-up plus its first steady forward
    order = [Action(FORWARD, rank, i) for i in range(warmup)]
    for j in range(m):
        # steady (and, once the forwards run out, cool-down): Bi, a deferred W, the next F.
        order.append(Action(BACKWARD_INPUT, rank, j))
        if j >= rank:
            order.append(Action(BACKWARD_WEIGHT, rank, j - rank))
        if warmup + j < m:
            order.append(Action(FORWARD, rank, warmup + j))
    # cool-down tail: the Ws still deferred fill the bubble 1F1B leaves here.
    order += [Action(BACKWARD_WEIGHT, rank, j) for j in range(max(m - rank, 0), m)]
    return order


def _zbv(p: int, m: int, stage_to_rank: list[int], pass_times: tuple[float, float, float] = UNIT_PASSES
         ) -> list[list[Action]]:
    """V-shape zero bubble (Qi et al. 2024): rank r holds stage r and stage 2p - 1 - r.

    The forward runs down the ranks through chunk 0 and back up through chunk 1, so rank 0 holds
    both the first and the last stage and the backward starts where the forward began. The order is
    found by list scheduling (:func:`_zbv_list_order`) with a chunk's pass times ``pass_times`` =
    (t_F, t_Bi, t_W), equal unless given (an order found for equal times leaves gaps when the real
    passes differ). Like Qi et al., who try several heuristics and keep the fastest, it finds an
    order by each of three rules and keeps the one that ends first: a Bi first, the input gradient
    the previous stage waits for; or a forward first whenever the memory allows it and, when only
    the memory holds a forward back, a W to free it (on 8 ranks with 9 microbatches, Bi 1.4 and W
    0.6 of F, the first rule's last microbatch waited at the V's tip for the others' backwards, and
    the step ran 40% past the bound below against 12%); the latter also with one activation kept
    for chunk 1's forwards (an eager chunk 0 can fill a rank's limit and hold up the V's return).
    The rules after the first are not tried once one ends at the bound no order beats: the last
    rank's work after the p - 1 forwards it waits for. Pass times that stall every search get the
    order found for equal times. The searches name passes by their keys; only the order kept becomes
    :class:`Action` objects (making one costs about as much as choosing it).
    """
    t_f, t_bi, t_w = pass_times
    bound = (p - 1) * t_f + 2 * m * (t_f + t_bi + t_w)
    found = []
    for forward_first, reserve in ((False, 0), (True, 0), (True, 1)):
        if any(end <= bound * (1 + 1e-9) for _, end in found):
            break
        if (order := _zbv_list_order(p, m, stage_to_rank, pass_times, forward_first, reserve)) is not None:
            found.append(order)
    if found:
        fastest = min(found, key=lambda order_and_end: order_and_end[1])[0]
        return [[Action(*key) for key in order] for order in fastest]
    if pass_times == UNIT_PASSES:
        raise AssertionError(f"ZB-V's list scheduling stalled at p={p}, m={m} with equal passes")
    return _zbv(p, m, stage_to_rank)


def _zbv_list_order(p: int, m: int, stage_to_rank: list[int], pass_times: tuple[float, float, float],
                    forward_first: bool, reserve: int) -> tuple[list[list[Key]], float] | None:
    """ZB-V's order by list scheduling, as the keys of each rank's passes, and when it ends; None if
    the search stalls.

    Whenever a rank is free it runs one of the passes whose inputs are ready, an F only while it
    holds fewer than 2p chunk activations (p whole-rank activations: 1F1B's first-rank peak),
    ``reserve`` of them kept for chunk 1's forwards: a Bi first (it unblocks the previous stage), else
    an F, else a W to fill the gap; with ``forward_first``, an F the memory allows before anything,
    and a W before anything when only the memory holds an F back. Earlier microbatches and deeper
    stages first. Consecutive passes of a stage run their microbatches in order. Some pass times
    stall a search (on two ranks, a W much shorter than Bi lets a rank fill its limit with forwards
    that the V's turn, on the same rank, then cannot pass).

    Kept linear in the 6pm passes with a small constant, as :func:`_zbv` runs it up to three times a
    build (18,432 passes each at p = 16, m = 192, a 1,024-GPU shape): each stage runs its F, Bi and W
    in microbatch order, so a rank only ever chooses among the next pass of each kind on each of its
    two stages, and whether one is ready is a look-up of when the passes it reads end, kept in a list
    per stage and kind.
    """
    num_stages, limit = 2 * p, 2 * p
    last_stage = num_stages - 1
    t_forward, t_input_grad, t_weight = pass_times
    # When each F and Bi ends, by stage then microbatch (inf until placed): what the passes that read
    # them wait for. Nothing reads a W.
    forward_end = [[math.inf] * m for _ in range(num_stages)]
    input_grad_end = [[math.inf] * m for _ in range(num_stages)]
    # the microbatch each stage's next F, Bi and W is for
    next_forward, next_input_grad, next_weight = [0] * num_stages, [0] * num_stages, [0] * num_stages
    # A rank's stages, deepest first: of two passes of one kind for the same microbatch the deeper
    # stage's runs, so a later stage replaces an earlier pick only with a smaller microbatch.
    stages_deepest_first = [sorted((s for s in range(num_stages) if stage_to_rank[s] == rank), reverse=True)
                            for rank in range(p)]
    # a forward of the stage runs only while its rank holds fewer activations than this
    forward_room = [limit - reserve if s < p else limit for s in range(num_stages)]
    # the ranks whose passes the end of a pass of the stage can make ready: its own and its neighbours'
    wakes = [{stage_to_rank[n] for n in (s - 1, s, s + 1) if 0 <= n < num_stages} for s in range(num_stages)]
    orders: list[list[Key]] = [[] for _ in range(p)]
    alive, free_at = [0] * p, [0.0] * p
    running: list[tuple[float, int]] = []  # (end, stage) of each pass under way
    t, woken, left = 0.0, set(range(p)), 3 * num_stages * m
    while left:
        # only a rank whose pass just ended, or whose neighbour's did, can have a new pass ready
        for rank in sorted(woken):
            if free_at[rank] > t:
                continue
            # the ready pass of each kind that runs first, by its key
            forward = input_grad = weight = None
            forward_inputs_ready = False  # an F has its input, whether or not the memory lets it run
            for s in stages_deepest_first[rank]:
                mb = next_forward[s]
                if mb < m and (s == 0 or forward_end[s - 1][mb] <= t):
                    forward_inputs_ready = True
                    if alive[rank] < forward_room[s] and (forward is None or mb < forward[2]):
                        forward = (FORWARD, s, mb)
                mb = next_input_grad[s]
                if (mb < m and forward_end[s][mb] <= t and (s == last_stage or input_grad_end[s + 1][mb] <= t)
                        and (input_grad is None or mb < input_grad[2])):
                    input_grad = (BACKWARD_INPUT, s, mb)
                mb = next_weight[s]
                if mb < m and input_grad_end[s][mb] <= t and (weight is None or mb < weight[2]):
                    weight = (BACKWARD_WEIGHT, s, mb)
            if forward_first and forward_inputs_ready:
                # an F the memory allows before anything, else a W to free the memory an F waits for
                chosen = forward or weight or input_grad
            else:
                chosen = input_grad or forward or weight
            if chosen is None:
                continue
            orders[rank].append(chosen)
            op, stage, mb = chosen
            if op == FORWARD:
                next_forward[stage] += 1
                end = forward_end[stage][mb] = t + t_forward
                alive[rank] += 1
            elif op == BACKWARD_INPUT:
                next_input_grad[stage] += 1
                end = input_grad_end[stage][mb] = t + t_input_grad
            else:
                next_weight[stage] += 1
                end = t + t_weight
                alive[rank] -= 1
            free_at[rank] = end
            heapq.heappush(running, (end, stage))
            left -= 1
        if not running:  # passes left and none under way: stalled
            return None
        t, woken = running[0][0], set()
        while running and running[0][0] == t:  # the next passes to end
            woken |= wakes[heapq.heappop(running)[1]]
    return orders, max(free_at)


def dualpipev_slots(p: int, m: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s F&B slots in DualPipeV's order (:func:`_dualpipev`'s phases 4 and 5), as
    (forward down the V beside the up chunk's backward, forward up beside the down chunk's backward):
    the tip's first pair has nothing to overlap. The cost model's closed form of what the slots hide;
    the tests hold it against the order."""
    return m - 2 * p + rank + 1 - (rank == p - 1), m - p


def _dualpipev(p: int, m: int, rank: int) -> list[Action]:
    """DualPipeV (DeepSeek-V3 report; torch's ScheduleDualPipeV): the V of zbv, rank r holding chunk
    0 = stage r and chunk 1 = stage 2p - 1 - r, run in eight phases. Each steady slot pairs the
    forward of one chunk with the full backward of the other, on two different microbatches (F&B), so
    that one's communication (expert parallel's all-to-all, above all) hides behind the other's
    compute. The ends split their backwards as zero-bubble schedules do: Bi as soon as it can run, W
    (first in, first out) where the rank would otherwise wait. Needs m >= 2p.
    """
    down, up = rank, 2 * p - 1 - rank
    order: list[Action] = []
    done = {(op, s): 0 for op in (FORWARD, BACKWARD_INPUT) for s in (down, up)}  # next microbatch per pass
    weights: deque = deque()  # Bi's whose W is still owed

    def take(op: str, stage: int) -> int:
        mb = done[(FORWARD if op == FORWARD else BACKWARD_INPUT, stage)]
        done[(FORWARD if op == FORWARD else BACKWARD_INPUT, stage)] += 1
        return mb

    def forward(stage):
        order.append(Action(FORWARD, stage, take(FORWARD, stage)))

    def backward(stage, split: bool, overlapped: bool = False):
        mb = take(BACKWARD, stage)
        order.append(Action(BACKWARD_INPUT if split else BACKWARD, stage, mb, overlapped=overlapped))
        if split:
            weights.append((stage, mb))

    def weight():
        if weights:
            order.append(Action(BACKWARD_WEIGHT, *weights.popleft()))

    def slot(forward_stage, backward_stage):  # F&B: a forward and another microbatch's backward
        forward(forward_stage)
        backward(backward_stage, split=False, overlapped=True)

    for _ in range(2 * (p - rank - 1)):  # 1: the first arm fills, deepest ranks last
        forward(down)
    for _ in range(rank + 1):  # 2: both arms fill
        forward(down)
        forward(up)
    for _ in range(p - rank - 1):  # 3: the first backwards come back up the V, zero-bubble style
        backward(up, split=True)
        weight()
        forward(up)
    for i in range(m - 2 * p + rank + 1):  # 4: steady state, two F&B slots per round
        if i == 0 and rank == p - 1:  # the tip's first pair has nothing to overlap yet
            forward(down)
            backward(up, split=False)
        else:
            slot(down, up)
        slot(up, down)
    for _ in range(p - rank - 1):  # 5: the forwards run out
        backward(up, split=False)
        slot(up, down)
    split = False
    for i in range(rank + 1):  # 6: cool-down; from half-way on, backwards split to fill the tail
        if i == (rank + 1) // 2 and rank % 2:
            split = True
        backward(up, split)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        backward(down, split)
    for _ in range(p - rank - 1):  # 7: deferred weights between the last input gradients
        weight()
        backward(down, split)
    while weights:  # 8: the weights still owed
        weight()
    return order


def _data_deps(action: Action, num_stages: int) -> list[tuple[str | None, int, int]]:
    """The computes whose results a compute reads, as keys; an op of None is the pass that makes the
    next stage's input gradient, which only the microbatch can tell (Bi where it is split, else B).

    A forward reads the previous stage's output; a backward (or Bi) reads its own forward's stored
    activation and the next stage's input gradient; W reads what its Bi left.
    """
    s, mb = action.stage, action.microbatch
    if action.op == FORWARD:
        return [(FORWARD, s - 1, mb)] if s > 0 else []
    if action.op == BACKWARD_WEIGHT:
        return [(BACKWARD_INPUT, s, mb)]
    return [(FORWARD, s, mb)] + ([(None, s + 1, mb)] if s < num_stages - 1 else [])


def _input_stage(action: Action, num_stages: int) -> int | None:
    """The stage whose output this compute consumes (None for the first forward or the loss end)."""
    if action.op == FORWARD and action.stage > 0:
        return action.stage - 1
    if action.op in (BACKWARD, BACKWARD_INPUT) and action.stage < num_stages - 1:
        return action.stage + 1
    return None


def _output_stage(action: Action, num_stages: int) -> int | None:
    """The stage that consumes this compute's output (None when nothing flows on)."""
    if action.op == FORWARD and action.stage < num_stages - 1:
        return action.stage + 1
    if action.op in (BACKWARD, BACKWARD_INPUT) and action.stage > 0:
        return action.stage - 1
    return None


def _with_p2p(order: list[Action], stage_to_rank: list[int]) -> list[Action]:
    """Put the recv right before each compute that needs remote data and the send right after.

    Receiving as late as possible and sending as early as possible is what makes a compute order
    that is itself consistent deadlock-free under buffered sends. An overlapped slot (F, then a
    backward marked ``overlapped``) receives both inputs before it and sends both outputs after it.
    """
    crossings = _crossings(tuple(stage_to_rank))
    out: list[Action] = []
    for i, action in enumerate(order):
        if action.overlapped:
            continue  # placed with the forward it shares a slot with
        slot = (action, order[i + 1]) if i + 1 < len(order) and order[i + 1].overlapped else (action,)
        for a in slot:
            if recv := crossings[(a.op, a.stage)][0]:
                out.append(Action(recv[0], a.stage, a.microbatch, recv[1]))
        out += slot
        for a in slot:
            if send := crossings[(a.op, a.stage)][1]:
                out.append(Action(send[0], a.stage, a.microbatch, send[1]))
    return out


@lru_cache(maxsize=64)
def _crossings(stage_to_rank: tuple[int, ...]
               ) -> dict[tuple[str, int], tuple[Crossing | None, Crossing | None]]:
    """For each compute (op, stage) of a placement: the recv it needs right before it and the send
    right after it, each as (op, peer), or None where its input (output) stays on its rank or there
    is none. Placing the p2p actions and checking them then costs a look-up an action, not a walk
    of the data flow (the table is shared: read-only)."""
    num_stages = len(stage_to_rank)
    table = {}
    for stage, rank in enumerate(stage_to_rank):
        for op in COMPUTE_OPS:
            action, forward = Action(op, stage, 0), op == FORWARD
            source, target = _input_stage(action, num_stages), _output_stage(action, num_stages)
            recv = send = None
            if source is not None and stage_to_rank[source] != rank:
                recv = (RECV_FORWARD if forward else RECV_BACKWARD, stage_to_rank[source])
            if target is not None and stage_to_rank[target] != rank:
                send = (SEND_FORWARD if forward else SEND_BACKWARD, stage_to_rank[target])
            table[(op, stage)] = (recv, send)
    return table


# ------------------------------------------------------------------------------------------- validate
def _describe(key: Key) -> str:
    return str(Action(*key))


def validate_schedule(schedule: Schedule) -> ScheduleReport:
    """Prove that ``schedule`` is complete, well paired, dependency-respecting and deadlock-free.

    Runs the per-rank lists as the executor would (sends never block, a recv waits for its send,
    a compute waits for its inputs) and raises :class:`ScheduleError` naming the rank and action at
    the first problem found.
    """
    _check_placement(schedule)
    counts = Counter((a.op, a.stage, a.microbatch) for actions in schedule.actions for a in actions)
    _check_complete(schedule, counts)
    _check_pairs(schedule, counts)
    order, waits = _execution_order(schedule)
    return ScheduleReport(peak_activations=_peak_activations(schedule), order=order, waits=waits,
                          proved=schedule.actions)


@lru_cache(maxsize=32)
def validated_schedule(
    name: str, pp: int, microbatches: int, virtual_stages: int = 1,
    pass_times: tuple[float, float, float] = UNIT_PASSES,
) -> tuple[Schedule, ScheduleReport]:
    """A built-in schedule built and proved once per shape, for callers that run it many times.

    Proving a schedule costs as much as simulating it, and the simulator and planner ask for the same
    few shapes again and again. Built-in schedules are a pure function of (name, pp, microbatches,
    virtual stages), so the proof of one build holds for every later request of that shape. Both
    results are shared: treat them as read-only (build your own with :func:`build_schedule` to edit).
    """
    schedule = build_schedule(name, pp, microbatches, virtual_stages, pass_times)
    return schedule, validate_schedule(schedule)


def _check_placement(schedule: Schedule) -> None:
    """Every action is on the rank that owns its stage, for a stage and microbatch that exist."""
    p, num_stages = schedule.pp, schedule.num_stages
    if len(schedule.stage_to_rank) != num_stages or any(not 0 <= r < p for r in schedule.stage_to_rank):
        raise ScheduleError(
            f"stage_to_rank must map {num_stages} stages to ranks 0..{p - 1}, got {schedule.stage_to_rank}"
        )
    if len(schedule.actions) != p:
        raise ScheduleError(f"expected one action list per rank ({p}), got {len(schedule.actions)}")
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if not (0 <= a.stage < num_stages and 0 <= a.microbatch < schedule.microbatches):
                raise ScheduleError(
                    f"rank {rank}: {a} is outside {num_stages} stages x {schedule.microbatches} microbatches"
                )
            owner = schedule.stage_to_rank[a.stage]
            if owner != rank:
                raise ScheduleError(f"rank {rank}: {a} belongs to rank {owner}, which holds stage {a.stage}")


def _check_complete(schedule: Schedule, counts: Counter) -> None:
    """Each stage runs each microbatch's forward and backward exactly once: a full backward, or Bi and
    W. A schedule may split some backwards and not others (DualPipeV; torch's merged zero-bubble
    orders), never one (stage, microbatch)'s both ways. ``counts``: how often each key appears."""
    for key, n in counts.items():
        op, stage, mb = key
        rank = schedule.stage_to_rank[stage]
        if n > 1:
            raise ScheduleError(f"rank {rank}: {_describe(key)} appears {n} times")
        if op == BACKWARD and _is_split(counts, stage, mb):
            raise ScheduleError(
                f"rank {rank}: {_describe(key)} mixes a full backward with a split Bi/W backward of the same "
                f"stage and microbatch"
            )
    whole, split = (FORWARD, BACKWARD), (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
    for stage in range(schedule.num_stages):
        for mb in range(schedule.microbatches):
            for op in split if _is_split(counts, stage, mb) else whole:
                if (op, stage, mb) not in counts:
                    raise ScheduleError(
                        f"rank {schedule.stage_to_rank[stage]}: missing {op} {_describe((op, stage, mb))}"
                    )


def _is_split(keys: Counter, stage: int, mb: int) -> bool:
    """Whether the backward of (stage, mb) is split: Bi or W is among ``keys``."""
    return (BACKWARD_INPUT, stage, mb) in keys or (BACKWARD_WEIGHT, stage, mb) in keys


def _check_pairs(schedule: Schedule, present: Counter) -> None:
    """Sends and recvs pair one to one with the right peers, and every cross-rank edge has a pair.
    ``present``: the keys the schedule holds."""
    num_stages, owner = schedule.num_stages, schedule.stage_to_rank
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op in COMPUTE_OPS:
                continue
            op, offset = _COUNTERPART[a.op]
            neighbour = a.stage + offset
            if not 0 <= neighbour < num_stages:
                raise ScheduleError(f"rank {rank}: {a} has no neighbouring stage to talk to")
            if owner[neighbour] == rank:
                raise ScheduleError(
                    f"rank {rank}: {a} talks to stage {neighbour} on the same rank, which hands over locally"
                )
            if a.peer != owner[neighbour]:
                raise ScheduleError(
                    f"rank {rank}: {a} names peer {a.peer}, "
                    f"but stage {neighbour} is on rank {owner[neighbour]}"
                )
            if (op, neighbour, a.microbatch) not in present:
                raise ScheduleError(f"rank {rank}: {a} has no matching {op} on rank {a.peer}")
    crossings = _crossings(tuple(owner))  # the recv before and the send after each compute, if remote
    for rank, actions in enumerate(schedule.actions):
        for a in actions:
            if a.op in COMPUTE_OPS:
                for crossing in crossings[(a.op, a.stage)]:
                    if crossing and (needed := (crossing[0], a.stage, a.microbatch)) not in present:
                        raise ScheduleError(
                            f"rank {rank}: {a} needs {_describe(needed)}, which rank {rank} never issues"
                        )


def dependencies_of(schedule: Schedule) -> Callable[[Action], list[Key]]:
    """A function giving what an action of ``schedule`` waits for, as (op, stage, microbatch) keys.

    A compute waits for the computes it reads (:func:`_data_deps`), through the recv on its own rank
    when the producer is remote; a send waits for the compute that made its tensor, and a recv for
    the matching send. Built once per schedule (whose stages are checked to exist), so looking up one
    action costs a look-up in a table of what each (op, stage) waits for.
    """
    split = schedule.split_backwards
    waits_of = _dependency_table(tuple(schedule.stage_to_rank))

    def waits_for(action: Action) -> list[Key]:
        mb = action.microbatch
        # an op of None: the pass that makes the input gradient of (stage, mb), Bi where it is split
        return [(op or (BACKWARD_INPUT if (stage, mb) in split else BACKWARD), stage, mb)
                for op, stage in waits_of[(action.op, action.stage)]]

    return waits_for


@lru_cache(maxsize=64)
def _dependency_table(stage_to_rank: tuple[int, ...]) -> dict[tuple[str, int], tuple]:
    """What an action of each (op, stage) waits for, as (op, stage) pairs of its own microbatch; an op
    of None stands for the pass that makes that stage's input gradient, which only the microbatch
    can tell (Bi where its backward is split, else B). Shared: read-only."""
    num_stages, table = len(stage_to_rank), {}
    for s, rank in enumerate(stage_to_rank):
        for op in (RECV_FORWARD, RECV_BACKWARD):
            send, offset = _COUNTERPART[op]
            table[(op, s)] = ((send, s + offset),)
        table[(SEND_FORWARD, s)] = ((FORWARD, s),)
        table[(SEND_BACKWARD, s)] = ((None, s),)
        for op in COMPUTE_OPS:  # the passes it reads, through the recv on its own rank where remote
            table[(op, s)] = tuple(
                (read, stage) if stage_to_rank[stage] == rank
                else (RECV_FORWARD if read == FORWARD else RECV_BACKWARD, s)
                for read, stage, _ in _data_deps(Action(op, s, 0), num_stages)
            )
    return table


def _execution_order(schedule: Schedule) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """Run every rank as far as its dependencies allow; a rank left waiting means deadlock.

    Returns the global order, as (rank, index into that rank's list), and for each of its entries the
    positions in that order of what the action waited for (what a simulation times it after). A
    worklist wakes a rank only when the action it waits for completes, and a woken rank keeps the
    dependencies it had looked up, so the cost is linear in the number of actions.
    """
    waits_for = dependencies_of(schedule)
    done: dict[Key, int] = {}  # what has run, and its position in the order
    position = [0] * schedule.pp
    waiting: dict[Key, list[int]] = {}
    blocked_on: dict[int, tuple[Key, list[Key]]] = {}  # the key a rank waits for, and all it needs
    order: list[tuple[int, int]] = []
    waits: list[tuple[int, ...]] = []
    position_of = done.__getitem__
    ready = deque(schedule.ranks)
    while ready:
        rank = ready.popleft()
        actions, index = schedule.actions[rank], position[rank]
        needs = blocked_on.pop(rank, (None, None))[1]
        while index < len(actions):
            action = actions[index]
            if needs is None:
                needs = waits_for(action)
            missing = None
            for key in needs:
                if key not in done:
                    missing = key
                    break
            if missing is not None:
                waiting.setdefault(missing, []).append(rank)
                blocked_on[rank] = (missing, needs)
                break
            key = (action.op, action.stage, action.microbatch)
            waits.append(tuple(map(position_of, needs)))
            done[key] = len(order)
            order.append((rank, index))
            index += 1
            needs = None
            woken = waiting.pop(key, None)
            if woken:
                ready.extend(woken)
        position[rank] = index
    if blocked_on:
        stuck = {rank: key for rank, (key, _) in blocked_on.items()}
        raise ScheduleError(_stuck_message(schedule, position, stuck))
    return order, waits


def _stuck_message(schedule: Schedule, position: list[int], blocked_on: dict[int, Key]) -> str:
    """Name an action that waits for something later on its own rank, else the cycle of waits."""
    waits = []
    for rank, key in sorted(blocked_on.items()):
        action = schedule.actions[rank][position[rank]]
        owner = schedule.stage_to_rank[key[1]]
        if owner == rank:
            return f"rank {rank}: {action} waits for {_describe(key)}, which comes after it on rank {rank}"
        waits.append(f"rank {rank} waits at {action} for {_describe(key)} on rank {owner}")
    return "deadlock: " + "; ".join(waits)


def _peak_activations(schedule: Schedule) -> list[int]:
    """Per rank: most activations alive at once."""
    return [peak_held(actions) for actions in schedule.actions]


def peak_held(actions: list[Action], weight: Callable[[int], float] = lambda stage: 1) -> float:
    """Most of ``weight(stage)`` summed over the (stage, microbatch) activations a rank's ``actions``
    hold at once: each is held from its forward to the pass that last reads it (the full backward, or
    W of a split one). Weights of a chunk's layers give the layers held, where chunks differ."""
    alive = peak = 0
    for a in actions:
        if a.op == FORWARD:
            alive += weight(a.stage)
            peak = max(peak, alive)
        elif a.op in (BACKWARD, BACKWARD_WEIGHT):
            alive -= weight(a.stage)
    return peak


# -------------------------------------------------------------------------------------------- bubbles
def theoretical_bubble(name: str, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a step, ``idle / (p x step time)``, for equal-time stages and free p2p.

    Conventions: every stage takes t_F per forward and t_B = 2 t_F per full backward (Megatron's
    convention; the fractions below do not depend on the ratio except for the split schedules).
    - naive: (p - 1) / p, one rank busy at a time.
    - gpipe, 1f1b: (p - 1) / (m + p - 1) (GPipe, Huang et al. 2019; 1F1B has the same bubble and
      lower memory, Narayanan et al. 2021): a ramp of p - 1 stage times at each end.
    - interleaved: (p - 1) / (v m + p - 1) for m >= p: the ramp is made of chunks 1/v as long
      (Narayanan et al.), whether or not p divides m. With m < p a round is shorter than the pipeline:
      one microbatch's trip through all p v chunks and back sets the step, each other microbatch adds
      a chunk time, 1 - m / (p + (m - 1) / v). Both are 1 - m / (max(m, p) + (min(m, p) - 1) / v).
    - zb-h1, assuming t_F = t_Bi = t_W (Qi et al. 2023): the ramp shrinks from 1F1B's
      (p - 1)(t_F + t_Bi + t_W) to (p - 1)(t_F + t_Bi - t_W) = (p - 1) t_F against 3m t_F of work, so
      (p - 1) / (3m + p - 1) for m >= p. With m < p the gradient's trip back up the pipeline
      dominates and the step takes (2m + 2p - 1) t_F.
    - zbv, assuming t_F = t_Bi = t_W per chunk (Qi et al. 2024): only the start-up ramp is left (rank
      p - 1 cannot start before p - 1 chunk forwards have run, and no single-step schedule can hide
      that), so (p - 1) / (6m + p - 1) in chunk times for m >= p; a lower bound for m < p.
    - dualpipev: DualPipe's bubble (DeepSeek-V3 report, Table 2; for PP stages on PP/2 ranks)
      (PP/2 - 1)(F&B + B - 3W) per rank in chunk times, here (p - 1)(F&B + B - 3W). With t_F = t_W,
      t_B = 2 t_F and nothing hidden in a slot (F&B = F + B) that is 2(p - 1) against 6m of work:
      (p - 1) / (3m + p - 1), the same as ZB-H1's, with twice the chunks in flight (2p + 1).
    """
    _check_shape_args(name, pp, microbatches, virtual_stages)
    p, m, v = pp, microbatches, virtual_stages
    ramp = p - 1
    if name == "naive":
        return ramp / p
    if name in ("gpipe", "1f1b"):
        return ramp / (m + ramp)
    if name == "interleaved":
        return 1 - m / (max(m, p) + (min(m, p) - 1) / v)
    if name == "zb-h1":
        return 1 - 3 * m / max(3 * m + ramp, 2 * m + 2 * p - 1)
    if name == "dualpipev":
        return ramp / (3 * m + ramp)
    return ramp / (6 * m + ramp)
