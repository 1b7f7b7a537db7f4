"""How long paralab takes to notice each kind of failure, and to clean up after a killed launcher.

    python benchmarks/bench_failures.py --repeats 3

Each case runs in a Python of its own (ddp, tiny model, 2 ranks), the medians of ``--repeats`` are
printed as a Markdown table (docs/failures.md quotes it; elastic figures: benchmarks/bench_elastic.py):

- a rank raises: from its error report on disk to the RunError in the launcher;
- a rank is SIGKILLed from outside: from the kill to the RunError naming it;
- a rank hangs (``--timeout`` 5 s): from its last heartbeat to the RunError naming it ("stopped
  answering"): the peers' collective timeout, the wait for the evidence to settle, the stack dump;
- the launcher is SIGKILLed: from the kill until no process of the run is left and its temporary
  directories are gone (the janitor's work);
- ``paralab nodes``, a rank raises: from its error report to the command's exit (the agents notice,
  stop the other workers and exit).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from paralab.bench import benchmark_parser

# Each launcher records when rank 1's files first appear (its heartbeat per step, its error report).
RUN = """
import glob, json, os, threading, time
seen = {{}}
def watch():
    while True:
        for f in glob.glob(os.environ["TMPDIR"] + "/paralab-run-*/rank1.*"):
            try:
                key = os.path.basename(f) + (":" + open(f).read() if f.endswith(".beat") else "")
                seen.setdefault(key, time.time())
            except OSError:
                pass
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
{setup}
import paralab
try:
    paralab.run("ddp", 2, steps=100000, global_batch=8, {options})
except paralab.RunError as e:
    killed = globals().get("killed")
    print(json.dumps({{"rank": e.rank, "raised": time.time(), "seen": seen, "killed": killed}}))
"""
KILL_RANK_1 = """
import multiprocessing, signal
def kill_rank_1(step, steps):
    global killed
    rank1 = [p for p in multiprocessing.active_children() if p.name == "paralab-rank1"]
    if step >= 2 and rank1 and "killed" not in globals():
        killed = time.time()
        os.kill(rank1[0].pid, signal.SIGKILL)
"""


def _failed_run(tmp: Path, setup: str, options: str) -> dict:
    script = RUN.format(setup=setup, options=options)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp)})
    (line,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert line["rank"] == 1, line
    return line


def raising_rank(tmp: Path) -> float:
    run = _failed_run(tmp, "", "fault={'rank': 1, 'step': 2}")
    return run["raised"] - run["seen"]["rank1.error.json"]


def killed_rank(tmp: Path) -> float:
    run = _failed_run(tmp, KILL_RANK_1, "progress=kill_rank_1")
    return run["raised"] - run["killed"]


def hung_rank(tmp: Path) -> float:
    run = _failed_run(tmp, "", "timeout_s=5, fault={'rank': 1, 'step': 2, 'kind': 'hang'}")
    return run["raised"] - run["seen"]["rank1.beat:2"]


def killed_launcher(tmp: Path) -> float:
    parent = subprocess.Popen([sys.executable, "-c", RUN.format(setup="", options="")],
                              env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL)
    while not any(b.read_text() not in ("", "0") for b in tmp.glob("paralab-run-*/rank*.beat")):
        time.sleep(0.05)
    started = psutil.Process(parent.pid).children(recursive=True)  # janitor, forkserver, ranks
    killed = time.time()
    parent.send_signal(signal.SIGKILL)
    parent.wait()

    def alive(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    while any(map(alive, started)) or any(p.name.startswith(("paralab-", "pymp-")) for p in tmp.iterdir()):
        time.sleep(0.005)
    return time.time() - killed


def nodes_raising_rank(tmp: Path) -> float:
    command = [sys.executable, "-m", "paralab", "nodes", "--nnodes", "2", "--nproc-per-node", "1", "--",
               "--strategy", "ddp", "--steps", "100000", "--fail", "rank=1,step=2"]
    nodes = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TMPDIR": str(tmp)})
    reported = None
    while nodes.poll() is None:
        if reported is None and any(tmp.glob("paralab-nodes-*/reports/rank1.error.json")):
            reported = time.time()
        time.sleep(0.005)
    ended = time.time()
    assert "rank 1 failed" in nodes.stderr.read()
    return ended - reported


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (the median is printed)")
    args = parser.parse_args()
    cases = [("a rank raises: report -> RunError", raising_rank),
             ("a rank is SIGKILLed: kill -> RunError", killed_rank),
             ("a rank hangs (timeout 5 s): last heartbeat -> RunError", hung_rank),
             ("the launcher is SIGKILLed: kill -> no process, no temporary dir", killed_launcher),
             ("paralab nodes, a rank raises: report -> exit 1 naming it", nodes_raising_rank)]
    print("| failure | median (s) | runs (s) |\n|---|---:|---|")
    for name, case in cases:
        figures = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                figures.append(case(Path(tmp)))
        runs = ", ".join(f"{x:.2f}" for x in figures)
        print(f"| {name} | {statistics.median(figures):.2f} | {runs} |", flush=True)


if __name__ == "__main__":
    main()
