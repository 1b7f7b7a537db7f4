"""The figures of an executed notebook: read out of its outputs and stored widget state, and drawn.

One way of reading them for the whole book: the notebook pages draw each figure where its cell showed
it (a widget's inside its snapshot), and the gallery page (``gallery.html``) puts every figure of
every notebook one after another, each under its notebook and cell, so that a reviewer sees them all
at once. A figure is a plotly output as displayed, or a plotly FigureWidget (the explorers') as the
widget state stores it; book/build.py stores each one's figure as the notebook finished.

book/build.py loads this file by its path (it runs as a script, not as a package).
"""

from __future__ import annotations

import html

PLOTLY = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


# ------------------------------------------------------------------------------------------ reading
def widget_state(nb) -> dict:
    """Model id -> {model_name, state}: the widgets the run stored (nbclient's store_widget_state)."""
    return nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def widget_models(model_id: str, state: dict) -> list[dict]:
    """A widget's model and those of its children, depth first (the order of an app's layout), each
    once; a model the state lacks is skipped."""
    models, seen = [], set()

    def walk(mid: str) -> None:
        if mid in seen or mid not in state:
            return
        seen.add(mid)
        models.append(state[mid])
        for child in state[mid]["state"].get("children", []):
            walk(child.removeprefix("IPY_MODEL_"))

    walk(model_id)
    return models


def widget_figure(model: dict) -> dict | None:
    """The figure ({data, layout}) a plotly FigureWidget's model holds; None for another widget."""
    values = model["state"]
    if "_widget_data" not in values:
        return None
    return {"data": values["_widget_data"], "layout": values.get("_widget_layout", {})}


def plotly_figure(output_data: dict) -> dict:
    """The figure ({data, layout}) of a plotly output (its mime bundle has PLOTLY)."""
    figure = output_data[PLOTLY]
    return {"data": figure.get("data", []), "layout": figure.get("layout", {})}


def figures_of(nb) -> list[tuple[int, str, dict]]:
    """(cell index, cell id, figure) for every figure the notebook's outputs show, in order."""
    state = widget_state(nb)
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY in data:
                found.append((index, cell.get("id", ""), plotly_figure(data)))
            elif WIDGET_VIEW in data:
                for model in widget_models(data[WIDGET_VIEW]["model_id"], state):
                    figure = widget_figure(model)
                    if figure:
                        found.append((index, cell.get("id", ""), figure))
    return found


# ------------------------------------------------------------------------------------------ drawing
def figure_html(figure: dict) -> str:
    """A figure as a div and the script that draws it (interactive); plotly.js is on the page."""
    import plotly.io as pio

    return pio.to_html(figure, include_plotlyjs=False, full_html=False, config={"responsive": True})


def title_of(figure: dict) -> str:
    title = figure["layout"].get("title", "")
    return title.get("text", "") if isinstance(title, dict) else str(title)


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def gallery_body(sections: list[tuple[dict, list[tuple[int, str, dict]]]]) -> str:
    """The gallery page's body: per notebook page ({name, title, file}) its figures from figures_of,
    numbered, each under a line that links to its cell in the notebook's page."""
    contents, body, number = [], [], 0
    for page, figures in sections:
        name, title = html.escape(page["name"]), html.escape(page["title"])
        link = f'<a href="#{name}">{title}</a> <code>{name}</code>'
        contents.append(f"<li>{link}: {count(len(figures), 'figure')}</li>")
        body.append(f'<h2 id="{name}"><a href="{page["file"]}">{title}</a> <code>{name}</code></h2>')
        for cell, cell_id, figure in figures:
            number += 1
            anchor = f"#cell-id={html.escape(cell_id)}" if cell_id else ""
            body.append(f'<p class="where">figure {number} · <a href="{page["file"]}{anchor}">cell {cell}</a>'
                        f" · {html.escape(title_of(figure))}</p>{figure_html(figure)}")
    intro = (f"<h1>Every figure the notebooks draw</h1><p>{count(number, 'figure')} from "
             f"{count(len(sections), 'notebook')}, one after another, as a learner sees them (hover and "
             "zoom them); a widget's figure as it was when its notebook had run.</p>")
    return intro + f'<ul class="gallery">{"".join(contents)}</ul>' + "".join(body)
