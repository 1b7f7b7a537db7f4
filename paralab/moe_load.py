"""Where a mixture of experts sent its tokens, read back from a trace (plain data, no torch).

Every mixture-of-experts layer (paralab.models.moe) records trace counters on its rank at each
forward, so a run's load is part of its trace like its spans and its memory:

- ``moe.l{layer}.routed.e{expert}``: tokens this rank sent to ``expert`` (after the capacity cut);
- ``moe.l{layer}.dropped``: token-to-expert assignments dropped for lack of capacity;
- ``moe.l{layer}.received``: tokens this rank's own experts computed (with expert parallel, tokens
  from every rank of its group; the rank with the most is the one the others wait for);
- ``moe.l{layer}.aux``: the layer's load-balancing loss.

:func:`expert_load` sums them per step (forwards of one step, over its microbatches), which is what
the figures in paralab.viz.moe and notebook 11 draw.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

PREFIX = "moe."
_NAME = re.compile(r"moe\.l(\d+)\.(routed|dropped|received|aux)(?:\.e(\d+))?$")


def counter_name(layer: int, what: str, expert: int | None = None) -> str:
    """The counter a layer records (``what``: routed, dropped, received or aux)."""
    return f"{PREFIX}l{layer}.{what}" + (f".e{expert}" if expert is not None else "")


@dataclass
class ExpertLoad:
    """Tokens per expert, per rank, per step, as a run's trace recorded them.

    ``routed[(step, rank, layer)]``: tokens rank sent to each expert; ``dropped[(step, rank, layer)]``
    and ``received[(step, rank, layer)]`` counts; ``aux[(step, rank, layer)]`` the balancing loss
    (summed over the step's microbatches, so a mean over them is ``aux / microbatches``)."""

    experts: int = 0
    routed: dict = field(default_factory=dict)
    dropped: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)
    aux: dict = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return sorted({k[0] for k in self.routed})

    @property
    def ranks(self) -> list[int]:
        return sorted({k[1] for k in self.routed})

    @property
    def layers(self) -> list[int]:
        return sorted({k[2] for k in self.routed})

    def tokens_per_expert(self, step: int, layer: int | None = None) -> list[int]:
        """Tokens each expert computed in ``step`` (all ranks; one layer, or the sum over layers)."""
        self._check_layer(layer)
        out = [0] * self.experts
        for (s, _, lay), counts in self.routed.items():
            if s == step and (layer is None or lay == layer):
                out = [a + b for a, b in zip(out, counts)]
        return out

    def dropped_per_step(self) -> list[int]:
        return [sum(v for (s, _, _), v in self.dropped.items() if s == step) for step in self.steps]

    def received_per_rank(self, step: int) -> list[int]:
        """Tokens each rank's experts computed in ``step``, summed over layers: the work each rank did."""
        totals = defaultdict(int)
        for (s, rank, _), v in self.received.items():
            if s == step:
                totals[rank] += v
        return [totals[rank] for rank in self.ranks]

    def imbalance(self, step: int, layer: int | None = None) -> float:
        """The busiest expert's tokens over the mean, of one layer or averaged over layers: 1.0 is a
        perfect balance, E is every token on one expert. The factor by which the hot expert's rank
        slows the layer (a layer the trace does not hold is refused by :meth:`tokens_per_expert`)."""
        factors = []
        for each in self.layers if layer is None else [layer]:
            tokens = self.tokens_per_expert(step, each)
            mean = sum(tokens) / len(tokens)
            if mean > 0:
                factors.append(max(tokens) / mean)
        return sum(factors) / len(factors) if factors else 1.0

    def _check_layer(self, layer: int | None) -> None:
        """A layer the trace does not hold would read as no tokens, a perfect balance: refused."""
        if layer is not None and layer not in self.layers:
            raise ValueError(f"no MoE layer {layer} in this trace: its layers are {self.layers}")


def expert_load(trace) -> ExpertLoad:
    """The ExpertLoad of a Trace: each ``moe.*`` counter summed into the step whose window (on its
    own rank) holds it."""
    windows = defaultdict(list)
    for span in trace.spans:
        if span.lane == "step" and span.step is not None:
            windows[span.rank].append((span.start, span.end, span.step))
    load = ExpertLoad()
    for c in trace.counters:
        match = _NAME.match(c.name)
        if not match:
            continue
        step = next((k for lo, hi, k in windows[c.rank] if lo <= c.t <= hi), None)
        if step is None:
            continue
        layer, what, expert = int(match[1]), match[2], match[3]
        key = (step, c.rank, layer)
        if what == "routed":
            e = int(expert)
            load.experts = max(load.experts, e + 1)
            counts = load.routed.setdefault(key, [])
            counts.extend([0] * (e + 1 - len(counts)))
            counts[e] += int(c.value)
        else:
            table = getattr(load, what)
            table[key] = table.get(key, 0) + c.value
    for counts in load.routed.values():
        counts.extend([0] * (load.experts - len(counts)))
    return load
