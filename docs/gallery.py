"""The gallery: every figure the notebooks draw, one after another, on one HTML page.

    python docs/gallery.py                          # run every notebook, write docs/_build/gallery.html
    python docs/gallery.py notebooks/07_elastic.ipynb -o /tmp/elastic.html
    python docs/gallery.py --executed DIR           # notebooks already run (with their outputs) in DIR

`make gallery` runs the first line. A reviewer scrolls through every figure at once; each is the one
a learner sees, interactive (hover, zoom), under its notebook and cell. Figures come from the outputs
of the run: plotly figures as displayed, and figure widgets (the explorers') as they were when the
notebook finished, read from the widget state the run stores. Plotly.js is inlined once, so the page
opens without a network.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def run_notebook(path: Path, timeout_s: int = 600):
    """The notebook, executed top to bottom in its own folder, with its widget state stored."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def figures_of(nb) -> list[tuple[int, dict]]:
    """(cell index, {"data", "layout"}) for every figure in the notebook's outputs, in order."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    found = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if PLOTLY_MIME in data:
                figure = data[PLOTLY_MIME]
                found.append((index, {"data": figure.get("data", []), "layout": figure.get("layout", {})}))
            elif WIDGET_MIME in data:
                found += [(index, fig) for fig in _widget_figures(data[WIDGET_MIME]["model_id"],
                                                                  state, set())]
    return found


def _widget_figures(model_id: str, state: dict, seen: set) -> list[dict]:
    """The plotly figure widgets in a widget and its children, depth first (an app's layout order)."""
    if model_id in seen or model_id not in state:
        return []
    seen.add(model_id)
    values = state[model_id]["state"]
    if "_widget_data" in values:  # plotly's FigureWidget
        return [{"data": values["_widget_data"], "layout": values.get("_widget_layout", {})}]
    out = []
    for child in values.get("children", []):
        out += _widget_figures(child.removeprefix("IPY_MODEL_"), state, seen)
    return out


def _title(figure: dict) -> str:
    title = figure["layout"].get("title", "")
    return title.get("text", "") if isinstance(title, dict) else str(title)


def _count(figures: list) -> str:
    return f"{len(figures)} figure{'' if len(figures) == 1 else 's'}"


def page(sections: list[tuple[str, list[tuple[int, dict]]]]) -> str:
    """The HTML: a table of contents, then per notebook its figures, each under its cell and title."""
    from plotly.offline import get_plotlyjs

    toc, body, number = [], [], 0
    for name, figures in sections:
        anchor = html.escape(name.replace(" ", "-"))
        toc.append(f'<li><a href="#{anchor}">{html.escape(name)}</a>: {_count(figures)}</li>')
        body.append(f'<h2 id="{anchor}">{html.escape(name)}</h2>')
        for cell, figure in figures:
            number += 1
            body.append(f'<p class="where">figure {number} · cell {cell} · {html.escape(_title(figure))}</p>'
                        f'<div class="figure" id="fig{number}"></div>'
                        f'<script>Plotly.newPlot("fig{number}", {json.dumps(figure["data"])}, '
                        f'{json.dumps(figure["layout"])}, {{responsive: true}});</script>')
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>paralab: every figure</title>"
            "<style>body{font-family:sans-serif;max-width:1150px;margin:2em auto}"
            ".where{color:#555;margin:2em 0 0.3em}.figure{border-bottom:1px solid #ddd}</style>"
            f"<script>{get_plotlyjs()}</script></head><body><h1>paralab: every figure the notebooks draw</h1>"
            f"<p>{number} figures from {len(sections)} notebooks, as a learner sees them "
            f"(hover for details).</p><ul>{''.join(toc)}</ul>{''.join(body)}</body></html>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    parser.add_argument("--executed", type=Path, help="a folder of notebooks already run: read, do not run")
    parser.add_argument("-o", "--output", type=Path, default=REPO / "docs" / "_build" / "gallery.html")
    args = parser.parse_args(argv)
    import nbformat

    paths = args.notebooks or sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))
    sections = []
    for path in paths:
        started = time.perf_counter()
        nb = nbformat.read(args.executed / path.name, as_version=4) if args.executed else run_notebook(path)
        figures = figures_of(nb)
        print(f"{path.name}: {_count(figures)} ({time.perf_counter() - started:.0f} s)")
        sections.append((path.stem, figures))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(page(sections), encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
