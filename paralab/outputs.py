"""Where a command will write, checked before it starts anything: a run must not train for minutes and
then find that its ``--trace`` path is a directory, and a command that reads files (merge, report)
must not write its output over them.

Nothing is left behind here; a path passes when writing it would not fail for its shape or
permissions (a missing parent directory is fine: the writers create it). Permission bits do not say
it all (root passes them for /proc and for a read-only mount), so a probe file is made and removed in
the nearest directory that exists.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import tempfile
from pathlib import Path

from paralab.config import ConfigError
from paralab.text import count_text, listed


def check_file(path: str | os.PathLike, what: str) -> None:
    """``path`` can be written as a file; ConfigError saying why not."""
    path = Path(path)
    check_replaceable(path, what)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what} {path} is not writable")
    _check_parent(path, what)


def check_replaceable(path: str | os.PathLike, what: str) -> None:
    """Nothing at ``path`` that a file written beside it and renamed over it would destroy: a directory,
    a device, a pipe or a socket (`-o /dev/null`, run as root, had replaced the machine's); ConfigError.
    The writers check this much themselves; :func:`check_file` also probes the permissions, once, before
    a command starts."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{what} {path} is not a regular file (a device, pipe or socket); give a file name")


def check_dir(path: str | os.PathLike, what: str) -> None:
    """``path`` is, or can be created as, a writable directory; ConfigError saying why not."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a directory")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable")
    _check_parent(path, what)


def unread_text(exc: Exception, path: str | os.PathLike) -> str:
    """Why a trace could not be read, in a line: an OS error as the file and what the system said
    ("out/: No such file or directory", not "[Errno 2] ..."), a format error as it names itself."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename or path}: {exc.strerror}"
    return str(exc)


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
    except OSError as exc:  # /proc, which exists, says ENOENT: it takes no new files
        why = "it takes no new files" if exc.errno == errno.ENOENT else exc.strerror
        raise ConfigError(f"{what} {path}: cannot write in {ancestor} ({why})") from None


def check_run_outputs(args) -> None:
    """``paralab run``'s --trace, --report (files), --trace-dir and --profile (directories): each
    writable, each its own, and no --trace inside the --trace-dir; plotly there to draw a --report."""
    files = check_outputs(files=[("--trace", args.trace), ("--report", args.report)],
                          dirs=[("--trace-dir", args.trace_dir), ("--profile", args.profile)])
    if args.trace_dir:
        check_trace_dir(args.trace_dir, files)
    if args.report and (missing := plotly_missing()):  # a run had trained, then died importing plotly
        raise ConfigError(f"--report: {missing}")


# how to get the notebook extras (plotly, ipywidgets): paralab is on no package index, so from a clone
LAB_INSTALL = "pip install 'paralab[lab]' (from a clone of paralab: pip install -e '.[lab]')"
PLOTLY_MISSING = f"paralab.viz needs plotly: {LAB_INSTALL}, or pip install plotly"


def plotly_missing() -> str:
    """:data:`PLOTLY_MISSING` where plotly, which draws reports, is not installed, else "": asked before
    a run that is to write one, which had trained and then died on the import. Only paralab.viz imports
    plotly; this looks for it without importing it."""
    return "" if importlib.util.find_spec("plotly") else PLOTLY_MISSING


def check_outputs(files: list[tuple[str, str | None]], dirs: list[tuple[str, str | None]]
                  ) -> list[tuple[str, str]]:
    """Each (name, path) given (None: not asked for) writable as a file or as a directory, and each
    its own path: what a run writes, checked before it starts (``paralab run`` and ``paralab.run``).
    Returns the files given."""
    files = [(name, path) for name, path in files if path]
    dirs = [(name, path) for name, path in dirs if path]
    for name, path in files:
        check_file(path, name)
    for name, path in dirs:
        check_dir(path, name)
    check_distinct(files + dirs)
    return files


def check_distinct(outputs: list[tuple[str, str]]) -> None:
    """No two options name one path: the file would hold only the last output written (a --trace
    overwritten by the --report), or a directory mix two kinds of ``rankN.json``."""
    named: dict[Path, str] = {}
    for flag, path in outputs:
        resolved = Path(path).resolve()
        if resolved in named:
            raise ConfigError(f"{named[resolved]} and {flag} both name {path}: one would overwrite or mix "
                              "with the other's output; give each its own path")
        named[resolved] = flag


def check_trace_dir(trace_dir: str, files: list[tuple[str, str]]) -> None:
    """A --trace-dir is read as one run: ``paralab merge DIR`` reads every ``*.json`` in it as a rank's
    trace, so a --trace written into it would read as one more rank. A directory an earlier run wrote
    is reused, as torchrun users rerun a command: this run's ranks overwrite their files, and what a run
    of another world size leaves (a 4-rank run's ranks 2 and 3 beside a 2-rank run's) is refused where
    the folder is read (``trace.load``), naming both runs."""
    for flag, path in files:
        if read_as_a_rank(path, trace_dir):
            raise ConfigError(f"{flag} {path} is inside --trace-dir {trace_dir}, where it would be read as "
                              "one more rank's trace; write it elsewhere")


def rank_trace_name(rank: int) -> str:
    """The file a torchrun rank writes its trace to in a --trace-dir."""
    return f"rank{rank:05d}.json"


def check_trace_dir_holds_only(trace_dir: str, world_size: int) -> None:
    """A --trace-dir is read back as its run (by ``paralab nodes``, or ``paralab merge`` after a
    torchrun): a ``*.json`` there that none of its ``world_size`` ranks overwrites (a larger run's
    ranks, a merged trace) would be read with them and refused only once the run had trained.
    Refused before any rank trains."""
    folder = Path(trace_dir)
    ours = {rank_trace_name(rank) for rank in range(world_size)}
    others = sorted(p.name for p in folder.glob("*.json") if p.name not in ours) if folder.is_dir() else []
    if others:
        raise ConfigError(f"--trace-dir {trace_dir} holds {listed(others, shown=4)}, which this run of "
                          f"{count_text(world_size, 'rank')} would not overwrite and would read back as its "
                          "own; give an empty folder or move them out")


def read_as_a_rank(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether a file at ``path`` would be read as one more rank's trace when ``folder`` is loaded:
    ``Trace.load`` of a folder reads every ``*.json`` directly in it."""
    return Path(path).suffix == ".json" and Path(path).resolve().parent == Path(folder).resolve()


def check_output_reads_no_input(output: str | os.PathLike, inputs: list[tuple[str, str | None]]) -> None:
    """ConfigError when writing ``output`` (``-o``) would destroy what the command reads, ``inputs``
    as (what the command calls it, path): the same file (by another name too: a link, ``./x``), or,
    for a folder of per-rank traces, a ``.json`` inside it, which the next read of the folder would
    take for one more rank. Asked before anything is read: the input is gone once the output is
    written."""
    for what, path in inputs:
        if path is None:
            continue
        if same_file(output, path):
            raise ConfigError(f"-o {output} is the {what} to read, which writing it would overwrite; "
                              "write it elsewhere")
        if Path(path).is_dir() and read_as_a_rank(output, path):
            raise ConfigError(f"-o {output} is inside {path}, the {what} to read, where it would be read "
                              "as one more rank's trace; write it elsewhere")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once links and ``..`` are resolved, or, where
    both exist, the same inode (a hard link)."""
    a, b = Path(a), Path(b)
    return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
