"""A disk that fails on demand: a FUSE passthrough whose reads, writes and syncs of chosen files answer
EIO while a switch file exists. Root, /dev/fuse, libfuse 3 and mfusepy (the ``test`` extra) are needed.

``python failing_fs.py BACKING MOUNTPOINT SWITCH [NAME_PREFIX]`` mounts BACKING at MOUNTPOINT in the
foreground; while the file SWITCH exists, every read, write, fsync and truncate of a file whose name
starts with NAME_PREFIX (default: gpuslice.db, so the state file with its -wal and -shm) fails with EIO,
as read(2) and write(2) do on a disk with bad sectors. Other files and the listing keep working.

No write-back cache: a write reaches this process at write(2), so the error is the caller's at once
(a block device's page cache would report it only at the next fsync). Locks are left to the kernel.
``mounted`` starts one in the background for a test or a benchmark, and ``available`` says why not.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["available", "mounted"]


def available() -> str | None:
    """None when a failing disk can be mounted here, else why not (a test skips with it)."""
    if os.geteuid() != 0:
        return "mounting FUSE needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (the fuse kernel module, or the container's device)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as err:  # OSError: no libfuse (Debian's fuse3 / libfuse3-3)
        return f"mfusepy or libfuse is missing ({err}); install gpuslice[test] and Debian's fuse3"
    return None


@contextlib.contextmanager
def mounted(root: Path, prefix: str = "gpuslice.db") -> Iterator[tuple[Path, Path]]:
    """Mount a failing disk under ``root``; yields (mount point, switch file). The switch is absent: the
    disk works until the caller creates it."""
    backing, mount, switch = root / "backing", root / "mnt", root / "fail-now"
    backing.mkdir(parents=True, exist_ok=True)
    mount.mkdir(exist_ok=True)
    log = open(root / "failing_fs.log", "wb")  # noqa: SIM115 (the child writes it)
    proc = subprocess.Popen([sys.executable, __file__, str(backing), str(mount), str(switch), prefix],
                            stdout=log, stderr=log)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the failing disk did not mount: {(root / 'failing_fs.log').read_text()}")
            time.sleep(0.05)
        yield mount, switch
    finally:
        switch.unlink(missing_ok=True)
        for umount in (["fusermount3", "-u", "-z", str(mount)], ["umount", "-l", str(mount)]):
            if shutil.which(umount[0]) and subprocess.run(umount, capture_output=True).returncode == 0:
                break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _operations(backing: str, switch: str, prefix: str):
    import mfusepy

    def failing(path: str) -> bool:
        return os.path.basename(path).startswith(prefix) and os.path.exists(switch)

    def eio() -> mfusepy.FuseOSError:
        return mfusepy.FuseOSError(errno.EIO)

    class Passthrough(mfusepy.Operations):
        use_ns = True

        def _full(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def getattr(self, path, fh=None):
            st = os.lstat(self._full(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns",
                    "st_ctime_ns", "st_ino", "st_dev")  # fmt: skip
            found = {k: getattr(st, k) for k in keys}
            for k in ("st_atime", "st_mtime", "st_ctime"):
                found[k] = found.pop(k + "_ns")
            return found

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._full(path))]

        def access(self, path, amode):
            if not os.access(self._full(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)

        def chmod(self, path, mode):
            os.chmod(self._full(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._full(path), uid, gid)

        def mkdir(self, path, mode):
            os.mkdir(self._full(path), mode)

        def rmdir(self, path):
            os.rmdir(self._full(path))

        def unlink(self, path):
            os.unlink(self._full(path))

        def rename(self, old, new):
            os.rename(self._full(old), self._full(new))

        def symlink(self, target, source):
            os.symlink(source, self._full(target))

        def readlink(self, path):
            return os.readlink(self._full(path))

        def utimens(self, path, times=None):
            os.utime(self._full(path), ns=times, follow_symlinks=False)

        def statfs(self, path):
            st = os.statvfs(self._full(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag",
                    "f_frsize", "f_namemax")  # fmt: skip
            return {k: getattr(st, k) for k in keys}

        def open(self, path, flags):
            return os.open(self._full(path), flags)

        def create(self, path, mode, fi=None):
            return os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)  # a later mmap reads it too

        def read(self, path, size, offset, fh):
            if failing(path):
                raise eio()
            return os.pread(fh, size, offset)

        def write(self, path, data, offset, fh):
            if failing(path):
                raise eio()
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            if failing(path):
                raise eio()
            os.truncate(self._full(path), length)

        def flush(self, path, fh):
            if failing(path):
                raise eio()

        def fsync(self, path, datasync, fh):
            if failing(path):
                raise eio()
            os.fsync(fh)

        def release(self, path, fh):
            os.close(fh)

    return Passthrough()


def main() -> None:
    import mfusepy

    backing, mount, switch = sys.argv[1:4]
    prefix = sys.argv[4] if len(sys.argv) > 4 else "gpuslice.db"
    # allow_other: the server may run as another user than root; default_permissions: the kernel checks
    # modes as on a real disk. No kernel_cache/writeback: every write and uncached read comes here.
    mfusepy.FUSE(_operations(os.path.abspath(backing), switch, prefix), mount, foreground=True,
                 nothreads=False, allow_other=True, default_permissions=True)  # fmt: skip


if __name__ == "__main__":
    main()
