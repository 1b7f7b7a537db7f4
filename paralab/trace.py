"""The one trace type of paralab: measured runs and the simulator both produce a :class:`Trace`.

A trace is a list of :class:`Span` (a stretch of time on one rank's compute or comm lane) plus
:class:`Counter` samples (utilisation, memory) and free-form ``meta``. Times are seconds on one clock
shared by all ranks: every rank starts its clock when it leaves the same barrier, so spans from
different ranks (and from files written by different torchrun workers) line up when merged.

Traces save as plain JSON (never pickle) and export to the Chrome trace event format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

COMPUTE, COMM, STEP, EVENT = "compute", "comm", "step", "event"
LANES = (COMPUTE, COMM, STEP, EVENT)
FORMAT_VERSION = 1


@dataclass
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

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Counter:
    """A sampled value on one rank (CPU %, memory bytes, ...), drawn as a counter track."""

    rank: int
    name: str
    t: float
    value: float


@dataclass
class Trace:
    spans: list[Span] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def merge(cls, traces: list[Trace]) -> Trace:
        """Put per-rank traces (already on the shared clock) into one, keeping the first meta."""
        merged = cls(meta=dict(traces[0].meta) if traces else {})
        ranks_meta: dict = {}
        for trace in traces:
            merged.spans.extend(trace.spans)
            merged.counters.extend(trace.counters)
            ranks_meta.update(trace.meta.get("ranks", {}))
        if ranks_meta:
            merged.meta["ranks"] = ranks_meta
        merged.spans.sort(key=lambda s: (s.start, s.rank))
        return merged

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.spans} | {c.rank for c in self.counters})

    def select(self, lane: str | None = None, kind: str | None = None, rank: int | None = None) -> list[Span]:
        return [
            s
            for s in self.spans
            if (lane is None or s.lane == lane) and (kind is None or s.kind == kind) and (rank is None or s.rank == rank)
        ]

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict:
        return {
            "format": "paralab-trace",
            "version": FORMAT_VERSION,
            "meta": self.meta,
            "spans": [dataclasses.asdict(s) for s in self.spans],
            "counters": [dataclasses.asdict(c) for c in self.counters],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        """A paralab trace dict, or a Chrome trace export written by :meth:`to_chrome`."""
        if "traceEvents" in data:
            return cls.from_chrome(data)
        if data.get("format") != "paralab-trace":
            raise ValueError("not a paralab trace (no 'format: paralab-trace', no 'traceEvents')")
        return cls(
            spans=[Span(**s) for s in data.get("spans", [])],
            counters=[Counter(**c) for c in data.get("counters", [])],
            meta=_int_rank_keys(data.get("meta", {})),
        )

    @classmethod
    def from_chrome(cls, data: dict) -> Trace:
        """Rebuild the trace from :meth:`to_chrome` output: every span field travels in the event's args."""
        fields = {f.name for f in dataclasses.fields(Span)}
        spans = [Span(**{k: v for k, v in e["args"].items() if k in fields})
                 for e in data["traceEvents"] if e.get("ph") == "X" and "lane" in e.get("args", {})]
        counters = [Counter(e["pid"], e["name"], e["ts"] / 1e6, float(e["args"][e["name"]]))
                    for e in data["traceEvents"] if e.get("ph") == "C"]
        meta = _int_rank_keys(dict(data.get("otherData", {}).get("paralab", {})))
        return cls(spans=sorted(spans, key=lambda s: (s.start, s.rank)), counters=counters, meta=meta)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Load a paralab trace file, or merge every ``*.json`` trace in a directory (torchrun --trace-dir)."""
        path = Path(path)
        if path.is_dir():
            files = sorted(path.glob("*.json"))
            if not files:
                raise FileNotFoundError(f"no trace files (*.json) in {path}")
            return cls.merge([cls.load(f) for f in files])
        return cls.from_dict(json.loads(path.read_text()))

    def to_chrome(self) -> dict:
        """Chrome trace event format: one process per rank, one thread per lane, counters as 'C' events."""
        lane_tid = {lane: i for i, lane in enumerate(LANES)}
        events: list[dict] = []
        for rank in self.ranks:
            events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
            for lane, tid in lane_tid.items():
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": lane}})
        for s in self.spans:
            args = {k: v for k, v in dataclasses.asdict(s).items() if v is not None}
            events.append(
                {
                    "ph": "X",
                    "name": s.name or s.kind,
                    "cat": s.kind,
                    "pid": s.rank,
                    "tid": lane_tid.get(s.lane, len(LANES)),
                    "ts": s.start * 1e6,
                    "dur": max(s.duration, 0.0) * 1e6,
                    "args": args,
                }
            )
        for c in self.counters:
            events.append({"ph": "C", "name": c.name, "pid": c.rank, "ts": c.t * 1e6, "args": {c.name: c.value}})
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"paralab": self.meta}}

    def save_chrome(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_chrome()))
        return path

    # ------------------------------------------------------------------ metrics
    def step_windows(self) -> dict[int, tuple[float, float]]:
        """step -> (start, end) over all ranks, from the per-rank ``step`` spans."""
        windows: dict[int, list[float]] = {}
        for s in self.spans:
            if s.lane == STEP and s.step is not None:
                lo, hi = windows.get(s.step, (s.start, s.end))
                windows[s.step] = (min(lo, s.start), max(hi, s.end))
        return dict(sorted(windows.items()))

    def step_times(self) -> list[float]:
        return [hi - lo for lo, hi in self.step_windows().values()]

    def median_step_time(self) -> float:
        """Median step time over the steps after the first (the first pays for warm-up)."""
        times = self.step_times()
        if not times:
            return 0.0
        return statistics.median(times[1:] if len(times) > 1 else times)

    def busy_time(self, rank: int, lane: str = COMPUTE, window: tuple[float, float] | None = None) -> float:
        """Time covered by the rank's spans on a lane (overlaps counted once), clipped to a window."""
        return _clipped_union([s for s in self.spans if s.rank == rank and s.lane == lane], window)

    def _chosen_windows(self, steps: list[int] | None = None) -> list[tuple[float, float]]:
        windows = self.step_windows()
        return [windows[k] for k in (steps if steps is not None else _after_first(list(windows)))]

    def _mean_busy(self, lanes: str | tuple[str, ...], windows: list[tuple[float, float]]
                   ) -> dict[int, float]:
        """Per rank: time covered by its spans on ``lanes`` (one lane or several, overlaps counted
        once) per window, averaged over the windows (spans are grouped by rank once, so large
        simulated traces stay fast)."""
        lanes = (lanes,) if isinstance(lanes, str) else lanes
        by_rank: dict[int, list[Span]] = {rank: [] for rank in self.ranks}
        for s in self.spans:
            if s.lane in lanes:
                by_rank[s.rank].append(s)
        n = max(len(windows), 1)
        return {rank: sum(_clipped_union(spans, w) for w in windows) / n for rank, spans in by_rank.items()}

    def idle_fraction(self, steps: list[int] | None = None) -> dict[int, float]:
        """Per rank: share of the step windows in which the rank computes nothing (waits or talks)."""
        chosen = self._chosen_windows(steps)
        mean_window = sum(hi - lo for lo, hi in chosen) / max(len(chosen), 1)
        busy = self._mean_busy(COMPUTE, chosen)
        return {rank: 1.0 - b / mean_window if mean_window > 0 else 0.0 for rank, b in busy.items()}

    def bubble_fraction(self) -> float:
        """Idle time inside the steps / (ranks x step time), over the steps after the first."""
        fractions = self.idle_fraction()
        return sum(fractions.values()) / len(fractions) if fractions else 0.0

    def comm_bytes(self, payload: bool = False) -> dict[str, int]:
        """op -> bytes per step summed over ranks (wire bytes, or payload bytes with payload=True)."""
        steps = max(len(self.step_windows()), 1)
        totals: dict[str, float] = defaultdict(float)
        for s in self.spans:
            if s.lane == COMM:
                totals[s.kind] += s.payload_bytes if payload else s.bytes
        return {op: int(round(v / steps)) for op, v in sorted(totals.items())}

    def comm_bytes_by_link(self) -> dict[str, int]:
        """Wire bytes per step summed over ranks, split into intra-node and inter-node traffic."""
        steps = max(len(self.step_windows()), 1)
        split = {"intra_node": 0, "inter_node": 0}
        for s in self.select(lane=COMM):
            split["inter_node" if s.inter_node else "intra_node"] += s.bytes
        return {k: v // steps for k, v in split.items()}

    def time_breakdown(self) -> dict[int, dict[str, float]]:
        """Per rank, seconds per step (steps after the first): where the step's time went.

        ``compute_s`` computing; ``comm_s`` communicating, split into ``overlapped_comm_s`` (while
        also computing) and ``exposed_comm_s`` (nothing computed meanwhile); ``idle_s`` not computing
        (step time - compute: exposed communication included); ``wait_s`` neither computing nor
        communicating: waiting on another rank, the host or the data, with nothing recorded.
        """
        step_time = self.median_step_time()
        chosen = self._chosen_windows()
        compute, comm = self._mean_busy(COMPUTE, chosen), self._mean_busy(COMM, chosen)
        either = self._mean_busy((COMPUTE, COMM), chosen)
        return {
            rank: {
                "compute_s": compute[rank],
                "comm_s": comm[rank],
                "overlapped_comm_s": max(compute[rank] + comm[rank] - either[rank], 0.0),
                "exposed_comm_s": max(either[rank] - compute[rank], 0.0),
                "idle_s": max(step_time - compute[rank], 0.0),
                "wait_s": max(step_time - either[rank], 0.0),
            }
            for rank in self.ranks
        }

    def summary(self) -> dict:
        """Headline metrics of the run: the numbers the CLI's --json and the notebooks show.

        ``per_rank`` holds :meth:`time_breakdown`; the same keys at the top level are its means over
        the ranks."""
        step_time = self.median_step_time()
        tokens = self.meta.get("tokens_per_step", 0)
        per_rank = self.time_breakdown()
        keys = next(iter(per_rank.values()), {})
        means = {key: sum(r[key] for r in per_rank.values()) / len(per_rank) for key in keys}
        return {
            "step_time_s": step_time,
            "step_times_s": self.step_times(),
            "tokens_per_s": tokens / step_time if step_time > 0 else 0.0,
            "comm_bytes": self.comm_bytes(),
            "comm_payload_bytes": self.comm_bytes(payload=True),
            "comm_bytes_by_link": self.comm_bytes_by_link(),
            "per_rank": per_rank,
            "bubble_fraction": self.bubble_fraction(),
            **means,
        }


def _int_rank_keys(meta: dict) -> dict:
    if "ranks" in meta:  # JSON object keys are strings
        meta["ranks"] = {int(k): v for k, v in meta["ranks"].items()}
    return meta


def _after_first(steps: list[int]) -> list[int]:
    return steps[1:] if len(steps) > 1 else steps


def _clipped_union(spans: list[Span], window: tuple[float, float] | None) -> float:
    intervals = []
    for s in spans:
        lo, hi = s.start, s.end
        if window is not None:
            lo, hi = max(lo, window[0]), min(hi, window[1])
        if hi > lo:
            intervals.append((lo, hi))
    return _union_length(intervals)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total
