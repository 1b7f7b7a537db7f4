"""The collectives explorer: one all-reduce, ring against tree, on a link you choose (the alpha-beta
model of paralab.collectives; the links of the hardware presets, or this machine as measured)."""

from __future__ import annotations

from paralab.widgets._common import attach, figure_widget, message, replace_figure, widgets

GROUPS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def links(measured: dict | None = None) -> dict[str, tuple[float, float]]:
    """{name: (alpha, bandwidth)}: each GPU preset's NVLink (inside a node) and InfiniBand (one GPU's
    NIC, across nodes), and ``measured`` links given as the same pairs."""
    from paralab.sim.hardware import PRESETS

    out = {}
    for name, hw in PRESETS.items():
        out[f"{name} NVLink"] = (hw.intra_latency, hw.intra_bw)
        out[f"{name} InfiniBand"] = (hw.inter_latency, hw.inter_bw)
    return {**out, **(measured or {})}


def collectives_explorer(measured: dict | None = None, size_mb: float = 1.0, link: str = "h100 InfiniBand"):
    """Sliders: message size and the largest group; a dropdown: the link. The figure: the all-reduce's
    predicted time against the number of ranks, ring and tree. Attributes: ``controls``, ``figure``,
    ``message`` (where the tree overtakes the ring), ``redraw()``."""
    from paralab.collectives import ring_time, tree_time
    from paralab.viz.collectives import ring_against_tree

    choices = links(measured)
    w = widgets()
    controls = {
        "link": w.Dropdown(options=list(choices), value=link, description="link"),
        "size_mb": w.FloatLogSlider(value=size_mb, base=2, min=-10, max=10, step=1, description="MiB"),
        "max_group": w.SelectionSlider(options=GROUPS[1:], value=256, description="up to"),
    }
    msg = w.HTML()
    fw = figure_widget(ring_against_tree({link: choices[link]}, size_mb * 2**20, GROUPS[:3]))

    def redraw(*_):
        c = {k: v.value for k, v in controls.items()}
        alpha, bandwidth = choices[c["link"]]
        payload, groups = c["size_mb"] * 2**20, [n for n in GROUPS if n <= c["max_group"]]
        replace_figure(fw, ring_against_tree({c["link"]: (alpha, bandwidth)}, payload, groups))
        faster = [n for n in groups
                  if tree_time(payload, n, alpha, bandwidth) < ring_time("all_reduce", payload, n, alpha,
                                                                         bandwidth)]
        msg.value = message(f"the tree is faster from {faster[0]} ranks on" if faster
                            else "the ring is faster at every group size shown", "info")

    for control in controls.values():
        control.observe(redraw, names="value")
    app = w.VBox([w.HBox([controls["link"], controls["size_mb"], controls["max_group"]]), msg, fw])
    attach(app, controls=controls, figure=fw, message=msg, redraw=redraw)
    redraw()
    return app
