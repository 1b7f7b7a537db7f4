"""A small process that cleans up after a launcher, even one that was killed outright.

A launcher (``paralab.run`` in a script or a Jupyter kernel, ``paralab nodes``, ``paralab elastic``)
cleans up after itself on every exit path it sees: an error, a timeout, a KeyboardInterrupt. It sees
none when it is SIGKILLed (an out-of-memory kill, a kernel restart), or ended by SIGTERM or SIGHUP
(a closed terminal), and a second Ctrl-C can cut its clean-up short. Ranks forked from the
forkserver are not its children, so the parent-death signal never fires for them; agents and their
workers run in sessions of their own.

So each launch starts a janitor: this file, run as a script by the same Python, with nothing but
the standard library (it starts in milliseconds), in a session of its own (a Ctrl-C or a hang-up
sent to the launcher's terminal does not reach it). The launcher tells it, one line at a time on
its stdin, which processes it started (by PID: the janitor opens a pidfd at once, so a PID reused
later is never signalled) and which directories are temporary. When its stdin reaches end of file
(the launcher finished, or died: the kernel closes the pipe either way) or the launcher's process
ends, the janitor SIGKILLs those processes, waits for them, removes the directories and exits. The
launcher, at the end of a normal run, stops everything itself first and waits for the janitor, so
that everything is gone when ``launch`` returns. A directory that outlives single runs (the
forkserver's ``pymp-*``) is removed only if the launcher itself is gone.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time

RELEASE = "release"  # the launcher is alive and ending the run normally: keep what lives as long as it does
LAUNCHER_GONE_WAIT_S = 2.0  # after end of file without a release: how long to look for the launcher's exit
KILL_WAIT_S = 5.0


class Janitor:
    """The launcher's side: start the janitor, tell it what to clean, and finish."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
        )
        self._paths: list[str] = []  # what finish removes itself if the janitor is gone
        self._lost = False

    def _tell(self, line: str) -> None:
        """One order; none once the janitor is gone (killed from outside: a run that had trained then
        failed on the broken pipe, exit 1, its run directory left behind)."""
        if self._lost:
            return
        try:
            self.proc.stdin.write(os.fsencode(line) + b"\n")
            self.proc.stdin.flush()
        except OSError:  # BrokenPipeError: its end of the pipe is closed
            self._lost = True

    def kill_at_end(self, pid: int) -> None:
        """SIGKILL this process (and, for an agent, with it whatever dies with it) at the end."""
        self._tell(f"pid {pid}")

    def remove_at_end(self, path: str | os.PathLike) -> None:
        self._paths.append(os.fspath(path))
        self._tell(f"path {os.fspath(path)}")

    def remove_if_launcher_dies(self, path: str | os.PathLike) -> None:
        """A directory the launcher's process keeps for later runs (the forkserver's)."""
        self._tell(f"path-if-launcher-dies {os.fspath(path)}")

    def leave(self) -> None:
        """Hand everything to the janitor without waiting and without a release, after an interrupt.

        A script interrupted with Ctrl-C exits next, and a second Ctrl-C can cut short the exit's own
        removal of the forkserver's directory; unreleased, the janitor removes it once this process
        is gone (a Jupyter kernel survives an interrupt: it is kept). The ranks are killed either way."""
        try:
            self.proc.stdin.close()
        except OSError:  # pragma: no cover - the janitor already gone
            pass

    def finish(self, timeout_s: float = 30.0) -> None:
        """Let the janitor kill what is left and remove the directories; wait until it has.

        An interrupt while waiting leaves the janitor at work: it needs nothing more from here. A
        janitor killed from outside leaves the directories to remove here; the processes it would
        have killed the launcher has stopped and joined already, on the way here."""
        try:
            self._tell(RELEASE)
        finally:
            try:
                self.proc.stdin.close()
            except OSError:  # the orders it flushes had nowhere to go: the janitor is gone
                self._lost = True
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kill and a rmtree that take this long
            pass
        if self._lost:
            _remove(self._paths)


# ------------------------------------------------------------------------------------ the janitor
def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError, AttributeError):  # gone already, or no pidfd (not Linux)
        return None


def _gone(pidfd: int | None, timeout_s: float) -> bool:
    if pidfd is None:
        return True
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _kill(pidfds: list[int]) -> None:
    for fd in pidfds:
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + KILL_WAIT_S
    for fd in pidfds:
        _gone(fd, max(deadline - time.monotonic(), 0.0))


def _remove(paths: list[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def serve(launcher_pid: int) -> None:
    """Collect orders until the launcher is done or dead, then carry them out."""
    launcher = _pidfd(launcher_pid) if os.getppid() == launcher_pid else None
    orders = {"pid": [], "path": [], "path-if-launcher-dies": [], RELEASE: []}  # pids become pidfds at once
    stdin = sys.stdin.fileno()
    poller = select.poll()
    poller.register(stdin, select.POLLIN)
    if launcher is not None:
        poller.register(launcher, select.POLLIN)
    pending = b""
    while True:
        events = dict(poller.poll())
        if stdin not in events:  # the launcher ended; its last orders were read already
            break
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in map(os.fsdecode, lines):
            kind, _, value = line.partition(" ")
            orders[kind].append(_pidfd(int(value)) if kind == "pid" else value)
    _kill([fd for fd in orders["pid"] if fd is not None])
    _remove(orders["path"])
    if not orders[RELEASE] and _gone(launcher, LAUNCHER_GONE_WAIT_S):
        _remove(orders["path-if-launcher-dies"])


if __name__ == "__main__":
    serve(int(sys.argv[1]))
