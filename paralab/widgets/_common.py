"""Widget plumbing shared by the apps: lazy imports, message boxes, in-place figure updates.

ipywidgets and plotly are imported inside functions (DESIGN principle 6). Apps are plain ipywidgets
containers; the pieces a notebook or a test drives (``controls``, ``figure``, ``message``, methods)
are attached as attributes, so ``app.controls["microbatches"].value = 16`` redraws the figure.
"""

from __future__ import annotations

import html

from paralab.config import finite_number


def widgets():
    try:
        import ipywidgets
    except ImportError as exc:  # pragma: no cover - exercised only without ipywidgets
        from paralab.outputs import LAB_INSTALL

        raise ImportError(f"paralab.widgets needs ipywidgets: {LAB_INSTALL}") from exc
    return ipywidgets


def row(*children):
    """Controls side by side, wrapping onto a second line where the output is too narrow for them (a
    plain HBox runs its last controls past the output's edge)."""
    w = widgets()
    return w.HBox(list(children), layout=w.Layout(flex_flow="row wrap"))


def chosen(argument: str, value, options: list):
    """``value``, where it is one of a selection's ``options`` (bare, or (label, value) pairs); else a
    ValueError naming the explorer's ``argument`` and its choices, before any widget is made: traitlets
    had said only "Invalid selection: value not found"."""
    values = [option[1] if isinstance(option, tuple) else option for option in options]
    if value not in values:
        raise ValueError(f"{argument}={value!r} is not one of this explorer's choices: "
                         f"{', '.join(map(str, values))}")
    return value


def within(argument: str, value, low: float, high: float, whole: bool = False) -> None:
    """ValueError naming the explorer's ``argument`` unless ``value`` is a number (``whole``: a whole
    one, for an integer slider) from ``low`` to ``high``: a slider had clamped it without a word
    (stages=0 drew 2 pipeline ranks, 3.5 drew 3)."""
    kind = "a whole number" if whole else "a number"
    if not (finite_number(value) and low <= value <= high and (type(value) is int or not whole)):
        raise ValueError(f"{argument} must be {kind} from {low:g} to {high:g}, got {value!r}")


def select(kind, argument: str, options: list, value, **kwargs):
    """A selection widget (``kind``: Dropdown, SelectionSlider) of ``options`` at ``value``, the explorer's
    ``argument`` (:func:`chosen`)."""
    return kind(options=options, value=chosen(argument, value, options), **kwargs)


def toggle(options: list[str], value: str, description: str, argument: str = ""):
    """Toggle buttons beside their label, each as wide as its text: ipywidgets 8 stacks a toggle's
    label over its buttons, each 148 px wide (the memory explorer's "recompute" had sat over its row).
    ``argument``: the explorer's argument ``value`` came from, checked (:func:`chosen`)."""
    value = chosen(argument, value, options) if argument else value
    return widgets().ToggleButtons(options=options, value=value, description=description,
                                   style={"button_width": "auto"},
                                   layout={"display": "flex", "grid_gap": "8px", "margin": "2px 24px 2px 0"})


def up_to(counts: list[int], value: int, noun: str, argument: str = ""):
    """An "up to" slider over ``counts`` that names what it counts ("up to (GPUs)"; "1,024"): a bare
    "1024" had not said whether it counted ranks or GPUs. The noun is in the description, not the
    readout, whose box cuts "1,024 ranks" to "1,024 rank". ``argument``: as :func:`toggle`'s."""
    w = widgets()
    value = chosen(argument, value, counts) if argument else value
    return w.SelectionSlider(options=[(f"{n:,}", n) for n in counts], value=value,
                             description=f"up to ({noun}s)", style={"description_width": "initial"})


def figure_widget(fig):
    """A plotly FigureWidget (live in the notebook, updated in place) from a Figure."""
    import plotly.graph_objects as go

    return go.FigureWidget(fig)


def replace_figure(fw, fig) -> None:
    """Make FigureWidget ``fw`` show ``fig``: update traces in place when they line up, else swap them
    and the layout.

    In-place updates send only the changed arrays to the browser, and keep zoom and legend state.
    """
    new = list(fig.data)
    with fw.batch_update():
        if [(t.type, t.name) for t in fw.data] == [(t.type, t.name) for t in new]:
            for old, trace in zip(fw.data, new):
                old.update(trace.to_plotly_json(), overwrite=True)
            fw.layout.update(fig.layout.to_plotly_json(), overwrite=True)
            # an update leaves what the new layout does not name: a limit line the new figure drops
            fw.layout.shapes, fw.layout.annotations = fig.layout.shapes, fig.layout.annotations
        else:  # another kind of figure: its layout replaces the old one whole (subplots, axes, titles)
            fw.data = ()
            if stale := left_over(fw.layout.to_plotly_json(), fig.layout.to_plotly_json()):
                fw.plotly_relayout(stale)
            fw.layout = fig.layout
            fw.add_traces(new)


def left_over(old: dict, new: dict) -> dict:
    """What layout ``old`` sets and ``new`` does not, as a relayout that clears it: each such key set to
    None, but a first axis ("xaxis", "yaxis") emptied to {} (:data:`PRIMARY_AXES`).

    A new layout reaches the browser as a relayout, which plotly.js applies to the layout it shows: a key
    it names replaces the key shown, whole (an axis, the legend: checked in Chromium), and a key it does
    not name stays. After the rank matrix, the bars "by op" had been drawn in its first panel's fifth of
    the width, beside its empty second and third axes. Sent first, this clears them."""
    return {key: {} if key in PRIMARY_AXES else None for key in old if key not in new}


# A cartesian figure's first axes, which plotly.js keeps whatever the layout says: a relayout that
# removed "xaxis" (the bars "by op" name none, the rank matrix's first panel had one), or set one of
# its fields to None ("yaxis.autorange": the matrix's rows run top down), threw in the browser once the
# traces were gone ("reading '_inputDomain'") and left the rest of the clearing undone: the matrix's
# node boxes, panel titles and "to rank" title had stayed over the next view. Emptied whole, they don't.
PRIMARY_AXES = ("xaxis", "yaxis")


def message(text: str = "", kind: str = "info") -> str:
    """HTML for a message line: info (grey), error (red), ok (green)."""
    color = {"info": "#555", "error": "#B00020", "ok": "#2E7D32"}[kind]
    body = html.escape(text).replace("\n", "<br>")
    return (f'<div style="color:{color};font-family:monospace;white-space:pre-wrap">{body}</div>' if text
            else "")


# Heads the title of a figure left as it was when the controls are refused: without it the title names
# settings the controls no longer hold, and the figure reads as theirs. On a line of its own: before a
# long title on one line, it had pushed the title's end past the figure's right edge.
NOT_REDRAWN = "<i>not redrawn for these settings (see the message), last drawn:</i><br>"
# Heads a measured run's figure once the controls have moved off the shape it ran (its title names it)
EARLIER_RUN = "<i>an earlier run, not the settings above (its shape in the title):</i><br>"
MARK_PX = 22  # a mark's line, which the legend and the plot move down by while it is shown


def refuse(msg, fw, text: str) -> None:
    """Say in ``msg`` why the controls' settings cannot be drawn, and mark ``fw`` as the last figure
    drawn (:data:`NOT_REDRAWN`) until it is redrawn: by :func:`replace_figure`, whose figure brings its
    own title, legend and margins, or by :func:`redrawn`."""
    msg.value = message(text, "error")
    if fw.data:  # an empty figure (nothing drawn yet) needs no mark
        mark(fw, NOT_REDRAWN)


def redrawn(fw) -> None:
    """Take :func:`refuse`'s mark off a figure updated in place under its old title."""
    unmark(fw, NOT_REDRAWN)


def mark(fw, line: str) -> None:
    """Head ``fw``'s title with ``line`` (:data:`NOT_REDRAWN`, :data:`EARLIER_RUN`), once."""
    title = fw.layout.title.text or ""
    if not title.startswith(line):
        with fw.batch_update():
            fw.layout.title.text = line + title
            _lower_title_legend_and_plot(fw, MARK_PX)


def unmark(fw, line: str) -> None:
    """Take :func:`mark`'s ``line`` off ``fw``'s title, where it heads it."""
    title = fw.layout.title.text or ""
    if title.startswith(line):
        with fw.batch_update():
            fw.layout.title.text = title.removeprefix(line)
            _lower_title_legend_and_plot(fw, -MARK_PX)


def _lower_title_legend_and_plot(fw, px: int) -> None:
    """Make room for a line of ``px`` pixels added to the title (taken off where negative):
    ``paralab.viz._common.style`` pins the title and the legend below it for one line, in fractions of
    the height. plotly grows a title upward from where its last line sits: moved half a line down, the
    first line stays inside the figure, and the legend and the plot a whole line down clear the last."""
    fw.layout.margin.t += px
    if fw.layout.title.yref == "container":
        fw.layout.title.y -= px / 2 / fw.layout.height
    if fw.layout.legend.yref == "container":
        fw.layout.legend.y -= px / fw.layout.height


def lines_below_title(fig):
    """Make room for a title's lines after its first (``<br>``, as plotly never wraps a title, and a long
    one runs past the figure's right edge): ``paralab.viz._common.style`` pins the title and the legend
    below it for one line. Returns ``fig``."""
    extra = (fig.layout.title.text or "").count("<br>")
    if extra:
        _lower_title_legend_and_plot(fig, MARK_PX * extra)
    return fig


def whole_labels(controls: dict) -> dict:
    """Give each control's description the width it needs: ipywidgets' fixed label width cuts a
    notebook's "global batch" to "global bat…"."""
    for control in controls.values():
        control.style.description_width = "initial"
    return controls


def attach(box, **parts):
    """Hang the app's parts on its container (see the module docstring)."""
    for name, value in parts.items():
        setattr(box, name, value)
    return box
