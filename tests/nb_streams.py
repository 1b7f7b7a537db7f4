"""pytest plugin: a notebook cell that writes to stderr fails, unless the notebook explains it.

JupyterLab draws stderr in a red box, which a learner reads as a failure, so information belongs on
stdout or in a figure. A warning the notebook means to show (and explains in the text around it) is
allowed in a cell tagged ``warning-explained``. Active for every nbval run (the repository's root
conftest.py loads it); tests/test_notebook_streams.py runs it on a notebook made to break it.
"""

from __future__ import annotations

import pytest

EXPLAINED = "warning-explained"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    outputs = getattr(item, "test_outputs", None) or []  # nbval's cells keep what they printed here
    cell = getattr(item, "cell", None)
    tags = cell.metadata.get("tags", []) if cell is not None else []
    stderr = "".join(o.get("text", "") for o in outputs
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    if stderr and EXPLAINED not in tags:
        raise AssertionError("the cell wrote to stderr (a red box in JupyterLab); "
                             f"print information to stdout, or tag the cell {EXPLAINED!r} where the notebook "
                             f"explains the warning:\n{stderr[:2000]}")
    return result
