"""Where each global rank sits in a hybrid run: a (pp, dp, tp) grid, tensor parallel innermost.

    global rank = (pp_index x dp + dp_index) x tp + tp_index

Why this order: tensor parallelism talks in every layer, forward and backward, so its ranks are
neighbours (the same node, the fastest links); data parallelism talks once per step (the gradient
all-reduce); pipeline parallelism sends one activation per microbatch to the next stage, the least
traffic, so it is outermost and the stages are the ranks farthest apart. It is the order of
torch's ``init_device_mesh(device, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``, which builds
the process groups of the run from this grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

DIMS = ("pp", "dp", "tp")  # outermost first


@dataclass(frozen=True)
class RankLayout:
    """The grid of a dp x tp x pp run. ``coords`` maps each global rank to its (pp, dp, tp)."""

    dp: int
    tp: int
    pp: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.pp, self.dp, self.tp

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @cached_property
    def coords(self) -> dict[int, tuple[int, int, int]]:
        return {self.rank_of(p, d, t): (p, d, t)
                for p in range(self.pp) for d in range(self.dp) for t in range(self.tp)}

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def groups(self, dim: str) -> list[list[int]]:
        """The ranks that vary only along ``dim`` (the other two coordinates fixed), each list in
        that dimension's order: the tp groups, the dp groups, or the pipelines (pp)."""
        axis = DIMS.index(dim)
        lines: dict[tuple, list[int]] = {}
        for rank, coord in self.coords.items():  # in rank order, so each line is in that dimension's order
            lines.setdefault(coord[:axis] + coord[axis + 1:], []).append(rank)
        return list(lines.values())

    def text(self) -> str:
        """One row per (pp, dp), one column per tp rank: the global rank in each cell."""
        head = f"dp={self.dp} x tp={self.tp} x pp={self.pp} = {self.world_size} ranks " \
               f"(global rank = (pp * {self.dp} + dp) * {self.tp} + tp)"
        width = max(len(str(self.world_size - 1)), 3)
        rows = [head, " " * 9 + " ".join(f"tp{t}".rjust(width) for t in range(self.tp))]
        for p in range(self.pp):
            for d in range(self.dp):
                label = (f"pp{p}" if d == 0 else "").ljust(5) + f"dp{d}".ljust(4)
                rows.append(label + " ".join(str(self.rank_of(p, d, t)).rjust(width) for t in range(self.tp)))
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.text()

    def to_dict(self) -> dict:
        """Plain JSON data for a trace's meta or a figure: dims, shape and every rank's coordinate."""
        return {"dims": list(DIMS), "shape": list(self.shape),
                "coords": {str(rank): list(coord) for rank, coord in self.coords.items()}}


def rank_layout(dp: int, tp: int, pp: int) -> RankLayout:
    """The rank layout of a dp x tp x pp hybrid run (``print`` it for the table)."""
    if min(dp, tp, pp) < 1:
        raise ValueError(f"every degree must be >= 1, got dp={dp}, tp={tp}, pp={pp}")
    return RankLayout(dp, tp, pp)
