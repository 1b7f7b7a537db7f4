"""A real browser: JupyterLab started as `make lab` does, a notebook run in headless Chromium.

Chromium is the Debian package (/usr/bin/chromium, installed by .ci/run when missing), driven by
Python playwright through ``executable_path``; playwright's own browser download is never used. The
test opens tests/browser/widgets.ipynb (a copy, in the server's private root), runs all its cells
from the Run menu, and checks that the plotly figures and the widgets rendered (and no "Error
displaying widget"), then drags the slider with the keyboard and checks that the figure changed.
It skips cleanly when there is no Chromium or no playwright.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_lab import LabServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
NOTEBOOK = Path(__file__).resolve().parent / "browser" / "widgets.ipynb"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no Chromium at /usr/bin/chromium (apt-get install chromium)"),
]

# The y values of the figure-widget plot in the last output cell (plotly keeps them on the graph div).
STARTED = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-InputArea-prompt')]
  .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""
PLOT_YS = """() => {
  const plots = [...document.querySelectorAll('.jp-Cell .js-plotly-plot')];
  return plots.map(p => (p.data && p.data[0] && Array.from(p.data[0].y || [])) || null);
}"""


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.mark.timeout(240)
def test_notebook_widgets_and_figures_render_and_respond(tmp_path, browser):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    server = LabServer(tmp_path / "lab", extra_args=(f"--ServerApp.root_dir={root}",))
    (tmp_path / "lab").mkdir()
    errors: list[str] = []
    with server:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.set_default_timeout(60_000)
        page.goto(f"{server.url}/lab/tree/{NOTEBOOK.name}?token={server.token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", state="attached")
        # the kernel must be up before "Run All" (it would queue anyway, but this makes failures clearer)
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']",
                               state="attached", timeout=90_000)

        # Run > Run All Cells. A click that lands while the kernel connection is still settling can be
        # dropped, so try again until the input prompts show that cells were queued or ran.
        for _attempt in range(4):
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
            try:
                page.wait_for_function(STARTED, timeout=15_000)
                break
            except PlaywrightTimeout:
                page.keyboard.press("Escape")
        else:
            pytest.fail("Run All Cells did not start the notebook")

        slider = page.locator(".jp-OutputArea .widget-slider").first
        slider.wait_for(state="visible", timeout=90_000)
        page.wait_for_function(f"({PLOT_YS})().filter(y => y && y.length).length >= 2", timeout=90_000)

        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text
        assert "Traceback" not in text, text[-2000:]
        assert page.locator(".jp-OutputArea-output.jp-RenderedError, .jp-OutputArea-output[data-mime-type="
                            "'application/vnd.jupyter.stderr']").count() == 0
        before = page.evaluate(PLOT_YS)
        assert len(before[-1]) == 2, before

        handle = slider.locator(".noUi-handle").first
        handle.focus()
        for _ in range(3):
            handle.press("ArrowRight")
        page.wait_for_function(f"(() => {{ const ys = ({PLOT_YS})(); return ys[ys.length - 1].length === 5; }})()",
                               timeout=30_000)
        after = page.evaluate(PLOT_YS)
        assert after[-1] != before[-1] and len(after[-1]) == 5
        assert after[0] == before[0], "the static figure must not change"
        assert not [e for e in errors if "widget" in e.lower()], errors
        page.close()
    assert server.leftovers == [], f"processes outlived the lab: {server.leftovers}"
