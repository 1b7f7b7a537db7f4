"""What `make lab` refuses: a lab that anyone on the network can reach, or one without a token.

jupyter_server_config.py binds 127.0.0.1 and asks for a token, but the command line outranks a config
file: ``--ip=0.0.0.0`` would listen on every interface and ``--IdentityProvider.token=`` would turn the
token off, without a word. So the config file reads the command line the way JupyterLab does (with
its own aliases and flags) and refuses both, unless the user opts in explicitly:

    PARALAB_LAB_ALLOW_REMOTE=1    listen on an address other than loopback
    PARALAB_LAB_ALLOW_NO_TOKEN=1  run without a token

as in ``make lab LAB_ARGS="--ip=0.0.0.0" PARALAB_LAB_ALLOW_REMOTE=1``. Without them, use an SSH tunnel
(``ssh -L 8888:127.0.0.1:8888 host``) to reach a lab on another machine.
"""

from __future__ import annotations

import ipaddress
import os

ALLOW_REMOTE, ALLOW_NO_TOKEN = "PARALAB_LAB_ALLOW_REMOTE", "PARALAB_LAB_ALLOW_NO_TOKEN"
TOKEN_SETTINGS = (("IdentityProvider", "token"), ("ServerApp", "token"), ("NotebookApp", "token"))


def command_line_config(argv: list[str]):
    """The traitlets config that ``jupyter lab ARGV`` takes from its command line."""
    from jupyterlab.labapp import LabApp
    from traitlets.config.loader import KVArgParseConfigLoader

    app = LabApp()
    return KVArgParseConfigLoader(argv, aliases=app.aliases, flags=app.flags).load_config()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # "", "*", a host name: all interfaces, or a name that may resolve to any
        return False


def refusal(argv: list[str], env=os.environ) -> str | None:
    """Why the lab must not start with this command line and environment, or None."""
    config = command_line_config(argv)
    for section in ("ServerApp", "NotebookApp"):
        ip = str(config[section].ip) if "ip" in config[section] else None
        if ip is not None and not is_loopback(ip) and env.get(ALLOW_REMOTE) != "1":
            return (f"paralab lab: refusing to listen on {ip!r}: the lab would be reachable from the "
                    "network. Keep the default (127.0.0.1) and reach it through an SSH tunnel, or opt in "
                    f"with {ALLOW_REMOTE}=1 (make lab LAB_ARGS=... {ALLOW_REMOTE}=1) and keep the token.")
    empty = [f"--{section}.{name}" for section, name in TOKEN_SETTINGS
             if name in config[section] and str(config[section][name]) == ""]
    if env.get("JUPYTER_TOKEN") == "":
        empty.append("JUPYTER_TOKEN")
    if empty and env.get(ALLOW_NO_TOKEN) != "1":
        return (f"paralab lab: refusing to run without a token ({', '.join(empty)} is empty): anyone who "
                "reaches the port could run code as you. Leave the token out (a random one is printed at "
                f"start-up) or opt in with {ALLOW_NO_TOKEN}=1.")
    return None
