"""paralab's own runs recorded by torch.profiler, so that a profile speaks paralab's language.

With ``--profile DIR`` (``RunConfig.profile_dir``) each rank trains inside :func:`profile_rank` and
writes ``DIR/rank{r}.json``, a plain torch.profiler (Kineto) trace. While it records, the rank's
Recorder opens a ``record_function`` range with every span and closes it with the span, named by
:func:`span_label`::

    paralab compute:forward step=3 microbatch=1 stage=2 clock=0.041375
    paralab comm:all_reduce name=bucket%200 step=3 bytes=10528 payload_bytes=5264 group_size=2 clock=0.043106
    paralab step:step name=step%203 step=3 clock=0.041200

and, where the call issuing a communication span returned (its ``issue_s``) and where an async one's
wait() began (its ``waited_s``), an empty range named after that span's (:func:`mark_label`)::

    paralab issued comm:all_reduce name=mlp%20g step=3 bytes=64 payload_bytes=64 group_size=2 clock=0.043106

so Perfetto shows paralab's spans beside torch's operators, and :mod:`paralab.trace_import` reads
them back (:func:`parse_label`) into the very spans paralab's own trace holds. Keys are
:class:`~paralab.trace.Span` field names; values are URL-quoted; fields left at their defaults are
left out. Every range also carries ``clock``, the recorder's clock when the span opened (seconds
since the barrier that started every rank's clock, to the microsecond), so the import can put each
rank's profile on paralab's own timeline: a range opens a little after its clock read, by a delay
that is usually microseconds but can be milliseconds when the process is descheduled between the
two, so the import takes the smallest of the many (range start - clock). The run's metadata
(strategy, schedule, degrees, tokens per step) travels as the trace's top-level ``paralab`` key.

The format lives here alone: the recorder is handed :func:`span_label` and :func:`mark_label` while
profiling is on and knows nothing of them otherwise.

Your own job profiles itself (torch.profiler in its training loop);
:func:`paralab.runtime.torchrun.run_torchrun` runs such a script under torchrun on this machine from
a notebook or a test, and leaves no process behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote

from paralab.trace import Span

PREFIX = "paralab "
MOMENTS = ("issued", "wait")  # of a communication span: its call returned; its wait() began
METADATA_KEY = "paralab"
_LIST_FIELDS, _BOOL_FIELDS, _TEXT_FIELDS = ("group_ranks",), ("inter_node",), ("name",)
_UNLABELLED = ("rank", "lane", "kind", "start", "end")  # the prefix and the profiler's own timing carry these
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Span) if f.default is not dataclasses.MISSING}


def span_label(kind: str, lane: str, fields: dict, clock: float) -> str:
    """The record_function name of a span: ``paralab LANE:KIND key=value ... clock=SECONDS`` (module
    docstring). ``clock`` (the recorder's time at opening) is written on every span: each is one
    sample of the offset between the profiler's clock and paralab's, and the import needs the one
    sample taken with the least delay."""
    parts = [f"{PREFIX}{lane}:{kind}"]
    for key, value in fields.items():
        if key in _UNLABELLED or value == _DEFAULTS.get(key) or (key == "name" and value == kind):
            continue
        if key in _LIST_FIELDS:
            value = ",".join(str(v) for v in value)
        elif key in _BOOL_FIELDS:
            value = 1
        parts.append(f"{key}={quote(str(value), safe=',')}")
    parts.append(f"clock={clock:.6f}")
    return " ".join(parts)


def mark_label(moment: str, label: str) -> str:
    """The name of the empty range that marks a ``moment`` (one of :data:`MOMENTS`) of the span
    labelled ``label``: ``paralab MOMENT`` and the span's own label, so the import pairs the two."""
    return f"{PREFIX}{moment} {label.removeprefix(PREFIX)}"


def marked(text: str) -> tuple[str, str] | None:
    """(moment, the label of the span) a :func:`mark_label` range marks, or None for any other range."""
    for moment in MOMENTS:
        if text.startswith(head := f"{PREFIX}{moment} "):
            return moment, PREFIX + text.removeprefix(head)
    return None


def parse_label(text: str) -> dict | None:
    """Span fields (lane, kind, ...; ``clock`` when present) from a :func:`span_label` name, or None
    for any other range name."""
    if not text.startswith(PREFIX):
        return None
    head, *pairs = text[len(PREFIX):].split(" ")
    lane, _, kind = head.partition(":")
    if not kind:
        return None
    out: dict = {"lane": lane, "kind": kind}
    known = set(_DEFAULTS) | {"clock"}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in known:
            continue
        value = unquote(value)
        if key in _TEXT_FIELDS:
            out[key] = value
        elif key in _LIST_FIELDS:
            out[key] = [int(v) for v in value.split(",") if v]
        elif key in _BOOL_FIELDS:
            out[key] = value == "1"
        elif key == "clock":
            out[key] = float(value)
        else:
            out[key] = int(value)
    return out


@contextmanager
def profile_rank(ctx):
    """Run the body under torch.profiler when ``cfg.profile_dir`` is set (else do nothing), with the
    recorder's spans as record_function ranges; write ``profile_dir/rank{r}.json`` at the end."""
    cfg, recorder = ctx.cfg, ctx.recorder
    if not cfg.profile_dir:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    from paralab.runtime.result import run_meta

    # kineto prints a "USDT: ... profiler_start" line on stderr for every profile unless told not to:
    # in a notebook that is a red box per rank for no news
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if recorder.cuda else [])
    # record_shapes: torch's own communication ops then carry their tensor sizes, so an import that
    # ignores paralab's names (names="torch") still finds the bytes
    with profile(activities=activities, record_shapes=True) as prof:
        recorder.range_label, recorder.mark_label = span_label, mark_label
        try:
            yield
        finally:
            recorder.range_label = recorder.mark_label = None
        prof.add_metadata_json(METADATA_KEY, json.dumps(run_meta(cfg, ctx.layout)))
    path = Path(cfg.profile_dir) / f"rank{recorder.rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
