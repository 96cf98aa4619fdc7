"""A plugin's Unix socket: bound under a private name, published over the public one, removed at its
stop only while it is still its own; a folder too deep for gRPC is refused in words, not a traceback."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuslice.errors import UserError
from gpuslice.k8s import plugin_socket


def _server() -> grpc.Server:
    return grpc.server(futures.ThreadPoolExecutor(max_workers=1))


def _deep(tmp_path: Path, length: int, name: str = "dra.sock") -> Path:
    """A socket path of exactly ``length`` characters below ``tmp_path``."""
    folder = tmp_path / ("d" * (length - len(str(tmp_path)) - len(name) - 2))
    return folder / name


def test_a_path_whose_private_name_fits_grpcs_limit_binds_and_one_longer_is_refused_in_words(
    tmp_path: Path,
) -> None:
    fits = _deep(tmp_path, plugin_socket.MAX_PATH - 8)  # the private name adds 8 characters
    server = _server()
    private = plugin_socket.listen(server, fits)
    assert len(str(private)) == plugin_socket.MAX_PATH
    server.start()
    own = plugin_socket.publish(private, fits)
    assert fits.is_socket() and not private.exists()
    server.stop(0).wait()
    plugin_socket.unlink_own(fits, own)
    assert not fits.exists()
    with pytest.raises(UserError, match=r"at most 105.*1 characters shorter"):
        plugin_socket.listen(_server(), _deep(tmp_path, plugin_socket.MAX_PATH - 7))


def test_a_socket_published_over_ours_is_not_removed_at_our_stop(tmp_path: Path) -> None:
    path = tmp_path / "gpu.sock"
    first, second = _server(), _server()
    mine = plugin_socket.publish(plugin_socket.listen(first, path), path)
    theirs = plugin_socket.publish(plugin_socket.listen(second, path), path)
    plugin_socket.unlink_own(path, mine)
    assert path.exists()
    plugin_socket.unlink_own(path, theirs)
    assert not path.exists()
    first.stop(0).wait()
    second.stop(0).wait()
