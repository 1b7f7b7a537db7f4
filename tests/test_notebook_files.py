"""The notebooks as committed: no outputs or saved widget state (nbval and the book execute them), and
every exercise's answer in a collapsed cell tagged ``answer``, which the book folds into <details>."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
# what a collapsed answer cell shows of itself in JupyterLab: its first line, which gave the answer
# away in most notebooks (a formula, an assert)
ANSWER_FIRST_LINE = "# The answer, and why (open this cell once you have predicted).\n"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_is_committed_clean_with_its_answers_tagged_and_collapsed(path):
    notebook = json.loads(path.read_text())
    assert "widgets" not in notebook["metadata"], "saved widget state: strip metadata.widgets"
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code), "outputs committed"
    for cell in code:
        hidden = cell["metadata"].get("jupyter", {}).get("source_hidden", False)
        tagged = "answer" in cell["metadata"].get("tags", [])
        assert hidden == tagged, f"cell {cell['id']}: collapsed {hidden}, tagged answer {tagged}"
    has_exercises = any("## Exercises" in "".join(c["source"]) for c in notebook["cells"])
    answers = [c for c in code if "answer" in c["metadata"].get("tags", [])]
    assert bool(answers) == has_exercises
    assert all("assert " in "".join(c["source"]) for c in answers), "an answer checks itself with an assert"
    assert all(c["source"][0] == ANSWER_FIRST_LINE for c in answers), "a collapsed answer shows its answer"


def test_every_notebook_is_read():
    assert len(NOTEBOOKS) >= 15
