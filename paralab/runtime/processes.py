"""Several processes waited for together, under one deadline.

Processes that work together (torchrun agents acting as nodes, calibration ranks) cannot finish once
one of them fails: the others wait for it until their own timeouts. So they are polled together, all
of them on every pass, and the wait ends soon after the first failure (``settle_s`` later, so that
its peers can report what they saw) or at the deadline; the caller stops those still running and
blames the first that failed (paralab.runtime.failures).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

POLL_S = 0.05


@dataclass
class Waited:
    codes: list[int | None]  # each process's exit code, None where it was still running
    first_failed: list[int]  # the processes seen failed on the pass that saw the first failure
    timed_out: bool

    @property
    def running(self) -> list[int]:
        return [i for i, code in enumerate(self.codes) if code is None]


def wait_together(procs: list[subprocess.Popen], timeout_s: float, settle_s: float = 0.0) -> Waited:
    """Poll every process on every pass until all have ended, ``settle_s`` after one has failed, or
    when ``timeout_s`` has passed."""
    deadline, first_failed = time.monotonic() + timeout_s, []
    while True:
        codes = [proc.poll() for proc in procs]
        if not first_failed and (first_failed := [i for i, code in enumerate(codes) if code]):
            deadline = min(deadline, time.monotonic() + settle_s)
        if None not in codes or time.monotonic() > deadline:
            return Waited(codes, first_failed, timed_out=not first_failed and None in codes)
        time.sleep(POLL_S)
