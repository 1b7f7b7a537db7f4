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


def count_text(count: int, noun: str, plural: str | None = None) -> str:
    """"1 GPU", "1,024 GPUs": a count and its noun, in the singular for one (``plural`` where adding
    an s is wrong: "microbatches")."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def listed(items: list, shown: int = 8, total: int | None = None) -> str:
    """"a, b, c": items in a sentence, the first ``shown`` of them and "and N more" past those.
    ``total``: how many there are, where ``items`` holds only the first few (a world's missing ranks
    are counted, not listed)."""
    total = len(items) if total is None else total
    more = f" and {total - shown} more" if total > shown else ""
    return ", ".join(map(str, items[:shown])) + more


def numbered(noun: str, numbers: list[int], total: int | None = None) -> str:
    """"rank 2", "ranks 2, 3": a noun and the numbers it names, in the singular for one; past eight,
    "and N more" (``total``: as :func:`listed`'s)."""
    total = len(numbers) if total is None else total
    return f"{noun if total == 1 else noun + 's'} {listed(numbers, total=total)}"


def steps_said(steps: list[int]) -> str:
    """Step numbers in order, as a sentence names them: "step 3", "steps 1-5" where consecutive, else
    "steps 2, 5, 9" (the first and last few past six: "steps 0, 2, 4 ... 40, 42, 44 (23 steps)")."""
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[-1] + 1)):
        return f"steps {steps[0]}-{steps[-1]}"
    if len(steps) <= 6:
        return "steps " + ", ".join(map(str, steps))
    return (f"steps {', '.join(map(str, steps[:3]))} ... {', '.join(map(str, steps[-3:]))} "
            f"({len(steps)} steps)")
