"""Several processes waited for together, under one deadline.

Processes that work together (torchrun agents acting as nodes, calibration ranks) cannot finish once
one of them fails: the others wait for it until their own timeouts. So they are polled together, all
of them on every pass, and the wait ends soon after the first failure (``settle_s`` later, so that
its peers can report what they saw) or at the deadline; the caller stops those still running and
blames the first that failed (paralab.runtime.failures).
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

POLL_S = 0.05
STARTUP_GRACE_S = 120.0  # before the first step: ranks import torch (a forkserver, or each torchrun worker)
HANG_MARGIN_S = 30.0  # past a collective's timeout: time for a rank waiting on a hung peer to fail and say so


@dataclass
class ProgressWatch:
    """A run's watchdog, fed the step the slowest rank has reached. The run hung when that step has
    not moved for longer than a collective may wait (``timeout_s``: a rank waiting on a hung peer
    fails by then and says so) plus HANG_MARGIN_S, and before the first step also STARTUP_GRACE_S.
    So a long healthy run is never cut short, and a run that stalls where no collective times out
    (every rank stopped, or stuck before its process group) is not waited on for ever."""

    timeout_s: float
    last_step: int = -1
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)

    def saw(self, step: int, now: float | None = None) -> bool:
        """Record the slowest rank's ``step``; whether it moved on."""
        if step <= self.last_step:
            return False
        self.last_step, self.last_progress = step, time.monotonic() if now is None else now
        return True

    def hung(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        grace = STARTUP_GRACE_S if self.last_step < 0 else 0.0
        return now - self.last_progress > self.timeout_s + HANG_MARGIN_S + grace

    def _where(self) -> str:
        return "before its first step" if self.last_step < 0 else f"at step {self.last_step}"

    def message(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        return (f"no rank made progress for {now - self.last_progress:.0f} s "
                f"(timeout {self.timeout_s:.0f} s): the run hung {self._where()}, or one step "
                "takes longer than that here (--timeout, timeout_s=, gives it longer); "
                f"started {now - self.started:.0f} s ago")


@dataclass
class Waited:
    codes: list[int | None]  # each process's exit code, None where it was still running
    first_failed: list[int]  # the processes seen failed on the pass that saw the first failure
    timed_out: bool
    hung: bool = False  # the caller's watchdog ended the wait

    @property
    def running(self) -> list[int]:
        return [i for i, code in enumerate(self.codes) if code is None]


def wait_together(procs: list[subprocess.Popen], timeout_s: float | None, settle_s: float = 0.0,
                  watchdog: Callable[[], bool] | None = None) -> Waited:
    """Poll every process on every pass until all have ended, ``settle_s`` after one has failed, when
    ``timeout_s`` has passed (None: no limit), or when ``watchdog()``, called on each pass while none
    has failed, says the processes hung."""
    deadline, first_failed = time.monotonic() + (math.inf if timeout_s is None else timeout_s), []
    while True:
        codes = [proc.poll() for proc in procs]
        if not first_failed and (first_failed := [i for i, code in enumerate(codes) if code]):
            deadline = min(deadline, time.monotonic() + settle_s)
        if None not in codes or time.monotonic() > deadline:
            return Waited(codes, first_failed, timed_out=not first_failed and None in codes)
        if not first_failed and watchdog is not None and watchdog():
            return Waited(codes, first_failed, timed_out=False, hung=True)
        time.sleep(POLL_S)
