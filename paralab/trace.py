"""The one trace type of paralab: measured runs and the simulator both produce a :class:`Trace`.

A trace is a list of :class:`Span` (a stretch of time on one rank's compute or comm lane) plus
:class:`Counter` samples (utilisation, memory) and free-form ``meta``. Times are seconds on one clock
shared by all ranks: every rank starts its clock when it leaves the same barrier, so spans from
different ranks (and from files written by different torchrun workers) line up when merged.

Waiting against moving: a collective cannot move data before every member has entered it, nor a
receive before its sender has sent. The merged timeline knows when each rank entered, so
:meth:`Trace.comm_arrivals` splits each collective and receive into the wait for the last participant
and the transfer itself (what a straggler, or ranks time-sharing cores, cost the others).

Traces save as plain JSON (never pickle) and export to the Chrome trace event format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open. A file is checked as it loads: every span and counter
field must have its type (times finite numbers), and anything else is a TraceFormatError that names
the file and the place (``spans[3].start: expected a number, got '1.0'``).

Size: loading, merging and the summary metrics take time and memory in proportion to the number of
spans (the busy time per step window comes from one sorted union of each rank's spans and a binary
search per window), so a million spans merge in seconds (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import operator
import os
import statistics
import types
import typing
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from paralab.config import MAX_RANKS, finite_number, first_difference, nulls_for_non_finite
from paralab.outputs import check_replaceable
from paralab.text import count_text, numbered

COMPUTE, COMM, STEP, EVENT = "compute", "comm", "step", "event"
GZIP_MAGIC = b"\x1f\x8b"
TORCH_PROFILE_HINT = "(a torch.profiler trace?): `paralab import` reads those"
LANES = (COMPUTE, COMM, STEP, EVENT)
FORMAT_VERSION = 1
# the summary's figures that only compute and communication spans hold: a run that did not record them
# (unmeasured_why) did not measure these, which its summary says as None, not as 0 bytes and a pipeline
# idle all of its step
SPAN_FIGURES = ("comm_bytes", "comm_payload_bytes", "comm_bytes_by_link", "bubble_fraction", "per_rank")
NO_TRACE = "--no-trace"
UNTRACED_COLLECTIVES = "torch runs its collectives out of paralab's sight"


def not_measured(why: str) -> str:
    """How a figure a run did not measure is said (``why``: :func:`unmeasured_why`'s words)."""
    return f"not measured ({why})"


def pipelined(meta: dict) -> bool:
    """Whether a trace's ``meta`` says its run is a pipeline: two stages or more (a measured run's
    layout writes its pp; an import is told it). Only a pipeline's idle time is a bubble: a
    data-parallel rank's is its exposed waits, which :meth:`Trace.time_breakdown` says as such."""
    return (meta.get("stages") or meta.get("pp") or 0) >= 2


def unmeasured_why(meta: dict) -> str:
    """Why the run a trace's ``meta`` describes did not measure its SPAN_FIGURES, '' where it did: it
    recorded step spans only (``--no-trace``), or it is one of torch's own implementations (a torch_*
    reference, ``meta["collectives_traced"]`` False), whose collectives run inside DDP's hooks, FSDP2,
    DTensor or the pipelining schedule, where paralab's recorder does not see them (torch_ddp had read
    0 bytes sent, torch_pp a 98% bubble of its step spans). Only a trace paralab measured: an imported
    profile of such a run carries its config, but its spans are the profiler's, every one recorded."""
    if meta.get("source", "measured") != "measured":
        return ""
    if (meta.get("config") or {}).get("trace") is False:
        return NO_TRACE
    return UNTRACED_COLLECTIVES if meta.get("collectives_traced") is False else ""


def holds_a_launchs_world(meta: dict) -> bool:
    """Whether a trace file is one of the per-rank files (or the merged file) of a ``paralab run``
    launch, whose folder must hold every rank of its world: measured, and its config's world the
    trace's. An elastic run's world changes as it runs (its trace names the most nodes), and an import
    of some ranks' profiles names the whole world on purpose."""
    config = meta.get("config") or {}
    return meta.get("source") == "measured" and config.get("world_size") == meta.get("world_size")


def ranks_missing(metas: list[dict], world: int | None, held) -> list[int]:
    """The ranks of a launch's world that none of its files holds (``held``), where every file is one
    of a launch's (:func:`holds_a_launchs_world`); empty otherwise (an elastic trace, an import of some
    ranks, a simulation name more ranks than they hold on purpose)."""
    if world is None or not all(holds_a_launchs_world(meta) for meta in metas):
        return []
    return sorted(set(range(world)) - set(held))


class TraceFormatError(ValueError):
    """A trace file, or trace data, that is not what a trace must be (says where and what)."""


def load_spans(path: str | Path) -> Trace:
    """:meth:`Trace.load` for a command that reads what ran (merge, report): refused, as what it would
    say is wrong or nothing, a trace of no spans (it had merged as "0 spans, median step 0.0 ms"), one
    that holds a rank beyond its world size, and one rank's file of a launch (a report of it had summed
    one rank's bytes as the run's; a folder short of ranks is refused as it loads)."""
    trace = Trace.load(path)
    if not trace.spans:
        raise TraceFormatError(f"{path}: holds no spans, so nothing that ran")
    world = trace.meta.get("world_size")
    if isinstance(world, int) and (beyond := [rank for rank in trace.ranks if rank >= world]):
        raise TraceFormatError(f"{path} holds rank {beyond[0]}, beyond its world size {world}")
    if missing := ranks_missing([trace.meta], world, trace.ranks):
        raise TraceFormatError(f"{path} holds {count_text(len(trace.ranks), 'rank')} of the {world} of "
                               f"its run ({numbered('rank', missing)} missing): give the folder of every "
                               "rank's file")
    return trace


@dataclass(slots=True)
class Span:
    """One timed piece of work on one rank.

    ``bytes`` is what this rank put on the wire under ring-algorithm accounting (NCCL's bus-bandwidth
    convention: all-reduce 2(n-1)/n of the tensor, all-gather and reduce-scatter (n-1)/n of the full
    tensor, send the tensor, recv nothing); ``payload_bytes`` is the tensor size the call was given.
    """

    rank: int
    lane: str
    kind: str
    start: float
    end: float
    name: str = ""
    bytes: int = 0
    payload_bytes: int = 0
    peer: int | None = None
    group_size: int = 0
    step: int | None = None
    microbatch: int | None = None
    stage: int | None = None
    inter_node: bool = False  # the wire bytes leave the node (ring successor or peer on another node)
    group_ranks: list[int] | None = None  # a collective on a subgroup: its global ranks
    # A communication span's first ``issue_s`` seconds (the call that issued it: all of a blocking call)
    # and last ``waited_s`` (an async call's wait()): its rank was inside a call for it, nothing else
    # running on its thread (CPU) or stream (CUDA). A compute span around those stretches (a tensor-
    # parallel all-reduce inside a layer's forward) did not compute in them: see Trace.computing.
    issue_s: float = 0.0
    waited_s: float = 0.0

    @property
    def in_call(self) -> list[tuple[float, float]]:
        """The stretches its rank spent inside calls for it (``issue_s``, ``waited_s``, within the span:
        a profile's host-timed marks may outrun its device-timed span), if any."""
        stretches = ((self.start, min(self.start + self.issue_s, self.end)),
                     (max(self.end - self.waited_s, self.start), self.end))
        return [(lo, hi) for lo, hi in stretches if hi > lo]

    @property
    def duration(self) -> float:
        return self.end - self.start


def typical_step_time(times: dict[int, float]) -> float:
    """The median of ``times`` (step -> seconds) over the steps :func:`past_warm_up` keeps: a run's
    typical step (0.0 where there is none)."""
    typical = [times[step] for step in past_warm_up(list(times))]
    return statistics.median(typical) if typical else 0.0


@dataclass(slots=True)
class Counter:
    """A sampled value on one rank (CPU %, memory bytes, ...), drawn as a counter track."""

    rank: int
    name: str
    t: float
    value: float


# A collective is matched across its members in issue order; a match is refused (and the rest of that
# group's calls left unsplit) when its last member entered after another member had already finished,
# by more than this: the calls are then not the same operation (clocks agree to well under a millisecond).
CLOCK_SLACK_S = 1e-3


@dataclass(frozen=True, slots=True)
class Arrival:
    """A communication span and when the last participant entered it: every member of a collective,
    or the sender of a receive. ``last_entry`` is None when the trace cannot say (a send, a group it
    cannot name, a partner missing from the trace): the whole span then counts as transfer."""

    span: Span
    last_entry: float | None

    @property
    def wait_s(self) -> float:
        """Time from entering the call until the last participant entered (0 when it was the last)."""
        if self.last_entry is None:
            return 0.0
        return min(max(self.last_entry - self.span.start, 0.0), self.span.duration)

    @property
    def transfer_s(self) -> float:
        return self.span.duration - self.wait_s


@dataclass(repr=False)
class Trace:
    spans: list[Span] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        """A line a notebook cell can show: what the trace holds, not its tens of thousands of spans."""
        ranks = sorted({s.rank for s in self.spans})
        kinds = sorted({s.kind for s in self.spans})
        source = self.meta.get("source") or self.meta.get("strategy") or ""
        return (f"Trace({source + ', ' if source else ''}{len(self.spans)} spans on "
                f"{count_text(len(ranks), 'rank')}, {len(self.counters)} counters; "
                f"kinds: {', '.join(kinds)})")

    # ------------------------------------------------------------------ building
    @classmethod
    def merge(cls, traces: list[Trace]) -> Trace:
        """Put per-rank traces (already on the shared clock) into one, keeping the first meta, its
        sends landed (:meth:`land_sends`). (An elastic run merges each of its worlds' traces: one rank
        number in several is its own.)"""
        merged = cls(meta=dict(traces[0].meta) if traces else {})
        ranks_meta: dict = {}
        for trace in traces:
            merged.spans.extend(trace.spans)
            merged.counters.extend(trace.counters)
            ranks_meta.update(trace.meta.get("ranks", {}))
        if ranks_meta:
            merged.meta["ranks"] = ranks_meta
        merged.spans.sort(key=lambda s: (s.start, s.rank))
        merged.land_sends()
        return merged

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.spans} | {c.rank for c in self.counters})

    def select(self, lane: str | None = None, kind: str | None = None, rank: int | None = None) -> list[Span]:
        return [
            s
            for s in self.spans
            if (lane is None or s.lane == lane)
            and (kind is None or s.kind == kind)
            and (rank is None or s.rank == rank)
        ]

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "format": "paralab-trace",
            "version": FORMAT_VERSION,
            "meta": self.meta,
            "spans": [_fields_of(s) for s in self.spans],
            "counters": [_fields_of(c) for c in self.counters],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        """A paralab trace dict, or a Chrome trace export written by :meth:`to_chrome`; TraceFormatError
        if it is neither, or a field has the wrong type."""
        if not isinstance(data, dict):
            raise TraceFormatError(f"expected a JSON object at the top, got {_json_kind(data)}")
        if "traceEvents" in data:
            return cls.from_chrome(data)
        if data.get("format") != "paralab-trace":
            raise TraceFormatError("not a paralab trace (no 'format: paralab-trace', no 'traceEvents')")
        if data.get("version", FORMAT_VERSION) != FORMAT_VERSION:  # files before versions had none
            raise TraceFormatError(f"format version {json.dumps(data['version'])[:20]}: this paralab reads "
                                   f"version {FORMAT_VERSION}")
        return cls(
            spans=_build_all(Span, _list_in(data, "spans"), "spans"),
            counters=_build_all(Counter, _list_in(data, "counters"), "counters"),
            meta=_checked_meta(data.get("meta", {}), "meta"),
        )

    @classmethod
    def from_chrome(cls, data: dict) -> Trace:
        """Rebuild the trace from :meth:`to_chrome` output: every span field travels in the event's args.
        Complete events without paralab's args (another tool's) are skipped."""
        spans, counters = [], []
        for i, e in enumerate(_list_in(data, "traceEvents")):
            where = f"traceEvents[{i}]"
            if not isinstance(e, dict):
                raise TraceFormatError(f"{where}: expected an object, got {_json_kind(e)}")
            args = e.get("args", {})
            if not isinstance(args, dict):
                raise TraceFormatError(f"{where}.args: expected an object, got {_json_kind(args)}")
            if e.get("ph") == "X" and "lane" in args:
                fields = {k: v for k, v in args.items() if k in _KINDS[Span]}
                spans.append(_build(Span, fields, f"{where}.args"))
            elif e.get("ph") == "C":
                name = e.get("name")
                if name not in args:
                    raise TraceFormatError(f"{where}: counter event without its value (args.{name})")
                fields = {"rank": e.get("pid"), "name": name, "t": _number(e.get("ts"), where) / 1e6,
                          "value": args[name]}
                counters.append(_build(Counter, fields, where))
        other = _object_in(data, "otherData")
        if "paralab" not in other and not spans and any(
                isinstance(e, dict) and e.get("ph") == "X" for e in data["traceEvents"]):
            raise TraceFormatError(f"a Chrome trace from another tool {TORCH_PROFILE_HINT}")
        meta = _checked_meta(other.get("paralab", {}), "otherData.paralab")
        spans.sort(key=lambda s: (s.start, s.rank))
        return cls(spans=spans, counters=counters, meta=meta)

    def save(self, path: str | Path) -> Path:
        return _write_json(path, {"format": "paralab-trace", "version": FORMAT_VERSION, "meta": self.meta},
                           spans=map(_fields_of, self.spans), counters=map(_fields_of, self.counters))

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Load a paralab trace file, or merge every ``*.json`` trace in a directory (torchrun --trace-dir).
        A file that is not a trace raises TraceFormatError naming it, and so does a directory where two
        files hold one rank (a merged trace beside the per-rank files it came from would count every
        span twice)."""
        path = Path(path)
        if path.is_dir():
            files = sorted(path.glob("*.json"))
            if not files and (gzipped := sorted(path.glob("*.json.gz"))):
                raise TraceFormatError(f"{path}: no paralab traces (*.json), only gzipped files such as "
                                       f"{gzipped[0].name} {TORCH_PROFILE_HINT}")
            if not files:
                raise FileNotFoundError(f"no trace files (*.json) in {path}")
            traces = [cls.load(f) for f in files]
            _check_one_run(path, files, traces)
            return cls.merge(traces)
        raw = path.read_bytes()
        if raw[:2] == GZIP_MAGIC:  # paralab writes plain JSON; torch.profiler's handler gzips its own
            raise TraceFormatError(f"{path}: gzipped, not a paralab trace {TORCH_PROFILE_HINT}")
        text = raw.decode("utf-8", errors="replace")
        try:
            data = json.loads(text)
        except RecursionError:
            raise TraceFormatError(f"{path}: JSON nested too deeply to be a trace") from None
        except ValueError as exc:
            raise TraceFormatError(f"{path}: not JSON ({exc})") from None
        try:
            return cls.from_dict(data)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{path}: {exc}") from None

    def to_chrome(self) -> dict:
        """Chrome trace event format: one process per rank, a thread per lane (and a further one for each
        span a lane's others overlap: :func:`_chrome_threads`), counters as 'C' events."""
        return {"traceEvents": list(self._chrome_events()), "displayTimeUnit": "ms",
                "otherData": {"paralab": self.meta}}

    def _chrome_events(self):
        tids = _chrome_threads(self.spans)
        threads = ({(rank, i) for rank in self.ranks for i in range(len(LANES))}
                   | {(s.rank, tids[id(s)]) for s in self.spans})
        for rank in self.ranks:
            yield {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}}
        for rank, tid in sorted(threads):
            row, lane = divmod(tid, CHROME_ROWS_APART)
            yield {"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                   "args": {"name": LANES[lane] + (f" {row + 1}" if row else "")}}
        for s in self.spans:
            args = {k: v for k, v in _fields_of(s).items() if v is not None}
            yield {"ph": "X", "name": s.name or s.kind, "cat": s.kind, "pid": s.rank, "tid": tids[id(s)],
                   "ts": s.start * 1e6, "dur": max(s.duration, 0.0) * 1e6, "args": args}
        for c in self.counters:
            yield {"ph": "C", "name": c.name, "pid": c.rank, "ts": c.t * 1e6, "args": {c.name: c.value}}

    def save_chrome(self, path: str | Path) -> Path:
        return _write_json(path, {"displayTimeUnit": "ms", "otherData": {"paralab": self.meta}},
                           traceEvents=self._chrome_events())

    # ------------------------------------------------------------------ metrics
    def step_windows(self) -> dict[int, tuple[float, float]]:
        """step -> (start, end) over all ranks, from the per-rank ``step`` spans: where a step lies on
        the time axis. Not how long it took: ranks need not start a step together (one that leaves
        a collective first starts the next step first), so neighbouring windows can overlap; a
        step's time is its ranks' own (:meth:`step_times`)."""
        return _over_ranks(self.rank_step_windows())

    def rank_step_windows(self) -> dict[int, dict[int, tuple[float, float]]]:
        """rank -> step -> (start, end) of that rank's own ``step`` span(s): its steps tile its time."""
        windows: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
        for s in self.spans:
            if s.lane == STEP and s.step is not None:
                lo, hi = windows[s.rank].get(s.step, (s.start, s.end))
                windows[s.rank][s.step] = (min(lo, s.start), max(hi, s.end))
        return {rank: dict(sorted(own.items())) for rank, own in sorted(windows.items())}

    def step_times_by_step(self) -> dict[int, float]:
        """step -> its time, in step order: the longest of its ranks' own step spans (a synchronous
        step waits for its slowest rank). Not the window over all ranks, which holds the ranks'
        offsets from one another too: a DDP job whose ranks run a few ms apart would read each step
        that much longer than it took."""
        longest: dict[int, float] = {}
        for own in self.rank_step_windows().values():
            for step, (lo, hi) in own.items():
                longest[step] = max(longest.get(step, 0.0), hi - lo)
        return dict(sorted(longest.items()))

    def step_times(self) -> list[float]:
        """Each step's time, in step order (:meth:`step_times_by_step`)."""
        return list(self.step_times_by_step().values())

    def typical_steps(self) -> list[int]:
        """The steps a trace's figures are taken over: those its ranks have step spans of, past the
        job's warm-up (:func:`past_warm_up`)."""
        return past_warm_up(list(self.step_times_by_step()))

    def median_step_time(self) -> float:
        """Median time of the :meth:`typical_steps` (:func:`typical_step_time`)."""
        return typical_step_time(self.step_times_by_step())

    def busy_time(self, rank: int, lane: str = COMPUTE, window: tuple[float, float] | None = None) -> float:
        """Time covered by the rank's spans on a lane (overlaps counted once), clipped to a window: on
        the compute lane the passes, their own waits included, as :meth:`idle_fraction` counts them."""
        union = Covered([(s.start, s.end) for s in self.spans if s.rank == rank and s.lane == lane])
        return union.length if window is None else union.covered(*window)

    def _chosen_windows(self, steps: list[int] | None = None) -> dict[int, dict[int, tuple[float, float]]]:
        """Per rank: step -> its own window, for each of ``steps`` (the :meth:`typical_steps` unless
        given) it has a span for; a rank with no step spans of its own takes the windows over all
        ranks."""
        own = self.rank_step_windows()
        everyone = _over_ranks(own)
        chosen = steps if steps is not None else past_warm_up(list(everyone))
        return {rank: {k: windows[k] for k in chosen if k in windows}
                for rank in self.ranks for windows in [own.get(rank) or everyone]}

    def _intervals(self, lane: str) -> dict[int, list[tuple[float, float]]]:
        """Per rank: (start, end) of its spans on ``lane``."""
        by_rank: dict[int, list[tuple[float, float]]] = {rank: [] for rank in self.ranks}
        for s in self.spans:
            if s.lane == lane:
                by_rank[s.rank].append((s.start, s.end))
        return by_rank

    def computing(self) -> dict[int, list[tuple[float, float]]]:
        """Per rank: the stretches in which it computed, disjoint and in order: its compute spans less
        the time it spent inside communication calls there (:attr:`Span.in_call`). A compute span
        covers a whole pass, and a tensor-parallel layer blocks on its all-reduces inside it: counted as
        compute, they would read as hidden behind compute, while every one is on the critical path."""
        calls: dict[int, list[tuple[float, float]]] = {rank: [] for rank in self.ranks}
        for s in self.spans:
            if s.lane == COMM:
                calls[s.rank] += s.in_call
        return {rank: Covered(pairs).minus(Covered(calls[rank]))
                for rank, pairs in self._intervals(COMPUTE).items()}

    def blocked(self) -> list[tuple[Span, float, float]]:
        """(call, start, end) of each stretch of a compute span in which its rank was inside a
        communication call: what :meth:`computing` leaves out, each with its call."""
        compute = {rank: Covered(pairs) for rank, pairs in self._intervals(COMPUTE).items()}
        return [(s, lo, hi) for s in self.spans if s.lane == COMM
                for stretch in s.in_call for lo, hi in compute[s.rank].within(*stretch)]

    def idle_fraction(self, steps: list[int] | None = None) -> dict[int, float]:
        """Per rank: share of its steps in which the rank runs no pass (forward, backward,
        optimizer...): what the schedule leaves idle, the pipeline bubble. A rank with none of the
        steps (an elastic run's rank lost before them) is left out. A pass's own waits (a
        tensor-parallel layer's all-reduces) are the pass's here; :meth:`time_breakdown` splits them out."""
        chosen = {rank: list(windows.values()) for rank, windows in self._chosen_windows(steps).items()
                  if windows}
        passes = self._intervals(COMPUTE)
        busy = _mean_covered({rank: passes[rank] for rank in chosen}, chosen)
        mean_window = {rank: sum(hi - lo for lo, hi in windows) / len(windows)
                       for rank, windows in chosen.items()}
        return {rank: 1.0 - b / mean_window[rank] if mean_window[rank] > 0 else 0.0
                for rank, b in busy.items()}

    def bubble_fraction(self) -> float:
        """The mean over ranks of each one's idle share of its own steps (:meth:`idle_fraction`), over
        the :meth:`typical_steps`."""
        fractions = self.idle_fraction()
        return sum(fractions.values()) / len(fractions) if fractions else 0.0

    def comm_bytes(self, payload: bool = False) -> dict[str, int]:
        """op -> bytes per step summed over ranks (wire bytes, or payload bytes with payload=True)."""
        totals = self.per_step_bytes(lambda s: s.kind, payload)
        return {op: int(round(v)) for op, v in sorted(totals.items())}

    def comm_bytes_by_link(self) -> dict[str, int]:
        """Wire bytes per step summed over ranks, split into intra-node and inter-node traffic."""
        split = self.per_step_bytes(lambda s: "inter_node" if s.inter_node else "intra_node")
        return {k: int(split[k]) for k in ("intra_node", "inter_node")}

    def per_step_bytes(self, key: typing.Callable[[Span], typing.Hashable], payload: bool = False
                       ) -> dict[typing.Hashable, Fraction]:
        """key(span) -> the communication spans' bytes per step summed over ranks, each rank's over the
        steps it has (a rank whose profile was cut short moved its bytes in fewer steps), exactly: what
        every bytes-per-step figure reads (comm_bytes, by link, by group, viz.comm's views). Only the
        bytes of its steps, in a trace that has steps: an elastic run's lost step, redone later and in
        no step, had been divided over the steps that rank kept (a node lost at step 2 of 3 read 1.5
        times its bytes a step)."""
        steps = self.step_counts()
        stepless = not any(s.lane == STEP for s in self.spans)  # a trace of no steps is one step
        by_rank: dict[tuple, int] = defaultdict(int)
        for s in self.spans:
            if s.lane == COMM and (s.step is not None or stepless):
                by_rank[key(s), s.rank] += s.payload_bytes if payload else s.bytes
        totals: dict[typing.Hashable, Fraction] = defaultdict(Fraction)
        for (k, rank), nbytes in by_rank.items():
            totals[k] += Fraction(nbytes) / steps.get(rank, 1)
        return totals

    def step_counts(self) -> dict[int, int]:
        """rank -> the steps it has spans for (at least one); a rank with none, the run's."""
        own = self.rank_step_windows()
        everyone = max(len(_over_ranks(own)), 1)
        return {rank: len(own.get(rank, {})) or everyone for rank in self.ranks}

    def group_of(self, span: Span) -> tuple[int, ...] | None:
        """The global ranks a communication span ran among: its recorded group (comm.py records a
        subgroup's ranks), sender and receiver for a point-to-point call, every rank for a call on the
        whole world (recorded without ``group_ranks``). None when the trace cannot name the group: a
        subgroup recorded by its size alone (simulated traces), or a world smaller than the trace's
        (an elastic run after it lost a node)."""
        return span_group(span, self.world_size)

    @property
    def world_size(self) -> int:
        """The run's world: the size its metadata records, or the ranks its spans name if more."""
        return max(int(self.meta.get("world_size") or 0), max(self.ranks, default=-1) + 1)

    def comm_bytes_by_group(self, payload: bool = False) -> dict[tuple[int, ...] | None, int]:
        """group (see :meth:`group_of`) -> bytes per step summed over its members (wire bytes, or
        payload bytes with payload=True), the per-group view of :meth:`comm_bytes`."""
        world = self.world_size
        totals = self.per_step_bytes(lambda s: span_group(s, world), payload)
        return {group: int(v) for group, v in totals.items()}

    def comm_arrivals(self) -> list[Arrival]:
        """Every communication span, in the trace's order, with when its last participant entered.

        A collective is matched across the members of its group in issue order (the k-th call on a
        group is the same operation on every member); a receive with the sends from its peer, in order
        (messages between two ranks arrive in the order they were sent: gloo and NCCL match them so
        per group), of the same size. A send is not split: it leaves when its rank says so. See
        :class:`Arrival` and :data:`CLOCK_SLACK_S` for what is left unsplit."""
        world = self.world_size
        comm = [s for s in self.spans if s.lane == COMM]
        calls: dict[tuple, dict[int, list[Span]]] = defaultdict(lambda: defaultdict(list))
        for s in sorted(comm, key=lambda s: s.start):
            if s.peer is None and (group := span_group(s, world)) is not None and s.rank in group:
                calls[group][s.rank].append(s)
        last: dict[int, float] = {}  # id(span) -> when its last participant entered
        for group, by_rank in calls.items():
            for ops in zip(*(by_rank.get(rank, []) for rank in group)):  # a member missing: none match
                entry = max(o.start for o in ops)
                if len({o.kind for o in ops}) > 1 or entry > min(o.end for o in ops) + CLOCK_SLACK_S:
                    break  # not one operation: the issue orders differ from here on
                for o in ops:
                    last[id(o)] = entry
        for send, recv in self.p2p_pairs():
            last[id(recv)] = send.start
        return [Arrival(s, last.get(id(s))) for s in comm]

    def p2p_pairs(self) -> list[tuple[Span, Span]]:
        """Each send with the receive that took its data: between two ranks, in the order they were
        posted (gloo and NCCL match messages so), while the sizes agree and the send was posted before
        the receive ended (beyond :data:`CLOCK_SLACK_S`, the calls are not the same message)."""
        sends: dict[tuple, list[Span]] = defaultdict(list)
        recvs: dict[tuple, list[Span]] = defaultdict(list)
        p2p = (s for s in self.spans if s.lane == COMM and s.peer is not None)
        for s in sorted(p2p, key=lambda s: s.start):
            if s.kind == "send":
                sends[(s.rank, s.peer)].append(s)
            elif s.kind == "recv":
                recvs[(s.peer, s.rank)].append(s)
        pairs = []
        for key, received in recvs.items():
            for send, recv in zip(sends.get(key, []), received):
                if send.payload_bytes != recv.payload_bytes or send.start > recv.end + CLOCK_SLACK_S:
                    break
                pairs.append((send, recv))
        return pairs

    def land_sends(self) -> None:
        """End each async send when its receive did, where the sender could not say sooner: gloo's isend
        reports itself done only inside ``wait()``, so a pipeline's sends, waited for at the end of the
        step, had been drawn as 90 ms in flight for 32 KiB a 0.2 ms receive took. Its data has landed
        by then (or by the return of the call that posted it, which under gloo can come later); the
        wait at the end of the step found it gone (``waited_s`` 0). A blocking send, never waited for,
        keeps its end: its call held the rank until then."""
        for send, recv in self.p2p_pairs():
            landed = max(recv.end, send.start + send.issue_s)
            if send.waited_s and landed < send.end:
                send.end, send.waited_s = landed, 0.0

    def time_breakdown(self) -> dict[int, dict[str, float]]:
        """Per rank, seconds per step (the :meth:`typical_steps`): where the step's time went.

        ``compute_s`` computing (waits inside compute spans left out: :meth:`computing`); ``comm_s``
        communicating, split two ways: into ``overlapped_comm_s`` (while also computing) and
        ``exposed_comm_s`` (nothing computed meanwhile), and into
        ``comm_waiting_s`` (inside calls that wait for their last participant, see
        :meth:`comm_arrivals`, with no call moving data) and ``comm_transfer_s`` (data moving). The
        exposed part splits the same way: ``exposed_waiting_s`` (a straggler's cost, or a peer not yet
        scheduled) and ``exposed_transfer_s`` (what faster links would shorten). ``idle_s`` not
        computing (step time - compute: exposed communication included); ``wait_s`` neither computing
        nor communicating: waiting on another rank, the host or the data, with nothing recorded. Each
        is a mean over the rank's :meth:`typical_steps`, and so is the step time they are read against,
        ``mean_step_s`` (each step's the slowest rank's: :meth:`step_times_by_step`): idle = exposed +
        waiting exactly, and compute + idle = ``mean_step_s``. The summary's headline ``step_time_s``
        is the steps' median.
        """
        step_times = self.step_times_by_step()
        steps = self._chosen_windows()
        # each rank's steps' mean time, over the steps its figures are means of: the parts add up
        # (a median step beside mean parts had read a rank's exposed communication longer than its idle
        # time, and its waiting clamped to 0)
        step_time = {rank: sum(step_times[k] for k in own) / len(own) if own else 0.0
                     for rank, own in steps.items()}
        chosen = {rank: list(own.values()) for rank, own in steps.items()}
        computing, communicating = self.computing(), self._intervals(COMM)
        compute, comm = _mean_covered(computing, chosen), _mean_covered(communicating, chosen)
        either = _mean_covered({r: computing[r] + communicating[r] for r in self.ranks}, chosen)
        moving: dict[int, list[tuple[float, float]]] = {rank: [] for rank in self.ranks}
        for a in self.comm_arrivals():
            moving[a.span.rank].append((a.span.start + a.wait_s, a.span.end))
        transfer = _mean_covered(moving, chosen)
        computing_or_moving = _mean_covered({r: moving[r] + computing[r] for r in self.ranks}, chosen)
        out = {}
        for rank in self.ranks:
            exposed = max(either[rank] - compute[rank], 0.0)
            exposed_transfer = min(max(computing_or_moving[rank] - compute[rank], 0.0), exposed)
            out[rank] = {
                "mean_step_s": step_time[rank],
                "compute_s": compute[rank],
                "comm_s": comm[rank],
                "overlapped_comm_s": max(compute[rank] + comm[rank] - either[rank], 0.0),
                "exposed_comm_s": exposed,
                "comm_waiting_s": max(comm[rank] - transfer[rank], 0.0),
                "comm_transfer_s": min(transfer[rank], comm[rank]),
                "exposed_waiting_s": exposed - exposed_transfer,
                "exposed_transfer_s": exposed_transfer,
                "idle_s": max(step_time[rank] - compute[rank], 0.0),
                "wait_s": max(step_time[rank] - either[rank], 0.0),
            }
        return out

    def summary(self) -> dict:
        """Headline metrics of the run: the numbers the CLI's --json and the notebooks show.

        ``per_rank`` holds :meth:`time_breakdown`; the same keys at the top level are its means over
        the ranks. A trace that did not record its spans (:func:`unmeasured_why`) measured none of these
        but its steps: each is None, which every reader of a summary (a run's, ``paralab merge``'s, a
        report's, a comparison's) says as not measured, where its missing spans had read as no bytes
        sent and every rank idle. ``bubble_fraction`` is 0 where the trace is not a pipeline's
        (:func:`pipelined`), measured or not: a data-parallel run's idle time had read as a bubble
        wherever its trace was summarised but in the run's own summary. ``unmeasured_why`` says why the
        span figures read None (None where they were measured), for every reader alike."""
        step_time, piped = self.median_step_time(), pipelined(self.meta)  # no pipeline, no bubble
        why = unmeasured_why(self.meta)
        tokens = self.meta.get("tokens_per_step", 0)
        per_rank = self.time_breakdown()
        keys = next(iter(per_rank.values()), {})
        means = {key: sum(r[key] for r in per_rank.values()) / len(per_rank) for key in keys}
        summary = {
            "step_time_s": step_time,
            "step_times_s": self.step_times(),
            "tokens_per_s": tokens / step_time if step_time > 0 else 0.0,
            "comm_bytes": self.comm_bytes(),
            "comm_payload_bytes": self.comm_bytes(payload=True),
            "comm_bytes_by_link": self.comm_bytes_by_link(),
            "per_rank": per_rank,
            "bubble_fraction": self.bubble_fraction() if piped else 0.0,
            **means,
            "unmeasured_why": why or None,  # why the span figures read None, where they do
        }
        if why:
            summary.update(dict.fromkeys((*SPAN_FIGURES, *means)), bubble_fraction=None if piped else 0.0)
        return summary


# ---------------------------------------------------------------------------------- reading files
def _field_kinds(cls) -> dict[str, tuple[type, type | None, bool]]:
    """field -> (its JSON kind, the kind of a list's items, whether null is allowed), from the
    dataclass's annotations: what a trace file must hold is said once, in Span and Counter."""
    kinds = {}
    for name, hint in typing.get_type_hints(cls).items():
        options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        (base,) = [o for o in options if o is not type(None)]
        item = (typing.get_args(base) or (None,))[0]
        kinds[name] = (typing.get_origin(base) or base, item, type(None) in options)
    return kinds


_KINDS = {cls: _field_kinds(cls) for cls in (Span, Counter)}
_REQUIRED = {cls: {f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
             for cls in (Span, Counter)}


def _build(cls, data, where: str, index: int | None = None):
    """``cls(**data)`` once every key is known and every value has its field's kind."""
    if type(data) is not dict:
        raise TraceFormatError(f"{_at(where, index)}: expected an object, got {_json_kind(data)}")
    kinds = _KINDS[cls]
    if data.keys() - kinds.keys() or _REQUIRED[cls] - data.keys():
        unknown, missing = sorted(data.keys() - kinds.keys()), sorted(_REQUIRED[cls] - data.keys())
        raise TraceFormatError(f"{_at(where, index)}: " + "; ".join(
            ([f"unknown key(s) {', '.join(map(repr, unknown))}"] if unknown else [])
            + ([f"missing {', '.join(map(repr, missing))}"] if missing else [])))
    for key, value in data.items():
        kind, item, nullable = kinds[key]
        if value is None:
            ok = nullable
        elif kind is float:
            ok = finite_number(value)
        elif kind is list:
            ok = type(value) is list and all(type(v) is item for v in value)
        else:
            ok = type(value) is kind
        if not ok:
            expected = {float: "a finite number", int: "an integer", str: "a string", bool: "true or false",
                        list: f"a list of {getattr(item, '__name__', item)}"}[kind]
            expected += " or null" if nullable else ""
            raise TraceFormatError(f"{_at(where, index)}.{key}: expected {expected}, got {_json_kind(value)} "
                                   f"{json.dumps(value)[:40]}")
    if not 0 <= data["rank"] < MAX_RANKS:  # figures draw a row (a matrix) per rank up to the largest
        raise TraceFormatError(f"{_at(where, index)}.rank: expected a rank in 0..{MAX_RANKS - 1:,}, got "
                               f"{data['rank']}")
    if cls is Span:
        _check_span(data, _at(where, index))
    return cls(**data)


# a span's counts and stretches: a negative one (a hand-edited file) would pass into sums as a saving
_NOT_NEGATIVE = ("bytes", "payload_bytes", "group_size", "issue_s", "waited_s")


def _check_span(data: dict, where: str) -> None:
    """What a span's fields must hold beside their kinds: a lane the figures draw, no negative count or
    stretch, an end no earlier than its start."""
    if data["lane"] not in LANES:
        raise TraceFormatError(f"{where}.lane: expected one of {', '.join(LANES)}, got {data['lane']!r}")
    for key in _NOT_NEGATIVE:
        if data.get(key, 0) < 0:
            raise TraceFormatError(f"{where}.{key}: expected 0 or more, got {data[key]}")
    if data["end"] < data["start"]:
        raise TraceFormatError(f"{where}: ends at {data['end']} before it starts at {data['start']}")


def _build_all(cls, items: list, where: str) -> list:
    return [_build(cls, data, where, i) for i, data in enumerate(items)]


def _at(where: str, index: int | None) -> str:
    return where if index is None else f"{where}[{index}]"


def _json_kind(value) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true/false", int: "a number",
             float: "a number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


def _list_in(data: dict, key: str) -> list:
    value = data.get(key, [])
    if type(value) is not list:
        raise TraceFormatError(f"{key}: expected a list, got {_json_kind(value)}")
    return value


def _object_in(data: dict, key: str) -> dict:
    value = data.get(key, {})
    if type(value) is not dict:
        raise TraceFormatError(f"{key}: expected an object, got {_json_kind(value)}")
    return value


def _number(value, where: str) -> float:
    if not finite_number(value):
        raise TraceFormatError(f"{where}: expected a finite number, got {_json_kind(value)} "
                               f"{json.dumps(value)[:40]}")
    return value


# The meta keys the summary, the report and the figures read, and the JSON kind each must have
_META_KINDS = {
    "world_size": "a world size",
    # a degree or count below 1, or no tokens, had loaded and read as a negative throughput
    **dict.fromkeys(("pp", "microbatches", "virtual_stages", "dp", "tp", "cp", "ep"), "a whole number >= 1"),
    "tokens_per_step": "a number > 0",
    **dict.fromkeys(("strategy", "schedule", "source", "model", "memory_note"), "a string"),
    **dict.fromkeys(("layout", "mesh", "config"), "an object"),
    **dict.fromkeys(("peak_memory_bytes", "memory_by_kind", "memory_ranks", "step_records", "generations",
                     "warnings"), "a list"),
    "losses": "a list of numbers",  # a diverged run's NaN among them, saved as null
}
_KIND_CHECKS = {"a whole number >= 1": lambda v: type(v) is int and 1 <= v < 2**63,
                "a world size": lambda v: type(v) is int and 0 <= v <= MAX_RANKS,
                "a number > 0": lambda v: finite_number(v) and v > 0,
                "a string": lambda v: type(v) is str, "an object": lambda v: type(v) is dict,
                "a list": lambda v: type(v) is list,
                "a list of numbers": lambda v: type(v) is list and all(
                   x is None or type(x) in (int, float) for x in v)}


def _checked_meta(meta, where: str) -> dict:
    """The meta object (a copy), its known keys of the right kind (null allowed), its per-rank map
    keyed by int again (JSON object keys are strings)."""
    if type(meta) is not dict:
        raise TraceFormatError(f"{where}: expected an object, got {_json_kind(meta)}")
    meta = dict(meta)
    for key, kind in _META_KINDS.items():
        if meta.get(key) is not None and not _KIND_CHECKS[kind](meta[key]):
            raise TraceFormatError(f"{where}.{key}: expected {kind}, got {_json_kind(meta[key])} "
                                   f"{json.dumps(meta[key])[:40]}")
    if meta.get("losses") is not None:
        meta["losses"] = [float("nan") if x is None else x for x in meta["losses"]]
    ranks, by_kind = meta.get("memory_ranks"), meta.get("memory_by_kind")
    if ranks is not None and (not all(type(r) is int for r in ranks) or len(ranks) != len(by_kind or ())):
        raise TraceFormatError(f"{where}.memory_ranks: expected the rank of each memory_by_kind entry")
    if "ranks" in meta:
        ranks = meta["ranks"]
        if type(ranks) is not dict or not all(str(k).lstrip("-").isdigit() for k in ranks):
            raise TraceFormatError(f"{where}.ranks: expected an object keyed by rank numbers")
        meta["ranks"] = {int(k): v for k, v in ranks.items()}
    return meta


def _check_one_run(folder: Path, files: list[Path], traces: list[Trace]) -> None:
    """TraceFormatError unless a folder's traces can be one run's: one world size in every file that
    says one, no rank beyond it and none missing (another run's files left in a reused --trace-dir, or
    a node's files left on its own disk, had merged in silence), the same settings in every file that
    records its run's (a ddp run's rank 0 beside a pipeline's rank 1), no rank in two files (a merged
    trace beside its per-rank files would count every span twice)."""
    sizes = {file: trace.meta["world_size"] for file, trace in zip(files, traces, strict=True)
             if trace.meta.get("world_size") is not None}
    first, world = next(iter(sizes.items()), (None, None))
    if other := next((file for file, size in sizes.items() if size != world), None):
        raise TraceFormatError(f"{folder}: {first.name} is a trace of a run of world size {world}, "
                               f"{other.name} of one of {sizes[other]}: merge each run's files alone")
    settings = [(file.name, trace.meta["config"]) for file, trace in zip(files, traces, strict=True)
                if isinstance(trace.meta.get("config"), dict)]
    if differ := first_difference(settings):
        raise TraceFormatError(f"{folder}: {differ[0]} is a trace of another run than {settings[0][0]}: "
                               f"it has {differ[1]}; merge each run's files alone")
    # where the settings agree, only the launch's id tells two runs apart
    ids = [(file, trace.meta["run_id"]) for file, trace in zip(files, traces, strict=True)
           if "run_id" in trace.meta]
    if other := next((file for file, run in ids if run != ids[0][1]), None):
        raise TraceFormatError(f"{folder}: {ids[0][0].name} and {other.name} are traces of two launches "
                               "(their run ids differ: a rerun's files beside an earlier run's?); merge each "
                               "run's files alone")
    holder: dict[int, Path] = {}
    for file, trace in zip(files, traces, strict=True):
        if twice := sorted(set(trace.ranks) & holder.keys()):
            raise TraceFormatError(f"{folder}: rank {twice[0]} is in {holder[twice[0]].name} and in "
                                   f"{file.name} (a merged trace beside its per-rank files?)")
        if world is not None and (beyond := [rank for rank in trace.ranks if rank >= world]):
            raise TraceFormatError(f"{folder}: {file.name} holds rank {beyond[0]}, beyond the world size "
                                   f"{world} of {first.name}: traces of two runs")
        holder.update(dict.fromkeys(trace.ranks, file))
    if missing := ranks_missing([trace.meta for trace in traces], world, holder.keys()):
        raise TraceFormatError(f"{folder}: holds {len(holder)} of the {world} ranks of its run; "
                               f"{numbered('rank', missing)} missing (each node writes its own ranks' files: "
                               f"gather every node's --trace-dir here, or write it to a shared file system)")


# The Chrome format wants a thread's complete events nested, and Perfetto drops those that overlap
# without nesting: a pipeline's sends in flight together, prefetched gathers and a ring's K/V transfers
# had lost up to a third of a trace's communication there. Each such span goes on a further thread of
# its lane ("comm 2", ...), whose tid is the lane's plus CHROME_ROWS_APART for each row down.
CHROME_ROWS_APART = 100


def _chrome_threads(spans: list[Span]) -> dict[int, int]:
    """id(span) -> tid in its rank's process: its lane's, CHROME_ROWS_APART further for each row down."""
    rows = rows_in_flight(spans)
    return {id(s): LANES.index(s.lane) + CHROME_ROWS_APART * rows[id(s)] for s in spans}


def rows_in_flight(spans: list[Span]) -> dict[int, int]:
    """id(span) -> its row among the spans of its rank and lane that run at the same time (calls in flight
    together): the first row whose spans all ended by its start, 0 for a span nothing overlaps. The
    Chrome export's threads and the timeline's sub-rows."""
    ends: dict[tuple[int, str], list[float]] = defaultdict(list)  # each row's last span's end
    out = {}
    for s in sorted(spans, key=lambda s: (s.start, s.end)):
        taken = ends[s.rank, s.lane]
        row = next((k for k, end in enumerate(taken) if end <= s.start), len(taken))
        taken[row:row + 1] = [s.end]
        out[id(s)] = row
    return out


def _write_json(path: str | Path, head: dict, **arrays) -> Path:
    """Write ``{**head, name: [items...]}`` to ``path`` a thousand items at a time, so that writing a
    large trace never holds a second copy of it (as dicts and as one string) in memory. Written to a
    temporary file beside it, then renamed over it: an interrupt (Ctrl-C, an error) leaves the file
    that was there, never half a trace, and no temporary file. A symbolic link's target is written,
    the link kept; a path that is no regular file (a device, a pipe) is refused, not replaced."""
    check_replaceable(path, "output")
    path, target = Path(path), Path(path).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    try:
        with open(partial, "x", encoding="utf-8") as f:
            f.write(_json_of(head)[:-1])
            for name, items in arrays.items():
                f.write(f", {json.dumps(name)}: [")
                first = True
                while chunk := list(itertools.islice(items, 1000)):
                    f.write(("" if first else ", ") + _json_of(chunk)[1:-1])
                    first = False
                f.write("]")
            f.write("}")
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def _json_of(obj) -> str:
    """``obj`` as JSON, a non-finite number (a diverged run's NaN loss) as null: Perfetto, browsers and
    jq refuse a bare ``NaN``. Most chunks hold none, and pay only for the check that says so."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        return json.dumps(nulls_for_non_finite(obj), allow_nan=False)


_FIELD_VALUES = {cls: (cls.__slots__, operator.attrgetter(*cls.__slots__)) for cls in (Span, Counter)}


def _fields_of(obj) -> dict:
    """A Span's or Counter's fields as a dict (dataclasses.asdict, without its deep copy: 10x faster)."""
    names, values = _FIELD_VALUES[type(obj)]
    return dict(zip(names, values(obj)))


def span_group(span: Span, world: int) -> tuple[int, ...] | None:
    """The ranks a communication span ran among, in a world of ``world`` ranks (see Trace.group_of)."""
    if span.group_ranks:
        return tuple(span.group_ranks)
    if span.peer is not None:
        return tuple(sorted((span.rank, span.peer)))
    if span.group_size >= world:
        return tuple(range(world))
    return None


def _mean_covered(intervals: dict[int, list[tuple[float, float]]],
                  windows: dict[int, list[tuple[float, float]]]) -> dict[int, float]:
    """Per rank: the time its intervals cover (overlaps counted once) per window of its own, averaged
    over those windows. Linear in intervals: each rank's are merged into one union, once."""
    covered = {}
    for rank, pairs in intervals.items():
        union, own = Covered(pairs), windows.get(rank, [])
        covered[rank] = sum(union.covered(lo, hi) for lo, hi in own) / max(len(own), 1)
    return covered


def _over_ranks(own: dict[int, dict[int, tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    """step -> (start, end) over all ranks, from each rank's own windows (:meth:`Trace.step_windows`)."""
    windows: dict[int, tuple[float, float]] = {}
    for per_rank in own.values():
        for step, (lo, hi) in per_rank.items():
            first, last = windows.get(step, (lo, hi))
            windows[step] = (min(first, lo), max(last, hi))
    return dict(sorted(windows.items()))


def past_warm_up(steps: list[int]) -> list[int]:
    """``steps`` (in order) without a job's first, step 0, which pays for warm-up (allocations, the
    first calls' set-up), where there are others. A trace whose first step is later keeps them all:
    torch.profiler's schedule records only after steps of its own to wait and warm up (a profile of
    steps 2 and 3 had been summarised from step 3 alone)."""
    return [step for step in steps if step != 0] or steps


class Covered:
    """The time covered by some intervals (overlaps counted once), as sorted disjoint intervals with
    running totals, so the time covered inside any window is two binary searches away."""

    def __init__(self, intervals: list[tuple[float, float]]):
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.before: list[float] = []  # covered time before each interval
        total = 0.0
        for lo, hi in sorted(pair for pair in intervals if pair[1] > pair[0]):
            if self.ends and lo <= self.ends[-1]:
                if hi > self.ends[-1]:
                    total += hi - self.ends[-1]
                    self.ends[-1] = hi
                continue
            self.starts.append(lo)
            self.ends.append(hi)
            self.before.append(total)
            total += hi - lo
        self.length = total

    def _until(self, t: float) -> float:
        """Time covered before ``t``."""
        i = bisect.bisect_right(self.starts, t) - 1
        return 0.0 if i < 0 else self.before[i] + min(t, self.ends[i]) - self.starts[i]

    def covered(self, lo: float, hi: float) -> float:
        return max(self._until(hi) - self._until(lo), 0.0)

    def within(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """The covered stretches between ``lo`` and ``hi``."""
        i = max(bisect.bisect_right(self.starts, lo) - 1, 0)
        out = []
        while i < len(self.starts) and self.starts[i] < hi:
            if self.ends[i] > lo:
                out.append((max(self.starts[i], lo), min(self.ends[i], hi)))
            i += 1
        return out

    def minus(self, other: Covered) -> list[tuple[float, float]]:
        """This union's intervals with ``other``'s cut out, in order. Linear: each interval of
        ``other`` is passed once, and looked at again only by the intervals of this one it overlaps."""
        out, j = [], 0
        for lo, hi in zip(self.starts, self.ends):
            while j < len(other.ends) and other.ends[j] <= lo:
                j += 1
            k = j
            while k < len(other.starts) and other.starts[k] < hi:
                if other.starts[k] > lo:
                    out.append((lo, other.starts[k]))
                lo = max(lo, other.ends[k])
                k += 1
            if hi > lo:
                out.append((lo, hi))
        return out
