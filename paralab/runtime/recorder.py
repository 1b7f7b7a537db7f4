"""Per-rank span recorder: the measuring half of paralab's tracing.

Each rank owns one :class:`Recorder`. Strategies wrap compute in ``recorder.span("forward")`` and
paralab.comm wraps every collective, so the rank's timeline is complete without the strategy
having to think about timing.

Why two clocks: on CPU a host clock is the truth, but on CUDA the host only *enqueues* kernels, so
host timestamps would show launch times, not execution. There, each span records a pair of CUDA
events on the current stream and the times are resolved (one synchronisation) when the step ends.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from paralab.trace import COMM, COMPUTE, STEP, Counter, Span, Trace

_ACTIVE: Recorder | None = None


def active() -> Recorder | None:
    """The recorder of this process, if a paralab rank is running here (used by paralab.comm)."""
    return _ACTIVE


class Recorder:
    def __init__(self, rank: int, *, enabled: bool = True, cuda: bool = False, node_of=None):
        self.rank = rank
        self.enabled = enabled
        self.cuda = cuda
        self.node_of = node_of or (lambda r: 0)
        self.spans: list[Span] = []
        self.counters: list[Counter] = []
        self.context: dict = {"step": None, "microbatch": None, "stage": None}
        self._t0 = time.perf_counter()
        self._pending_cuda: list[tuple] = []  # (span, its start, end, issued and wait events)
        self._cuda_ref = None
        self._cuda_shift = 0.0
        self.on_step = None  # called with the step number as each step begins (progress, heartbeats)
        # While torch.profiler records (paralab.profiling.profile_rank): (kind, lane, fields, start) ->
        # the name of a record_function range opened and closed with each span, so profiles carry spans;
        # and (moment, label) -> the name of the empty range that marks a moment of that span's call.
        self.range_label = self.mark_label = None

    # ------------------------------------------------------------------ clock
    def start_clock(self, align=None) -> None:
        """Zero the clock. Called by every rank right after the same barrier, which puts all ranks'
        spans on one timeline to within the barrier's exit skew: tens of microseconds on idle cores,
        milliseconds when ranks share cores. ``align(t0)`` (every rank calls it: it may be collective)
        returns the zero to use instead, on the same perf_counter clock (see worker.rank_session)."""
        self._t0 = time.perf_counter()
        if self.cuda:
            import torch

            self._cuda_ref = torch.cuda.Event(enable_timing=True)
            self._cuda_ref.record()
            self._cuda_ref.synchronize()
            self._t0 = time.perf_counter()
        if align is not None:
            origin = align(self._t0)
            self._cuda_shift = self._t0 - origin  # CUDA times count from the reference event, at _t0
            self._t0 = origin

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def activate(self) -> Recorder:
        global _ACTIVE
        _ACTIVE = self
        return self

    def deactivate(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    # ------------------------------------------------------------------ spans
    def set_context(self, **fields) -> None:
        """Tag the following spans with step / microbatch / stage."""
        self.context.update(fields)

    @contextmanager
    def tagged(self, **fields):
        """Tag the spans opened inside with ``fields``, then the context as it was: a receive posted
        ahead, during another action, is its own action's."""
        before = {key: self.context.get(key) for key in fields}
        self.set_context(**fields)
        try:
            yield
        finally:
            self.set_context(**before)

    def open(self, kind: str, lane: str = COMPUTE, **fields) -> _OpenSpan | None:
        """Start a span. With tracing disabled only step spans are kept (step times stay measurable)."""
        if not self.enabled and lane != STEP:
            return None
        return _OpenSpan(self, kind, lane, fields)

    def close(self, handle: _OpenSpan | None, blocking: bool = False) -> None:
        if handle is not None:
            handle.close(blocking)

    @contextmanager
    def span(self, kind: str, lane: str = COMPUTE, **fields):
        handle = self.open(kind, lane, **fields)
        try:
            yield handle
        finally:
            self.close(handle)

    def _add(self, span: Span, start_event=None, end_event=None, issue_event=None, wait_event=None) -> None:
        if start_event is not None:
            self._pending_cuda.append((span, start_event, end_event, issue_event, wait_event))
        self.spans.append(span)

    def counter(self, name: str, value: float) -> None:
        if self.enabled:
            self.counters.append(Counter(self.rank, name, self.now(), float(value)))

    @contextmanager
    def step(self, step: int):
        """The whole step on this rank: defines the step windows that summaries are computed over."""
        self.set_context(step=step, microbatch=None, stage=None)
        if self.on_step is not None:
            self.on_step(step)
        with self.span("step", lane=STEP, name=f"step {step}"):
            yield
        self.flush()

    def flush(self) -> None:
        """Resolve CUDA event times into the host clock (one sync per step, never per span)."""
        if not self._pending_cuda:
            return
        import torch

        torch.cuda.synchronize()

        def at(event) -> float:  # on the host clock, every event read the same way
            return self._cuda_ref.elapsed_time(event) / 1e3 + self._cuda_shift

        for span, start_ev, end_ev, issue_ev, wait_ev in self._pending_cuda:
            span.start, span.end = at(start_ev), at(end_ev)
            if issue_ev is not None:  # a blocking call's is its end event: all of it, exactly
                span.issue_s = at(issue_ev) - span.start
            if wait_ev is not None:
                span.waited_s = span.end - at(wait_ev)
        self._pending_cuda.clear()

    def trace(self, meta: dict | None = None) -> Trace:
        self.flush()
        return Trace(spans=list(self.spans), counters=list(self.counters), meta=dict(meta or {}))


class _OpenSpan:
    """A span that has started; closing it records the end (host time, or a CUDA event)."""

    def __init__(self, recorder: Recorder, kind: str, lane: str, fields: dict):
        self.recorder = recorder
        self.kind, self.lane = kind, lane
        self.fields = {**recorder.context, **fields}
        self.start = recorder.now()
        self.range = self.label = None
        if recorder.range_label is not None:
            from torch.profiler import record_function

            self.label = recorder.range_label(kind, lane, self.fields, self.start)
            self.range = record_function(self.label).__enter__()
        self.start_event = _event() if recorder.cuda else None
        self.marks: dict[str, tuple[float, object]] = {}  # moment -> (host time, CUDA event or None)

    def mark(self, moment: str) -> None:
        """Note that the call issuing this span's work has returned (``"issued"``: Span.issue_s, all of
        a blocking call), or that the rank begins to wait for it (``"wait"``: Span.waited_s, an async
        call's wait()). While profiling, an empty range named after the span's own marks the moment
        for the import."""
        self._marked(moment, self.recorder.now(), _event() if self.start_event is not None else None)

    def _marked(self, moment: str, t: float, event) -> None:
        self.marks[moment] = (t, event)
        rec = self.recorder
        if self.label is not None and rec.mark_label is not None:
            from torch.profiler import record_function

            with record_function(rec.mark_label(moment, self.label)):
                pass

    def close(self, blocking: bool = False) -> None:
        """``blocking``: the span was one call, waited out whole, so its issue is all of it."""
        rec = self.recorder
        end_event = _event() if self.start_event is not None else None
        end = rec.now()
        if self.range is not None:
            self.range.__exit__(None, None, None)
        if blocking:  # marked after the range, so a profile's blocking call is all issue whatever its clock
            self._marked("issued", end, end_event)
        fields = dict(self.fields)
        name = fields.pop("name", "") or self.kind
        issued, issue_event = self.marks.get("issued", (None, None))
        waited, wait_event = self.marks.get("wait", (None, None))
        span = Span(rank=rec.rank, lane=self.lane, kind=self.kind, start=self.start, end=end, name=name,
                    issue_s=0.0 if issued is None else issued - self.start,
                    waited_s=0.0 if waited is None else end - waited, **fields)
        rec._add(span, self.start_event, end_event, issue_event, wait_event)


def _event():
    """A CUDA timing event recorded now on the current stream."""
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


__all__ = ["Recorder", "active", "COMM", "COMPUTE", "STEP"]
