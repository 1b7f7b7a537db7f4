"""Python's cyclic garbage collector, paused around the simulator's large pure computations.

A built and proved pipeline schedule is hundreds of thousands of small objects (actions, the tuples
of what each waits for), and the simulator keeps the schedules it has proved (``lru_cache``). The
cyclic collector walks every live object at each full collection, and pricing the layouts of a plan
allocates enough to set off many: 16-27% of planning Llama 3 405B on 16,384 H100s
(benchmarks/RESULTS.md). None of these objects forms a cycle, so reference counting frees them all;
pausing the collector for the computation changes nothing but its time.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


def without_cyclic_gc(function: F) -> F:
    """``function`` with the cyclic collector paused while it runs, and resumed after (where it was on
    before: a call inside another such call leaves it to the outer one)."""

    @functools.wraps(function)
    def paused(*args, **kwargs):
        was_on = gc.isenabled()
        gc.disable()
        try:
            return function(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()

    return paused
