"""The token file: created once with mode 0600, reused, refused when others can read it; bearer checks."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.server.auth import (
    POLL_SECONDS,
    TokenFile,
    bearer_problem,
    check_bearer,
    load_or_create_token,
    read_token,
)
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
    with pytest.raises(InvalidRequest, match="gpuslice serve --state-dir") as refused:
        read_token(tmp_path)
    # the client prints this line as it is: the command to run and the variable's name, exactly
    assert str(refused.value) == (
        f"no token at {tmp_path / 'token'}: start the server with `gpuslice serve --state-dir {tmp_path}` "
        "or set GPUSLICE_TOKEN"
    )


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
    outcome: list[BaseException] = []

    def read():
        try:
            read_token(tmp_path)
        except BaseException as err:  # handed to the test's thread
            outcome.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)  # generous: a read that does not block returns at once
    blocked = reader.is_alive()
    if blocked:  # let the blocked open go on (a writer arrives), so that no thread is left behind
        os.close(os.open(tmp_path / "token", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert not blocked, "reading a FIFO in the token file's place waited for a writer"
    assert isinstance(outcome[0], InvalidRequest) and "not a regular file" in str(outcome[0])


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


@pytest.mark.parametrize("header", ["nope", "Token nope", "Basic bm9wZQ==", "Bearer", "Bearer  "])
def test_a_token_sent_without_its_bearer_scheme_is_rejected_not_told_it_is_missing(header):
    problem = bearer_problem(header, "secret")
    # the 401's detail as the client shows it: how the header must read and where the token is
    assert problem == (
        "token rejected: the Authorization header must read 'Bearer <token>', with the token from the "
        "server's state directory (file 'token') or GPUSLICE_TOKEN"
    )
    assert "needs" not in problem and "secret" not in problem
    assert bearer_problem("   ", "secret").startswith("this call needs")


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
    with pytest.raises(InvalidRequest, match="does not hold one token; delete it"):
        read_token(tmp_path)


def test_a_huge_token_file_is_refused_without_reading_it_into_memory(tmp_path):
    """A sparse 1 GiB file read whole would need 1 GiB of memory; under an address-space limit of 256 MiB
    more than the process has, the read must stop after 4 KiB and refuse the file."""
    path = tmp_path / "token"
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    path.chmod(0o600)
    program = textwrap.dedent(
        """
        import re, resource, sys
        from gpuslice.errors import InvalidRequest
        from gpuslice.server.auth import read_token
        size = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (256 << 20), resource.RLIM_INFINITY))
        try:
            read_token(sys.argv[1])
        except InvalidRequest as err:
            print(err)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "does not hold one token" in done.stdout
    with pytest.raises(InvalidRequest, match="does not hold one token"):  # and here, as the server reads it
        read_token(tmp_path)


def test_a_token_file_of_exactly_4_kib_is_still_read(tmp_path):
    path = tmp_path / "token"
    path.write_bytes(b"t" * 4096)
    path.chmod(0o600)
    assert read_token(tmp_path) == "t" * 4096


def test_a_new_token_is_256_bits_as_43_urlsafe_characters(tmp_path):
    token = load_or_create_token(tmp_path)
    assert len(token) == 43
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert (tmp_path / "token").read_text() == token + "\n"


def test_a_state_directory_that_is_a_file_is_refused_as_unreadable(tmp_path):
    (tmp_path / "state").write_text("not a folder\n")
    with pytest.raises(InvalidRequest, match="cannot be read"):
        read_token(tmp_path / "state")


def test_a_token_file_of_another_user_is_refused(tmp_path, monkeypatch):
    load_or_create_token(tmp_path)
    owner = (tmp_path / "token").stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(InvalidRequest, match=f"belongs to user id {owner}"):
        read_token(tmp_path)


@pytest.mark.parametrize("mode", [0o640, 0o620, 0o610, 0o604, 0o602, 0o601])
def test_a_token_file_any_group_or_other_bit_is_refused(tmp_path, mode):
    load_or_create_token(tmp_path)
    os.chmod(tmp_path / "token", mode)
    with pytest.raises(InvalidRequest, match="chmod 600"):
        read_token(tmp_path)


@pytest.mark.parametrize(
    "header",
    ["Bearer secret", "bearer secret", "BEARER secret", "Bearer  secret", "Bearer secret "],
    ids=["canonical", "lower-case scheme", "upper-case scheme", "two spaces", "trailing blank"],
)
def test_the_bearer_scheme_is_case_insensitive_and_blanks_around_the_token_are_ignored(header):
    # RFC 7235: the scheme is case-insensitive; RFC 6750: one or more spaces before the token
    assert bearer_problem(header, "secret") is None


def test_a_bearer_with_no_token_on_the_server_is_rejected_and_says_the_file_is_unusable():
    assert "no usable token file" in bearer_problem("Bearer secret", None)
    with pytest.raises(NotAuthenticated, match="no usable token file"):
        check_bearer("Bearer secret", None)
    assert bearer_problem(None, None) == bearer_problem("", "secret")  # told it needs a bearer first


def _replace_token(path, text):
    replacement = path.with_name("token.new")
    replacement.write_text(text)
    replacement.chmod(0o600)
    os.replace(replacement, path)  # a new inode: the watcher sees it whatever the clock's resolution


def test_polling_reads_the_file_again_only_when_it_changed(tmp_path):
    load_or_create_token(tmp_path)
    watched = TokenFile(tmp_path)
    assert watched.poll() is False and watched.poll() is False
    _replace_token(tmp_path / "token", "second\n")
    assert watched.poll() is True and watched.current == "second"
    assert watched.poll() is False
    os.chmod(tmp_path / "token", 0o644)
    assert watched.poll() is True and watched.current is None and "chmod 600" in watched.problem
    (tmp_path / "token").unlink()
    assert watched.poll() is True and "missing" in watched.problem
    assert watched.poll() is False


def test_a_token_file_swapped_for_a_link_to_itself_is_noticed_and_refused(tmp_path):
    load_or_create_token(tmp_path)
    watched = TokenFile(tmp_path)
    os.rename(tmp_path / "token", tmp_path / "elsewhere")  # same inode, size, mtime and mode
    (tmp_path / "token").symlink_to(tmp_path / "elsewhere")
    assert watched.poll() is True
    assert watched.current is None and "symbolic link" in watched.problem


def test_changes_are_logged_without_the_token_and_the_first_read_and_unchanged_reads_are_not(
    tmp_path, caplog
):
    token = load_or_create_token(tmp_path)
    with caplog.at_level(logging.WARNING, logger="gpuslice.server"):
        watched = TokenFile(tmp_path)
        watched.reload()
        assert caplog.records == []
        _replace_token(tmp_path / "token", "second\n")
        watched.reload()
        (tmp_path / "token").unlink()
        watched.reload()
        watched.reload()
    messages = [record.getMessage() for record in caplog.records]
    # each line says it is about the token, for an operator searching the log
    path = tmp_path / "token"
    assert messages == [
        f"token: read again from {path}; the previous one is refused",
        f"token: the token file {path} is missing",
    ]
    assert not any(token in m or "second" in m for m in messages)


def test_the_watcher_follows_the_file_and_stops(tmp_path):
    load_or_create_token(tmp_path)
    watched = TokenFile(tmp_path, poll_seconds=0.01)
    watched.stop()  # stopping a watcher that never started is harmless
    watched = TokenFile(tmp_path, poll_seconds=0.01)
    watched.start()
    try:
        thread = next(t for t in threading.enumerate() if t.name == "gpuslice-token")
        assert thread.daemon  # never holds up the server's exit
        _replace_token(tmp_path / "token", "second\n")
        deadline = time.monotonic() + 10  # generous: only a stalled machine takes more than a poll
        while watched.current != "second" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watched.current == "second"
    finally:
        watched.stop()
    assert not thread.is_alive()


def test_a_replaced_token_takes_effect_within_a_second():
    assert 0 < POLL_SECONDS <= 1
