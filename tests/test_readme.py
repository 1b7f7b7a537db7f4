"""README's Python runs as written: every paralab name a snippet uses is there after its own imports."""

import ast
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"

# in a fresh interpreter (a test's imports would have put paralab's submodules on the package): run a
# snippet's imports, then look up each dotted name it uses without calling anything
_RESOLVE = """
import ast, re, sys
tree = ast.parse(sys.argv[1])
scope = {}
exec(compile(ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], []),
             "<readme>", "exec"), scope)
for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        chain = ast.unparse(node)
        root = chain.split(".")[0]
        if root in scope and re.fullmatch(r"[\\w.]+", chain):
            eval(chain, scope)
"""


def python_snippets() -> list[str]:
    """The fenced Python blocks, and the inline code that calls paralab (``paralab.x.y(...)``), each
    with ``import paralab`` before it as a reader would have."""
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    inline = [code for code in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
              if code.startswith("paralab.") and "(" in code]
    return [f"import paralab\n{snippet}" for snippet in blocks + inline]


def test_readmes_python_names_what_it_imports():
    """`paralab.sim.bridge.predict_run_trace(run.config)` after `import paralab` had raised
    AttributeError: paralab imports its simulator only when asked for."""
    snippets = python_snippets()
    assert any("predict_run_trace" in snippet for snippet in snippets)
    for snippet in snippets:
        ast.parse(snippet)
        out = subprocess.run([sys.executable, "-c", _RESOLVE, snippet], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, f"{snippet}\n{out.stderr[-2000:]}"
