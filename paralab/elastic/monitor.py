"""Resource monitoring on each worker: what the balancer and the reader need to see.

Every step each rank samples its step time, CPU utilisation (process CPU time over wall time, so 100 %
is one busy core), resident memory and, on a GPU, allocated memory and utilisation. They go into the
rank's trace as counters, which Perfetto draws as counter tracks under the rank. Membership changes,
restarts, the injected failure and checkpoint save/load are spans on the trace's "event" lane.

Why spans are streamed to a file as they close: an elastic worker may be killed at any moment (the
failure injector's SIGKILL, or its agent stopping it for a membership change), so the trace cannot wait
for a clean exit. Each completed step appends its spans and counters to ``rankN.trace.jsonl``; what a
killed worker did up to its last step is on disk, and paralab.elastic.history merges the files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from paralab.runtime.recorder import Recorder
from paralab.trace import EVENT, Span


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Monitor:
    def __init__(self, recorder: Recorder, device: torch.device, out: Path):
        self.rec = recorder
        self.device = device
        self.out = out
        self._written_spans = 0
        self._written_counters = 0
        self._last = (time.perf_counter(), _cpu_seconds())

    def sample(self, step_time_s: float | None = None, world_size: int | None = None) -> None:
        """Counters for the stretch since the last sample (a step, usually); nothing when the
        recorder is off (its counters would be dropped)."""
        if not self.rec.enabled:
            return
        wall, cpu = time.perf_counter(), _cpu_seconds()
        (last_wall, last_cpu), self._last = self._last, (wall, cpu)
        if world_size is not None:
            self.rec.counter("world_size", world_size)
        if step_time_s is not None:
            self.rec.counter("step_time_s", step_time_s)
        if wall > last_wall:
            self.rec.counter("cpu_percent", 100.0 * (cpu - last_cpu) / (wall - last_wall))
        self.rec.counter("rss_bytes", rss_bytes())
        if self.device.type == "cuda":
            self.rec.counter("gpu_allocated_bytes", torch.cuda.memory_allocated(self.device))
            try:
                self.rec.counter("gpu_percent", torch.cuda.utilization(self.device))
            except (RuntimeError, ModuleNotFoundError):  # needs NVML (pynvml), which may be absent
                pass

    @contextmanager
    def event(self, kind: str, name: str, **fields):
        """A span on the event lane (checkpoint save/load, rendezvous, failure)."""
        with self.rec.span(kind, lane=EVENT, name=name, **fields):
            yield

    def mark(self, kind: str, name: str, start: float, end: float | None = None) -> None:
        """An event-lane span for something that happened outside the recorder's clock (the
        rendezvous before the clock started: ``start`` is negative)."""
        if self.rec.enabled:
            self.rec.spans.append(Span(rank=self.rec.rank, lane=EVENT, kind=kind, name=name, start=start,
                                       end=self.rec.now() if end is None else end))

    def flush(self) -> None:
        """Append the spans and counters recorded since the last flush to this rank's trace file."""
        self.rec.flush()
        spans, counters = self.rec.spans[self._written_spans:], self.rec.counters[self._written_counters:]
        if not spans and not counters:
            return
        with open(self.out, "a") as f:
            for s in spans:
                f.write(json.dumps({"span": dataclasses.asdict(s)}) + "\n")
            for c in counters:
                f.write(json.dumps({"counter": dataclasses.asdict(c)}) + "\n")
        self._written_spans += len(spans)
        self._written_counters += len(counters)
