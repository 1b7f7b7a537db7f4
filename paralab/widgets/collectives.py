"""The collectives explorer: one all-reduce, ring against tree, on a link you choose (the alpha-beta
model of paralab.collectives; the links of the hardware presets, or this machine as measured)."""

from __future__ import annotations

import math
from typing import NamedTuple

from paralab.config import finite_number
from paralab.widgets._common import (
    attach,
    figure_widget,
    message,
    replace_figure,
    row,
    select,
    up_to,
    widgets,
)

GROUPS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
SIZES_MB = [2.0**k for k in range(-10, 11)]  # 1 KiB to 1 GiB


class Link(NamedTuple):
    """A link of the alpha-beta model, how many ranks it can join (None: any number, as a network
    does) and whether NCCL's tree runs on it (a measured gloo link has no tree algorithm)."""

    alpha: float
    bandwidth: float
    reach: int | None = None
    tree: bool = True


def links(measured: dict | None = None) -> dict[str, Link]:
    """Each GPU preset's NVLink (inside a node: as many ranks as the node has GPUs) and InfiniBand
    (one GPU's NIC, across nodes), and ``measured`` links {name: Link, or (alpha, bandwidth) of a
    gloo link (no tree)}."""
    from paralab.sim.hardware import PRESETS

    out = {}
    for name, hw in PRESETS.items():
        out[f"{name} NVLink"] = Link(hw.intra_latency, hw.intra_bw, reach=hw.gpus_per_node)
        out[f"{name} InfiniBand"] = Link(hw.inter_latency, hw.inter_bw)
    return {**out, **{name: measured_link(name, link) for name, link in (measured or {}).items()}}


def measured_link(name: str, link) -> Link:
    """``link`` as a Link: itself, or a gloo link (no tree) of its (alpha in s, bandwidth in bytes/s),
    as :func:`paralab.collectives.fit_alpha_beta` gives them: alpha a number >= 0, bandwidth one > 0 or
    inf (a TypeError or ValueError naming the link otherwise: a pair of one had been "missing 1
    required positional argument", and a bandwidth of -3 had drawn negative times)."""
    if isinstance(link, Link):  # checked too: Link(1e-5, -3.0) had drawn negative times
        alpha, bandwidth = link.alpha, link.bandwidth
    elif isinstance(link, tuple | list) and len(link) == 2:
        alpha, bandwidth = link
    else:
        raise TypeError(f"measured link {name!r} must be a Link or (alpha in s, bandwidth in bytes/s), "
                        f"got {link!r}")
    if not (finite_number(alpha) and alpha >= 0 and (finite_number(bandwidth) or bandwidth == math.inf)
            and bandwidth > 0):
        raise ValueError(f"measured link {name!r} needs alpha >= 0 s and a bandwidth > 0 bytes/s, "
                         f"got {link!r}")
    return link if isinstance(link, Link) else Link(alpha, bandwidth, tree=False)


def tree_takes_over(payload: float, groups: list[int], link: Link) -> int | None:
    """The smallest of ``groups`` whose all-reduce of ``payload`` bytes NCCL's tree finishes before the
    ring on ``link`` (the alpha-beta model), or None where the ring is faster at every one."""
    from paralab.collectives import ring_time, tree_time

    return next((n for n in groups if tree_time(payload, n, link.alpha, link.bandwidth)
                 < ring_time("all_reduce", payload, n, link.alpha, link.bandwidth)), None)


def collectives_explorer(measured: dict | None = None, size_mb: float = 1.0, link: str = "h100 InfiniBand"):
    """Sliders: message size (``size_mb``: the power of two nearest it, from 1 KiB to 1 GiB) and the
    largest group; a dropdown: the link. The figure: the all-reduce's predicted time against the number
    of ranks, ring and tree (up to what the link can join). Attributes: ``controls``, ``figure``,
    ``message`` (where the tree overtakes the ring), ``redraw()``."""
    from paralab.viz.collectives import beyond_reach, ring_against_tree, size_label

    if not (finite_number(size_mb) and size_mb > 0):  # 0 had divided by zero, -1 a math domain error
        raise ValueError(f"size_mb must be a number of MiB above 0, got {size_mb!r}")
    if not isinstance(measured, dict | None):  # a list had been "no attribute 'items'"
        raise TypeError(f"measured must be {{name: link}}, got {type(measured).__name__}")
    choices = links(measured)
    w = widgets()
    controls = {
        "link": select(w.Dropdown, "link", list(choices), link, description="link"),
        # sizes named as the title names them: a float slider had read "1.02e+3" MiB
        "size_mb": w.SelectionSlider(options=[(size_label(s * 2**20), s) for s in SIZES_MB],
                                     value=min(SIZES_MB, key=lambda s: abs(math.log2(s / size_mb))),
                                     description="size"),
        "max_group": up_to(GROUPS[1:], 256, "rank"),
    }
    msg = w.HTML()
    fw = figure_widget(ring_against_tree({link: choices[link][:2]}, size_mb * 2**20, GROUPS[:3]))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        chosen = choices[c["link"]]
        reach = min(c["max_group"], chosen.reach or c["max_group"])
        payload, groups = c["size_mb"] * 2**20, [n for n in GROUPS if n <= reach]
        replace_figure(fw, ring_against_tree({c["link"]: chosen[:2]}, payload, groups))
        from_ranks = tree_takes_over(payload, groups, chosen)
        said = (f"the tree is faster from {from_ranks} ranks on" if from_ranks
                else "the ring is faster at every group size shown")
        if not chosen.tree:
            said += " (in the model: gloo, measured here, runs no tree; NCCL does)"
        if chosen.reach and c["max_group"] > chosen.reach:
            said += "; " + beyond_reach(chosen.reach)
        msg.value = message(said, "info")

    for control in controls.values():
        control.observe(redraw, names="value")
    app = w.VBox([row(controls["link"], controls["size_mb"], controls["max_group"]), msg, fw])
    attach(app, controls=controls, figure=fw, message=msg, redraw=redraw)
    redraw()
    return app
