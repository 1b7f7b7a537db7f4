"""`make lab` starts a real JupyterLab on notebooks/, bound to 127.0.0.1, with a token.

The test starts it exactly the way a user does (`make lab`, with the install step marked as done and
`--no-browser --port=N` passed through LAB_ARGS), but with its own Jupyter data, runtime, settings,
config and workspaces dirs, so nothing of the user's is read or written. It fetches the lab page and
the welcome notebook through the REST API with its token, checks the lab/ settings and workspace
took effect, then stops the server and checks that no process it started is left. A non-loopback
address or an empty token is refused before the server starts (lab/guard.py).

``LabServer`` is shared with tests/test_browser.py.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """JupyterLab started through `make lab` in private Jupyter dirs; a context manager."""

    def __init__(self, tmp: Path, extra_args: tuple[str, ...] = ()):
        self.tmp = Path(tmp)
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = extra_args
        self.proc: subprocess.Popen | None = None
        self.log_path = self.tmp / "lab.log"

    def env(self) -> dict:
        env = dict(os.environ)
        for var, sub in [("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                         ("JUPYTERLAB_SETTINGS_DIR", "user-settings"), ("JUPYTER_CONFIG_DIR", "config"),
                         ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
            path = self.tmp / sub
            path.mkdir(parents=True, exist_ok=True)
            env[var] = str(path)
        env.pop("JUPYTER_CONFIG_PATH", None)
        env["JUPYTER_TOKEN"] = self.token
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def command(self) -> list[str]:
        venv = Path(sys.prefix)
        lab_args = " ".join([f"--port={self.port}", "--no-browser", *self.extra_args])
        # -o: treat the install stamp as up to date, so the test never reinstalls anything.
        return ["make", "--no-print-directory", "-C", str(REPO), "-o", f"{venv}/.installed", "lab",
                f"VENV={venv}", f"LAB_ARGS={lab_args}"]

    def __enter__(self) -> LabServer:
        if shutil.which("make") is None:
            pytest.skip("make is not installed")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"`make lab` exited with {self.proc.returncode}:\n{self.read_log()}")
            try:
                if self.get("/api/status", raw=True).status == 200:
                    return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"JupyterLab did not answer within {START_TIMEOUT_S} s:\n{self.read_log()}")

    def __exit__(self, *exc) -> None:
        self.stop()

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, token: bool = True, raw: bool = False):
        headers = {"Authorization": f"token {self.token}"} if token else {}
        req = urllib.request.Request(self.url + path, headers=headers)
        resp = urllib.request.urlopen(req, timeout=10)
        return resp if raw else resp.read()

    def get_json(self, path: str):
        return json.loads(self.get(path))

    def processes(self) -> list[psutil.Process]:
        """make, the shell, jupyter lab and everything they started (kernels, ranks)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Ask the server to shut down (it stops its kernels), then make sure nothing is left."""
        if self.proc is None:
            return
        procs = self.processes()
        if self.proc.poll() is None:
            try:
                req = urllib.request.Request(self.url + "/api/shutdown", method="POST", data=b"",
                                             headers={"Authorization": f"token {self.token}"})
                urllib.request.urlopen(req, timeout=10).read()
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=15)
        for p in alive:  # only processes this server started
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            self.proc.wait(timeout=5)
        finally:
            self.log.close()
        self.leftovers = [p.pid for p in alive]
        self.proc_pids = [p.pid for p in procs]
        self.proc = None


def test_make_lab_serves_the_welcome_notebook(tmp_path):
    server = LabServer(tmp_path)
    with server:
        # Bound to loopback only: the listening socket of the server process is on 127.0.0.1.
        listening = [c.laddr for p in server.processes() for c in _connections(p)
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == server.port]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening

        # A token is required: without it the API answers 403, with it 200.
        with pytest.raises(urllib.error.HTTPError) as refused:
            server.get("/api/contents/00_welcome.ipynb", token=False)
        assert refused.value.code == 403

        page = server.get(f"/lab?token={server.token}", token=False).decode()
        assert "jupyter-config-data" in page and "JupyterLab" in page
        match = re.search(r'<script id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)
        assert match, "no page config in the lab page"
        config = json.loads(match.group(1))
        assert config["news"] == {"disabled": True}
        assert Path(config["serverRoot"]).resolve() == REPO / "notebooks"

        welcome = server.get_json("/api/contents/00_welcome.ipynb?content=1")
        assert welcome["type"] == "notebook" and welcome["content"]["cells"], "welcome notebook is empty"
        assert any("paralab" in "".join(c["source"]) for c in welcome["content"]["cells"])

        # lab/settings/overrides.json is applied: no news, no update check.
        notif = server.get_json("/lab/api/settings/@jupyterlab/apputils-extension:notification")
        defaults = notif["schema"]["properties"]
        assert defaults["fetchNews"]["default"] == "false" and defaults["checkForUpdates"]["default"] is False
        # closing a notebook shuts its kernel down: an idle kernel keeps ~0.6 GB (torch and the ranks'
        # forkserver), and two left open took a 2 GB Binder box over its limit in notebook 06
        tracker = server.get_json("/lab/api/settings/@jupyterlab/notebook-extension:tracker")
        assert tracker["schema"]["properties"]["kernelShutdown"]["default"] is True

        # The default URL is the paralab workspace, which opens the welcome notebook.
        resp = urllib.request.urlopen(f"{server.url}/?token={server.token}", timeout=10)
        assert "/lab/workspaces/paralab" in resp.url
        workspace = server.get_json("/lab/api/workspaces/paralab")
        assert workspace["data"]["layout-restorer:data"]["main"]["current"] == "notebook:00_welcome.ipynb"
        # and it went to this test's own workspaces dir, not the user's
        assert list((tmp_path / "workspaces").glob("paralab-*.jupyterlab-workspace"))

    assert server.leftovers == [], f"processes outlived the lab: {server.leftovers}"
    assert not [pid for pid in server.proc_pids if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def _connections(proc: psutil.Process):
    try:
        return proc.net_connections(kind="inet")
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return []


GUARD = runpy.run_path(str(REPO / "lab" / "guard.py"))


@pytest.mark.parametrize(
    "argv, env, refused",
    [
        (["--port=8899", "--no-browser"], {}, None),
        (["--ip=127.0.0.1"], {}, None),
        (["--ip", "::1"], {}, None),
        (["--ip=0.0.0.0"], {}, "PARALAB_LAB_ALLOW_REMOTE=1"),
        (["--ServerApp.ip="], {}, "refusing to listen on ''"),
        (["--ip=0.0.0.0"], {"PARALAB_LAB_ALLOW_REMOTE": "1"}, None),
        (["--IdentityProvider.token="], {}, "PARALAB_LAB_ALLOW_NO_TOKEN=1"),
        (["--ServerApp.token", ""], {}, "--ServerApp.token is empty"),
        ([], {"JUPYTER_TOKEN": ""}, "JUPYTER_TOKEN is empty"),
        (["--IdentityProvider.token="], {"PARALAB_LAB_ALLOW_NO_TOKEN": "1"}, None),
    ],
)
def test_the_lab_refuses_the_network_and_an_empty_token_unless_asked(argv, env, refused):
    answer = GUARD["refusal"](argv, env)
    assert answer is None if refused is None else refused in answer


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, message", [
    (("--ip=0.0.0.0",), "refusing to listen on '0.0.0.0'"),
    (("--IdentityProvider.token=",), "refusing to run without a token"),
])
def test_make_lab_refuses_to_start_and_says_how_to_opt_in(tmp_path, args, message):
    server = LabServer(tmp_path, extra_args=args)
    proc = subprocess.Popen(server.command(), env=server.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # it started after all: stop it, and fail below
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert proc.returncode != 0 and message in out and "PARALAB_LAB_ALLOW_" in out, out[-2000:]


def test_binders_start_gives_kernels_the_threads_the_cpu_quota_allows():
    """A Binder pod sees its node's cores and may use about one: torch in a kernel had sized its thread
    pool by the cores it saw. binder/start sets OMP_NUM_THREADS to what the ranks get (usable_cores,
    which reads the cgroup's quota), and keeps a value already set."""
    from paralab.runtime.worker import usable_cores

    probe = [sys.executable, "-c",
             "import os, torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # binder/start runs `python`: this one
    for given, expected in ((None, usable_cores()), ("1", 1)):
        run_env = env if given is None else {**env, "OMP_NUM_THREADS": given}
        out = subprocess.run([str(REPO / "binder" / "start"), *probe], env=run_env, capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        assert out == [str(expected), str(expected)]
