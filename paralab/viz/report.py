"""One standalone HTML report of a run, for people who are not in Jupyter.

``write_report(run_or_trace, "report.html")`` writes a single file with plotly.js embedded inline
(it opens offline, from a mail attachment or a CI artifact, and fetches nothing): a summary table,
the timeline (with a prediction stacked under it when given), bubbles on pipeline runs,
communication by op, rank by rank and by link, memory per rank, losses and throughput per step,
and the elastic view when the trace has world-size samples or events.

The CLI wires ``paralab report TRACE.json -o report.html`` with :func:`add_report_args` and
:func:`report_main`, and ``paralab run ... --report report.html`` by calling :func:`write_report`
on the RunResult. TRACE.json may be a paralab trace, a directory of per-rank traces (torchrun
``--trace-dir``), or the Chrome/Perfetto export ``RunResult.save_trace`` writes.

This module imports plotly only inside the functions that draw (DESIGN principle 6).
"""

from __future__ import annotations

import argparse
import datetime
import html
import sys
from pathlib import Path

from paralab.config import finite_number
from paralab.sim.specs import DEGREES
from paralab.text import count_text, steps_said
from paralab.trace import SPAN_FIGURES, Trace, load_spans, not_measured, past_warm_up, pipelined


# ------------------------------------------------------------------------------------------- content
def _summary_of(obj) -> tuple[Trace, dict, list[float] | None]:
    """(trace, summary dict, losses or None) from a RunResult or a Trace; without a pipeline, no
    bubble row (its 0 says only that there is no pipeline), whichever the report was given."""
    if isinstance(obj, Trace):
        trace, summary, meta = obj, obj.summary(), obj.meta
        # a run's trace records its layout, config and losses: the rows a --report of the run shows
        described = {**_picked(meta.get("config"), CONFIG_KEYS), **_picked(meta.get("layout"), LAYOUT_KEYS),
                     **_picked(meta, TRACE_KEYS)}
        summary.update({key: value for key, value in described.items() if value not in (None, "")})
        summary.setdefault("world_size", len(obj.ranks))
        losses = summary.get("losses") or None
    else:
        trace = getattr(obj, "trace", None)
        if not isinstance(trace, Trace):
            raise TypeError(f"write_report needs a Trace or a RunResult, got {type(obj).__name__}")
        summary, losses = dict(obj.summary), list(getattr(obj, "losses", []) or []) or None
    if not pipelined(trace.meta):
        summary.pop("bubble_fraction", None)
    return trace, summary, losses


# what a trace's meta, its layout and its config say of the run, as the summary's keys
TRACE_KEYS = ("strategy", "world_size", "dp", "tp", "pp", "cp", "ep", "schedule", "microbatches",
              "virtual_stages", "model", "source", "memory_by_kind", "memory_ranks", "peak_memory_bytes",
              "bytes_unknown_ops", "losses")
LAYOUT_KEYS = ("cp_mode", "cp_split", "zero", "sequence_parallel")
CONFIG_KEYS = ("steps", "device", "dtype")


def _picked(source, keys: tuple[str, ...]) -> dict:
    return {key: source[key] for key in keys if key in source} if isinstance(source, dict) else {}


def _shown(key: str, summary: dict) -> bool:
    """Whether the summary table has a row for ``key``: every degree that makes up the world, and the
    choices that change a run only where they apply (a cp mode at cp 2, sequence parallel at tp 2,
    ZeRO from stage 1, ep from 2, virtual stages from 2)."""
    value = summary.get(key)
    if key in ("cp_mode", "cp_split"):
        return summary.get("cp", 1) > 1 and bool(value)
    if key == "sequence_parallel":
        return summary.get("tp", 1) > 1 and value is not None
    if key in ("zero", "virtual_stages", "ep"):
        return isinstance(value, int) and value > (0 if key == "zero" else 1)
    return value not in (None, "") or key in SPAN_FIGURES


def _value_text(key: str, value, summary: dict) -> str:
    """A summary value as the table shows it: a throughput of 0 beside a step time is one the trace
    cannot know (it does not say how many tokens a step trained on, as an imported profile does not);
    a figure of spans that the run did not record is said not measured, and why."""
    if value is None and key in SPAN_FIGURES:
        return not_measured(summary["unmeasured_why"])
    if key == "tokens_per_s" and not value and summary.get("step_time_s"):
        imported = summary.get("source") == "imported"
        return ("unknown: the trace does not say how many tokens a step trains on"
                + (" (paralab import --tokens-per-step)" if imported else ""))
    unknown = set(summary.get("bytes_unknown_ops") or ())
    if unknown and key in ("comm_bytes", "comm_payload_bytes"):  # profiled without record_shapes
        return _fmt({op: "unknown (no record_shapes)" if op in unknown else v for op, v in value.items()})
    if unknown and key == "comm_bytes_by_link":
        return _fmt(value) + f" (without {', '.join(sorted(unknown))}: their sizes are unknown)"
    if key == "step_time_s" and value:  # the per-rank table below takes the steps' mean
        which = "its one step, warm-up included" if summary.get("steps") == 1 else "the median step"
        return f"{value * 1e3:.2f} ms ({which})"
    if key == "tokens_per_s" and value:
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    if key == "bubble_fraction" and value is not None:
        return f"{value:.1%}"
    return _fmt(value)


def _fmt(value) -> str:
    from paralab.viz._common import fmt_bytes

    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {fmt_bytes(v) if isinstance(v, (int, float)) else v}"
                         for k, v in value.items()) or "—"
    if isinstance(value, list):
        shown = ", ".join(_fmt(v) if not isinstance(v, int) or v < 10**6 else fmt_bytes(v)
                          for v in value[:16])
        return shown + (" …" if len(value) > 16 else "")
    return str(value)


SUMMARY_KEYS = ("strategy", "source", "world_size", "dp", "cp", "cp_mode", "cp_split", "tp",
                "sequence_parallel", "pp", "schedule", "virtual_stages", "microbatches", "ep", "zero",
                "model", "dtype", "device", "steps", "step_time_s", "tokens_per_s", "bubble_fraction",
                "comm_bytes", "comm_payload_bytes", "comm_bytes_by_link", "peak_memory_bytes", "losses")


# Columns of the per-rank table: Trace.time_breakdown keys and their headings (ms per step).
RANK_COLUMNS = (("mean_step_s", "step (the steps' mean)"), ("compute_s", "compute"), ("comm_s", "comm"),
                ("overlapped_comm_s", "comm beside compute"),
                ("exposed_comm_s", "exposed comm"), ("comm_waiting_s", "comm waiting for peers"),
                ("comm_transfer_s", "comm moving data"), ("idle_s", "idle (not computing)"),
                ("wait_s", "waiting (nothing recorded)"))


def summary_table(summary: dict) -> str:
    """HTML tables: headline numbers, then where each rank's step time went (ms per step)."""
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_value_text(k, summary[k], summary))}</td></tr>"
        for k in SUMMARY_KEYS if k in summary and _shown(k, summary)
    )
    out = f'<table class="summary">{rows}</table>'
    per_rank = summary.get("per_rank") or {}
    if per_rank:
        body = "".join(
            f"<tr><td>r{r}</td>{''.join(f'<td>{v[key] * 1e3:.2f}</td>' for key, _ in RANK_COLUMNS)}</tr>"
            for r, v in sorted(per_rank.items(), key=lambda kv: int(kv[0]))
        )
        head = "".join(f"<th>{html.escape(label)} ms/step</th>" for _, label in RANK_COLUMNS)
        # scrolled sideways where the page is narrower than its columns (they had run past an 800 px edge)
        out += f'<div class="wide"><table class="ranks"><tr><th>rank</th>{head}</tr>{body}</table></div>'
        if summary.get("bubble_fraction") is not None:  # two idle figures of one rank, told apart
            out += f'<p class="sub">{IDLE_AGAINST_BUBBLE}</p>'
    return out


def prediction_line(predicted: Trace | None, summary: dict) -> str:
    """What the prediction stacked under the timeline says, beside what was measured: on which hardware,
    a step of how long, how much bubble (the page had drawn an H100's prediction as a sliver under a
    CPU's measurement without a word of either)."""
    from paralab.viz._common import hardware_said

    said = (predicted.meta.get("prediction") or {}) if predicted is not None else {}
    if not finite_number(said.get("step_time_s")):
        return ""
    on = hardware_said(predicted.meta)
    measured = summary.get("step_time_s")
    against = f", against {measured * 1e3:,.1f} ms measured" if finite_number(measured) else ""
    bubble = said.get("bubble_fraction")
    pipeline = f"; bubble {bubble:.1%}" if finite_number(bubble) and bubble > 0 else ""
    return (f'<p class="sub">predicted{on}: a step of {said["step_time_s"] * 1e3:,.1f} ms'
            f"{against}{pipeline}</p>")


IDLE_AGAINST_BUBBLE = (
    "idle (not computing) is each step less the compute, whose waits inside a pass (a blocking send, a "
    "tensor-parallel all-reduce) it leaves out, against the slowest rank's step; the pipeline bubble "
    "(bubble_fraction, and its figure below) counts those waits as the pass's and reads each rank "
    "against its own step: what the schedule leaves empty. So a rank's idle share reads at or above its "
    "bubble.")


def _worlds_text(meta: dict, ranks: int) -> str:
    """"2 ranks"; an elastic run's worlds in order, "4 ranks, then 3" (its trace holds every rank it had,
    and a run that ended on 2 had been headed "on 3 ranks"); a simulated step's ranks as one replica's
    pipeline of its whole layout (its report had read "5 ranks" beside the 1,000-GPU job's tokens/s)."""
    if replica := meta.get("replica_of"):  # a simulated step at scale draws one replica's pipeline ranks
        gpus = replica["dp"] * replica["tp"] * replica["pp"]
        return (f"{count_text(ranks, 'rank')}, one replica's pipeline of dp {replica['dp']:,} x tp "
                f"{replica['tp']} x pp {replica['pp']} ({count_text(gpus, 'GPU')})")
    sizes = [g.get("world_size") for g in meta.get("generations") or [] if isinstance(g, dict)]
    worlds = [n for k, n in enumerate(sizes) if isinstance(n, int) and (k == 0 or n != sizes[k - 1])]
    if len(worlds) < 2:  # one world: its size (an elastic trace's lanes count every node it had)
        return count_text(worlds[0] if worlds else ranks, "rank")
    return f"{count_text(worlds[0], 'rank')}, then {', then '.join(map(str, worlds[1:]))}"


def notes_list(meta: dict) -> str:
    """What the trace says about its own figures, above them: an imported profile's warnings (bytes
    unknown without record_shapes, ranks missing steps) and what its memory counts (on a CPU, what the
    profile allocated, not the process's peak), which a table of numbers would otherwise hide."""
    notes = [*meta.get("warnings", []), *([meta["memory_note"]] if meta.get("memory_note") else [])]
    items = "".join(f"<li>{html.escape(str(note))}</li>" for note in notes)
    return f'<ul class="notes">{items}</ul>' if items else ""


def report_figures(obj, predicted: Trace | None = None) -> list[tuple[str, object]]:
    """(section title, plotly Figure) pairs for everything the run has data for."""
    return _figures(*_summary_of(obj), predicted)


def _figures(trace: Trace, summary: dict, losses: list[float] | None, predicted: Trace | None):
    from paralab import viz
    from paralab.trace import COMM, EVENT, STEP

    # a --no-trace run's trace holds its steps alone: a timeline of them would be an empty panel. Of
    # several steps, the median one (as the notebooks draw it): every step of a 4-rank DualPipeV side by
    # side had left bars too thin to read; an elastic run keeps its whole history, which is its story
    steps = len(trace.step_windows())  # one walk of the spans, for the timeline and the throughput
    whole = steps <= 1 or trace.select(lane=EVENT)
    figs = [("Timeline", viz.timeline(trace, predicted=predicted, steps=None if whole else "median"))] if any(
        s.lane != STEP for s in trace.spans) or predicted is not None else []
    if pipelined(trace.meta) and not summary["unmeasured_why"]:  # step spans alone read 100% idle
        figs.append(("Pipeline bubble", viz.bubble(trace)))
    if trace.select(lane=COMM):
        figs += [("Communication by op and step", viz.comm_by_op(trace)),
                 ("Communication by parallel dimension and link", viz.comm_by_dimension(trace)),
                 ("Bytes exchanged, rank by rank", viz.comm_matrix(trace))]
    if "layout" in trace.meta and trace.meta["layout"].get("world_size", 1) > 1:
        figs.append(("Device mesh", viz.mesh(trace)))
    if summary.get("memory_by_kind"):  # an import's CPU memory is what the profile allocated, not a peak
        what = "allocated during the profile" if trace.meta.get("memory_note") else "peak memory"
        figs.append(("Memory per rank", viz.memory(summary, what=what)))
    if losses:
        figs.append(("Loss", viz.loss_curves({summary.get("strategy", "run"): losses})))
    if steps > 1:
        figs.append(("Throughput per step", viz.speedup_timeline(trace)))
    if trace.select(lane=EVENT) or any(c.name == "world_size" for c in trace.counters):
        figs.append(("Elastic", viz.elastic(trace)))
    return figs


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1200px; color: #222; }}
h1 {{ font-size: 1.5rem; margin-bottom: .2rem; }} h2 {{ font-size: 1.15rem; margin-top: 2rem; }}
.sub {{ color: #666; margin-top: 0; }}
table {{ border-collapse: collapse; margin: .6rem 0 1rem; font-size: .9rem; }}
th, td {{ border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }}
table.summary th {{ background: #f6f6f6; width: 14rem; }}
.wide {{ overflow-x: auto; }}
ul.notes {{ background: #fff8e1; border-left: 4px solid #f0b400; padding: .5rem 1rem .5rem 2rem; }}
</style>
<script type="text/javascript">{plotlyjs}</script>
</head><body>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
{notes}
<h2>Summary</h2>
{table}
{figures}
</body></html>
"""


def write_report(trace_or_result, path: str | Path, *, predicted=None, title: str | None = None) -> Path:
    """Write one standalone HTML file (plotly.js inline, no network) and return its path.

    ``trace_or_result``: a RunResult (summary, losses and memory included) or a Trace.
    ``predicted``: a simulated Trace to stack under the measured timeline.
    """
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from paralab.viz._common import as_trace

    trace, summary, losses = _summary_of(trace_or_result)  # once: a large trace's summary takes seconds
    predicted = as_trace(predicted) if predicted is not None else None
    sections = []
    for i, (heading, fig) in enumerate(_figures(trace, summary, losses, predicted)):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"figure-{i}",
                          config={"displaylogo": False, "responsive": True})
        sections.append(f'<section class="figure"><h2>{html.escape(heading)}</h2>{div}</section>')
    ranks = len(trace.ranks)
    title = title or (f"paralab report: {summary.get('strategy') or trace.meta.get('source') or 'trace'} "
                      f"on {_worlds_text(trace.meta, ranks)}")
    steps = list(trace.step_windows())  # one walk of the spans: a report may be of a million
    typical = past_warm_up(steps)
    over = f" (the summary over {steps_said(typical)})" if len(typical) < len(steps) else ""
    subtitle = (f"{count_text(ranks, 'rank')} · {count_text(len(trace.spans), 'span')} · "
                f"{count_text(len(steps), 'step')}{over} · "
                f"written {datetime.datetime.now().isoformat(timespec='seconds')}")
    page = PAGE.format(title=html.escape(title), subtitle=html.escape(subtitle), notes=notes_list(trace.meta),
                       table=summary_table(summary) + prediction_line(predicted, summary),
                       figures="\n".join(sections), plotlyjs=get_plotlyjs().replace("</script", "<\\/script"))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- CLI
def add_report_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``paralab report``: TRACE [-o OUT] [--predicted TRACE] [--title TEXT]."""
    parser.add_argument("trace", help="paralab trace JSON, a --trace-dir directory, or a Chrome trace export")
    parser.add_argument("-o", "--output", default="report.html",
                        help="HTML file to write (default: report.html)")
    parser.add_argument("--predicted", default=None,
                        help="a simulated trace to stack under the measured timeline")
    parser.add_argument("--title", default=None, help="report title")


def report_main(args) -> int:
    """``paralab report``: 0 when written, 2 when plotly is missing, a trace file is missing or not a
    trace, or the output cannot be written or would overwrite a trace it reads (message on stderr,
    checked before any trace is read)."""
    from paralab.config import ConfigError
    from paralab.outputs import check_file, check_output_reads_no_input, plotly_missing, unread_text

    if missing := plotly_missing():  # one line, not an ImportError's traceback
        print(f"paralab report: {missing}", file=sys.stderr)
        return 2
    inputs = [("trace", args.trace), ("--predicted trace", getattr(args, "predicted", None))]
    try:
        check_file(args.output, "output")
        check_output_reads_no_input(args.output, inputs)
    except ConfigError as exc:
        print(f"paralab report: {exc}", file=sys.stderr)
        return 2
    traces = []
    for label, name in inputs:
        if name is None:
            traces.append(None)
            continue
        try:
            traces.append(load_spans(name))
        except (OSError, ValueError) as exc:  # TraceFormatError names the file and what is wrong
            print(f"paralab report: cannot read {label}: {unread_text(exc, name)}", file=sys.stderr)
            return 2
    if traces[1] is not None and (differs := not_its_prediction(traces[0], traces[1])):
        print(f"paralab report: the --predicted trace is not of this run's layout ({differs}): stack "
              "the prediction of the same run (paralab.sim.bridge.predict_run_trace of its config)",
              file=sys.stderr)
        return 2
    out = write_report(traces[0], args.output, predicted=traces[1], title=getattr(args, "title", None))
    print(f"wrote {out}")
    return 0


def not_its_prediction(measured: Trace, predicted: Trace) -> str:
    """How ``predicted`` is of another layout than ``measured`` (its world size, or a degree both
    traces record), or "": a 2-rank pipeline's prediction had been stacked under a 4-rank hybrid run
    without a word, under a title that called them one run."""
    said = [f"world size {predicted.world_size} against {measured.world_size}"
            ] if predicted.world_size != measured.world_size else []
    said += [f"{key} {predicted.meta[key]} against {measured.meta[key]}" for key in DEGREES
             if key in predicted.meta and key in measured.meta and predicted.meta[key] != measured.meta[key]]
    return ", ".join(said)
