"""Bring your own trace: torch.profiler (Kineto) traces in, a paralab :class:`~paralab.trace.Trace` out.

    paralab import rank0.json rank1.json.gz -o trace.json        # then: paralab report trace.json
    trace = paralab.import_profile(["rank0.json", "rank1.json"])  # every figure of paralab.viz takes it

One file per rank, as torch.profiler writes them (``export_chrome_trace``, or the ``*.pt.trace.json``
of ``tensorboard_trace_handler``), plain or gzipped; a directory stands for the traces in it, in
natural order (rank2 before rank10), less the paralab traces it holds (an earlier import's output:
left out, with a warning). What becomes what (the mapping of torch's operators lives in
:mod:`paralab.trace_ops`):

- ranks: each file's ``distributedInfo.rank`` (torch writes it once a process group exists), else the
  order of the files, with a warning; a rank's node is its ``host_name``.
- steps: ``ProfilerStep#N`` ranges (``prof.step()`` every iteration) are step N, their projection on
  the GPU included; a trace without them is one step.
- spans: forward, backward, optimizer and other compute, memcpy, and communication with its bytes;
  idle time is the gaps, which ``Trace.summary()`` measures (idle, exposed and overlapped
  communication, waiting).
- clocks: every rank is first put on one clock (Kineto's ``ts`` + ``baseTimeNanoseconds``, Unix
  time). Ranks of one host read one clock, and it stands. Across hosts, as paralab starts every
  rank's clock on leaving one barrier, each host's ranks are shifted together so that the first
  collective over all ranks ends at the same instant everywhere (ranks leave a collective together,
  but not to the microsecond: the median over the host's ranks), which lines up hosts whose clocks
  disagree; a file that names no host is a host of its own. Without such a collective in every file
  the profilers' clocks stand. Ranks of one host whose first collective over all ranks ends, or (with
  none) whose first common steps lie, more than a second apart on its clock are of different runs:
  refused. ``meta["clock"]`` says which was done, and how far each rank (in rank
  order) was moved against the first beyond what the profilers' clocks said (``correction_s``).

A profile of a paralab run (``paralab run --profile DIR``, see :mod:`paralab.profiling`) carries
paralab's own spans as named ranges. With ``names="auto"`` (the default) those ranges are the spans,
so the import agrees with paralab's own trace, and each rank goes on paralab's own clock by the
``clock`` its ranges carry (the smallest range start - clock: a range opens after its clock read),
each host-timed span starting at its own clock;
``names="torch"`` reads such a profile like any other.
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import os
import re
import statistics
import sys
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from paralab.cli_args import json_text
from paralab.config import ConfigError, finite_number
from paralab.outputs import check_file, same_file
from paralab.profiling import METADATA_KEY, MOMENTS, PREFIX, marked, parse_label
from paralab.schedules import (
    SCHEDULES,
    SEND_BACKWARD,
    SEND_FORWARD,
    build_schedule,
    chunks_per_rank,
    shape_problems,
)
from paralab.text import count_text, numbered, steps_said
from paralab.trace import CLOCK_SLACK_S, COMM, GZIP_MAGIC, MAX_RANKS, STEP, Span, Trace
from paralab.trace_ops import DEVICE_CATS, HOST_CATS, Event, comm_spans, compute_spans
from paralab.warn import ParalabWarning, warn

NAMES = ("auto", "paralab", "torch")
IMPORT_FACTS = ("schedule", "pp", "microbatches", "tokens_per_step")  # what a user may tell an import
# Ranks of one run on one host leave a collective within scheduling delays (ms on a loaded machine);
# a second is far beyond them, and far below the time between two runs
ONE_HOST_SKEW_S = 1.0
STEP_RE = re.compile(r"ProfilerStep#(\d+)")
NUMBERED_BY_ORDER = ("no file says its rank (no distributedInfo: profiled before init_process_group?), so "
                     "the files were numbered as ranks by their order")
REPEATING_SCHEDULE = ("a profiler schedule that repeats (repeat=0, or above 1) writes a file per cycle of "
                      "each process: give one cycle's")


class ProfileError(ConfigError):
    """A file that is not a torch.profiler trace paralab can read; says which file and what is missing
    (the CLI exits 2)."""


class ParalabTraceError(ProfileError):
    """A paralab trace where a torch.profiler trace is wanted: refused when given by name, left out
    (with a warning) when a directory given holds it (an earlier import's output, say)."""


class ProfileWarning(ParalabWarning):
    """What an imported profile cannot tell, or may tell wrong (also in the trace's
    ``meta["warnings"]``)."""


@dataclass
class RankProfile:
    """What one file holds: its rank, host and clock, and its timed events (seconds, the file's clock)."""

    path: Path
    rank: int | None
    world_size: int | None
    host: str
    base_ns: int
    paralab_meta: dict
    shapes_recorded: bool = False  # record_shapes=True: torch's c10d calls carry their tensors' sizes
    subgroups: list[list[int]] = field(default_factory=list)  # process groups smaller than the world
    groups_listed: bool = False  # distributedInfo lists the job's process groups (pg_config)
    host_events: list[Event] = field(default_factory=list)
    device_events: list[Event] = field(default_factory=list)
    peak_memory: dict[int, float] = field(default_factory=dict)  # device type (0 CPU, 1 CUDA) -> bytes
    negative_durations: int = 0  # events left out for a dur below 0: unfinished (torch writes -1), or edited

    @property
    def on_gpu(self) -> bool:
        return any(e.cat != "gpu_user_annotation" for e in self.device_events)


# On a CPU, torch's [memory] events count the bytes allocated since the profiler started (less those
# freed), not what the process held before: the figure is named for that, not a peak of the process.
CPU_MEMORY = "allocated during the profile"
CPU_MEMORY_NOTE = ("CPU ranks: the most bytes allocated while the profiler recorded (torch's memory events "
                   "count only allocations made since profiling started), not the process's peak memory")


# ---------------------------------------------------------------------------------------------- files
def expand(paths) -> list[tuple[Path, bool]]:
    """(file, whether it was named) in the order given; a directory stands for its *.json and *.json.gz
    files in natural order (rank2 before rank10: without distributedInfo the order is the ranks')."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    if not isinstance(paths, list | tuple) or not all(isinstance(p, str | os.PathLike) for p in paths):
        raise ConfigError(f"paths must be a profile's file, a directory of them or a list of these, got "
                          f"{paths!r}"[:200])  # None or a number had raised TypeError from Path()
    files: list[tuple[Path, bool]] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted((p for p in path.iterdir() if p.name.endswith((".json", ".json.gz"))),
                           key=lambda p: [int(n) if n.isdigit() else n for n in re.split(r"(\d+)", p.name)])
            if not found:
                # traces in folders below it (a TensorBoard log dir's plugins/profile/<run>/, one per run)
                below = sorted({p.parent for p in path.rglob("*.json*")
                                if p.name.endswith((".json", ".json.gz"))})
                hint = f": give the directory that holds them, {below[0]}" if len(below) == 1 else (
                    f": they are in {len(below)} directories below it, {below[0]} first; give one run's"
                    if below else "")
                raise ProfileError(f"{path}: no .json or .json.gz traces in this directory{hint}")
            files += [(p, False) for p in found]
        else:
            files.append((path, True))
    if not files:
        raise ProfileError("no profile given")
    seen: set[Path] = set()
    for path, _ in files:
        if path.resolve() in seen:  # it would be read as two ranks
            raise ProfileError(f"{path}: given twice; give one file per rank")
        seen.add(path.resolve())
    return files


def _read_profiles(paths) -> tuple[list[RankProfile], list[str]]:
    """The profiles of the files ``paths`` stand for (:func:`expand`), and a warning for each paralab
    trace a directory given holds, which is left out (one given by name is refused)."""
    profiles, left_out = [], []
    for path, named in expand(paths):
        try:
            profiles.append(read_profile(path))
        except ParalabTraceError:
            if named:
                raise
            left_out.append(str(path))
    if not profiles:
        raise ProfileError(f"{', '.join(left_out)}: paralab traces, not torch.profiler ones: no profile to "
                           "import")
    return profiles, [f"{path}: a paralab trace, not a torch.profiler one: left out" for path in left_out]


def read_profile(path: Path) -> RankProfile:
    """Parse one torch.profiler trace; ProfileError (one line: the file and what is missing) otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not raw or raw.isspace():  # (isspace copies nothing: profiles run to hundreds of MB)
        raise ProfileError(f"{path}: an empty file, not a torch.profiler trace")
    try:
        data = json.loads(gzip.decompress(raw) if raw[:2] == GZIP_MAGIC else raw)
    except (OSError, EOFError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise ProfileError(f"{path}: not a JSON trace ({str(exc).splitlines()[0]})") from None
    paralab_export = isinstance(data, dict) and "paralab" in (data.get("otherData") or {})  # Trace.to_chrome
    if isinstance(data, dict) and (data.get("format") == "paralab-trace" or paralab_export):
        raise ParalabTraceError(f"{path}: a paralab trace already, not a torch.profiler one (for paralab "
                                "report)")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ProfileError(f"{path}: no traceEvents list, so not a Chrome trace from torch.profiler")
    info = data.get("distributedInfo") if isinstance(data.get("distributedInfo"), dict) else {}
    world = _whole(path, "distributedInfo.world_size", info.get("world_size"))
    if world is not None and not 1 <= world <= MAX_RANKS:  # a billion had filled the memory with ranks
        raise ProfileError(f"{path}: distributedInfo.world_size {world} is not a world size "
                           f"(1..{MAX_RANKS:,})")
    profile = RankProfile(
        path=path, rank=_whole(path, "distributedInfo.rank", info.get("rank")), world_size=world,
        host=str(data.get("host_name") or ""), base_ns=_whole(path, "baseTimeNanoseconds",
                                                              data.get("baseTimeNanoseconds")) or 0,
        paralab_meta=data.get(METADATA_KEY) if isinstance(data.get(METADATA_KEY), dict) else {},
        shapes_recorded=bool(data.get("record_shapes")),
        subgroups=_subgroups(info, world), groups_listed=isinstance(info.get("pg_config"), list),
    )
    for i, e in enumerate(data["traceEvents"]):
        if not isinstance(e, dict):
            raise ProfileError(f"{path}: traceEvents[{i}] is not an event object")
        if e.get("ph") == "i" and e.get("name") == "[memory]":
            _note_memory(profile, e.get("args") or {})
        if e.get("ph") != "X" or e.get("cat") not in HOST_CATS + DEVICE_CATS:
            continue
        ts, dur, args = e.get("ts"), e.get("dur"), e.get("args") or {}
        if not finite_number(ts) or not finite_number(dur):
            raise ProfileError(f"{path}: traceEvents[{i}] ({e.get('name')!r}) has no numeric ts and dur")
        if not isinstance(args, dict):
            raise ProfileError(f"{path}: traceEvents[{i}] ({e.get('name')!r}): args is not an object")
        if dur < 0:
            profile.negative_durations += 1
            continue
        if not all(v is None or isinstance(v, (int, float, str)) for v in (e.get("pid"), e.get("tid"))):
            raise ProfileError(f"{path}: traceEvents[{i}] ({e.get('name')!r}): pid or tid is not a number or "
                               "a name")
        profile.shapes_recorded |= "Input Dims" in args  # older torch writes no record_shapes key
        event = Event(str(e.get("name", "")), e["cat"], e.get("pid"), e.get("tid"), ts * 1e-6,
                      (ts + dur) * 1e-6, args)
        (profile.host_events if e["cat"] in HOST_CATS else profile.device_events).append(event)
    if not profile.host_events and not profile.device_events:
        if profile.negative_durations:
            raise ProfileError(f"{path}: every torch.profiler operator and kernel has a negative duration "
                               f"({count_text(profile.negative_durations, 'event')}): events left "
                               "unfinished, or an edited file")
        raise ProfileError(f"{path}: no torch.profiler operators or kernels (events of category "
                           f"{', '.join(HOST_CATS + DEVICE_CATS)}), so not a torch.profiler trace")
    return profile


def _subgroups(info: dict, world: int | None) -> list[list[int]]:
    """The process groups smaller than the ``world`` that distributedInfo lists (``pg_config``), one
    rank's included: a collective on it puts nothing on the wire."""
    groups = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    ranks = [g.get("ranks") for g in groups if isinstance(g, dict)]
    return [r for r in ranks if isinstance(r, list) and world is not None and 0 < len(r) < world]


def _note_memory(profile: RankProfile, args) -> None:
    total = args.get("Total Allocated") if isinstance(args, dict) else None
    if finite_number(total):
        device = _int_or_none(args.get("Device Type")) or 0
        profile.peak_memory[device] = max(profile.peak_memory.get(device, 0.0), float(total))


def _whole(path: Path, key: str, value) -> int | None:
    """A whole number the file gives (its rank, world size, clock origin in ns), None where it gives
    none; anything else is refused, not rounded (a rank of 1.7 had been read as rank 1)."""
    if value is None:
        return None
    if type(value) is int or (isinstance(value, str) and value.isdecimal() and value.isascii()):
        return int(value)
    if type(value) is float and value.is_integer() and abs(value) < 2**53:  # 1.0, not a clock's rounding
        return int(value)
    raise ProfileError(f"{path}: {key} is not a whole number ({json.dumps(value)[:40]})")


def _int_or_none(value) -> int | None:
    if isinstance(value, (int, float)) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    return None


# ---------------------------------------------------------------------------------------------- steps
def step_windows(profile: RankProfile) -> dict[int, tuple[float, float]]:
    """step -> (start, end) on the file's clock, from ProfilerStep#N on the host and its GPU projection;
    the whole trace as step 0 when the profile has no steps."""
    windows: dict[int, tuple[float, float]] = {}
    for e in profile.host_events + profile.device_events:
        match = STEP_RE.fullmatch(e.name)
        if match:
            n = int(match[1])
            lo, hi = windows.get(n, (e.start, e.end))
            windows[n] = (min(lo, e.start), max(hi, e.end))
    if not windows:
        events = profile.host_events + profile.device_events
        windows[0] = (min(e.start for e in events), max(e.end for e in events))
    return dict(sorted(windows.items()))


def step_of(windows: dict[int, tuple[float, float]], t: float) -> int | None:
    return next((n for n, (lo, hi) in windows.items() if lo <= t <= hi), None)


# ---------------------------------------------------------------------------------------------- spans
def paralab_spans(profile: RankProfile, rank: int) -> tuple[list[Span], float | None]:
    """The spans of a profiled paralab run, from its named ranges (device time where the GPU shows
    the range), and the offset that puts the file's clock on paralab's own (None without clocks).

    A range opens only after the recorder read its ``clock`` (the label is made from it), so each
    range's start - clock is the offset plus a delay that is never negative and varies (milliseconds
    when the process is descheduled between the two): the smallest is the best estimate, not a
    middle one. A communication span's ``issue_s`` and ``waited_s`` come from the empty ranges that mark
    when its call returned and when its wait() began (paralab.profiling.mark_label), paired by name in
    order, on the host's clock (a blocking call's mark follows its range: all of it is issue).

    A host-timed span starts at its clock plus that offset, where paralab's own trace starts it: a
    range that opened late (its thread descheduled after the clock read) would start it late, and
    had made an imported step 0 8-11% shorter than the native trace's."""
    on_device = {(e.name, e.args.get("External id")): e for e in profile.device_events
                 if e.cat == "gpu_user_annotation" and e.name.startswith(PREFIX)}
    annotations = sorted((e for e in profile.host_events if e.cat == "user_annotation"),
                         key=lambda e: e.start)
    moments: dict[tuple[str, str], deque] = defaultdict(deque)  # (moment, a span's label) -> its times
    for e in annotations:
        if (mark := marked(e.name)) is not None:
            moments[mark].append(e.start)
    labelled = [(e, fields) for e in annotations if (fields := parse_label(e.name)) is not None]
    offset = min((e.start - fields["clock"] for e, fields in labelled if "clock" in fields), default=None)
    spans = []
    for e, fields in labelled:
        clock = fields.pop("clock", None)
        timed = on_device.get((e.name, e.args.get("External id")), e)
        start = clock + offset if timed is e and clock is not None else timed.start
        lane, kind = fields.pop("lane"), fields.pop("kind")
        name = fields.pop("name", "") or kind
        issued, waited = (moments[m, e.name].popleft() if moments.get((m, e.name)) else None
                          for m in MOMENTS)
        length = timed.end - start  # a host-timed mark may outrun a device-timed span, either end
        spans.append(Span(rank, lane, kind, start, timed.end, name=name, **fields,
                          issue_s=0.0 if issued is None else min(max(issued - start, 0.0), length),
                          waited_s=0.0 if waited is None else min(max(e.end - waited, 0.0), length)))
    return spans, offset


def _world_only(profile: RankProfile, world_size: int) -> bool:
    """Whether every collective of this rank whose group the profile does not state (gloo's) was over
    all ranks: its distributedInfo lists the job's process groups and none smaller than the world; or,
    in a world of two, lists none at all (a torch that writes no pg_config; the only smaller group is
    one rank's). Four ranks had been read as groups unknown, so nothing was aligned or checked on them."""
    return not profile.subgroups and (profile.groups_listed or world_size == 2)


def torch_spans(profile: RankProfile, rank: int, world_size: int) -> list[Span]:
    """Spans from torch's own operators, kernels and communication (paralab.trace_ops), with step
    spans from the profiler's steps."""
    windows = step_windows(profile)
    spans = [Span(rank, STEP, "step", lo, hi, name=f"step {n}", step=n) for n, (lo, hi) in windows.items()]
    at = lambda t: step_of(windows, t)  # noqa: E731
    for span in (compute_spans(profile.host_events, profile.device_events, rank, at)
                 + comm_spans(profile.host_events, profile.device_events, rank, world_size,
                              world_only=_world_only(profile, world_size))):
        span.step = at(span.start)
        spans.append(span)
    return spans


# ---------------------------------------------------------------------------------------------- import
def import_profile(paths, *, names: str = "auto", meta: dict | None = None) -> Trace:
    """A Trace from torch.profiler traces, one file per rank (see the module docstring).

    ``names``: "auto" reads paralab's named ranges when every profile has them, else torch's
    operators; "paralab" or "torch" insists on one. ``meta`` adds facts the profiles lack
    (``schedule``, ``pp``, ``microbatches`` for the bubble figure; ``tokens_per_step`` for
    throughput). Raises ConfigError for a fact that cannot be (:func:`_fact_problem`), before any file
    is read, and ProfileError for a file that is missing, malformed or not a torch.profiler trace, or
    for a fact of ``meta`` that the profile of a paralab run, which carries its own, contradicts.
    """
    if names not in NAMES:
        raise ConfigError(f"names must be one of {NAMES}, got {names!r}")
    if problem := _fact_problem(meta or {}):
        raise ConfigError(problem)
    profiles, said = _read_profiles(paths)
    _check_facts_agree(profiles, meta or {})
    ranks = _assign_ranks(profiles)
    said += _check_one_run(profiles, ranks)
    if len(profiles) > 1 and _numbered_by_order(profiles):
        order = [f"{p.path} {'is ' * (r == 0)}rank {r}" for r, p in enumerate(profiles)]
        said.append(f"{NUMBERED_BY_ORDER}: "
                    + ", ".join(order if len(order) < 4 else [order[0], "...", order[-1]]))
    world = max([p.world_size or 0 for p in profiles] + [max(ranks) + 1, len(profiles)])
    given = set(ranks)
    if missing := world - len(given):  # counted, not listed: a world may hold millions of ranks
        first = list(itertools.islice((r for r in range(world) if r not in given), 8))
        said.append(f"the files hold {len(ranks)} of the {world} ranks of their world (none for "
                    f"{numbered('rank', first, total=missing)}): the trace has only the ranks given")
    if (meta or {}).get("pp") and world % meta["pp"]:
        raise ProfileError(f"pp {meta['pp']} does not divide the {world} ranks of these profiles")
    use_paralab = names == "paralab" or (names == "auto" and all(_has_paralab_ranges(p) for p in profiles))
    spans_by_rank, offsets = {}, {}
    for rank, profile in zip(ranks, profiles):
        if use_paralab:
            if not _has_paralab_ranges(profile):
                raise ProfileError(f"{profile.path}: no paralab ranges (paralab run --profile writes them)")
            spans_by_rank[rank], offsets[rank] = paralab_spans(profile, rank)
        else:
            spans_by_rank[rank] = torch_spans(profile, rank, world)
            offsets[rank] = None
    idle = [r for r in sorted(spans_by_rank) if not any(s.lane != STEP for s in spans_by_rank[r])]
    if len(idle) == len(spans_by_rank):
        raise ProfileError(f"{', '.join(str(p.path) for p in profiles)}: no rank recorded an operator or a "
                           "collective, nothing to import (a repeating schedule's last, almost empty files? "
                           "give the files of a cycle that recorded its steps)")
    clock = _align(spans_by_rank, profiles, ranks, offsets, world, paralab_clock=use_paralab)
    hosts = sorted({p.host for p in profiles})
    node_of = {rank: hosts.index(p.host) for rank, p in zip(ranks, profiles)}
    spans = [s for rank in sorted(spans_by_rank) for s in spans_by_rank[rank]]
    for s in spans:
        if s.lane == COMM:
            s.inter_node = _crosses_nodes(s, node_of, world)
    trace = Trace(sorted(spans, key=lambda s: (s.start, s.rank)), meta=_meta(profiles, ranks, world, node_of))
    trace.land_sends()  # a paralab profile's sends carry their wait marks, as the run's own trace did
    trace.meta.update(names="paralab" if use_paralab else "torch", clock=clock, **(meta or {}))
    said += _what_the_steps_hide(spans_by_rank, profiles, ranks, use_paralab, idle)
    said += _sends_the_schedule_makes(trace, meta or {})
    unsized = _unsized_comm(spans_by_rank, ranks)
    if unsized:
        trace.meta["bytes_unknown_ranks"] = sorted(unsized)
        trace.meta["bytes_unknown_ops"] = sorted(set().union(*unsized.values()))
        shapeless = sorted(r for r, p in zip(ranks, profiles) if r in unsized and not p.shapes_recorded)
        if shapeless:
            were = "was" if len(shapeless) == 1 else "were"
            said.append(f"{numbered('rank', shapeless)} {were} profiled without record_shapes=True: "
                        "a profile taken so holds no sizes of its communication, so the bytes are unknown "
                        "(0 in the trace); profile with record_shapes=True to measure them")
        if unsaid := {r: ops for r, ops in unsized.items() if r not in shapeless}:
            said.append("recorded shapes without a dtype (a tensor list's, as a scatter's receiving ranks "
                        "record) leave some bytes unknown (0 in the trace): " + "; ".join(
                            f"rank {r}'s {', '.join(sorted(ops))}" for r, ops in sorted(unsaid.items())))
    if negative := [p for p in profiles if p.negative_durations]:
        said.append("events of a negative duration (left unfinished, or an edited file) left out: "
                    + ", ".join(f"{p.path.name} {p.negative_durations:,}" for p in negative))
    if said:
        trace.meta["warnings"] = said
    for text in said:  # a script or notebook hears them too, as paralab's other warnings
        warn(text, ProfileWarning)
    return trace


def _what_the_steps_hide(spans_by_rank: dict[int, list[Span]], profiles: list[RankProfile], ranks: list[int],
                         use_paralab: bool, idle: list[int]) -> list[str]:
    """Warnings for figures that import without error but say less than they seem to: a profile with
    no steps (its totals read as one step's), a rank with no operators (``idle``), collectives whose process
    group the profile does not name (gloo's) in a job that made groups smaller than the world."""
    said = []
    stepless = [str(p.path) for p in profiles if not use_paralab and not _profiler_steps(p)]
    if stepless:
        said.append(f"{', '.join(stepless)}: no ProfilerStep ranges (torch records them only under a "
                    "torch.profiler.schedule, with prof.step() after each step), so each is imported as "
                    "one step, and its figures per step are the whole profile's")
    if idle:
        said.append(f"{numbered('rank', idle)} recorded no operators or communication (a "
                    "schedule's last, almost empty file?)")
    groups = sorted({tuple(g) for p in profiles for g in p.subgroups})
    unnamed = any(s.lane == COMM and s.peer is None and s.group_ranks is None
                  for spans in spans_by_rank.values() for s in spans)
    if groups and unnamed:
        said.append(f"the job made process groups smaller than the world "
                    f"({', '.join(str(list(g)) for g in groups)}), "
                    "and the profile does not say which group each collective ran on (gloo's do not): "
                    "they are imported as collectives over all ranks, so their bytes and pairing may be off")
    return said


def _chunks_per_rank(schedule: str) -> int:
    """The model chunks a rank of ``schedule`` holds, as import takes it: interleaved's are not a
    fact it is given (two; its rule on rounds holds for any), the others' as the schedules say."""
    return chunks_per_rank(schedule, 2 if schedule == "interleaved" else 1)


def _sends_the_schedule_makes(trace: Trace, facts: dict) -> list[str]:
    """A warning when the pipeline facts given (``schedule``, ``pp``, ``microbatches``; the bubble
    figure reads them) make a different number of sends per step on some rank than the profile
    records: one stage per rank (world = pp), each microbatch crossing each boundary once forward and
    once back. Not checked: a job of several pipelines (world > pp: which rank holds which stage is not
    in the profile), and interleaved, whose chunks per rank import is not given."""
    name, pp, m = facts.get("schedule"), facts.get("pp"), facts.get("microbatches")
    if not (name and pp and m) or trace.world_size != pp or name == "interleaved":
        return []
    schedule = build_schedule(name, pp, m, _chunks_per_rank(name))
    expected = {r: sum(a.op in (SEND_FORWARD, SEND_BACKWARD) for a in acts)
                for r, acts in enumerate(schedule.actions)}
    per_step: dict[int, dict[int, int]] = {rank: defaultdict(int) for rank in trace.ranks}
    for s in trace.spans:
        if s.lane == STEP:
            per_step[s.rank].setdefault(s.step, 0)
        elif s.kind == "send" and s.step is not None:
            per_step[s.rank][s.step] += 1
    measured = {r: statistics.median(steps.values()) for r, steps in per_step.items() if steps}
    differ = [r for r in sorted(measured) if measured[r] != expected.get(r)]
    if not differ:
        return []
    r = differ[0]
    return [f"{name} over pp {pp} with {count_text(m, 'microbatch', 'microbatches')} sends "
            f"{count_text(expected.get(r, 0), 'message')} a step from rank {r}; the profile records "
            f"{measured[r]:g}: check --schedule, --pp and --microbatches (the bubble figure reads them)"]


def _profiler_steps(profile: RankProfile) -> set[int]:
    """The ProfilerStep#N numbers a rank's profile records."""
    return {int(m[1]) for e in profile.host_events if (m := STEP_RE.fullmatch(e.name))}


def _check_facts_agree(profiles: list[RankProfile], facts: dict) -> None:
    """ProfileError for a fact given (``meta``) that the profiles say otherwise: a paralab run's profile
    carries its run's own (schedule, pp, microbatches, tokens per step: paralab.profiling), which a fact
    given over it would silently have replaced. A torch job's profile says none of them, so for it a
    fact cannot be checked, and is taken as given."""
    run = {k: v for p in profiles for k, v in p.paralab_meta.items()}
    for key, value in facts.items():
        if key in run and run[key] != value:
            flag = "--" + key.replace("_", "-")
            raise ProfileError(f"{flag} {value} contradicts these profiles: they are of a paralab run whose "
                               f"{key} was {run[key] or 'none'} (they carry it); leave {flag} out")


def _has_paralab_ranges(profile: RankProfile) -> bool:
    return any(e.cat == "user_annotation" and e.name.startswith(PREFIX) for e in profile.host_events)


def _assign_ranks(profiles: list[RankProfile]) -> list[int]:
    """distributedInfo's ranks when every file has one, the order of the files when none has (a tool
    or a process without a process group); no rank twice, none outside its world. A mix is refused:
    numbering the files without a rank around the others' could give one the rank of another."""
    stated = [p for p in profiles if p.rank is not None]
    if stated and len(stated) < len(profiles):
        bare = next(p for p in profiles if p.rank is None)
        raise ProfileError(f"{bare.path}: no distributedInfo.rank, while {stated[0].path} says rank "
                           f"{stated[0].rank}: give the files of one job, which all say their rank")
    ranks = [p.rank for p in profiles] if stated else list(range(len(profiles)))
    seen: dict[int, Path] = {}
    for rank, p in zip(ranks, profiles):
        if not 0 <= rank < MAX_RANKS:
            raise ProfileError(f"{p.path}: distributedInfo.rank {rank} is not a rank (0..{MAX_RANKS - 1:,})")
        if p.world_size is not None and rank >= p.world_size:
            raise ProfileError(f"{p.path}: rank {rank}, yet its distributedInfo.world_size is {p.world_size}")
        if rank in seen:
            raise ProfileError(f"{p.path}: rank {rank} again (also {seen[rank]}); give one file per rank "
                               f"({REPEATING_SCHEDULE})")
        seen[rank] = p.path
    return ranks


def _check_one_run(profiles: list[RankProfile], ranks: list[int]) -> list[str]:
    """Refuse files that cannot be one recording of one job (ProfileError, one line naming the
    conflict), from facts the files state, before any span is built; return warnings for what may
    still be one. (torch's ``trace_id`` tells nothing here: each rank's profiler makes its own, unless
    ``custom_trace_id_callback`` gives a whole job one.)"""
    by_world: dict[int, RankProfile] = {}
    for p in profiles:
        if p.world_size is not None:
            by_world.setdefault(p.world_size, p)
    if len(by_world) > 1:
        (n, a), (m, b) = list(by_world.items())[:2]
        raise ProfileError(f"{a.path} is from a world of {n} ranks, {b.path} of {m}: not one job")
    return _step_conflicts(profiles, ranks)


def _step_conflicts(profiles: list[RankProfile], ranks: list[int]) -> list[str]:
    """The ranks of one job record the same iterations (``ProfilerStep#N``, N counted alike on every
    rank): ProfileError when no step is common to all of them (another job, or another window of it);
    a warning naming the ranks that differ when some are (a rank's profile cut short), as each step
    keeps its ranks."""
    steps = {rank: _profiler_steps(p) for rank, p in zip(ranks, profiles)}
    if len({frozenset(s) for s in steps.values()}) == 1:
        return []
    said = "; ".join(f"rank {r} recorded steps {_steps_text(steps[r])}" for r in sorted(steps))
    if not set.intersection(*steps.values()):
        why = f" ({NUMBERED_BY_ORDER}; {REPEATING_SCHEDULE})" if _numbered_by_order(profiles) else ""
        raise ProfileError(f"{said}: no step common to every rank, so not one recording of one job{why}")
    return [f"{said}: the steps some ranks lack are imported without them"]


def _numbered_by_order(profiles: list[RankProfile]) -> bool:
    """Whether the ranks are the files' order (:func:`_assign_ranks`): no file says its own."""
    return all(p.rank is None for p in profiles)


def _steps_text(steps: set[int]) -> str:
    return ", ".join(map(str, sorted(steps))) if steps else "none (no ProfilerStep ranges)"


def _align(spans_by_rank: dict[int, list[Span]], profiles: list[RankProfile], ranks: list[int], offsets: dict,
           world: int, paralab_clock: bool) -> dict:
    """Shift every rank onto one timeline (module docstring); returns what was done, for the meta."""
    ref_ns = min(p.base_ns for p in profiles)
    shift = {rank: (p.base_ns - ref_ns) * 1e-9 for rank, p in zip(ranks, profiles)}
    on_paralab_clock = paralab_clock and all(offsets[r] is not None for r in ranks)
    if on_paralab_clock:
        shift = {r: -offsets[r] for r in ranks}
        method = "paralab: every rank's clock starts as it leaves the barrier before training"
    else:
        ends = _first_common_collective_ends(spans_by_rank, ranks, world)
        hosts = _clock_hosts(profiles, ranks)
        method = "clock: the profiler's own clocks (Unix time)"
        if len(ranks) > 1 and not ends and (steps := _first_common_steps(spans_by_rank, ranks)):
            # no collective to align on (sends only, groups smaller than the world, none at all): the
            # ranks of one run are still in a step at the same time (a pipeline's last stage may start
            # it seconds after the first, yet they exchange its microbatches within it)
            _check_one_clock(hosts, {r: (lo + shift[r], hi + shift[r]) for r, (lo, hi) in steps.items()},
                             "first common steps lie")
        if len(ranks) > 1 and ends:
            ref = min(ranks)
            # how far each rank's clock is off, read as if the first collective ended at one instant
            off = {r: ends[r] + shift[r] - ends[ref] - shift[ref] for r in ranks}
            _check_one_clock(hosts, {r: (-off[r], -off[r]) for r in ranks},
                             "first collective over all ranks ends")
            _check_collectives_meet(spans_by_rank, hosts, shift, world)
            if len(hosts) == 1:
                method = "clock: every rank ran on one host and read its clock"
            else:
                host_off = {r: statistics.median(off[m] for m in members)
                            for members in hosts.values() for r in members}
                shift = {r: shift[r] - host_off[r] for r in ranks}
                method = ("collective: the first collective over all ranks ends at one instant on every "
                          "host (the median of its ranks)")
    for rank, spans in spans_by_rank.items():
        for s in spans:
            s.start += shift[rank]
            s.end += shift[rank]
    if not on_paralab_clock:  # start the timeline at the first step
        t0 = min((s.start for spans in spans_by_rank.values() for s in spans if s.lane == STEP), default=0.0)
        for spans in spans_by_rank.values():
            for s in spans:
                s.start -= t0
                s.end -= t0
    moved = {r: shift[r] - (p.base_ns - ref_ns) * 1e-9 for r, p in zip(ranks, profiles)}
    first = min(ranks)
    return {"method": method, "correction_s": [moved[r] - moved[first] for r in sorted(ranks)]}


def _clock_hosts(profiles: list[RankProfile], ranks: list[int]) -> dict[str, list[int]]:
    """The ranks that read one clock, by host: a file that names no host is a host of its own."""
    hosts: dict[str, list[int]] = {}
    for rank, p in zip(ranks, profiles):
        hosts.setdefault(p.host or f"unnamed {rank}", []).append(rank)
    return hosts


def _check_one_clock(hosts: dict[str, list[int]], windows: dict[int, tuple[float, float]],
                     moment: str) -> None:
    """Ranks on one host (``hosts``: :func:`_clock_hosts`) read one clock: each rank's window (start,
    end) of a ``moment`` they share (the end of their first collective over all ranks, an instant; else
    their first common step) comes within ``ONE_HOST_SKEW_S`` of every other's on it. Further apart,
    the files are of different runs (ProfileError)."""
    for host, members in hosts.items():
        late = max(members, key=lambda r: windows[r][0])
        early = min(members, key=lambda r: windows[r][1])
        if (apart := windows[late][0] - windows[early][1]) > ONE_HOST_SKEW_S:
            raise ProfileError(f"ranks {min(late, early)} and {max(late, early)} ran on one host ({host}), "
                               f"yet their {moment} {apart:.3g} s apart on its clock: not one run")


# collectives that no rank leaves before every rank has entered (each rank's result needs every rank's
# data); a broadcast's root may leave first, and an all-to-all that sends a rank nothing need not wait
MEETING = ("all_reduce", "all_gather", "reduce_scatter", "barrier")
# what executes a collective (a gloo worker's range, an NCCL kernel): a host call (``c10d::...``, what a
# profile without them is read from) only queues the work, and the ranks' calls need not overlap
EXECUTIONS = ("gloo:", "nccl")


def _check_collectives_meet(spans_by_rank: dict[int, list[Span]], hosts: dict[str, list[int]],
                            shift: dict[int, float], world: int) -> None:
    """Ranks of one run on one host (one clock, ``shift`` its files' origins) are in each collective
    over every rank at the same time: each such collective's execution (``EXECUTIONS``) on a rank
    overlaps one of its kind on the host's next rank, in file order (within CLOCK_SLACK_S). Checked in
    the steps every rank recorded but the last (whose collectives may run past the end of another's
    recording), as the ranks number them alike. Two jobs run at the same time on one machine pass the
    first-collective check (their first collectives end within a second of each other) but not this
    one; checking each rank against the next finds any two jobs mixed."""
    def meeting(rank: int) -> list[tuple[float, float, str, int | None]]:
        return sorted(((s.start + shift[rank], s.end + shift[rank], s.kind, s.step)
                       for s in spans_by_rank[rank] if s.lane == COMM and s.kind in MEETING
                       and s.group_size == world and s.group_ranks is None
                       and s.name.lower().startswith(EXECUTIONS)), key=lambda call: call[0])

    for host, members in hosts.items():
        calls = {r: meeting(r) for r in members}
        index = {r: _by_kind(calls[r]) for r in members}
        steps = set(sorted(set.intersection(*({s.step for s in spans_by_rank[r] if s.lane == STEP}
                                              for r in members)))[:-1])
        checked = {r: [c for c in calls[r] if c[3] in steps] for r in members}  # once a rank, not a pair
        for a, b in zip(members, members[1:]):
            for one, other in ((a, b), (b, a)):
                lost = _first_unmet(checked[one], index[other])
                if lost is not None:
                    raise ProfileError(
                        f"ranks {a} and {b} ran on one host ({host}), yet rank {one}'s {lost[2]} in step "
                        f"{lost[3]} overlaps none of rank {other}'s on its clock: a collective over every "
                        "rank runs on all of them at once, so these files are not one run (two jobs that "
                        "ran at the same time?)")


def _by_kind(calls: list[tuple]) -> dict[str, tuple[list[float], list[float]]]:
    """kind -> (starts, the latest end so far) of ``calls`` (start, end, kind, step), sorted by start:
    what :func:`_first_unmet` searches."""
    by_kind: dict[str, tuple[list[float], list[float]]] = {}
    for start, end, kind, _ in calls:
        starts, reach = by_kind.setdefault(kind, ([], []))
        starts.append(start)
        reach.append(max(end, reach[-1]) if reach else end)
    return by_kind


def _first_unmet(calls: list[tuple], by_kind: dict[str, tuple[list[float], list[float]]]) -> tuple | None:
    """The first of ``calls`` (start, end, kind, step) that overlaps no call of its kind in another
    rank's ``by_kind`` (:func:`_by_kind`), or None."""
    for call in calls:
        start, end, kind, _ = call
        starts, reach = by_kind.get(kind, ([], []))
        k = bisect.bisect_right(starts, end + CLOCK_SLACK_S) - 1
        if k < 0 or reach[k] < start - CLOCK_SLACK_S:
            return call
    return None


def _first_common_steps(spans_by_rank: dict[int, list[Span]],
                        ranks: list[int]) -> dict[int, tuple[float, float]]:
    """Each rank's (start, end) of the lowest step every rank has (empty when there is none)."""
    steps = {r: {s.step: (s.start, s.end) for s in spans_by_rank[r] if s.lane == STEP} for r in ranks}
    common = set.intersection(*(set(own) for own in steps.values()))
    return {r: steps[r][min(common)] for r in ranks} if common else {}


def _first_common_collective_ends(spans_by_rank: dict[int, list[Span]], ranks: list[int],
                                  world: int) -> dict[int, float]:
    """Each rank's end of its first collective over every rank in the lowest step where every rank
    has one (empty when there is none): ranks whose profiles start at different steps are aligned on
    one collective, not each on its own first."""
    collectives = {r: [s for s in spans_by_rank[r] if s.lane == COMM and s.kind not in ("send", "recv")
                       and s.group_size == world and s.group_ranks is None and s.step is not None]
                   for r in ranks}
    common = set.intersection(*({s.step for s in spans} for spans in collectives.values()))
    if not common:
        return {}
    step = min(common)
    return {r: min((s for s in spans if s.step == step), key=lambda s: s.start).end
            for r, spans in collectives.items()}


def _crosses_nodes(s: Span, node_of: dict[int, int], world: int) -> bool:
    """Whether the span's wire bytes leave the node: the peer's node, or the ring successor's (as
    paralab.comm marks its own spans); unknown peers and groups stay on the node."""
    if s.peer is not None:
        return node_of.get(s.peer, node_of[s.rank]) != node_of[s.rank]
    members = sorted(s.group_ranks or (range(world) if s.group_size == world else []))
    if s.rank not in members:
        return False
    successor = members[(members.index(s.rank) + 1) % len(members)]
    return node_of.get(successor, node_of[s.rank]) != node_of[s.rank]


def _meta(profiles: list[RankProfile], ranks: list[int], world: int, node_of: dict[int, int]) -> dict:
    meta = {k: v for p in profiles for k, v in p.paralab_meta.items()}  # a profiled paralab run's own meta
    meta.update(source="imported", world_size=world, files=[str(p.path) for p in profiles])
    meta["ranks"] = {r: {"node": node_of[r], "host": p.host, "device": "cuda" if p.on_gpu else "cpu"}
                     for r, p in zip(ranks, profiles)}
    if all(p.peak_memory for p in profiles):
        order = sorted(zip(ranks, profiles))
        peaks = [int(p.peak_memory.get(1 if p.on_gpu else 0, max(p.peak_memory.values()))) for _, p in order]
        meta["memory_by_kind"] = [{"allocated" if p.on_gpu else CPU_MEMORY: peak}
                                  for peak, (_, p) in zip(peaks, order)]
        meta["memory_ranks"] = [rank for rank, _ in order]  # the profiled ranks may be any few
        if all(p.on_gpu for p in profiles):
            meta["peak_memory_bytes"] = peaks
        else:
            meta["memory_note"] = CPU_MEMORY_NOTE
    return meta


def _unsized_comm(spans_by_rank: dict[int, list[Span]], ranks: list[int]) -> dict[int, set[str]]:
    """The ops left without a size on each rank (a barrier has none to give): gloo's calls and bare c10d
    calls are sized by their recorded shapes alone, NCCL's record_param_comms needs none. A rank
    profiled without record_shapes has none; one with them lacks a dtype where its only tensor
    argument is a list (a scatter's receiving ranks: its bytes had read 0 without a word)."""
    unsized = {r: {s.kind for s in spans_by_rank[r] if s.lane == COMM and s.kind != "barrier"
                   and not s.payload_bytes} for r in ranks}
    return {r: ops for r, ops in unsized.items() if ops}


# ---------------------------------------------------------------------------------------------- CLI
def add_import_args(parser) -> None:
    """Arguments of ``paralab import PROFILE [PROFILE ...] -o OUT [--schedule ...]``."""
    parser.add_argument("profiles", nargs="+", metavar="PROFILE",
                        help="torch.profiler traces, one per rank (.json or .json.gz), or their directory")
    parser.add_argument("-o", "--output", required=True, help="the paralab trace to write (JSON)")
    parser.add_argument("--chrome", action="store_true", help="write Chrome trace format instead (Perfetto)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object (warnings stay on stderr)")
    parser.add_argument("--names", choices=NAMES, default="auto",
                        help="paralab: the spans a paralab run --profile named; torch: torch's operators; "
                             "auto: paralab's names where every profile has them")
    # what a profile cannot say, for the bubble figure and throughput
    parser.add_argument("--schedule", choices=SCHEDULES, help="the pipeline schedule the job ran")
    parser.add_argument("--pp", type=int, help="pipeline stages")
    parser.add_argument("--microbatches", type=int, help="microbatches per step")
    parser.add_argument("--tokens-per-step", type=int, help="tokens the job trains on per step")


def import_main(args) -> int:
    """``paralab import``: 0 when written; 2 (one line on stderr) for a file that cannot be imported,
    a fact below 1, or an output that cannot be written or would overwrite a profile (checked first:
    reading many profiles takes a while)."""
    try:
        _check_import_args(args)
        facts = {k: getattr(args, k) for k in IMPORT_FACTS}
        with warnings.catch_warnings():  # said below, as the import's own lines
            warnings.simplefilter("ignore", ProfileWarning)
            trace = import_profile(args.profiles, names=args.names,
                                   meta={k: v for k, v in facts.items() if v is not None})
    except ConfigError as exc:
        print(f"paralab import: {exc}", file=sys.stderr)
        return 2
    for warning in trace.meta.get("warnings", []):
        print(f"paralab import: warning: {warning}", file=sys.stderr)
    out = trace.save_chrome(args.output) if args.chrome else trace.save(args.output)
    summary = trace.summary()
    if args.json:
        print(json_text(_import_json(trace, summary, out)))
        return 0
    typical = trace.typical_steps()
    steps = count_text(len(summary['step_times_s']), 'step')
    print(f"imported {count_text(len(trace.ranks), 'rank')}, {steps}, {len(trace.spans)} spans -> {out}; "
          f"median step {summary['step_time_s'] * 1e3:.1f} ms"
          + (f" (of {steps_said(typical)})" if typical else ""))
    for line in _comm_lines(summary, set(trace.meta.get("bytes_unknown_ops", []))):
        print(f"  {line}")
    if "memory_note" in trace.meta:
        print(f"  memory: {trace.meta['memory_note']}")
    return 0


def _import_json(trace: Trace, summary: dict, out) -> dict:
    """What ``paralab import --json`` prints: the summary under the keys ``paralab run --json`` gives
    the same figures (``step_time_s``, ``comm_bytes``, ``peak_memory_bytes`` where a GPU's profile
    holds one), and what only an import can say: ops whose bytes some rank left unsized (profiled
    without record_shapes), its warnings, and its memory by profiled rank with the note that names it."""
    meta = trace.meta
    memory = {key: meta[key] for key in ("peak_memory_bytes", "memory_ranks", "memory_by_kind", "memory_note")
              if key in meta}
    return {"ranks": len(trace.ranks), "steps": len(trace.step_windows()), "spans": len(trace.spans),
            "trace": str(out), **summary, **memory,
            "comm_bytes_unknown": sorted(meta.get("bytes_unknown_ops", [])),
            "warnings": list(meta.get("warnings", []))}


def _check_import_args(args) -> None:
    """ConfigError for an output that cannot be written or is a profile to import, a fact below 1, or
    a schedule the facts given cannot make."""
    check_file(args.output, "output")
    _check_output_is_no_profile(args.profiles, Path(args.output))
    facts = {key: getattr(args, key) for key in IMPORT_FACTS}
    if problem := _fact_problem(facts, lambda key: "--" + key.replace("_", "-")):
        raise ConfigError(problem)


def _fact_problem(facts: dict, said=str) -> str:
    """What is wrong with the facts an import is given (``meta``: ``paralab import``'s flags, or
    ``import_profile``'s argument), each named as ``said(key)`` says: a key it does not take, an
    unknown schedule, a count not a whole number >= 1, or a schedule the counts cannot make. Empty when
    nothing is. Python's ``meta`` had reached the trace unchecked: a negative tokens_per_step read as a
    negative throughput, a pp of "2" a TypeError."""
    if not isinstance(facts, dict):
        return f"the facts (meta) must be a dict of {', '.join(IMPORT_FACTS)}, got {facts!r}"
    if unknown := sorted(set(facts) - set(IMPORT_FACTS)):
        return f"unknown fact(s) {', '.join(map(said, unknown))}: an import takes {', '.join(IMPORT_FACTS)}"
    schedule = facts.get("schedule")
    if schedule is not None and schedule not in SCHEDULES:
        return f"{said('schedule')} must be one of {', '.join(SCHEDULES)}, got {schedule!r}"
    for key in ("pp", "microbatches", "tokens_per_step"):
        value = facts.get(key)
        if value is not None and type(value) is not int:
            return f"{said(key)} must be a whole number, got {value!r}"
        if value is not None and value < 1:
            return f"{said(key)} must be >= 1, got {value}"
    if schedule and facts.get("pp") and facts.get("microbatches"):
        shape = shape_problems(schedule, facts["pp"], facts["microbatches"], _chunks_per_rank(schedule))
        return next(iter(shape), "")
    return ""


def _check_output_is_no_profile(profiles: list[str], output: Path) -> None:
    """ProfileError when writing ``output`` would overwrite a profile to import (the user's own data):
    one given by name, or one a directory given holds, unless it is a paralab trace there (an earlier
    import's output, left out of the import)."""
    for path, named in expand(profiles):
        if same_file(path, output) and (named or not _is_paralab_trace(path)):
            raise ProfileError(f"-o {output} is one of the profiles to import, which the trace would "
                               "overwrite: write it elsewhere")


def _is_paralab_trace(path: Path) -> bool:
    try:
        read_profile(path)
    except ParalabTraceError:
        return True
    except ProfileError:
        pass
    return False


def _comm_lines(summary: dict, unknown: set[str]) -> list[str]:
    """Bytes per op and step; for the ops some rank left unsized (``unknown``: profiled without
    record_shapes, NCCL's sized without them, or a size without its dtype) a 0 is not a measure, and a
    total that is not 0 leaves those ranks out: both say so."""
    from paralab.viz._common import fmt_bytes  # plotly-free, as the viz package imports it lazily

    lines = []
    for op, nbytes in summary["comm_payload_bytes"].items():
        partial = op in unknown
        if partial and not nbytes:
            lines.append(f"{op}: bytes unknown (no size recorded: see the warning)")
        else:
            lines.append(f"{op}: {fmt_bytes(nbytes)} of tensors per step (all ranks), "
                         f"{fmt_bytes(summary['comm_bytes'].get(op, 0))} on the wire"
                         + (" (ranks that recorded no size of it not counted)" if partial else ""))
    return lines
