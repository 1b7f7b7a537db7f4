"""The elastic monitor: world size, step time and utilisation redrawn as samples arrive.

A running elastic job (or a notebook polling one) calls ``monitor.push(counters=..., spans=...)``
with new samples, or ``monitor.update(trace)`` with a whole trace; the figure redraws in place, so
the notebook shows the run as it goes. Samples pushed without the run's history (its trace's meta) are
told apart into worlds by the ranks that recorded each step (``paralab.viz.elastic.step_records``).
"""

from __future__ import annotations

import math

from paralab.text import count_text
from paralab.trace import Trace
from paralab.widgets._common import attach, figure_widget, message, replace_figure, widgets


def elastic_monitor(trace: Trace | None = None, title: str = "elastic training"):
    """Attributes: ``figure``, ``status`` (HTML line), ``trace``, ``push(counters=, spans=)``,
    ``update(trace)``."""
    from paralab.viz._common import as_trace
    from paralab.viz.elastic import elastic, step_records

    def own_copy(given) -> Trace:  # push() extends it: the caller's run had grown the samples pushed
        t = as_trace(given)
        return Trace(spans=list(t.spans), counters=list(t.counters), meta=dict(t.meta))

    w = widgets()
    state = {"trace": own_copy(trace) if trace is not None else Trace()}
    fw = figure_widget(elastic(state["trace"], title=title))
    status = w.HTML()

    def redraw():
        t = state["trace"]
        replace_figure(fw, elastic(t, title=title))
        sizes = [c for c in t.counters if c.name == "world_size" and math.isfinite(c.value)]
        events = [s for s in t.spans if s.lane == "event"]
        parts = []
        if sizes:
            parts.append(f"world size {int(max(sizes, key=lambda c: c.t).value)}")
        parts.append(count_text(len(t.step_windows()) or len(step_records(t)), "step"))  # samples alone
        if events:
            last = max(events, key=lambda s: s.start)
            parts.append(f"last event: {last.kind} {last.name} at {last.start:.1f} s")
        status.value = message(" · ".join(parts))

    def update(new_trace) -> None:
        state["trace"] = own_copy(new_trace)
        app.trace = state["trace"]
        redraw()

    def push(counters=(), spans=()) -> None:
        state["trace"].counters.extend(counters)
        state["trace"].spans.extend(spans)
        redraw()

    app = w.VBox([status, fw])
    attach(app, figure=fw, status=status, trace=state["trace"], push=push, update=update)
    redraw()
    return app
