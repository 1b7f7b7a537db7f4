"""Where a command will write, checked before it starts anything: a run must not train for minutes and
then find that its ``--trace`` path is a directory.

Nothing is left behind here; a path passes when writing it would not fail for its shape or
permissions (a missing parent directory is fine: the writers create it). Permission bits do not say
it all (root passes them for /proc and for a read-only mount), so a probe file is made and removed in
the nearest directory that exists.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from paralab.config import ConfigError


def check_file(path: str | os.PathLike, what: str) -> None:
    """``path`` can be written as a file; ConfigError saying why not."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path} is not writable")
    _check_parent(path, what)


def check_dir(path: str | os.PathLike, what: str) -> None:
    """``path`` is, or can be created as, a writable directory; ConfigError saying why not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a directory")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable")
    _check_parent(path, what)


def _check_parent(path: Path, what: str) -> None:
    """The nearest existing ancestor is a directory this process may create things in."""
    ancestor = path.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{what} {path}: {ancestor} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot write in {ancestor} ({exc.strerror})") from None


def check_run_outputs(args) -> None:
    """``paralab run``'s --trace, --report (files), --trace-dir and --profile (directories)."""
    for option, value in (("--trace", args.trace), ("--report", args.report)):
        if value:
            check_file(value, option)
    for option, value in (("--trace-dir", args.trace_dir), ("--profile", args.profile)):
        if value:
            check_dir(value, option)
