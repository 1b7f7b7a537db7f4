"""A run on one machine listens on nothing beyond loopback.

Three things listen during a torch.distributed run, and each needs a nudge to stay on 127.0.0.1:

- the rendezvous / process-group **store**. torch's TCPStore server listens on every interface,
  whatever host it is given, and asks for no password, so anyone who can reach the port can read or
  write the keys ranks use to find each other. paralab's local launch uses a file store in its
  private run directory instead (no socket at all); where a TCP store is needed (the rendezvous of
  local torchrun agents, the process-group store of their workers) it is handed a socket already
  bound to 127.0.0.1 (:func:`serve_store`);
- **gloo**'s connections between ranks: each rank listens on the address its host name resolves to
  (an external interface on many machines) unless ``GLOO_SOCKET_IFNAME`` names another;
- **NCCL**'s bootstrap: rank 0 listens on the first non-loopback interface unless
  ``NCCL_SOCKET_IFNAME`` says otherwise (the data itself goes over NVLink or shared memory).

:func:`transport_env` names the loopback interface for both. A multi-node run on a real cluster must
listen on the network; docs/failures.md says on what, and what to do about it.
"""

from __future__ import annotations

import os
import socket

HOST = "127.0.0.1"
_SERVED = []  # stores this process hosts: they must live as long as the process group that uses them


def interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), if there is one."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


def transport_env() -> dict[str, str]:
    """Environment that keeps gloo's and NCCL's sockets on the loopback interface."""
    lo = interface()
    return {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo} if lo else {}


def serve_store(port: int = 0):
    """A TCPStore server listening on 127.0.0.1 only (``port`` 0: any free port; see ``.port``)."""
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(socket.SOMAXCONN)
    port = sock.getsockname()[1]
    # the store takes the listening socket over (and closes it when it is destroyed)
    return TCPStore(HOST, port, is_master=True, multi_tenant=True, wait_for_workers=False,
                    master_listen_fd=sock.detach())


def serve_env_store() -> None:
    """Under a local torchrun agent: host the process-group store on loopback before ``env://``.

    ``init_process_group("env://")`` makes rank 0 host a TCPStore on MASTER_PORT, on every interface.
    Here rank 0 hosts it first, on 127.0.0.1, and every rank (rank 0 too) is told to join the store
    at MASTER_ADDR:MASTER_PORT as a client (torch's own switch for a store its agent hosts)."""
    if os.environ.get("MASTER_ADDR") != HOST:
        return  # not a local launch: the store must be reachable from other machines
    if os.environ.get("RANK") == "0":
        _SERVED.append(serve_store(int(os.environ["MASTER_PORT"])))
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
