"""How `paralab merge` and `paralab report` scale with the number of spans (issue 13, item 9).

    python benchmarks/bench_trace_size.py --spans 100000 1000000

Writes a synthetic --trace-dir (8 ranks, one file each; every step a step span, 6 compute spans and
3 comm spans per rank, so steps grow with spans), then times each command in a fresh Python (wall
time and peak resident memory, from getrusage) and prints a Markdown table. Goal: linear in spans,
a million spans well under a minute on the development box; memory in proportion to the trace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paralab.bench import benchmark_parser

RANKS, COMPUTE, COMM = 8, 6, 3


def write_trace_dir(spans: int, out: Path) -> int:
    """Per-rank paralab trace files with about ``spans`` spans in all; the number of steps."""
    per_step = RANKS * (1 + COMPUTE + COMM)
    steps = max(spans // per_step, 1)
    for rank in range(RANKS):
        rows = []
        for step in range(steps):
            t = step * 0.1
            rows.append({"rank": rank, "lane": "step", "kind": "step", "start": t, "end": t + 0.1,
                         "step": step})
            for k in range(COMPUTE):
                rows.append({"rank": rank, "lane": "compute", "kind": "forward" if k < 3 else "backward",
                             "start": t + 0.01 * k, "end": t + 0.01 * k + 0.008, "step": step})
            for k in range(COMM):
                rows.append({"rank": rank, "lane": "comm", "kind": "all_reduce", "start": t + 0.05 + 0.01 * k,
                             "end": t + 0.058 + 0.01 * k, "bytes": 1 << 20, "payload_bytes": 1 << 19,
                             "group_size": RANKS, "step": step})
        meta = {"ranks": {rank: {"node": rank // 4}}, "tokens_per_step": 4096}
        data = {"format": "paralab-trace", "version": 1, "meta": meta, "spans": rows, "counters": []}
        (out / f"rank{rank:05d}.json").write_text(json.dumps(data))
    return steps


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of ``paralab ARGS`` in a Python of its own."""
    code = ("import resource, sys; from paralab.cli import main; code = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(code)")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], check=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - start, int(done.stderr.split()[-1]) / 1024


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--spans", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="spans in all of each synthetic trace folder")
    parser.add_argument("--report", action="store_true", help="time `paralab report` on the merged trace too")
    args = parser.parse_args()
    rows = ["| spans | steps | trace files (MB) | merge (s) | merge peak RSS (MiB) | report (s) "
            "| report peak RSS (MiB) |", "|---|---|---|---|---|---|---|"]
    for spans in args.spans:
        with tempfile.TemporaryDirectory() as tmp:
            traces, merged = Path(tmp) / "traces", Path(tmp) / "merged.json"
            traces.mkdir()
            steps = write_trace_dir(spans, traces)
            size = sum(f.stat().st_size for f in traces.iterdir()) / 1e6
            merge_s, merge_rss = timed(["merge", str(traces), "-o", str(merged)])
            report = timed(["report", str(merged), "-o", str(Path(tmp) / "r.html")]) if args.report else None
            report_cells = f"{report[0]:.1f} | {report[1]:.0f}" if report else "— | —"
            megabytes = f"{size:,.0f}" if size >= 100 else f"{size:.3g}"  # never 1.5e+03
            rows.append(f"| {spans:,} | {steps:,} | {megabytes} | {merge_s:.1f} | {merge_rss:.0f} "
                        f"| {report_cells} |")
            print(f"done: {rows[-1]}", file=sys.stderr, flush=True)  # progress; the table follows, whole
    print("\n".join(rows))


if __name__ == "__main__":
    main()
