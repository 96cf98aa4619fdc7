"""The server user's private files and folders, opened without following links.

A job runs as the server's user and can replace anything in its folder: ``stdout.log`` swapped for a
symbolic link to the server's token or to /etc/shadow, a hard link to the token, a FIFO that blocks
whoever opens it, or the folder itself swapped for a link. Another local user can create a folder the
server means to make first (a squatted name under /tmp). Everyone who opens a job's file goes through
this module: the API's log route (reading, also while following), the supervisor (appending a restarted
job's output) and the launcher (the supervisor's own log); the MPS daemon's folders are made here.

```text
open_folder(path)     the folder: O_DIRECTORY | O_NOFOLLOW; a directory of ours, not writable by others
open_for_reading(p)   p's folder as above, then p's name relative to that descriptor with O_NOFOLLOW and
                      O_NONBLOCK (a FIFO cannot block the open); fstat: a regular file of ours with one
                      link. None when the folder or the file does not exist
open_for_append(p)    the same checks, O_WRONLY | O_CREAT | O_APPEND, mode 0600. A name that fails them (a
                      link the job put there) is removed — the name only, never what it points to — and
                      a new file is made in its place (O_EXCL: a name put back meanwhile is refused)
read_regular(p, n)    at most n bytes of p, which must be a regular file (not a link at its last name, not a
                      FIFO that would block the reader): a report any process may point anywhere
private_folder(path)  made 0700 if missing; if it exists, it must pass open_folder's checks (then it is
                      narrowed to 0700)
```

Every refusal is an ``UnsafeFile`` naming the file and the problem; callers word it (the API answers
409). Standard library only: ``supervisor.py``, run by path with ``python -I``, loads this file by path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "UnsafeFile",
    "open_folder",
    "open_for_append",
    "open_for_reading",
    "private_folder",
    "read_regular",
]

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFile(Exception):
    """A file or folder is not what gpuslice made there: a link, not a regular file, another user's, or
    writable by others. Nothing was read or written through it."""


def _refusal(path: Path | str, info: os.stat_result, *, folder: bool) -> str | None:
    """Why ``info`` (an fstat of ``path``) must not be used, or None if it may."""
    kind = "folder" if folder else "file"
    if not folder and not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file (a FIFO, device or folder put in the log's place)"
    if info.st_uid != os.geteuid():
        return f"{path} belongs to user id {info.st_uid}, not to the server's user ({os.geteuid()})"
    if folder and stat.S_IMODE(info.st_mode) & 0o022:
        return f"the {kind} {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    if not folder and info.st_nlink != 1:
        return f"{path} has {info.st_nlink} names (a hard link to a file outside the job's folder?)"
    return None


def _link_error(err: OSError, path: Path | str) -> UnsafeFile | None:
    """The refusal for an open that failed because of a link or the wrong kind of file, else None."""
    # O_DIRECTORY | O_NOFOLLOW on a link to a folder fails with ENOTDIR, not ELOOP
    if err.errno == errno.ELOOP or (err.errno == errno.ENOTDIR and os.path.islink(path)):
        return UnsafeFile(f"{path} is a symbolic link, and gpuslice does not follow links there")
    if err.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
        return UnsafeFile(f"{path} is not what gpuslice made there ({os.strerror(err.errno)})")
    return None


def open_folder(path: Path | str) -> int:
    """A descriptor of the folder ``path`` (not through a link at its last name); the caller closes it.
    FileNotFoundError when it does not exist, UnsafeFile when it is not a private folder of ours."""
    try:
        fd = os.open(path, _FOLDER_FLAGS)
    except OSError as err:
        raise _link_error(err, path) or err from None
    try:
        reason = _refusal(path, os.fstat(fd), folder=True)
        if reason is not None:
            raise UnsafeFile(reason)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _checked(fd: int, path: Path) -> int:
    """``fd`` (made blocking) if it is a regular file of ours with one name; else closed, UnsafeFile."""
    try:
        reason = _refusal(path, os.fstat(fd), folder=False)
    except BaseException:
        os.close(fd)
        raise
    if reason is not None:
        os.close(fd)
        raise UnsafeFile(reason)
    os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO from blocking the open; the job inherits this
    return fd


def open_for_reading(path: Path | str) -> BinaryIO | None:
    """``path`` opened for reading (binary, unbuffered), or None when it or its folder does not exist."""
    path = Path(path)
    try:
        folder = open_folder(path.parent)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(path.name, _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _link_error(err, path) or err from None
    finally:
        os.close(folder)
    return open(_checked(fd, path), "rb", buffering=0)


def open_for_append(path: Path | str) -> int:
    """A descriptor appending to ``path`` (made 0600 if missing). A name that is not a regular file of
    ours is replaced by a new file, which says so in its first line. UnsafeFile when the folder
    itself is unsafe or the name cannot be replaced; OSError for anything else (no space, no access)."""
    path = Path(path)
    folder = open_folder(path.parent)
    try:
        try:
            fd = os.open(path.name, _APPEND_FLAGS | os.O_CREAT, 0o600, dir_fd=folder)
        except OSError as err:
            refusal = _link_error(err, path)
            if refusal is None:
                raise
        else:
            try:
                return _checked(fd, path)
            except UnsafeFile as err:
                refusal = err
        return _replace(folder, path, refusal)
    finally:
        os.close(folder)


def _replace(folder: int, path: Path, refusal: UnsafeFile) -> int:
    """Remove the name ``path`` in ``folder`` (unlink never follows a link: what it pointed to is left
    alone) and make a new file there; O_EXCL refuses a name the job put back in between."""
    try:
        with contextlib.suppress(FileNotFoundError):
            try:
                os.unlink(path.name, dir_fd=folder)
            except IsADirectoryError:
                os.rmdir(path.name, dir_fd=folder)
        fd = _checked(os.open(path.name, _APPEND_FLAGS | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=folder), path)
    except OSError as err:
        raise UnsafeFile(f"{refusal}, and it cannot be replaced by a new file ({err})") from None
    with contextlib.suppress(OSError):
        os.write(fd, f"gpuslice: {refusal}; replaced by this new file\n".encode())
    return fd


def read_regular(path: Path | str, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of the regular file ``path``; UnsafeFile for a link at its last name, a FIFO,
    a device or a folder (a FIFO would block the open, /dev/zero the read); OSError if it cannot be read."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as err:
        raise _link_error(err, path) or err from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        os.set_blocking(fd, True)
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def private_folder(path: Path | str) -> Path:
    """``path`` (and any missing parent) made 0700; an existing one must be a folder of ours that no one
    else can write, not a link, and is narrowed to 0700. UnsafeFile otherwise."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = open_folder(path)
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path
