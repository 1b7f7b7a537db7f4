"""`make book`: every notebook executed and laid out as a static HTML site, for readers outside Jupyter.

    python book/build.py                          # all notebooks, into book/_build
    python book/build.py --only 08_planning_at_scale --out /tmp/site
    python book/build.py --executed DIR           # reuse executed notebooks found in DIR (NAME.ipynb)

The site: ``index.html`` (the table of contents, each notebook with its line from README's table),
``tour.html`` (README itself, with its figures) and the documents it links to, one page per notebook,
and ``gallery.html``: every figure the notebooks draw, one after another under its notebook and cell,
for reviewing them all at once (``--only 07_elastic`` gives a book, and so a gallery, of that notebook
alone). Every page is offline: no CDN, plotly.js is served from ``assets/`` (copied from the plotly
package). Plotly figures stay interactive (hover, zoom). A widget has no kernel to talk to, so it is
shown as a snapshot: the figures it drew as the notebook ran (interactive as figures), the value of
each control, and a link to open the notebook live. An exercise's answer cell is folded into a
``<details>`` element. Each notebook runs once; book/figures.py reads the figures out of that run for
its page and the gallery alike.

Pages: the notebooks in ``notebooks/`` in name order, then EXTRA_PAGES. To add a page, put a notebook
in ``notebooks/`` (it joins the book in its place), or add ``(title, path relative to the repository)``
to EXTRA_PAGES: a notebook (executed like the others), a Markdown file or a ready HTML file.

Built with nbclient and nbconvert (the ``book`` extra), mistune for Markdown, plotly for figures.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import runpy
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXTRA_PAGES: list[tuple[str, str]] = []  # (title, path relative to ROOT): .ipynb, .md or .html
BINDER = re.compile(r"https://mybinder\.org/v2/gh/\S*?labpath=notebooks%2F")  # README's badge
FIGURES = SimpleNamespace(**runpy.run_path(str(Path(__file__).with_name("figures.py"))))  # book/figures.py
OFFLINE_JS = "assets/offline.js"  # stands in for the CDN scripts nbconvert's template would load
CSS = """
body { margin: 0; }
.book-bar { position: sticky; top: 0; z-index: 10; background: #263238; color: #eceff1; padding: 8px 18px;
            font: 14px/1.4 system-ui, sans-serif; display: flex; gap: 18px; align-items: center; }
.book-bar a { color: #80cbc4; text-decoration: none; }
.book-bar .live { margin-left: auto; }
.book-page { max-width: 1150px; margin: 0 auto; padding: 10px 24px 60px;
  font: 15px/1.55 system-ui, sans-serif; }
.book-page img { max-width: 100%; }
.book-page pre { background: #f5f5f5; padding: 8px; overflow-x: auto; }
.book-page .jp-OutputArea-output pre { word-break: normal; overflow-wrap: anywhere; }
.book-page table { border-collapse: collapse; }
.book-page td, .book-page th { border: 1px solid #ddd; padding: 4px 8px; }
.widget-snapshot { border: 1px dashed #90a4ae; border-radius: 6px; padding: 8px 10px; margin: 6px 0; }
.widget-snapshot .note { font: 13px/1.4 system-ui, sans-serif; color: #455a64; margin-bottom: 6px; }
.widget-snapshot .controls { font: 12px/1.4 monospace; color: #37474f; margin-bottom: 6px; }
details.answer { border-left: 3px solid #80cbc4; padding-left: 10px; margin: 8px 0 8px 70px; }
details.answer summary { cursor: pointer; color: #00796b; }
.where { color: #546e7a; margin: 2em 0 0.3em; border-top: 1px solid #ddd; padding-top: 0.5em; }
"""


# ------------------------------------------------------------------------------------------ running
# A FigureWidget sends its redraws as deltas; its synced state keeps the figure it was built with. This
# last cell writes every figure widget's current figure into that state, so the snapshots and the gallery
# show what the notebook ended with (it is removed again before the page is made).
SYNC_FIGURE_WIDGETS = """
import plotly.graph_objects as go
from ipywidgets.widgets.widget import _instances
for w in list(_instances.values()):
    if isinstance(w, go.FigureWidget):
        figure = w.to_plotly_json()
        w._widget_data, w._widget_layout = figure["data"], figure["layout"]
"""


def execute(path: Path, timeout_s: int) -> dict:
    """Run a notebook top to bottom in its own directory (widget state kept) and return it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(SYNC_FIGURE_WIDGETS))
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    nb.cells.pop()
    return nb


# ------------------------------------------------------------------------------------------ outputs
def widget_snapshot(model_id: str, state: dict, live: str) -> str:
    """The static face of a widget: its figures as drawn, its controls' values, its messages, and a
    link to the live notebook."""
    figures, controls, texts = [], [], []
    for model in FIGURES.widget_models(model_id, state):
        s, figure = model["state"], FIGURES.widget_figure(model)
        if figure:
            figures.append(FIGURES.figure_html(figure))
        elif model["model_name"] == "HTMLModel":
            if s.get("value"):
                texts.append(s["value"])
        elif "description" in s and ("value" in s or "index" in s):
            value = s.get("value")
            if value is None and "_options_labels" in s and s.get("index") is not None:
                value = s["_options_labels"][s["index"]]
            if s["description"] and not isinstance(value, (dict, list)):
                controls.append(f"{s['description']} = {value}")
    note = (f'Interactive in the live notebook: <a href="{live}">open it on Binder</a>, '
            "or in JupyterLab with <code>make lab</code>. Here: what it showed when the notebook had run.")
    parts = [f'<div class="note">{note}</div>']
    if controls:
        parts.append(f'<div class="controls">{html.escape("; ".join(controls))}</div>')
    return '<div class="widget-snapshot">' + "".join(parts + texts + figures) + "</div>"


def static_outputs(nb, live: str) -> None:
    """Replace plotly outputs by drawn figures, widget views by snapshots; fold answers."""
    import nbformat

    state = FIGURES.widget_state(nb)
    cells = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if FIGURES.PLOTLY in data:
                out["data"] = {"text/html": FIGURES.figure_html(FIGURES.plotly_figure(data))}
            elif FIGURES.WIDGET_VIEW in data:
                model_id = data[FIGURES.WIDGET_VIEW]["model_id"]
                out["data"] = {"text/html": widget_snapshot(model_id, state, live)}
        if "answer" in cell.get("metadata", {}).get("tags", []):
            cells.append(nbformat.v4.new_markdown_cell(answer_html(cell)))
        else:
            cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("widgets", None)


def answer_html(cell) -> str:
    """An exercise's collapsed answer cell, closed as JupyterLab shows it: the notebooks' text says to
    click its "⋯", which the summary therefore starts with."""
    printed = "".join(out.get("text", "") for out in cell.get("outputs", [])
                      if out.get("output_type") == "stream")
    return ('<details class="answer"><summary>⋯ Answer (the check and its reasoning)</summary>\n\n'
            f"<pre>{html.escape(cell.source)}</pre>\n<pre>{html.escape(printed)}</pre>\n</details>")


# ------------------------------------------------------------------------------------------ pages
def page(title: str, body: str, nav: str, head: str = "") -> str:
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
            f'<title>{html.escape(title)} — paralab</title><script src="assets/plotly.min.js"></script>'
            f'<style>{CSS}</style>{head}</head>'
            f'<body>{nav}<div class="book-page">{body}</div></body></html>\n')


def nav_bar(pages: list[dict], i: int | None, live: str | None) -> str:
    links = ['<a href="index.html">paralab, the book</a>', '<a href="tour.html">tour</a>',
             '<a href="gallery.html">gallery</a>']
    if i is not None:
        if i > 0:
            links.append(f'<a href="{pages[i - 1]["file"]}">← {html.escape(pages[i - 1]["name"])}</a>')
        if i + 1 < len(pages):
            links.append(f'<a href="{pages[i + 1]["file"]}">{html.escape(pages[i + 1]["name"])} →</a>')
    if live:
        links.append(f'<a class="live" href="{live}">open live ↗</a>')
    return '<div class="book-bar">' + " ".join(links) + "</div>"


def notebook_page(nb, pages: list[dict], i: int) -> str:
    """One notebook as a page: nbconvert's lab look, its head kept (styles), its CDN scripts swapped
    for a local no-op, inside the book's bar."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input_prompt=False)
    for trait in ("mathjax_url", "require_js_url", "mermaid_js_url", "mermaid_layout_elk_js_url",
                  "jquery_url"):
        if exporter.has_trait(trait):
            setattr(exporter, trait, OFFLINE_JS)
    full, _ = exporter.from_notebook_node(nb)
    head = re.search(r"<head>(.*?)</head>", full, re.S).group(1)
    head = re.sub(r"<title>.*?</title>", "", head, flags=re.S)
    body = re.search(r"<body[^>]*>(.*)</body>", full, re.S).group(1)
    info = pages[i]
    return page(info["title"], body, nav_bar(pages, i, info.get("live")), head=head)


def markdown_page(path: Path, title: str, nav: str, site: Path) -> str:
    """A Markdown file as a page; relative links to other .md files point at their pages, its images
    are copied beside (a remote one, like the Binder badge, is shown by its name: the site is offline)."""
    import mistune

    text = path.read_text()
    for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text):
        source = (path.parent / image).resolve()
        if source.is_file() and ROOT in source.parents:
            target = site / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)
    body = mistune.html(text)
    # offline: a remote image by its name
    body = re.sub(r'<img src="https?://[^"]*" alt="([^"]*)"\s*/?>', r"\1", body)
    body = re.sub(r'href="((?!https?:)[^"#]+)\.md(#[^"]*)?"',
                  lambda m: f'href="{md_file(path.parent / (m.group(1) + ".md"))}{m.group(2) or ""}"', body)
    body = re.sub(r'src="((?!https?:)[^"]+)"',
                  lambda m: f'src="{((path.parent / m.group(1)).resolve()).relative_to(ROOT)}"', body)
    return page(title, body, nav)


def md_file(path: Path) -> str:
    """The page name of a Markdown file of the repository: README.md is tour.html, docs/x.md docs-x.html."""
    rel = path.resolve().relative_to(ROOT)
    return "tour.html" if rel == Path("README.md") else str(rel.with_suffix(".html")).replace("/", "-")


def descriptions() -> dict[str, str]:
    """Notebook name -> its line in README's notebook table."""
    rows = re.findall(r"^\| `([0-9]{2}_[a-z_]+)` \| (.+) \|$", (ROOT / "README.md").read_text(), re.M)
    return dict(rows)


def first_heading(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (.+)$", cell.source, re.M)
            if match:
                return match.group(1).strip()
    return ""


# ------------------------------------------------------------------------------------------ the site
def build(out: Path, only: list[str] | None = None, executed: Path | None = None,
          timeout_s: int = 900, extra_pages: list[tuple[str, str]] = EXTRA_PAGES) -> list[dict]:
    """Write the site into ``out`` and return its pages ({name, title, file, seconds, figures});
    ``extra_pages`` are added after the notebooks, as EXTRA_PAGES is."""
    import nbformat
    from plotly.offline import get_plotlyjs

    out.mkdir(parents=True, exist_ok=True)
    (out / "assets").mkdir(exist_ok=True)
    (out / "assets" / "plotly.min.js").write_text(get_plotlyjs())
    (out / "assets" / "offline.js").write_text("/* paralab's book is offline: no CDN scripts */\n")
    (out / "executed").mkdir(exist_ok=True)

    sources = [(p.stem, p) for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]
    sources += [(Path(rel).stem, ROOT / rel) for _, rel in extra_pages]
    titles = dict((Path(rel).stem, title) for title, rel in extra_pages)
    if only:
        missing = sorted(set(only) - {name for name, _ in sources})
        if missing:
            raise SystemExit(f"book: no page named {missing}; pages are {[n for n, _ in sources]}")
        sources = [(n, p) for n, p in sources if n in only]
    binder = BINDER.search((ROOT / "README.md").read_text()).group(0)  # set in one place: README's badge
    pages = [{"name": name, "path": path, "file": f"{name}.html",
              "live": binder + path.name if path.suffix == ".ipynb" and path.parent == NOTEBOOKS else None}
             for name, path in sources]

    notebooks, figures = {}, {}
    for info in pages:
        path = info["path"]
        if path.suffix != ".ipynb":
            continue
        cached = executed / path.name if executed else None
        start = time.perf_counter()
        if cached and cached.exists():
            nb = nbformat.read(cached, as_version=4)
        else:
            print(f"book: running {path.name} ...", flush=True)
            nb = execute(path, timeout_s)
        info["seconds"] = round(time.perf_counter() - start, 1)
        nbformat.write(nb, out / "executed" / path.name)
        info["title"] = titles.get(info["name"]) or first_heading(nb) or info["name"]
        notebooks[info["name"]] = nb
        figures[info["name"]] = FIGURES.figures_of(nb)  # before the pages replace the outputs
        info["figures"] = len(figures[info["name"]])

    for i, info in enumerate(pages):
        path = info["path"]
        if path.suffix == ".ipynb":
            nb = notebooks[info["name"]]
            static_outputs(nb, info["live"])
            text = notebook_page(nb, pages, i)
        elif path.suffix == ".md":
            info["title"] = titles.get(info["name"], info["name"])
            text = markdown_page(path, info["title"], nav_bar(pages, i, None), out)
        else:
            info["title"] = titles.get(info["name"], info["name"])
            text = path.read_text()
        (out / info["file"]).write_text(text)

    tour_nav = nav_bar(pages, None, None)
    (out / "tour.html").write_text(markdown_page(ROOT / "README.md", "paralab: the tour", tour_nav, out))
    for doc in re.findall(r"\]\(((?:docs|benchmarks)/[^)#\s]+\.md)", (ROOT / "README.md").read_text()):
        (out / md_file(ROOT / doc)).write_text(markdown_page(ROOT / doc, doc, tour_nav, out))
    (out / "index.html").write_text(index_page(pages))
    gallery = [(p, figures[p["name"]]) for p in pages if p["name"] in figures]
    (out / "gallery.html").write_text(page("gallery", FIGURES.gallery_body(gallery), tour_nav))
    (out / "pages.json").write_text(json.dumps([{k: v for k, v in p.items() if k != "path"}
                                                for p in pages], indent=1))
    return pages


def index_page(pages: list[dict]) -> str:
    lines = descriptions()
    items = "".join(
        f'<li><a href="{p["file"]}"><b>{html.escape(p["title"])}</b></a> <code>{p["name"]}</code>'
        + (f"<br><span>{lines[p['name']]}</span>" if p["name"] in lines else "") + "</li>"
        for p in pages)
    body = ("<h1>paralab, the book</h1><p>Every notebook of the lab, run top to bottom on the machine that "
            "built this site, with its figures (hover and zoom them). Widgets are shown as they were drawn; "
            "open a notebook live to move their controls. Start with <a href=\"tour.html\">the tour</a>.</p>"
            f'<ol class="toc">{items}</ol><p>All their figures on one page, one after another: '
            '<a href="gallery.html">the gallery</a>.</p>')
    return page("contents", body, nav_bar(pages, None, None))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "book" / "_build"))
    parser.add_argument("--only", nargs="*", help="page names (notebook stems) to build; default: all")
    parser.add_argument("--executed", help="a directory of already executed notebooks to reuse")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    args = parser.parse_args(argv)
    pages = build(Path(args.out), args.only, Path(args.executed) if args.executed else None, args.timeout)
    drawn = sum(p.get("figures", 0) for p in pages)
    print(f"book: {FIGURES.count(len(pages), 'page')} in {args.out} (open {Path(args.out) / 'index.html'}); "
          f"gallery.html: {FIGURES.count(drawn, 'figure')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
