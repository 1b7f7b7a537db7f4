"""A real browser: JupyterLab started as `make lab` does, a notebook run in headless Chromium.

Chromium is the Debian package (/usr/bin/chromium, installed by .ci/run when missing), driven by
Python playwright through ``executable_path``; playwright's own browser download is never used. The
first test opens tests/browser/widgets.ipynb (a copy, in the server's private root), runs all its
cells with JupyterLab's Run All Cells command, and checks that the plotly figures and the widgets
rendered (and no "Error displaying widget"), then drags the slider with the keyboard and checks that
the figure changed. The second runs the elastic tutorial (notebooks/07_elastic.ipynb) as far as its
story figure and reads the figure's phase labels off the drawn page (nbval runs the whole notebook).
A timeline drawn on a page of its own must leave the console empty (hatched bars coloured by
microbatch had logged plotly.js's "Invalid color specifier" six times a trace, drawn right all the
same). They skip cleanly when there is no Chromium or no playwright.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_lab import LabServer

from paralab.schedules import build_schedule
from paralab.sim.events import simulate_schedule

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 # a container's /dev/shm can be 64 MB, too small for a JupyterLab page
                 "--disable-dev-shm-usage"]
NOTEBOOK = Path(__file__).resolve().parent / "browser" / "widgets.ipynb"
ELASTIC = Path(__file__).resolve().parent.parent / "notebooks" / "07_elastic.ipynb"
PHASES = ["1. start", "2. training at 3 ranks", "3. failure", "4. detected", "5. rendezvous", "6. restore",
          "7. training at 2 ranks"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="no Chromium at /usr/bin/chromium (apt-get install chromium)"),
]

# The y values of the figure-widget plot in the last output cell (plotly keeps them on the graph div).
PLOT_YS = """() => {
  const plots = [...document.querySelectorAll('.jp-Cell .js-plotly-plot')];
  return plots.map(p => (p.data && p.data[0] && Array.from(p.data[0].y || [])) || null);
}"""
# every code cell's input prompt text ("[ ]:", "[*]:", "[3]:"); all cells have run when each shows a count
PROMPTS = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputArea-prompt')]
  .map(p => p.textContent.trim())"""
EXECUTED = f"""() => {{ const prompts = ({PROMPTS})();
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p)); }}"""
KERNEL_READY = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const context = panel && panel.sessionContext;
  const kernel = context && context.session && context.session.kernel;
  return Boolean(context && context.isReady && kernel && kernel.connectionStatus === 'connected'
                 && kernel.status === 'idle');
}"""

# a cell's traceback, or anything it wrote to stderr
ERROR_OUTPUTS = (".jp-OutputArea-output.jp-RenderedError, "
                 ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class PageState:
    """What the page showed, for a failure message that says why (CI cannot be watched)."""

    def __init__(self, page, server: LabServer):
        self.page, self.server = page, server
        self.errors: list[str] = []
        self.console: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("crash", lambda _page: self.errors.append("the page crashed"))
        page.on("console",
                lambda msg: self.console.append(f"{msg.type}: {msg.text}") if msg.type == "error" else None)

    def __str__(self) -> str:
        try:
            prompts = self.page.evaluate(PROMPTS)
            text = self.page.locator(".jp-NotebookPanel").inner_text(timeout=5_000)[-2000:]
        except Exception as exc:  # the page may be the thing that broke
            prompts, text = "?", f"(page unreadable: {exc})"
        log = (self.server.log_path.read_text(errors="replace")[-2000:] if self.server.log_path.exists()
               else "")
        try:  # a cell that raised stops Run All there: its traceback says why, wherever it is
            raised = self.page.locator(ERROR_OUTPUTS).all_inner_texts()
        except Exception:
            raised = ["?"]
        return (f"prompts {prompts}\npage errors {self.errors}\nconsole errors {self.console[-10:]}\n"
                f"errors and stderr in outputs: {[e[-1500:] for e in raised]}\n"
                f"notebook text:\n{text}\nlab log:\n{log}")


def run_all_cells(page, state: PageState, timeout_ms: int = 120_000) -> None:
    """Run every cell through JupyterLab's own "Run All Cells" command, once the kernel is ready.

    Clicking Run > Run All Cells raced the kernel connection (a click could be dropped, or run only
    the first cell, while the session was still settling), so the command is run through the app
    the server exposes (--LabApp.expose_app_in_browser), after the notebook's session says ready.
    """
    try:
        page.wait_for_function(KERNEL_READY, timeout=90_000)
    except Exception as exc:
        pytest.fail(f"the notebook's kernel never became ready: {exc}\n{state}")
    # started, not awaited: the command's promise settles only when every cell has run
    page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    try:
        page.wait_for_function(EXECUTED, timeout=timeout_ms)
    except Exception as exc:
        pytest.fail(f"Run All Cells did not run the notebook: {exc}\n{state}")


def copy_through(notebook: Path, dest: Path, through: str | None) -> None:
    """Copy ``notebook`` to ``dest``, whole, or to the first code cell whose source holds ``through``."""
    if through is None:
        shutil.copy(notebook, dest)
        return
    nb = json.loads(notebook.read_text())
    last = next((i for i, c in enumerate(nb["cells"])
                 if c["cell_type"] == "code" and through in "".join(c["source"])), None)
    if last is None:
        pytest.fail(f"no code cell of {notebook.name} holds {through!r}")
    nb["cells"] = nb["cells"][:last + 1]
    dest.write_text(json.dumps(nb))


@contextmanager
def notebook_run_in_lab(tmp_path: Path, browser, notebook: Path, timeout_ms: int = 120_000,
                        through: str | None = None):
    """A copy of ``notebook`` (to the cell that holds ``through``, where given) opened in a fresh lab and
    run: yields (page, state). Checks that no process outlives the lab."""
    root = tmp_path / "root"
    root.mkdir()
    copy_through(notebook, root / notebook.name, through)
    server = LabServer(tmp_path / "lab", extra_args=(f"--ServerApp.root_dir={root}",
                                                     "--LabApp.expose_app_in_browser=True"))
    (tmp_path / "lab").mkdir()
    with server:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        state = PageState(page, server)
        page.set_default_timeout(60_000)
        page.goto(f"{server.url}/lab/tree/{notebook.name}?token={server.token}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", state="attached")
        run_all_cells(page, state, timeout_ms)
        yield page, state
        page.close()
    assert server.leftovers == [], f"processes outlived the lab: {server.leftovers}"


def assert_no_error_or_stderr(page, state: PageState) -> None:
    assert "Traceback" not in page.locator(".jp-NotebookPanel").inner_text(), state
    assert page.locator(ERROR_OUTPUTS).count() == 0, state


@pytest.mark.timeout(600)  # the sum of the waits below, and the server's shutdown
def test_notebook_widgets_and_figures_render_and_respond(tmp_path, browser):
    with notebook_run_in_lab(tmp_path, browser, NOTEBOOK) as (page, state):
        slider = page.locator(".jp-OutputArea .widget-slider").first
        try:
            slider.wait_for(state="visible", timeout=60_000)
            page.wait_for_function(f"({PLOT_YS})().filter(y => y && y.length).length >= 2", timeout=60_000)
        except Exception as exc:
            pytest.fail(f"{exc}\n{state}")

        assert "Error displaying widget" not in page.locator(".jp-NotebookPanel").inner_text(), state
        assert_no_error_or_stderr(page, state)
        before = page.evaluate(PLOT_YS)
        assert len(before[-1]) == 2, before

        handle = slider.locator(".noUi-handle").first
        handle.focus()
        for _ in range(3):
            handle.press("ArrowRight")
        page.wait_for_function(f"(() => {{ const ys = ({PLOT_YS})(); "
                               "return ys[ys.length - 1].length === 5; })()",
                               timeout=30_000)
        after = page.evaluate(PLOT_YS)
        assert after[-1] != before[-1] and len(after[-1]) == 5
        assert after[0] == before[0], "the static figure must not change"
        assert not [e for e in state.errors if "widget" in e.lower() or "crash" in e], state


# the y-axis tick labels of the figure whose title holds the text (plotly draws them as SVG text), top
# to bottom as a reader sees them
FIGURE_TICKS = """title => {
  const plots = [...document.querySelectorAll('.jp-Cell .js-plotly-plot')];
  const plot = plots.find(p => (p.querySelector('.gtitle') || {}).textContent?.includes(title));
  if (!plot) return null;
  return [...plot.querySelectorAll('.ytick text')]
    .map(t => [t.getBoundingClientRect().top, t.textContent]).sort((a, b) => a[0] - b[0]).map(t => t[1]);
}"""


# the notebook's runs to its story figure (a recovery waits out a 5 s keep-alive), and the server; the
# balancer's four runs after it are nbval's to run, not this test's
@pytest.mark.timeout(600)
def test_the_elastic_notebook_draws_its_story_as_labelled_phases(tmp_path, browser):
    with notebook_run_in_lab(tmp_path, browser, ELASTIC, timeout_ms=300_000,
                             through="viz.elastic(trace") as (page, state):
        try:
            page.wait_for_function(f"({FIGURE_TICKS})('the run as it happened') !== null", timeout=60_000)
        except Exception as exc:
            pytest.fail(f"the elastic figure never appeared: {exc}\n{state}")
        ticks = page.evaluate(f"({FIGURE_TICKS})('the run as it happened')")
        assert [t for t in ticks if t in PHASES] == PHASES, (ticks, str(state))
        assert_no_error_or_stderr(page, state)


TUTORIAL = Path(__file__).resolve().parent.parent / "notebooks" / "01_data_parallel.ipynb"
# The data of the first figure in the output that holds a control labelled LABEL: each trace's y
# (or, when a figure stores it, its layout meta), so a redraw is seen whatever it changed.
FIGURE_OF = """([label]) => {
  const outputs = [...document.querySelectorAll('.jp-OutputArea-output')].filter(o =>
      [...o.querySelectorAll('.widget-label')].some(l => l.textContent.trim() === label));
  const plot = outputs.length ? outputs[0].querySelector('.js-plotly-plot') : null;
  if (!plot || !plot.data || !plot.querySelector('.main-svg')) return null;
  return JSON.stringify([plot.data.map(t => [t.name, Array.from(t.y || [])]), (plot.layout || {}).title]);
}"""


def _slider(page, app_label: str, label: str):
    """The slider described ``label`` in the first output that has a control ``app_label``."""
    output = page.locator(".jp-OutputArea-output",
                          has=page.locator(".widget-label", has_text=app_label)).first
    return output.locator(".widget-slider", has=page.locator(".widget-label", has_text=label)).first


def _nudge(slider, key: str, state: PageState, tries: int = 3) -> str:
    """Press ``key`` on ``slider``'s handle until its readout changes, and return the new readout. A
    press can be lost where the handle had not yet taken focus (a CI run under load once moved
    nothing), so each try waits 10 s for the readout before pressing again."""
    from playwright.sync_api import expect

    readout = slider.locator(".widget-readout")
    before = readout.inner_text()
    handle = slider.locator(".noUi-handle")
    for _ in range(tries):
        handle.scroll_into_view_if_needed()
        handle.focus()
        handle.press(key)
        try:
            expect(readout).not_to_have_text(before, timeout=10_000)  # the whole text: 16 -> 160 moved
            return readout.inner_text()
        except AssertionError:
            continue
    pytest.fail(f"{tries} presses of {key} left the slider at {before!r}\n{state}")


# the notebook's run, then for each explorer: its drawing, the slider's presses and the redraw, waited
# for generously (a redraw once took over a minute in a CI run on a loaded machine)
@pytest.mark.timeout(1200)  # the waits' worst case, about 1,150 s, with a failure's report
def test_a_tutorial_runs_and_its_explorers_respond(tmp_path, browser):
    """Notebook 01, as a learner runs it, as far as its second explorer (nbval runs the launches of the
    exercises after it): the communication explorer and the speedup explorer render, and each figure
    changes when one of its sliders is moved with the keyboard."""
    with notebook_run_in_lab(tmp_path, browser, TUTORIAL, timeout_ms=400_000,
                             through="widgets.speedup_explorer(") as (page, state):
        assert "Error displaying widget" not in page.locator(".jp-NotebookPanel").inner_text(), state
        assert_no_error_or_stderr(page, state)
        for label, moved in (("world size", "world size"), ("predict on", "up to")):
            try:
                page.wait_for_function(f"({FIGURE_OF})([{label!r}]) !== null", timeout=120_000)
            except Exception as exc:
                pytest.fail(f"the explorer with {label!r} did not render: {exc}\n{state}")
            before = page.evaluate(f"({FIGURE_OF})([{label!r}])")
            now = _nudge(_slider(page, label, moved), "ArrowRight" if moved == "world size" else "ArrowLeft",
                         state)
            try:
                page.wait_for_function(f"({FIGURE_OF})([{label!r}]) !== {before!r}", timeout=180_000)
            except Exception as exc:
                pytest.fail(f"moving {moved!r} to {now!r} did not redraw the {label!r} explorer: {exc}\n"
                            f"{state}")
        assert not [e for e in state.errors if "widget" in e.lower() or "crash" in e], state


def test_a_hatched_microbatch_timeline_logs_nothing_in_the_console(tmp_path, browser):
    from paralab import viz

    times = {"forward": 1e-3, "backward": 2e-3, "backward_input": 1e-3, "backward_weight": 1e-3}
    split, whole = (simulate_schedule(build_schedule(name, 4, 8), times, 1e-4, activation_bytes=1024)
                    for name in ("zb-h1", "1f1b"))
    # every hatch over microbatch colours: the split backward's two measured, the whole one predicted
    page_file = tmp_path / "timeline.html"
    viz.timeline(split, whole, layout="overlay").write_html(page_file, include_plotlyjs=True)
    page, console = browser.new_page(), []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    page.on("pageerror", lambda exc: console.append(f"page error: {exc}"))
    page.goto(page_file.as_uri())
    page.wait_for_function("document.querySelectorAll('g.barlayer path').length > 0", timeout=30_000)
    assert console == []


# What a FigureWidget's view does with the messages its model sends (plotly's widgetbundle.js):
# each one calls the plotly.js function of its name on the graph div, in the order sent.
REPLAY = """([figure, messages]) => {
  const div = document.createElement('div');
  document.body.appendChild(div);
  return Plotly.newPlot(div, figure.data, figure.layout).then(() => {
    const failed = [];
    for (const [name, m] of messages) {
      try {
        if (name === '_py2js_deleteTraces') Plotly.deleteTraces(div, m.delete_inds);
        else if (name === '_py2js_relayout') Plotly.relayout(div, m.relayout_data);
        else if (name === '_py2js_addTraces') Plotly.addTraces(div, m.trace_data);
        else failed.push('not replayed: ' + name);
      } catch (e) { failed.push(name + ': ' + e); }
    }
    return {failed, annotations: (div.layout.annotations || []).map(a => a.text),
            shapes: (div.layout.shapes || []).length,
            axes: Object.keys(div.layout).filter(k => /^[xy]axis\\d*$/.test(k)).sort()};
  });
}"""


@pytest.mark.parametrize("view", ["by op", "intra vs inter", "by step"])
def test_a_view_drawn_after_the_rank_matrix_shows_none_of_it_in_plotly_js(tmp_path, browser, view):
    """The comm explorer's switch from the rank matrix, as its FigureWidget sends it, replayed by
    Chromium's plotly.js: clearing the matrix's layout had thrown ("reading '_inputDomain'": its
    first axis removed, its rows' reversed autorange set to None, after the traces were gone), and the
    matrix's node boxes, panel titles and second and third axes had stayed over the next view."""
    import json
    from types import SimpleNamespace

    import plotly
    import plotly.io as pio

    from paralab import widgets
    from paralab.config import RunConfig
    from paralab.trace import Span, Trace

    cfg = RunConfig.build("tiny", strategy="ddp", world_size=4, global_batch=8)
    spans = [Span(r, "comm", "all_reduce", 0.0, 1.0, step=0, bytes=8, group_size=4) for r in range(4)]
    app = widgets.comm_explorer(SimpleNamespace(config=cfg, trace=Trace(spans=spans)), hardware="h100",
                                world_size=16, gpus_per_node=4)  # the what-if's 16 ranks: 4 node boxes
    app.controls["view"].value = "rank matrix"
    matrix, messages = json.loads(pio.to_json(app.figure)), []
    for name in ("_py2js_deleteTraces", "_py2js_relayout", "_py2js_addTraces", "_py2js_update",
                 "_py2js_restyle"):
        app.figure.observe(lambda change, name=name: change["new"] is None or messages.append(
            (name, json.loads(json.dumps(change["new"], default=str)))), names=name)
    app.controls["view"].value = view
    drawn = app.figure.layout
    page_file = tmp_path / "plotly.html"
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_file.write_text(f"<html><body><script>{plotly_js.read_text()}</script></body></html>")
    page = browser.new_page()
    page.goto(page_file.as_uri())
    shown = page.evaluate(REPLAY, [matrix, messages])
    assert shown["failed"] == [], shown
    assert shown["annotations"] == [a.text for a in drawn.annotations]
    assert shown["shapes"] == len(drawn.shapes) and shown["axes"] == ["xaxis", "yaxis"], shown
