"""`make book` (book/build.py): pages made offline from executed notebooks, checked in a real browser.

The unit tests turn a hand-made executed notebook into a page and read its figures (no kernel). The
gallery test builds the book of one small widget notebook (tests/browser/widgets.ipynb, run for real)
and finds its plotly figure and its figure widget's on the gallery page. The browser test builds the
book for two notebooks — 00_welcome (a measured run, its timeline) and 08_planning_at_scale (the
simulator's figures and two widgets) — with the tour and the documents it links to, opens every page
and the gallery in headless Chromium with the network cut off, and checks that every figure rendered.
(Every notebook is executed by nbval in `make test`; `make book` executes them all again for the site.)
"""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = runpy.run_path(str(ROOT / "book" / "build.py"))
FIGURES = BOOK["FIGURES"]  # book/figures.py
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("plotly")


def _state(models: dict) -> dict:
    return {mid: {"model_name": name, "state": state} for mid, (name, state) in models.items()}


def test_a_widget_becomes_a_snapshot_of_its_figures_controls_and_messages():
    state = _state({
        "box": ("VBoxModel",
                {"children": ["IPY_MODEL_size", "IPY_MODEL_link", "IPY_MODEL_msg", "IPY_MODEL_fig"]}),
        "size": ("SelectionSliderModel",
                 {"description": "up to", "index": 2, "_options_labels": ["2", "4", "8"]}),
        "link": ("DropdownModel", {"description": "link", "index": 0, "_options_labels": ["h100 NVLink"]}),
        "msg": ("HTMLModel", {"value": "<div>the tree is faster from 4 ranks on</div>"}),
        "fig": ("AnyModel", {"_widget_data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}],
                             "_widget_layout": {"title": {"text": "redrawn"}}}),
    })
    html = BOOK["widget_snapshot"]("box", state, "https://live/nb.ipynb")
    assert "up to = 8; link = h100 NVLink" in html
    assert "the tree is faster from 4 ranks on" in html
    assert ('href="https://live/nb.ipynb"' in html and html.count("plotly-graph-div") == 1
            and "redrawn" in html)


def test_figures_are_drawn_widgets_snapshotted_answers_folded():
    nb = nbformat.v4.new_notebook()
    figure = nbformat.v4.new_code_cell("fig")
    figure.outputs = [nbformat.v4.new_output("display_data",
                                             data={FIGURES.PLOTLY: {"data": [{"type": "bar"}],
                                                                    "layout": {}}})]
    widget = nbformat.v4.new_code_cell("app")
    widget.outputs = [nbformat.v4.new_output("execute_result",
                                             data={FIGURES.WIDGET_VIEW: {"model_id": "box"}})]
    answer = nbformat.v4.new_code_cell("assert x == 2\nprint('answer: 2')", metadata={"tags": ["answer"]})
    answer.outputs = [nbformat.v4.new_output("stream", name="stdout", text="answer: 2\n")]
    nb.cells = [figure, widget, answer]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json":
                              {"state": _state({"box": ("VBoxModel", {"children": []})})}}
    BOOK["static_outputs"](nb, "https://live")
    assert "Plotly.newPlot" in nb.cells[0].outputs[0]["data"]["text/html"]
    assert "widget-snapshot" in nb.cells[1].outputs[0]["data"]["text/html"]
    assert (nb.cells[2].cell_type == "markdown" and "<details" in nb.cells[2].source
            and "answer: 2" in nb.cells[2].source)
    assert "<summary>⋯ Answer" in nb.cells[2].source  # the notebooks say: click the "⋯"
    assert "widgets" not in nb.metadata


def test_figures_are_read_from_outputs_and_nested_figure_widgets_in_cell_order():
    nb = nbformat.v4.new_notebook()
    text, plot, app = (nbformat.v4.new_code_cell(source) for source in ("print(1)", "fig", "app"))
    text.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    plot.outputs = [nbformat.v4.new_output("display_data", data={
        FIGURES.PLOTLY: {"data": [{"type": "bar"}], "layout": {"title": {"text": "shown"}}, "config": {}}})]
    app.outputs = [nbformat.v4.new_output("execute_result", data={FIGURES.WIDGET_VIEW: {"model_id": "app"}})]
    nb.cells = [text, plot, app]
    nb.metadata["widgets"] = {FIGURES.WIDGET_STATE: {"state": _state({
        "app": ("VBoxModel", {"children": ["IPY_MODEL_slider", "IPY_MODEL_row", "IPY_MODEL_gone"]}),
        "slider": ("IntSliderModel", {"description": "ranks", "value": 4}),
        "row": ("HBoxModel", {"children": ["IPY_MODEL_left", "IPY_MODEL_right"]}),
        "left": ("AnyModel", {"_widget_data": [{"type": "scatter"}], "_widget_layout": {"title": "left"}}),
        "right": ("AnyModel", {"_widget_data": [{"type": "bar"}], "_widget_layout": {}}),
    })}}
    found = FIGURES.figures_of(nb)
    assert [(cell, cell_id) for cell, cell_id, _ in found] == [(1, plot.id), (2, app.id), (2, app.id)]
    assert [FIGURES.title_of(figure) for _, _, figure in found] == ["shown", "left", ""]
    assert found[0][2] == {"data": [{"type": "bar"}], "layout": {"title": {"text": "shown"}}}
    assert found[2][2]["data"] == [{"type": "bar"}]


def _plotted(page: str) -> list[tuple[list, dict]]:
    """(data, layout) of every Plotly.newPlot call on a page, in order."""
    decoder, found = json.JSONDecoder(), []
    for call in re.finditer(r"Plotly\.newPlot\(\s*", page):
        args, at = [], call.end()
        for _ in range(3):  # the div's id, the data, the layout
            value, at = decoder.raw_decode(page, at)
            args.append(value)
            at = re.compile(r"\s*,\s*").match(page, at).end()
        found.append((args[1], args[2]))
    return found


@pytest.mark.timeout(240)
def test_the_gallery_page_shows_a_notebooks_figure_and_its_figure_widget(tmp_path):
    site = tmp_path / "site"
    pages = BOOK["build"](site, only=["widgets"], extra_pages=[("widgets", "tests/browser/widgets.ipynb")])
    assert [(p["file"], p["figures"]) for p in pages] == [("widgets.html", 2)]
    gallery = (site / "gallery.html").read_text()
    plotted = _plotted(gallery)
    assert [layout["title"]["text"] for _, layout in plotted] == [
        "tiny model: gradient bytes", "all-reduce bytes on the wire per rank"]
    assert plotted[1][0][0]["type"] == "bar"  # the widget's figure, read from its stored state
    widget_cell = json.loads((ROOT / "tests" / "browser" / "widgets.ipynb").read_text())["cells"][2]["id"]
    assert (f'figure 2 · <a href="widgets.html#cell-id={widget_cell}">cell 2</a> · all-reduce bytes'
            in gallery)
    assert '<script src="assets/plotly.min.js"></script>' in gallery and 'src="http' not in gallery
    assert (site / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    assert 'href="gallery.html"' in (site / "index.html").read_text()
    assert 'href="gallery.html"' in (site / "widgets.html").read_text()


# Every plot div of the page, and whether plotly drew its SVG in it.
DRAWN = """() => [...document.querySelectorAll('.plotly-graph-div')]
  .map(d => d.querySelector('.main-svg') !== null)"""


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_the_built_book_renders_offline_in_chromium(tmp_path, no_leftover_ranks):
    from test_browser import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip("no Chromium at /usr/bin/chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    site = tmp_path / "site"
    pages = BOOK["build"](site, only=["00_welcome", "08_planning_at_scale"])
    assert [p["file"] for p in pages] == ["00_welcome.html", "08_planning_at_scale.html"]
    files = ["index.html", "tour.html", "docs-architecture.html", "gallery.html", *(p["file"] for p in pages)]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            remote, errors = [], []
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else (remote.append(route.request.url), route.abort()))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            drawn = {}
            for name in files:
                page.goto((site / name).as_uri())
                page.wait_for_load_state("load")
                page.wait_for_timeout(500)
                drawn[name] = page.evaluate(DRAWN)
                if name == "tour.html":
                    images = page.evaluate("() => [...document.images].map(i => i.naturalWidth)")
                    assert images and all(images), f"a figure of the tour did not load: {images}"
                if name == "index.html":
                    links = page.evaluate("() => [...document.querySelectorAll('.toc a')].map(a => "
                                          "a.getAttribute('href'))")
                    assert links == [p["file"] for p in pages]
            planning = page.goto((site / "08_planning_at_scale.html").as_uri()) and page.content()
            # printed lines wrap between words: nbconvert's style broke them anywhere ("seque|nce")
            breaks = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output pre')]"
                                   ".map(pre => getComputedStyle(pre).wordBreak)")
        finally:
            browser.close()
    assert remote == [] and errors == [], (remote, errors)
    for name in ("00_welcome.html", "08_planning_at_scale.html", "gallery.html"):
        assert drawn[name] and all(drawn[name]), f"{name}: figures drawn {drawn[name]}"
    assert len(drawn["gallery.html"]) == sum(p["figures"] for p in pages)
    assert planning.count("widget-snapshot") >= 2 and "open it on Binder" in planning
    assert breaks and set(breaks) == {"normal"}, breaks
