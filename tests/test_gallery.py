"""docs/gallery.py (`make gallery`): every figure a notebook draws, plotly outputs and figure widgets
alike, lands on the page, in order, under its notebook and cell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "tests" / "browser" / "widgets.ipynb"


def test_the_gallery_shows_a_notebooks_figure_and_its_figure_widget(tmp_path):
    out = tmp_path / "gallery.html"
    run = subprocess.run([sys.executable, str(REPO / "docs" / "gallery.py"), str(NOTEBOOK), "-o", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "widgets.ipynb: 2 figures" in run.stdout
    page = out.read_text()
    plots = re.findall(r'Plotly\.newPlot\("fig(\d+)", (\[.*?\]), (\{.*?\}), '
                       r'\{responsive: true\}\);</script>', page)
    assert [n for n, _, _ in plots] == ["1", "2"]
    static, widget = (json.loads(layout)["title"]["text"] for _, _, layout in plots)
    assert static == "tiny model: gradient bytes" and widget == "all-reduce bytes on the wire per rank"
    assert json.loads(plots[1][1])[0]["type"] == "bar"  # the widget's figure, read from its stored state
    assert "cell 1 · tiny model: gradient bytes" in page and "plotly" in page.split("</script>")[0].lower()
