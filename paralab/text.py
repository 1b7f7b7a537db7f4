"""Text as a notebook prints it: lines that fit a notebook cell's width.

JupyterLab breaks an output line that runs past the cell anywhere, in the middle of a word
("seque|nce"), so the notebooks print long generated sentences (a planner's layout and its
explanation) already broken, after a comma where one falls in reach.
"""

from __future__ import annotations

import textwrap

WIDTH = 110  # characters: what a notebook cell shows at its usual width without breaking a line


def at_commas(text: str, head: str = "", indent: str = "  ", width: int = WIDTH) -> str:
    """``head``, then ``text`` broken into lines of at most ``width`` characters after its commas
    (``", "``), each line after the first indented by ``indent``; a piece too long for a line alone is
    broken at its spaces."""
    lines, fresh = [head], True
    pieces = text.split(", ")
    for k, part in enumerate(pieces):
        piece = part + ("," if k < len(pieces) - 1 else "")
        if not fresh and len(lines[-1]) + 1 + len(piece) > width:
            lines.append(indent)
            fresh = True
        lines[-1] += piece if fresh else " " + piece
        fresh = False
    return "\n".join(textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False)
                     for line in lines)
