"""Trace: merge, JSON round trip, Chrome export, and the summary metrics on hand-built traces."""

import json

import pytest

from paralab.trace import COMM, COMPUTE, STEP, Counter, Span, Trace


def two_rank_trace() -> Trace:
    spans = []
    for rank in (0, 1):
        for step in (0, 1, 2):
            t = step * 10.0
            spans.append(Span(rank, STEP, "step", t, t + 10.0, step=step))
            spans.append(Span(rank, COMPUTE, "forward", t, t + 3.0, step=step))
            spans.append(Span(rank, COMPUTE, "backward", t + 3.0, t + 8.0, step=step))
            spans.append(Span(rank, COMM, "all_reduce", t + 5.0, t + 9.0, bytes=100, payload_bytes=100,
                              group_size=2, step=step))
    return Trace(spans=spans, meta={"tokens_per_step": 1000})


def test_metrics_of_a_known_trace():
    trace = two_rank_trace()
    assert trace.ranks == [0, 1]
    assert trace.step_times() == [10.0, 10.0, 10.0]
    assert trace.median_step_time() == 10.0
    # compute covers 8 of every 10 s: 20% idle on each rank
    assert trace.idle_fraction() == pytest.approx({0: 0.2, 1: 0.2})
    s = trace.summary()
    assert s["comm_bytes"] == {"all_reduce": 200}  # per step, summed over the two ranks
    assert s["tokens_per_s"] == pytest.approx(100.0)
    assert s["per_rank"][0]["comm_s"] == pytest.approx(4.0)


def test_overlapping_spans_are_counted_once():
    t = Trace(spans=[Span(0, STEP, "step", 0, 10, step=0), Span(0, COMPUTE, "a", 0, 6), Span(0, COMPUTE, "b", 4, 8)])
    assert t.busy_time(0) == pytest.approx(8.0)
    assert t.busy_time(0, window=(5, 7)) == pytest.approx(2.0)


def test_json_round_trip_and_directory_merge(tmp_path):
    trace = two_rank_trace()
    trace.counters.append(Counter(0, "cpu_percent", 1.0, 50.0))
    for rank in (0, 1):
        Trace(spans=trace.select(rank=rank), meta={"ranks": {rank: {"node": rank}}}).save(tmp_path / f"r{rank}.json")
    merged = Trace.load(tmp_path)
    assert len(merged.spans) == len(trace.spans)
    assert merged.meta["ranks"] == {0: {"node": 0}, 1: {"node": 1}}
    trace.save(tmp_path / "one.json")
    again = Trace.load(tmp_path / "one.json")
    assert again.spans == trace.spans and again.counters == trace.counters


def test_load_refuses_non_trace_json(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not a paralab trace"):
        Trace.load(tmp_path / "x.json")


def test_chrome_export_has_every_span_and_counter():
    trace = two_rank_trace()
    trace.counters.append(Counter(1, "cpu_percent", 1.0, 50.0))
    events = trace.to_chrome()["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(trace.spans)
    assert {e["pid"] for e in complete} == {0, 1}
    ar = next(e for e in complete if e["cat"] == "all_reduce")
    assert ar["ts"] == pytest.approx(5e6) and ar["dur"] == pytest.approx(4e6) and ar["args"]["bytes"] == 100
    assert [e for e in events if e["ph"] == "C"][0]["args"] == {"cpu_percent": 50.0}
