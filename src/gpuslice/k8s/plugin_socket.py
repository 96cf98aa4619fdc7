"""A gRPC server's Unix socket in the kubelet's folders, published so that two instances of one plugin
can overlap (a DaemonSet rolled with surge): each binds a private name, moves it to the public name once
it serves, and at its stop removes the public name only if it is still its own. Used by the device
plugin and the DRA kubelet plugin.

```text
listen(server, path)    -> bind .<name>.<random> beside path (the kubelet's watchers ignore dot files)
publish(private, path)  -> rename over path in one step; (device, inode) to know it by
unlink_own(path, own)   -> remove path only if it is that socket still
remove_stale(folder, g) -> remove sockets matching g that no server listens on (a killed instance's)
```

Each instance has its own public name too (the pod's UID in it): the kubelet takes a socket that
disappears, or is replaced, as the plugin leaving, and would drop it while the new instance is the one
serving; with a name per instance it keeps every registered instance and uses the newest.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import grpc

from gpuslice.errors import UserError

__all__ = ["MAX_PATH", "listen", "publish", "remove_stale", "unlink_own"]

# The longest Unix socket path gRPC binds (measured with grpcio 1.85: 105 binds, 106 is refused with
# "Path name should not have more than 107 characters"; the kernel's own limit is 107).
MAX_PATH = 105


def listen(server: grpc.Server, path: Path) -> Path:
    """Bind ``server`` to a private name beside ``path`` (a dot file, which the kubelet's plugin watcher
    ignores); ``publish`` moves it to ``path`` once the server runs. Why not bind ``path`` itself: gRPC
    unlinks a server's socket path when the server stops, whoever's socket is there by then, so an
    old instance stopping after a new one started (a rolling update with surge) would take the new
    one's socket away. The private name is gone from the directory by then, so gRPC removes nothing."""
    private = path.with_name(f".{path.name}.{secrets.token_hex(3)}")
    if len(str(private)) > MAX_PATH:
        raise UserError(
            f"socket path {path} is {len(str(path))} characters long; a gRPC Unix socket takes at most "
            f"{MAX_PATH}, {len(str(private)) - len(str(path))} of them for the name it binds first: give a "
            f"folder at least {len(str(private)) - MAX_PATH} characters shorter"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    server.add_insecure_port(f"unix://{private}")
    return private


def publish(private: Path, path: Path) -> tuple[int, int]:
    """Move the running server's socket to ``path``, replacing in one step a socket left by a killed
    predecessor or the live one of the instance this one replaces; (device, inode) of it, by which
    ``unlink_own`` later knows it."""
    os.chmod(private, 0o600)  # before it has its public name: never reachable by others
    os.replace(private, path)
    st = os.lstat(path)
    return (st.st_dev, st.st_ino)


def unlink_own(path: Path, own: tuple[int, int] | None) -> None:
    """Remove ``path`` only if it is still the socket this instance published: after a newer instance
    published its own there, removing it would leave the kubelet nothing to connect to. (A newer
    instance publishing between this check and the unlink is not guarded against; its window is
    microseconds, at its start.)"""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if own is not None and (st.st_dev, st.st_ino) == own:
        path.unlink(missing_ok=True)


def remove_stale(folder: Path, pattern: str) -> None:
    """Remove the sockets in ``folder`` matching ``pattern`` that no server listens on (left by an
    instance that was killed); a live one (the instance this one replaces, still serving) stays."""
    for path in Path(folder).glob(pattern):
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink(missing_ok=True)
            except OSError:  # not a socket, or busy: not ours to judge
                pass
