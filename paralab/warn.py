"""paralab's own warnings: one category, so the command line can say them in one line, and one way
to raise them that names the user's line (a script's, a notebook cell's), not a line of paralab's."""

from __future__ import annotations

import sys
import warnings


class ParalabWarning(RuntimeWarning):
    """A warning of paralab's: what it ran or read may not mean what it seems (ranks sharing cores, a
    disturbed calibration, a profile that cannot tell its bytes)."""


def warn(message: str, category: type[ParalabWarning] = ParalabWarning) -> None:
    """Warn, naming the first frame of the calling stack outside paralab: a fixed ``stacklevel`` names
    the right line from one caller only (paralab.run's warnings had named paralab/__init__.py)."""
    frame, inside = sys._getframe(1), 2  # stacklevel 2: warn's caller
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "paralab":
        frame, inside = frame.f_back, inside + 1
    warnings.warn(message, category, stacklevel=inside)
