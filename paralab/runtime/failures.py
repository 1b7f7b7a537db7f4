"""Which rank failed, and why: one RunError that names the rank at fault, not a rank that saw it.

When one rank fails, the others fail soon after, for its sake: a rank SIGKILLed from outside (or by
the out-of-memory killer) leaves its peers with "Connection closed by peer"; a rank that hangs leaves
them with a collective timeout. Those peers write error reports; the rank at fault may write none. So
the reports are read as evidence, most telling first:

1. a report that is not a consequence of another rank's failure (an exception the rank raised);
2. a rank that ended without a result or a report: killed, with its signal;
3. a rank still running that neither reported nor finished while its peers timed out waiting:
   it stopped answering (hung, or much slower than the others);
4. else the first report.

torch's errors carry the C++ stack they were raised from (dozens of ``frame #N:`` lines); those are
cut from what is shown, the Python traceback kept.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from paralab.runtime.result import RunError
from paralab.text import numbered

# what a rank reports when a peer died or stopped answering: a consequence, not a cause
_CONSEQUENCES = ("connection closed by peer", "connection reset", "broken pipe", "connection refused",
                 "timed out", "timeout")
_NATIVE_FRAME = re.compile(r"^\s*(frame #\d+:|Exception raised from )")


def is_consequence(report: dict) -> bool:
    """A report of a peer's failure seen from here: an error from the communication library (the
    rank says which, ``from_the_wire``) that says a peer went away or did not answer."""
    text = report["error"].lower()
    return report.get("from_the_wire", True) and any(marker in text for marker in _CONSEQUENCES)


def how_it_ended(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def cut_native_frames(text: str) -> str:
    """Replace each run of C++ stack lines ('Exception raised from ...', 'frame #N: ...') by one line."""
    out, cut = [], 0
    for line in text.splitlines():
        if _NATIVE_FRAME.match(line):
            cut += 1
            continue
        if cut:
            out.append(f"[{cut} lines of C++ stack cut]")
            cut = 0
        out.append(line)
    if cut:
        out.append(f"[{cut} lines of C++ stack cut]")
    return "\n".join(out)


def crash_report(report_dir: Path, rank: int) -> str:
    """What a rank that died of a fatal signal wrote as it died (worker.dump_stacks), if anything."""
    text = read_if_there(report_dir / f"rank{rank}.crash").strip()
    return f"(Python stack of rank {rank} as it died)\n{text}" if text else ""


def stack_report(report_dir: Path, rank: int, when: str = "which stopped answering") -> str:
    """The Python stack a rank wrote when asked (worker.dump_stacks), if any; ``when`` says why it
    was asked (the rank blamed, or every rank of a run that hung)."""
    text = read_if_there(report_dir / f"rank{rank}.stack").strip()
    return f"(Python stack of rank {rank}, {when})\n{text}" if text else ""


def read_if_there(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def then_reported(reports: list[dict]) -> str:
    """What the first peer to report said, as the tail of the message that blames another cause."""
    if not reports:
        return ""
    return f"; then rank {reports[0]['rank']} reported: {reports[0]['error'].splitlines()[0]}"


def blame(reports: list[dict], ended: dict[int, int], silent: list[int],
          stack_of=lambda rank: "", crash_of=lambda rank: "") -> RunError:
    """The RunError for a failed run (at least one report, or one rank that ended).

    ``reports``: the ranks' error reports ({"rank", "error", "traceback"}), in rank order;
    ``ended``: rank -> exit code of ranks that ended without a result; ``silent``: ranks still running
    without a result or a report; ``stack_of(rank)``: the Python stack of a silent rank, asked for
    only when that rank is the one blamed; ``crash_of(rank)``: what a rank that ended wrote as it
    died (its stack at a segmentation fault), if anything.
    """
    causes = [r for r in reports if not is_consequence(r)]
    if causes:
        first = causes[0]
        return RunError(first["rank"], first["error"], first["traceback"])
    reported = {r["rank"] for r in reports}
    seen = then_reported(reports)
    killed = [rank for rank in sorted(ended) if rank not in reported]
    if killed:
        rank = killed[0]
        return RunError(rank, f"died ({how_it_ended(ended[rank])}) without reporting a result{seen}",
                        crash_of(rank))
    if silent and reports:
        rank = silent[0]
        others = f" (so did {numbered('rank', silent[1:])})" if silent[1:] else ""
        return RunError(rank, f"stopped answering (hung, or much slower than the others){others}{seen}",
                        stack_of(rank))
    first = reports[0]
    return RunError(first["rank"], first["error"], first["traceback"])
