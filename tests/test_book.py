"""`make book` (book/build.py): pages made offline from executed notebooks, checked in a real browser.

The unit tests turn a hand-made executed notebook into a page (no kernel). The browser test builds
the book for two notebooks — 00_welcome (a measured run, its timeline) and 08_planning_at_scale (the
simulator's figures and two widgets) — with the tour and the documents it links to, opens every page
in headless Chromium with the network cut off, and checks that every figure rendered. (Every notebook
is executed by nbval in `make test`; `make book` executes them all again for the site.)
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = runpy.run_path(str(ROOT / "book" / "build.py"))
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
                                             data={BOOK["PLOTLY"]: {"data": [{"type": "bar"}],
                                                                    "layout": {}}})]
    widget = nbformat.v4.new_code_cell("app")
    widget.outputs = [nbformat.v4.new_output("execute_result",
                                             data={BOOK["WIDGET_VIEW"]: {"model_id": "box"}})]
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
    assert "widgets" not in nb.metadata


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
    files = ["index.html", "tour.html", "docs-architecture.html", *(p["file"] for p in pages)]
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
            welcome = page.goto((site / "08_planning_at_scale.html").as_uri()) and page.content()
        finally:
            browser.close()
    assert remote == [] and errors == [], (remote, errors)
    for name in ("00_welcome.html", "08_planning_at_scale.html"):
        assert drawn[name] and all(drawn[name]), f"{name}: figures drawn {drawn[name]}"
    assert welcome.count("widget-snapshot") >= 2 and "open it on Binder" in welcome
