"""The token file: created once with mode 0600, reused, refused when others can read it; bearer checks."""

from __future__ import annotations

import os
import stat

import pytest

from gpuslice.errors import InvalidRequest
from gpuslice.server.auth import check_bearer, load_or_create_token, read_token
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
