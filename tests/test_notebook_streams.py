"""The stderr check of the notebook runs (tests/nb_streams.py), on a notebook made to break it: one
cell prints information on stdout, one writes it to stderr, one shows a warning it is tagged as
explaining. Run by nbval in a pytest of its own, as `make test` runs the tutorials."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent


def test_information_on_stderr_fails_the_cell_an_explained_warning_does_not(tmp_path):
    cells = [nbformat.v4.new_code_cell("print('layout: 2 x 2')"),
             nbformat.v4.new_code_cell("import sys\nprint('layout: 2 x 2', file=sys.stderr)"),
             nbformat.v4.new_code_cell("import warnings\n"
                                       "warnings.warn('more ranks than cores', RuntimeWarning)",
                                       metadata={"tags": ["warning-explained"]})]
    path = tmp_path / "streams.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    out = subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"),
                          "-p", "tests.nb_streams", "-p", "no:cacheprovider", "-q", "-rf", str(path)],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    assert "1 failed, 2 passed" in out.stdout, out.stdout + out.stderr
    assert "Cell 1 - pytest plugin exception: the cell wrote to stderr" in out.stdout, out.stdout
