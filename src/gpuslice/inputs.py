"""User input at the edge: bounded numbers, text files and output folders, checked before any work.

Every command reads its counts, ratios, ports, input files and output folders through these checks, so
one kind of mistake gets one kind of answer wherever it is made:

- a number must be finite and inside its documented range (``1e400`` reads as infinity, ``nan`` passes
  every comparison, and an unbounded count turns into a hang or a MemoryError far from the input);
- a file given as text must be a regular file of UTF-8 text with something in it: a folder, a FIFO or a
  device (whose read would block or never end), a binary or non-UTF-8 file, or an empty one, is refused
  with its name and the first bad byte, never a UnicodeDecodeError or a hang;
- an output file must be a regular file or absent, in a folder that can be written (as below);
- an output folder must be writable *before* the work starts: the nearest existing folder is probed
  with a temporary entry that is removed at once (``os.access`` says yes to root everywhere, even under
  /proc), so a long run never ends in a traceback about where its results were to go.

Each check raises ``InvalidInput`` (a UserError: exit 2, HTTP 400) whose message names the flag.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuslice.errors import UserError

__all__ = [
    "InvalidInput",
    "bind_refused",
    "bounded_int",
    "check_listen_host",
    "file_kind",
    "finite_float",
    "read_json",
    "read_text",
    "writable_file",
    "writable_folder",
]


class InvalidInput(UserError):
    """A number out of its range, a file that is not text, or a folder that cannot be written."""


def bounded_int(value: int, name: str, low: int, high: int) -> int:
    """``value`` if ``low <= value <= high``; InvalidInput naming ``name`` and the range otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"invalid {name} {value!r}: use a whole number from {low:,} to {high:,}")
    return value


def finite_float(value: float, name: str, low: float, high: float) -> float:
    """``value`` if finite and ``low <= value <= high``; InvalidInput naming ``name`` otherwise."""
    if not math.isfinite(value):
        raise InvalidInput(f"invalid {name} {value!r}: use a finite number from {low:g} to {high:g}")
    if not low <= value <= high:
        raise InvalidInput(f"invalid {name} {value:g}: use a number from {low:g} to {high:g}")
    return value


def file_kind(path: str | Path) -> str:
    """``"file"`` for a regular file (or a link to one); else what is there, in words: ``"missing"``,
    ``"a folder"``, ``"a FIFO"``, ``"a device or socket"``."""
    try:
        return _kind_of(os.stat(path).st_mode)
    except OSError:
        return "missing"


def _kind_of(mode: int) -> str:
    """``file_kind``'s words for a file mode (``st_mode``)."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"


def read_text(path: str | Path, name: str, max_bytes: int = 256 * 1024**2) -> str:
    """The UTF-8 text of the file at ``path``; InvalidInput when it cannot be read, is not a regular
    file (a folder, a FIFO, a device), is larger than ``max_bytes``, holds a NUL byte (binary), is not
    UTF-8, or holds only white space."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer that never comes.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise InvalidInput(f"cannot read {name} {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # what was opened, not a second look at the name
            raise InvalidInput(f"{name} {path} is {_kind_of(info.st_mode)}: give a regular file")
        if info.st_size > max_bytes:
            raise InvalidInput(f"{name} {path} is {info.st_size:,} bytes: at most {max_bytes:,} are read")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise InvalidInput(f"cannot read {name} {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if b"\0" in data:
        at = data.index(0)
        raise InvalidInput(f"{name} {path} is a binary file (a NUL byte at offset {at}): give a text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInput(
            f"{name} {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None
    if not text.strip():
        raise InvalidInput(f"{name} {path} is empty")
    return text.removeprefix("\ufeff")  # a byte-order mark some editors write


def read_json(path: str | Path, name: str, max_bytes: int = 256 * 1024**2) -> Any:
    """The JSON value in the file at ``path``, after ``read_text``'s checks; InvalidInput naming ``name``
    and the file when it is not JSON, nests past the decoder's recursion (10,000 brackets are a
    RecursionError, not a JSONDecodeError) or holds an integer of thousands of digits (a ValueError)."""
    text = read_text(path, name, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(
            f"{name} {path} is not JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{name} {path} nests too deeply") from None
    except ValueError:  # past Python's 4,300-digit limit for int()
        raise InvalidInput(f"{name} {path} holds a number of thousands of digits") from None


def writable_file(path: str | Path, name: str) -> Path:
    """``path`` if it is a regular file or absent, and its folder is, or can be made, writable (see
    ``writable_folder``); nothing is created. A folder, FIFO or device in its place is refused: writing
    there would fail after the work, or block."""
    path = Path(path)
    kind = file_kind(path)
    if kind not in ("file", "missing"):
        raise InvalidInput(f"{name} {path} is {kind}: give a file name")
    writable_folder(path.parent, name)
    _check_name_lengths(path.parent, [path.name], name)
    return path


def _check_name_lengths(folder: Path, names: Sequence[str], option: str) -> None:
    """InvalidInput when one of ``names`` (to be made in or under ``folder``) is longer than the file
    system there allows: the write would fail only after the work."""
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except OSError:  # not there yet: the usual limit
        longest = 255
    for part in names:
        if len(os.fsencode(part)) > longest:
            raise InvalidInput(
                f"{option}: a name of {len(part):,} characters is too long (at most {longest})"
            )


def writable_folder(path: str | Path, name: str) -> Path:
    """``path`` if it is, or can be made, a folder this process may write into; nothing is created.

    The nearest existing folder on the way to ``path`` is probed by making (and at once removing) the
    first folder that would be made there, or a temporary one when ``path`` exists; InvalidInput names
    ``name`` when ``path`` or an ancestor is a file, or the probe fails (no permission, a name too long).
    """
    path = Path(path)
    existing = path
    while file_kind(existing) == "missing":  # a name too long to look up counts as missing, never raises
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under {existing}, which is a file"
        raise InvalidInput(f"{name} {path} {what}: give a folder")
    _check_name_lengths(existing, path.relative_to(existing).parts, name)
    first = path  # the first folder that would be made: probing it also catches a name too long
    while first != existing and first.parent != existing:
        first = first.parent
    try:
        if first == existing:
            os.rmdir(tempfile.mkdtemp(prefix=".gpuslice-probe-", dir=existing))
        else:
            os.mkdir(first)
            os.rmdir(first)
    except OSError as err:
        raise InvalidInput(f"{name} {path} cannot be written: {err.strerror or err} in {existing}") from None
    return path


def check_listen_host(host: str) -> None:
    """InvalidInput unless ``host`` (a server's --host) is an address of this machine: bound on an
    ephemeral port and let go at once, before any work, so a mistyped --host leaves nothing behind and
    is never handed to a server that would fail on it (the port itself is tried when the server listens)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError as err:
            raise InvalidInput(bind_refused(host, 0, err)) from None
        except (TypeError, UnicodeError):  # a name the resolver cannot even encode (a label over 63 bytes)
            raise InvalidInput(
                f"--host {host[:100]!r} is not a host name or an address: give 127.0.0.1 (this machine "
                "only), 0.0.0.0 (every interface) or one of its addresses"
            ) from None


def bind_refused(host: str, port: int, err: OSError) -> str:
    """Why ``host``:``port`` cannot be listened on, naming the option that is wrong."""
    if isinstance(err, socket.gaierror):
        return (
            f"--host {host!r} is neither an IP address nor a name this machine resolves ({err.strerror}): "
            "give 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or one of its addresses"
        )
    if err.errno == errno.EADDRNOTAVAIL:
        return (
            f"--host {host} is not an address of this machine: give 127.0.0.1 (this machine only), "
            "0.0.0.0 (every interface) or one of its addresses"
        )
    if err.errno == errno.EACCES:
        return f"--port {port} needs privileges this process lacks ({err.strerror}): pick a port from 1024"
    return f"cannot listen on {host}:{port} ({err.strerror}): check --host and --port"
