"""JupyterLab server configuration for paralab.

`make lab` puts this directory on JUPYTER_CONFIG_PATH, so `jupyter lab` reads this file:

- the server listens on 127.0.0.1 only, and asks for a token (a random one, printed in the URL at
  start-up, or the value of JUPYTER_TOKEN when it is set and not empty); a command line or
  JUPYTER_TOKEN that would change either is refused unless the user opts in (lab/guard.py:
  PARALAB_LAB_ALLOW_REMOTE=1, PARALAB_LAB_ALLOW_NO_TOKEN=1). The user's own Jupyter config files
  are not read for it: one that empties the token there is theirs to answer for;
- it serves notebooks/ and opens the "paralab" workspace (lab/workspaces/paralab.jupyterlab-workspace),
  which shows notebooks/00_welcome.ipynb;
- JupyterLab settings defaults come from lab/settings/overrides.json (no news pop-up, no update
  check, no extension manager calls to the network);
- pass --no-browser (make lab LAB_ARGS=--no-browser) to keep a browser from opening.

The tests start JupyterLab exactly this way, with their own data, runtime, settings and config dirs.
"""

import json
import runpy
import sys
from pathlib import Path

LAB = Path(__file__).resolve().parent
REPO = LAB.parent
WORKSPACE = "paralab"

c = get_config()  # noqa: F821 - provided by the traitlets config loader

c.ServerApp.ip = "127.0.0.1"
c.ServerApp.root_dir = str(REPO / "notebooks")
c.ServerApp.allow_remote_access = False
c.ServerApp.allow_root = True  # containers and CI often run as root; the server still binds loopback only
refused = runpy.run_path(str(LAB / "guard.py"))["refusal"](sys.argv[1:])
if refused:
    raise SystemExit(refused)

c.LabApp.app_settings_dir = str(LAB / "settings")
c.LabApp.default_url = f"/lab/workspaces/{WORKSPACE}"
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
c.LabApp.extension_manager = "readonly"  # no queries to PyPI from the lab


def _install_workspace() -> None:
    """Copy the paralab workspace into the workspaces dir unless the user already has one there."""
    try:
        from jupyterlab.commands import get_workspaces_dir
        from jupyterlab_server.workspaces_handler import WorkspacesManager
    except ImportError:  # not a JupyterLab process
        return
    manager = WorkspacesManager(get_workspaces_dir())
    if manager.load(WORKSPACE).get("data"):
        return
    raw = (LAB / "workspaces" / f"{WORKSPACE}.jupyterlab-workspace").read_text(encoding="utf-8")
    json.loads(raw)  # a broken file fails here, loudly
    manager.save(WORKSPACE, raw)


_install_workspace()
