"""The MPS daemon's pipe and log folders are private: never a guessable name another local user can make
first, and refused when they exist with another owner, open to others, or as a link."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from gpuslice.node.enforcement import MpsDaemon, MpsUnavailable, mps_dirs


@pytest.fixture
def control_program(tmp_path, monkeypatch):
    """A stand-in nvidia-cuda-mps-control that answers as a running daemon once ``-d`` made its pipe."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-d" ]; then : > "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi\n'
        "read cmd\n"
        'if [ "$cmd" = "quit" ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi\n'
        "exit 0\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _old_guessable_base(state_dir: Path) -> Path:
    """The name earlier versions derived for a deep state dir: anyone could compute and make it first."""
    digest = hashlib.sha1(str(state_dir.resolve() / "mps").encode()).hexdigest()[:12]
    return Path("/tmp") / f"gpuslice-mps-{os.getuid()}-{digest}"


def test_a_deep_state_dir_never_gets_a_folder_another_user_made_first(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    deep = tmp_path / ("d" * 90)
    squatted = _old_guessable_base(deep)
    (squatted / "pipe").mkdir(parents=True)
    try:
        os.chmod(squatted, 0o777)
        os.chmod(squatted / "pipe", 0o777)
        pipe, log = mps_dirs(deep)
        try:
            assert not str(pipe).startswith(str(squatted))
            assert len(str(pipe)) <= 100 and pipe.parent == log.parent
            info = pipe.parent.lstat()
            assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            assert stat.S_IMODE(info.st_mode) == 0o700
            assert mps_dirs(deep) == (pipe, log)  # recorded: server and jobs, and a restarted server, agree
        finally:
            shutil.rmtree(pipe.parent, ignore_errors=True)
    finally:
        shutil.rmtree(squatted, ignore_errors=True)


def test_a_recorded_folder_that_is_gone_or_not_private_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "no-such-runtime-dir"))
    deep = tmp_path / ("d" * 90)
    first, _ = mps_dirs(deep)
    made: list[Path] = [first.parent]
    try:
        first.parent.chmod(0o777)  # someone opened it to others: not used again
        second, _ = mps_dirs(deep)
        made.append(second.parent)
        assert second != first
        shutil.rmtree(second.parent)  # a reboot emptied /tmp
        third, _ = mps_dirs(deep)
        made.append(third.parent)
        assert third.parent.is_dir() and stat.S_IMODE(third.parent.stat().st_mode) == 0o700
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def test_xdg_runtime_dir_is_used_when_it_is_private(tmp_path, monkeypatch):
    runtime = Path(tempfile.mkdtemp(prefix="run-"))  # short, 0700, like /run/user/<uid>
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        pipe, _ = mps_dirs(tmp_path / ("d" * 90))
        assert pipe.parent.parent == runtime
    finally:
        shutil.rmtree(runtime)


def _squat(folder: Path, how: str) -> None:
    if how == "open to all":
        folder.mkdir(parents=True)
        folder.chmod(0o777)
    elif how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("making a folder another user's needs root")
        folder.mkdir(parents=True, mode=0o700)
        os.chown(folder, pwd.getpwnam("nobody").pw_uid, -1)
    elif how == "a link":
        elsewhere = folder.parent.parent / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.symlink_to(elsewhere)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("which", ["mps", "mps/pipe", "mps/log"])
@pytest.mark.parametrize("how", ["open to all", "another user's", "a link"])
def test_the_server_refuses_an_mps_folder_it_does_not_own_alone(tmp_path, control_program, which, how):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _squat(state / which, how)
    daemon = MpsDaemon(state)
    with pytest.raises(MpsUnavailable, match="not private") as refused:
        daemon.start()
    assert str(state / which) in str(refused.value)
    assert not (state / which / "control").exists()  # no daemon was started there


def test_the_server_makes_its_mps_folders_0700(tmp_path, control_program):
    with MpsDaemon(tmp_path / "state") as daemon:
        assert daemon.is_running()
        for folder in (daemon.pipe_dir.parent, daemon.pipe_dir, daemon.log_dir):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
