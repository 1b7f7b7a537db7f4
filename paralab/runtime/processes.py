"""Several processes waited for together, under one deadline.

Processes that work together (torchrun agents acting as nodes, calibration ranks) cannot finish once
one of them fails: the others wait for it until their own timeouts. So they are polled together, all
of them on every pass, and the wait ends at the first failure or at the deadline; the caller stops
those still running and blames the first that failed (paralab.runtime.failures).
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


def wait_together(procs: list[subprocess.Popen], timeout_s: float) -> Waited:
    """Poll every process on every pass until all have ended, one has failed, or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, code in enumerate(codes) if code]
        if failed or None not in codes or time.monotonic() > deadline:
            return Waited(codes, failed, timed_out=not failed and None in codes)
        time.sleep(POLL_S)
