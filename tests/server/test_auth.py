"""The token file: created once with mode 0600, reused, refused when others can read it; bearer checks."""

from __future__ import annotations

import os
import stat

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.server.auth import TokenFile, bearer_problem, check_bearer, load_or_create_token, read_token
from gpuslice.server.errors import NotAuthenticated


def test_token_is_created_once_with_mode_0600(tmp_path):
    token = load_or_create_token(tmp_path / "state")
    path = tmp_path / "state" / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 40
    assert load_or_create_token(tmp_path / "state") == token == read_token(tmp_path / "state")


def test_token_readable_by_others_is_refused_with_the_fix(tmp_path):
    load_or_create_token(tmp_path)
    os.chmod(tmp_path / "token", 0o644)
    with pytest.raises(InvalidRequest, match="chmod 600"):
        read_token(tmp_path)


def test_missing_token_says_how_to_start_the_server(tmp_path):
    with pytest.raises(InvalidRequest, match="gpuslice serve --state-dir"):
        read_token(tmp_path)


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Basic abc", "Bearer wrong", "bearer  "],
    ids=["none", "empty", "no token", "basic", "wrong token", "blank token"],
)
def test_bad_bearer_is_refused(header):
    with pytest.raises(NotAuthenticated):
        check_bearer(header, "secret")


def test_right_bearer_passes():
    assert check_bearer("Bearer secret", "secret") is None


def test_a_token_file_that_is_a_link_or_a_fifo_is_refused_without_following_or_blocking(tmp_path):
    real = tmp_path / "elsewhere"
    real.write_text("secret\n")
    os.chmod(real, 0o600)
    (tmp_path / "token").symlink_to(real)
    with pytest.raises(InvalidRequest, match="symbolic link"):
        read_token(tmp_path)
    (tmp_path / "token").unlink()
    os.mkfifo(tmp_path / "token", 0o600)  # a reader of a FIFO would wait for a writer for ever
    with pytest.raises(InvalidRequest, match="not a regular file"):
        read_token(tmp_path)


def test_the_token_file_is_followed_as_it_changes_and_none_while_it_is_gone(tmp_path):
    load_or_create_token(tmp_path)
    watched = TokenFile(tmp_path)
    first = watched.current
    (tmp_path / "token").unlink()
    watched.reload()
    assert watched.current is None and "missing" in watched.problem
    assert bearer_problem(f"Bearer {first}", watched.current).startswith("token rejected")
    fd = os.open(tmp_path / "token", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"second\n")
    os.close(fd)
    watched.reload()
    assert watched.current == "second" and watched.problem == ""


def test_no_bearer_and_a_wrong_bearer_are_told_apart():
    assert "needs 'Authorization: Bearer <token>'" in bearer_problem(None, "secret")
    assert bearer_problem("Bearer nope", "secret").startswith("token rejected")
    assert bearer_problem("Bearer secret", "secret") is None


def test_a_new_state_directory_is_made_with_its_parents_and_readable_by_its_owner_only(tmp_path):
    state = tmp_path / "a" / "b" / "state"
    load_or_create_token(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n", b"two words\n", b"x" * 4097, "tökén".encode()],
    ids=["empty", "blank", "inner space", "over 4 KiB", "not ascii"],
)
def test_a_token_file_that_holds_no_single_token_is_refused(tmp_path, content):
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(0o600)
    with pytest.raises(InvalidRequest):
        read_token(tmp_path)


def test_a_token_file_of_exactly_4_kib_is_still_read(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(b"t" * 4096)
    path.chmod(0o600)
    assert read_token(tmp_path) == "t" * 4096
