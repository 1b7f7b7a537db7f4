"""Trace: merge, JSON round trip, Chrome export, and the summary metrics on hand-built traces."""

import gzip
import json
import math

import pytest

from paralab import cli
from paralab import trace as trace_module
from paralab.config import RunConfig
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


@pytest.mark.parametrize("lengths, typical, median", [
    ({0: 10.0, 1: 1.0, 2: 3.0}, [1, 2], 2.0),  # a job's first step pays for warm-up: left out
    ({2: 1.0, 3: 3.0}, [2, 3], 2.0),  # torch.profiler's schedule warmed up before step 2: both kept
    ({0: 4.0}, [0], 4.0),  # the only step there is
])
def test_the_figures_are_taken_past_a_jobs_warm_up_step(lengths, typical, median):
    """A profile of steps 2 and 3 (``schedule(wait=1, warmup=1, active=2)``) had been summarised from
    step 3 alone, as if step 2 were the job's warm-up."""
    spans = [Span(rank, STEP, "step", 20.0 * step, 20.0 * step + took, step=step)
             for rank in (0, 1) for step, took in lengths.items()]
    spans += [Span(0, COMPUTE, "forward", 20.0 * step, 20.0 * step + 1.0, step=step) for step in lengths]
    trace = Trace(spans=spans)
    assert trace.typical_steps() == typical and trace.median_step_time() == median
    assert trace.step_times_by_step() == lengths
    # rank 0 computes 1 s of each step, rank 1 nothing: idle against the typical steps' mean length
    mean = sum(lengths[step] for step in typical) / len(typical)
    assert trace.idle_fraction() == pytest.approx({0: 1 - 1.0 / mean, 1: 1.0})


def test_a_ranks_breakdown_adds_up_when_its_steps_differ_in_length():
    """Each part a mean over the typical steps, the step time too: against the steps' median (2 s here,
    their mean 4 s) a rank's exposed communication (3 s) had read longer than its idle time (1 s), and
    its waiting clamped to 0."""
    spans, start = [], 0.0
    for step, (took, comm) in enumerate([(10.0, 0.0), (2.0, 1.0), (2.0, 1.0), (8.0, 7.0)]):
        for rank in (0, 1):
            spans += [Span(rank, STEP, "step", start, start + took, step=step),
                      Span(rank, COMPUTE, "forward", start, start + 1.0, step=step)]
            if comm:
                spans.append(Span(rank, COMM, "all_reduce", start + 1.0, start + 1.0 + comm, bytes=8,
                                  payload_bytes=8, group_size=2, step=step))
        start += took
    summary = Trace(spans=spans).summary()
    assert summary["step_time_s"] == 2.0  # the headline: the median
    for b in summary["per_rank"].values():
        assert b["idle_s"] == pytest.approx(4.0 - 1.0) and b["exposed_comm_s"] == pytest.approx(3.0)
        assert b["idle_s"] == pytest.approx(b["exposed_comm_s"] + b["wait_s"])
        assert b["mean_step_s"] == pytest.approx(b["compute_s"] + b["idle_s"])


def staggered_trace(lag: float, cut: int = 0) -> Trace:
    """Two ranks whose 10 s steps tile their own time, rank 1 ``lag`` s behind rank 0, and rank 1
    missing its last ``cut`` steps (a profile cut short)."""
    spans = []
    for rank, offset in ((0, 0.0), (1, lag)):
        for step in range(4 - (cut if rank else 0)):
            t = step * 10.0 + offset
            spans += [Span(rank, STEP, "step", t, t + 10.0, step=step),
                      Span(rank, COMPUTE, "backward", t, t + 6.0, step=step),
                      Span(rank, COMM, "all_reduce", t + 6.0, t + 9.0, bytes=100, payload_bytes=100,
                           group_size=2, step=step)]
    return Trace(spans=spans)


def test_a_step_takes_its_ranks_own_time_not_the_stretch_over_their_offsets():
    """Ranks that run a few seconds apart take 10 s a step each: the stretch from the first rank's
    start to the last one's end (13 s) had been read as the step, and each rank's time per step
    measured over those overlapping stretches (its all-reduce counted in two of them)."""
    trace = staggered_trace(lag=3.0)
    assert trace.step_windows()[1] == (10.0, 23.0)  # where the step lies, over both ranks
    assert trace.step_times() == [10.0] * 4
    for rank in (0, 1):
        breakdown = trace.time_breakdown()[rank]
        assert breakdown["compute_s"] == pytest.approx(6.0) and breakdown["comm_s"] == pytest.approx(3.0)
    assert trace.idle_fraction() == pytest.approx({0: 0.4, 1: 0.4})


def test_only_a_pipelines_idle_time_is_a_bubble_in_its_summary():
    """A data-parallel run's trace, merged, imported or compared, had summarised its exposed all-reduce
    as a bubble (25.7% of a ddp step here), where the run's own summary said 0."""
    trace = staggered_trace(lag=0.0)
    assert trace.summary()["bubble_fraction"] == 0.0  # no pp in its meta: no pipeline
    assert Trace(spans=trace.spans, meta={"pp": 1, "schedule": ""}).summary()["bubble_fraction"] == 0.0
    piped = Trace(spans=trace.spans, meta={"pp": 2, "schedule": "gpipe"})
    assert piped.summary()["bubble_fraction"] == pytest.approx(0.4) == trace.bubble_fraction()


def test_a_rank_lost_before_the_steps_measured_has_no_idle_fraction():
    """An elastic run's rank lost after step 0 has none of the steps after the first: it had counted as
    never idle (0.0), pulling the bubble down, where it had not run at all."""
    trace = staggered_trace(lag=0.0)
    trace.spans += [Span(2, STEP, "step", 0.0, 10.0, step=0), Span(2, COMPUTE, "backward", 0.0, 6.0, step=0)]
    assert trace.idle_fraction() == pytest.approx({0: 0.4, 1: 0.4})
    assert trace.bubble_fraction() == pytest.approx(0.4)


def test_a_rank_cut_short_moved_its_bytes_in_the_steps_it_has():
    trace = staggered_trace(lag=0.0, cut=2)
    assert trace.comm_bytes() == {"all_reduce": 200} == trace.comm_bytes(payload=True)
    assert trace.comm_bytes_by_link() == {"intra_node": 200, "inter_node": 0}
    assert trace.comm_bytes_by_group() == {(0, 1): 200}
    from paralab.viz.comm import bytes_by_dimension, bytes_by_group, comm_matrix, link_split_data

    # the figures read the same bytes per step (a rank's over its own steps)
    assert link_split_data(trace) == {"all_reduce": {"intra_node": 200, "inter_node": 0}}
    assert bytes_by_group(trace) == {(0, 1): {"all_reduce": 200}}
    assert sum(map(sum, comm_matrix(trace).data[0].customdata)) == 200
    by_dimension = bytes_by_dimension(trace).values()
    assert sum(links["intra_node"] for ops in by_dimension for links in ops.values()) == 200
    from paralab.viz.comm_compare import compare_matrix, links_per_rank_step, per_rank_step

    # and so do the measured-beside-predicted views, per rank (they had divided every rank's bytes by
    # the steps any rank communicated in: 75 where each rank moved 100 a step)
    assert per_rank_step(trace) == {"all_reduce": 100}
    assert links_per_rank_step(trace) == {"intra_node": 100, "inter_node": 0}
    assert compare_matrix({"measured": trace}).layout.meta["measured"]["bytes_per_step"] == 200


def test_bytes_per_step_are_the_steps_own_not_a_lost_steps_redone_later():
    """An elastic run files a lost step's spans under no step (it is redone later): rank 1's bytes of
    that step had been divided over the two steps it kept, 1.5 times what each of them moved."""
    spans = []
    for rank in (0, 1):
        for step in (0, 1):
            spans.append(Span(rank, STEP, "step", 10.0 * step, 10.0 * step + 5, step=step))
            spans.append(Span(rank, COMM, "all_reduce", 10.0 * step + 1, 10.0 * step + 2, bytes=100,
                              payload_bytes=100, group_size=2, step=step))
    spans.append(Span(1, COMM, "all_reduce", 30.0, 31.0, name="all_reduce (redone later)", bytes=100,
                      payload_bytes=100, group_size=2))
    assert Trace(spans=spans).comm_bytes() == {"all_reduce": 200}


def test_overlapping_spans_are_counted_once():
    t = Trace(spans=[Span(0, STEP, "step", 0, 10, step=0), Span(0, COMPUTE, "a", 0, 6),
                     Span(0, COMPUTE, "b", 4, 8)])
    assert t.busy_time(0) == pytest.approx(8.0)
    assert t.busy_time(0, window=(5, 7)) == pytest.approx(2.0)


def test_json_round_trip_and_directory_merge(tmp_path):
    trace = two_rank_trace()
    trace.counters.append(Counter(0, "cpu_percent", 1.0, 50.0))
    for rank in (0, 1):
        Trace(spans=trace.select(rank=rank),
              meta={"ranks": {rank: {"node": rank}}}).save(tmp_path / f"r{rank}.json")
    merged = Trace.load(tmp_path)
    assert len(merged.spans) == len(trace.spans)
    assert merged.meta["ranks"] == {0: {"node": 0}, 1: {"node": 1}}
    trace.save(tmp_path / "one.json")
    again = Trace.load(tmp_path / "one.json")
    assert again.spans == trace.spans and again.counters == trace.counters


@pytest.mark.parametrize("save", [Trace.save, Trace.save_chrome])
def test_a_diverged_runs_nan_loss_is_saved_as_json_and_read_back_as_nan(tmp_path, save):
    """A bare NaN is not JSON: Perfetto, browsers and jq refuse a file that holds one."""
    trace = two_rank_trace()
    trace.meta["losses"] = [2.5, float("nan")]
    save(trace, tmp_path / "t.json")
    text = (tmp_path / "t.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} written"))
    losses = Trace.load(tmp_path / "t.json").meta["losses"]
    assert losses[0] == 2.5 and math.isnan(losses[1])


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


def test_chrome_export_puts_calls_in_flight_together_on_threads_of_their_own():
    """A thread's complete events must nest, and Perfetto drops those that overlap otherwise: a pipeline's
    sends in flight together had shared the comm thread (up to a third of a cp ring's calls lost)."""
    spans = [Span(0, COMPUTE, "forward", 0.0, 3.0), Span(0, COMM, "send", 1.0, 4.0, name="send F0"),
             Span(0, COMM, "send", 2.0, 5.0, name="send F1"), Span(0, COMM, "send", 4.5, 6.0, name="send F2"),
             Span(1, COMM, "recv", 1.0, 4.0)]
    trace = Trace(spans=spans)
    events = trace.to_chrome()["traceEvents"]
    rows: dict[tuple, list] = {}
    for e in events:
        if e["ph"] == "X":
            rows.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for row in rows.values():
        row.sort()
        assert all(end <= start for (_, end, _), (start, _, _) in zip(row, row[1:])), row
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert [names[key] for key, row in sorted(rows.items()) if key[0] == 0] == ["compute", "comm", "comm 2"]
    assert [n for _, _, n in sorted(rows[0, 1])] == ["send F0", "send F2"]
    order = lambda s: (s.rank, s.start, s.name)  # noqa: E731
    assert sorted(Trace.from_chrome(trace.to_chrome()).spans, key=order) == sorted(spans, key=order)


# ---------------------------------------------------------------------------- bad files in, bad paths out
def _good() -> dict:
    return two_rank_trace().to_dict()


def _with_span(**changes) -> dict:
    data = _good()
    data["spans"][0].update(changes)
    return data


BAD_INPUTS = {
    "list-at-top": ([1, 2], "expected a JSON object at the top, got a list"),
    "unknown-span-key": (_with_span(colour="red"), "spans[0]: unknown key(s) 'colour'"),
    "string-time": (_with_span(start="1.0"), 'spans[0].start: expected a finite number, got a string "1.0"'),
    "nan-time": (_with_span(end=float("nan")), "spans[0].end: expected a finite number, got a number NaN"),
    "bool-rank": (_with_span(rank=True), "spans[0].rank: expected an integer, got true/false"),
    "spans-not-a-list": ({**_good(), "spans": {"a": 1}}, "spans: expected a list, got an object"),
    "chrome-counter-without-args": ({"traceEvents": [{"ph": "C", "name": "cpu", "pid": 0, "ts": 1}]},
                                    "traceEvents[0]: counter event without its value (args.cpu)"),
    "chrome-args-not-an-object": ({"traceEvents": [{"ph": "X", "name": "f", "pid": 0, "ts": 1, "args": [1]}]},
                                  "traceEvents[0].args: expected an object, got a list"),
    "chrome-string-ts": ({"traceEvents": [{"ph": "C", "name": "cpu", "pid": 0, "ts": "1",
                                           "args": {"cpu": 1}}]},
                         "traceEvents[0]: expected a finite number, got a string"),
    "bad-rank-keys": ({**_good(), "meta": {"ranks": {"zero": {}}}},
                      "meta.ranks: expected an object keyed by rank"),
    "string-world-size": ({**_good(), "meta": {"world_size": "2"}},
                          'meta.world_size: expected a world size, got a string "2"'),
    # a report had drawn a world x world matrix: an IndexError for -3, the machine's memory for 10**9
    "negative-rank": (_with_span(rank=-3), "spans[0].rank: expected a rank in 0..16,777,215, got -3"),
    "huge-rank": (_with_span(rank=10**9), "spans[0].rank: expected a rank in 0..16,777,215, got 1000000000"),
    "huge-world": ({**_good(), "meta": {"world_size": 2**62}}, "meta.world_size: expected a world size"),
    "ends-before-it-starts": (_with_span(start=2.0, end=1.0),
                              "spans[0]: ends at 1.0 before it starts at 2.0"),
    # these had merged and reported with exit 0: nothing drawn, bytes summed as a saving, no step
    "unknown-lane": (_with_span(lane="zzz"), "spans[0].lane: expected one of compute, comm"),
    "negative-bytes": (_with_span(bytes=-100), "spans[0].bytes: expected 0 or more, got -100"),
    "negative-wait": (_with_span(waited_s=-0.5), "spans[0].waited_s: expected 0 or more, got -0.5"),
    "no-spans": ({**_good(), "spans": []}, "holds no spans"),
    "newer-version": ({**_good(), "version": 99}, "format version 99: this paralab reads version 1"),
    "string-tokens": ({**_good(), "meta": {"tokens_per_step": "x"}},
                      "meta.tokens_per_step: expected a number > 0, got a string"),
    # had loaded, and read as a negative throughput or a pipeline of no stages
    "negative-tokens": ({**_good(), "meta": {"tokens_per_step": -1}},
                        "meta.tokens_per_step: expected a number > 0, got a number -1"),
    "zero-pp": ({**_good(), "meta": {"pp": 0}}, "meta.pp: expected a whole number >= 1, got a number 0"),
    "layout-a-list": ({**_good(), "meta": {"layout": [1]}}, "meta.layout: expected an object, got a list"),
    # the report lists these above its figures: a number had been a TypeError, a string one item a letter
    "warnings-a-number": ({**_good(), "meta": {"warnings": 5}}, "meta.warnings: expected a list"),
    # a run's losses travel in its trace for the report's Loss figure
    "losses-of-strings": ({**_good(), "meta": {"losses": ["x"]}}, "meta.losses: expected a list of numbers"),
    "memory-note-a-list": ({**_good(), "meta": {"memory_note": [1]}}, "meta.memory_note: expected a string"),
    "integer-beyond-a-float": (_with_span(start=10**400), "spans[0].start: expected a finite number"),
    "memory-ranks-short": ({**_good(), "meta": {"memory_ranks": [0], "memory_by_kind": [{"a": 1}, {"a": 2}]}},
                           "meta.memory_ranks: expected the rank of each memory_by_kind entry"),
    "chrome-meta-a-list": ({"traceEvents": [], "otherData": {"paralab": [1]}},
                           "otherData.paralab: expected an object, got a list"),
    "torch-profiler-trace": ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                               "tid": 1, "ts": 1, "dur": 2}]},
                             "`paralab import` reads those"),
}


@pytest.mark.parametrize("command", ["merge", "report"])
@pytest.mark.parametrize("name", [*BAD_INPUTS, "deeply-nested", "bad-file-in-a-folder"])
def test_bad_traces_exit_2_naming_the_file_and_what_is_wrong(tmp_path, capsys, command, name):
    if name == "deeply-nested":
        bad, text, reason = tmp_path / "t.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"
    elif name == "bad-file-in-a-folder":  # one good rank file, one bad: the bad one is named
        bad, reason = tmp_path / "traces" / "rank1.json", "spans[0].start"
        text = json.dumps(_with_span(start="x"))
        bad.parent.mkdir()
        (bad.parent / "rank0.json").write_text(json.dumps(_good()))
    else:
        data, reason = BAD_INPUTS[name]
        bad, text = tmp_path / "t.json", json.dumps(data)
    bad.write_text(text)
    target = bad.parent if name == "bad-file-in-a-folder" else bad
    assert cli.main([command, str(target), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: " in err and reason in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["merge", "report"])
@pytest.mark.parametrize("given", ["file", "folder"])
def test_gzipped_torch_profiles_are_pointed_to_paralab_import(tmp_path, capsys, command, given):
    """torch.profiler's tensorboard handler writes rank0.json.gz: a file had read "not JSON (Expecting
    value)", and a folder of them "no trace files (*.json)"."""
    profile = tmp_path / "prof" / "rank0.pt.trace.json.gz"
    profile.parent.mkdir()
    profile.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    target = profile if given == "file" else profile.parent
    assert cli.main([command, str(target), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "(a torch.profiler trace?): `paralab import` reads those" in err and str(target) in err, err


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_folder_without_traces_is_said_in_plain_words(tmp_path, capsys, command):
    """merge had said "cannot read no trace files (*.json) in empty"."""
    (tmp_path / "empty").mkdir()
    assert cli.main([command, str(tmp_path / "empty"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"no trace files (*.json) in {tmp_path / 'empty'}" in err and "cannot read no" not in err, err


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_rank_in_two_files_of_a_folder_exits_2(tmp_path, capsys, command):
    """A merged trace saved beside the per-rank files it came from would count every span twice."""
    trace = two_rank_trace()
    for rank in (0, 1):
        Trace(spans=trace.select(rank=rank), meta=trace.meta).save(tmp_path / f"rank{rank}.json")
    assert Trace.load(tmp_path).summary()["comm_bytes"] == {"all_reduce": 200}
    trace.save(tmp_path / "merged.json")
    assert cli.main([command, str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "rank 0 is in merged.json and in rank0.json" in err and str(tmp_path) in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["merge", "report"])
def test_an_output_path_that_is_a_directory_exits_2_before_reading(tmp_path, capsys, command):
    two_rank_trace().save(tmp_path / "t.json")
    assert cli.main([command, str(tmp_path / "t.json"), "-o", str(tmp_path)]) == 2
    assert f"output {tmp_path} is a directory" in capsys.readouterr().err


def test_spans_and_counters_round_trip_through_the_streaming_writers(tmp_path):
    spans = [Span(r % 8, COMPUTE, "forward", i * 1e-3, i * 1e-3 + 5e-4, step=i // 1000, group_ranks=[0, 1])
             for i, r in enumerate(range(20_000))]
    trace = Trace(spans=spans, counters=[Counter(0, "cpu", 0.5, 12.0)], meta={"ranks": {0: {"node": 0}}})
    assert Trace.load(trace.save(tmp_path / "t.json")).spans == spans
    again = Trace.load(trace.save_chrome(tmp_path / "c.json"))
    assert again.spans == spans and again.counters == trace.counters
    assert again.meta["ranks"] == {0: {"node": 0}}


# ------------------------------------------------------------------------- waiting against moving
def comm(rank, kind, start, end, **fields) -> Span:
    return Span(rank, COMM, kind, start, end, payload_bytes=fields.pop("payload_bytes", 64), **fields)


def splits(trace: Trace) -> list[tuple[int, str, float | None, float, float]]:
    return [(a.span.rank, a.span.kind, a.last_entry, a.wait_s, a.transfer_s) for a in trace.comm_arrivals()]


def test_a_collective_waits_for_its_last_member_then_moves():
    """Three ranks enter one all-reduce at 0, 2 and 5 s and all leave at 6 s: the first waits 5 s, the
    second 3 s, the last not at all, and each spends the last second moving data."""
    trace = Trace(spans=[comm(r, "all_reduce", t, 6.0, group_size=3)
                         for r, t in ((0, 0.0), (1, 2.0), (2, 5.0))])
    assert splits(trace) == [(0, "all_reduce", 5.0, 5.0, 1.0), (1, "all_reduce", 5.0, 3.0, 1.0),
                             (2, "all_reduce", 5.0, 0.0, 1.0)]


def test_calls_are_matched_per_group_in_issue_order():
    """Two groups of a 4-rank world, two calls each: the k-th call of a group on each member is one
    operation, whatever the other group does meanwhile."""
    spans = [comm(0, "all_reduce", 0.0, 2.0, group_ranks=[0, 1]),
             comm(1, "all_reduce", 1.5, 2.0, group_ranks=[0, 1]),
             comm(0, "all_gather", 3.0, 4.0, group_ranks=[0, 1]),
             comm(1, "all_gather", 2.5, 4.0, group_ranks=[0, 1]),
             comm(2, "all_reduce", 0.0, 1.0, group_ranks=[2, 3]),
             comm(3, "all_reduce", 0.2, 1.0, group_ranks=[2, 3]),
             comm(3, "all_reduce", 9.0, 9.5, group_ranks=[2, 3])]  # rank 2 never makes the second call
    got = {(r, kind, last) for r, kind, last, _, _ in splits(Trace(spans=spans))}
    assert got == {(0, "all_reduce", 1.5), (1, "all_reduce", 1.5), (0, "all_gather", 3.0),
                   (1, "all_gather", 3.0), (2, "all_reduce", 0.2), (3, "all_reduce", 0.2),
                   (3, "all_reduce", None)}


def test_a_receive_waits_for_its_send_and_a_send_is_not_split():
    spans = [comm(1, "recv", 1.0, 5.0, peer=0), comm(0, "send", 4.0, 4.5, peer=1, bytes=64),
             comm(1, "recv", 5.0, 6.0, peer=0), comm(0, "send", 4.8, 5.5, peer=1, bytes=64)]
    got = sorted(splits(Trace(spans=spans)))
    assert got == [(0, "send", None, 0.0, 0.5), (0, "send", None, 0.0, pytest.approx(0.7)),
                   (1, "recv", 4.0, 3.0, 1.0), (1, "recv", 4.8, pytest.approx(0.0), 1.0)]


@pytest.mark.parametrize("second", [
    comm(1, "all_gather", 0.5, 1.0, group_size=2),  # another op: the issue orders differ
    comm(1, "all_reduce", 1.5, 2.0, group_size=2),  # entered after rank 0 had left: not the same operation
])
def test_calls_that_cannot_be_one_operation_are_left_unsplit(second):
    trace = Trace(spans=[comm(0, "all_reduce", 0.0, 1.0, group_size=2), second])
    assert [last for _, _, last, _, _ in splits(trace)] == [None, None]
    assert [transfer for *_, transfer in splits(trace)] == pytest.approx([1.0, 0.5])


def test_a_group_the_trace_cannot_name_is_left_unsplit():
    """A world of 2 inside a trace of 3 ranks (an elastic run after a node was lost)."""
    spans = [comm(r, "all_reduce", 0.5 * r, 2.0, group_size=2)
             for r in (0, 1)] + [Span(2, COMPUTE, "forward", 0, 1)]
    trace = Trace(spans=spans, meta={"world_size": 3})
    assert trace.group_of(spans[0]) is None
    assert [last for _, _, last, _, _ in splits(trace)] == [None, None]


def test_time_breakdown_splits_communication_into_waiting_and_moving():
    """Per 10 s step, rank 0 computes 0-4 then enters an all-reduce that rank 1 enters at 7 (after
    computing 0-7); both leave at 9. Rank 0 waits 3 s and moves 2 s, rank 1 moves 2 s; all exposed.
    Rank 1 also has an async all-gather moving beside its compute (1-3, rank 0 entered at 0.5)."""
    spans = []
    for step in (0, 1):
        t = 10.0 * step
        spans += [Span(r, STEP, "step", t, t + 10, step=step) for r in (0, 1)]
        spans += [Span(0, COMPUTE, "forward", t, t + 4, step=step),
                  Span(1, COMPUTE, "forward", t, t + 7, step=step),
                  comm(0, "all_gather", t + 0.5, t + 3, group_size=2, step=step),
                  comm(1, "all_gather", t + 1, t + 3, group_size=2, step=step),
                  comm(0, "all_reduce", t + 4, t + 9, group_size=2, step=step),
                  comm(1, "all_reduce", t + 7, t + 9, group_size=2, step=step)]
    per_rank = Trace(spans=spans).time_breakdown()
    expected = {
        0: {"mean_step_s": 10, "compute_s": 4, "comm_s": 7.5, "overlapped_comm_s": 2.5, "exposed_comm_s": 5,
            "comm_waiting_s": 3.5, "comm_transfer_s": 4, "exposed_waiting_s": 3, "exposed_transfer_s": 2,
            "idle_s": 6, "wait_s": 1},
        1: {"mean_step_s": 10, "compute_s": 7, "comm_s": 4, "overlapped_comm_s": 2, "exposed_comm_s": 2,
            "comm_waiting_s": 0, "comm_transfer_s": 4, "exposed_waiting_s": 0, "exposed_transfer_s": 2,
            "idle_s": 3, "wait_s": 1},
    }
    assert per_rank == {r: pytest.approx(v) for r, v in expected.items()}
    for b in per_rank.values():
        assert b["comm_waiting_s"] + b["comm_transfer_s"] == pytest.approx(b["comm_s"])
        assert b["exposed_waiting_s"] + b["exposed_transfer_s"] == pytest.approx(b["exposed_comm_s"])


def test_a_wait_inside_a_compute_span_is_not_compute():
    """Per 10 s step, a forward 0-8 blocks 2-4 on an all-reduce (a tensor-parallel layer), takes 5-5.25
    to issue an all-gather and waits 6-7 for it (prefetched, waited for late): it computed 4.75 s, not 8.
    The all-reduce is exposed, the all-gather's 5.25-6 beside compute and the rest exposed."""
    spans = []
    for step in (0, 1):
        t = 10.0 * step
        spans += [Span(0, STEP, "step", t, t + 10, step=step),
                  Span(0, COMPUTE, "forward", t, t + 8, step=step),
                  comm(0, "all_reduce", t + 2, t + 4, group_size=1, issue_s=2.0, step=step),
                  comm(0, "all_gather", t + 5, t + 7, group_size=1, issue_s=0.25, waited_s=1.0, step=step)]
    trace = Trace(spans=spans)
    assert trace.computing()[0] == [(0, 2), (4, 5), (5.25, 6), (7, 8), (10, 12), (14, 15), (15.25, 16),
                                    (17, 18)]
    b = trace.time_breakdown()[0]
    assert b == pytest.approx({"mean_step_s": 10, "compute_s": 4.75, "comm_s": 4, "overlapped_comm_s": 0.75,
                               "exposed_comm_s": 3.25, "comm_waiting_s": 0, "comm_transfer_s": 4,
                               "exposed_waiting_s": 0, "exposed_transfer_s": 3.25, "idle_s": 5.25,
                               "wait_s": 2})
    assert trace.idle_fraction() == pytest.approx({0: 0.2})  # the bubble: no pass runs 8-10, whatever waits
    assert trace.busy_time(0) == pytest.approx(16)  # the passes, as the bubble counts them
    # without calls marked (a trace written before spans carried them) the span is all compute, as it was
    for s in spans:
        s.issue_s = s.waited_s = 0.0
    assert trace.time_breakdown()[0]["compute_s"] == pytest.approx(8)


@pytest.mark.parametrize("compute, waits, left", [
    ([(0, 10)], [], [(0, 10)]),
    ([(0, 10)], [(-5, 15)], []),
    ([(0, 4), (6, 10)], [(3, 7)], [(0, 3), (7, 10)]),  # one wait across two stretches
    ([(0, 10)], [(1, 2), (2, 3), (5, 6)], [(0, 1), (3, 5), (6, 10)]),  # waits that touch
    ([(0, 1), (2, 3)], [(1, 2), (4, 5)], [(0, 1), (2, 3)]),  # waits between stretches, and after
])
def test_computing_cuts_every_wait_out_of_the_compute_it_falls_in(compute, waits, left):
    spans = [Span(0, COMPUTE, "forward", lo, hi) for lo, hi in compute]
    spans += [comm(0, "all_reduce", lo, hi, issue_s=hi - lo) for lo, hi in waits]
    assert Trace(spans=spans).computing()[0] == left


def test_bytes_by_group_per_step():
    spans = ([Span(r, STEP, "step", 0, 1, step=0) for r in range(4)]
             + [Span(r, STEP, "step", 1, 2, step=1) for r in range(4)])
    spans += [comm(r, "all_reduce", 0, 1, bytes=100, group_ranks=[r - r % 2, r - r % 2 + 1], step=0)
              for r in range(4)]
    spans += [comm(r, "all_reduce", 1, 2, bytes=30, group_size=4, step=1) for r in range(4)]
    spans += [comm(0, "send", 1, 2, bytes=8, peer=2, step=1), comm(2, "recv", 1, 2, peer=0, step=1)]
    assert Trace(spans=spans).comm_bytes_by_group() == {(0, 1): 100, (2, 3): 100, (0, 1, 2, 3): 60, (0, 2): 4}


def test_an_async_send_lands_with_its_receive_and_a_blocking_one_keeps_its_end():
    """gloo's isend reports itself done only in wait(): a send waited for at the step's end ends when
    its receive did, and the wait found it gone. A blocking send held its rank until it returned."""
    spans = [Span(0, COMM, "send", 0.0, 9.0, step=0, peer=1, payload_bytes=8, issue_s=0.1, waited_s=0.2),
             Span(1, COMM, "recv", 0.5, 1.0, step=0, peer=0, payload_bytes=8),
             Span(0, COMM, "send", 2.0, 4.0, step=0, peer=1, payload_bytes=8, issue_s=2.0),
             Span(1, COMM, "recv", 2.5, 3.0, step=0, peer=0, payload_bytes=8),
             Span(0, COMM, "send", 5.0, 9.0, step=0, peer=1, payload_bytes=8, issue_s=1.5, waited_s=0.2),
             Span(1, COMM, "recv", 5.2, 6.0, step=0, peer=0, payload_bytes=8)]
    trace = Trace(spans=spans)
    trace.land_sends()
    early, blocking, slow_to_post = trace.select(kind="send")
    assert (early.end, early.waited_s) == (1.0, 0.0) and early.in_call == [(0.0, 0.1)]
    assert blocking.end == 4.0
    assert slow_to_post.end == 6.5  # its call returned after the receive ended


def _rank_files(folder, world: int, ranks) -> None:
    """Per-rank files as a run of ``world`` ranks writes them (torchrun's --trace-dir)."""
    for rank in ranks:
        spans = [Span(rank, STEP, "step", 0.0, 1.0, step=0)]
        meta = {"source": "measured", "world_size": world, "config": {"world_size": world}}
        Trace(spans=spans, meta=meta).save(folder / f"rank{rank:05d}.json")


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_folder_that_holds_two_runs_exits_2_naming_them(tmp_path, capsys, command):
    """A 2-rank run written into the --trace-dir of a 4-rank run overwrites ranks 0 and 1: the 4-rank
    run's ranks 2 and 3 had been merged in silence ("merged 4 rank(s)", world size 2)."""
    _rank_files(tmp_path, 4, range(4))
    _rank_files(tmp_path, 2, range(2))
    assert cli.main([command, str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert ("rank00000.json is a trace of a run of world size 2, rank00002.json of one of 4: merge each "
            "run's files alone") in err, err


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_folder_missing_a_rank_of_its_run_exits_2_naming_it(tmp_path, capsys, command):
    """Each node of a torchrun writes its own ranks' files: a --trace-dir on a disk of its own had
    merged one node's ranks in silence, its bytes read as the whole run's."""
    _rank_files(tmp_path, 4, (0, 1))  # node 0's files, node 1's on its own disk
    assert cli.main([command, str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (f"{tmp_path}: holds 2 of the 4 ranks of its run; ranks 2, 3 missing (each node writes its "
            "own ranks' files: gather every node's --trace-dir here") in err, err
    assert not (tmp_path / "out").exists()


def test_merging_one_ranks_file_of_a_larger_run_exits_2(tmp_path, capsys):
    """One rank's file of a 4-rank torchrun had been "merged" alone (merged 1 rank), where the same file
    in a folder short of ranks is refused."""
    _rank_files(tmp_path, 4, (0,))
    assert cli.main(["merge", str(tmp_path / "rank00000.json"), "-o", str(tmp_path / "out.json")]) == 2
    assert ("rank00000.json holds 1 rank of the 4 of its run (ranks 1, 2, 3 missing): give the folder of "
            "every rank's file") in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_reporting_one_ranks_file_or_a_rank_beyond_the_world_exits_2(tmp_path, capsys):
    """report took what merge refuses: one rank's file of a 4-rank launch (its bytes reported as the
    run's), and a file holding rank 7 of a world of 2 (merged too, as "3 ranks")."""
    _rank_files(tmp_path, 4, (0,))
    assert cli.main(["report", str(tmp_path / "rank00000.json"), "-o", str(tmp_path / "out.html")]) == 2
    err = capsys.readouterr().err
    assert "rank00000.json holds 1 rank of the 4 of its run (ranks 1, 2, 3 missing)" in err, err
    spans = [Span(rank, STEP, "step", 0.0, 1.0, step=0) for rank in (0, 1, 7)]
    Trace(spans=spans, meta={"source": "measured", "world_size": 2}).save(tmp_path / "beyond.json")
    for command in ("merge", "report"):
        assert cli.main([command, str(tmp_path / "beyond.json"), "-o", str(tmp_path / "out.html")]) == 2
        assert "beyond.json holds rank 7, beyond its world size 2" in capsys.readouterr().err
    assert not (tmp_path / "out.html").exists()


@pytest.mark.parametrize("meta", [
    {"source": "measured", "strategy": "elastic", "world_size": 4, "config": {"max_nodes": 4}},
    {"source": "imported", "world_size": 4, "config": {"world_size": 4}},
], ids=["elastic", "imported"])
def test_a_trace_that_names_more_ranks_than_it_holds_on_purpose_is_read(tmp_path, meta):
    """An elastic run's trace names its most nodes, and an import of some ranks' profiles the whole
    world: neither is a launch's folder missing a node's files."""
    steps = [Span(r, STEP, "step", 0.0, 1.0, step=0) for r in (0, 1)]
    Trace(spans=steps, meta=meta).save(tmp_path / "t.json")
    assert Trace.load(tmp_path).ranks == [0, 1]


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_folder_of_two_runs_of_one_world_size_exits_2_naming_a_difference(tmp_path, capsys, command):
    """A ddp run's rank 0 beside a pipeline run's rank 1 had merged into one run of two ranks."""
    for rank, strategy in ((0, "ddp"), (1, "pp")):
        settings = {**RunConfig(strategy=strategy).to_dict(), "threads_per_rank": rank}
        step = Span(rank, STEP, "step", 0.0, 1.0, step=0)
        meta = {"world_size": 2, "config": settings, "run_id": f"launch {rank}"}  # two launches' ids too
        Trace(spans=[step], meta=meta).save(tmp_path / f"rank{rank}.json")
    assert cli.main([command, str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert ("rank1.json is a trace of another run than rank0.json: it has strategy 'pp' against rank0.json's "
            "'ddp'; merge each run's files alone") in err, err  # threads a rank may choose for itself
    no_settings = Trace(spans=[Span(1, STEP, "step", 0.0, 1.0, step=0)], meta={"world_size": 2})
    no_settings.save(tmp_path / "rank1.json")  # a file that records no settings is not compared
    assert len(Trace.load(tmp_path).ranks) == 2


@pytest.mark.parametrize("command", ["merge", "report"])
def test_a_folder_of_two_launches_of_the_same_settings_exits_2(tmp_path, capsys, command):
    """A rerun into the same --trace-dir, after a node that failed before writing, had merged its
    files with the stale ones of the run before: their settings agree, their run ids do not."""
    settings = RunConfig(strategy="ddp", world_size=2).to_dict()
    for rank, run_id in ((0, "fresh"), (1, "stale")):
        step = Span(rank, STEP, "step", 0.0, 1.0, step=0)
        meta = {"world_size": 2, "config": settings, "run_id": run_id}
        Trace(spans=[step], meta=meta).save(tmp_path / f"rank{rank}.json")
    assert cli.main([command, str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    assert ("rank0.json and rank1.json are traces of two launches (their run ids differ: a rerun's files "
            "beside an earlier run's?); merge each run's files alone") in capsys.readouterr().err
    rerun = {"world_size": 2, "config": settings, "run_id": "fresh"}
    Trace(spans=[Span(1, STEP, "step", 0.0, 1.0, step=0)], meta=rerun).save(tmp_path / "rank1.json")
    assert Trace.load(tmp_path).ranks == [0, 1]  # one launch's files


def test_a_rank_beyond_the_world_size_of_a_folder_is_refused(tmp_path):
    _rank_files(tmp_path, 2, range(2))
    Trace(spans=[Span(5, STEP, "step", 0.0, 1.0, step=0)]).save(tmp_path / "stray.json")
    beyond = "stray.json holds rank 5, beyond the world size 2 of rank00000.json"
    with pytest.raises(ValueError, match=beyond):
        Trace.load(tmp_path)


def test_an_interrupted_write_leaves_the_file_that_was_there_and_nothing_else(tmp_path):
    """A Ctrl-C while a trace was written had left half of it at the user's path, over a good one."""
    good = two_rank_trace()
    path = good.save(tmp_path / "t.json")

    def spans_then_interrupt():
        yield from ({"rank": s.rank} for s in good.spans[:3])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trace_module._write_json(path, {"format": "paralab-trace"}, spans=spans_then_interrupt())
    assert Trace.load(path).spans == good.spans
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_a_trace_of_step_spans_only_measured_nothing_but_its_steps():
    """A --no-trace run's trace (step spans only), merged or compared, had summarised to no bytes sent
    and every rank idle all of its step; the run's own summary alone had said not measured."""
    from paralab.trace import SPAN_FIGURES

    steps = [Span(rank, STEP, "step", 0.02 * k, 0.02 * (k + 1), name=f"step {k}", step=k)
             for rank in (0, 1) for k in range(3)]
    summary = Trace(spans=steps, meta={"config": {"trace": False}, "pp": 2}).summary()
    assert summary["step_time_s"] == pytest.approx(0.02)
    assert all(summary[key] is None for key in (*SPAN_FIGURES, "idle_s", "compute_s", "comm_s")), summary
    traced = Trace(spans=steps, meta={"config": {"trace": True}}).summary()
    assert traced["comm_bytes"] == {} and traced["idle_s"] == pytest.approx(0.02)
    # without a pipeline there is no bubble, recorded or not, as the run's own summary says
    assert Trace(spans=steps, meta={"config": {"trace": False}}).summary()["bubble_fraction"] == 0.0
    # a profile of such a run, imported, holds the profiler's spans, every one recorded: it had read as
    # not measured, and paralab import had crashed on its bytes
    imported = Trace(spans=steps, meta={"source": "imported", "config": {"trace": False}}).summary()
    assert imported["comm_bytes"] == {} and imported["idle_s"] == pytest.approx(0.02)
