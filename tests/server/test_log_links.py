"""A job that swaps its log for a link gets its log read refused (409, with the reason), and nothing
outside its folder reaches a reader: with --public-reads, with the dashboard's read-only cookie, and
with the token itself."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from gpuslice.server.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for its httpx2 fork
    from fastapi.testclient import TestClient

TOKEN = "log-links-token"
SHADOW = "root:$6$stand-in-for-etc-shadow:19000:0:99999:7:::\n"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The daemon's state dir (tmp_path) with its token file, beside a 0600 stand-in for /etc/shadow."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    shadow = tmp_path.parent / f"{tmp_path.name}-shadow"
    shadow.write_text(SHADOW)
    shadow.chmod(0o600)
    return tmp_path


def _reader(app, how: str) -> TestClient:
    """A client that reads as ``how``: anonymously (--public-reads), with the read-only cookie, or with
    the token."""
    client = TestClient(app, follow_redirects=False)
    if how == "cookie":
        assert client.get("/?token=sign-in").status_code == 303  # leaves the read-only cookie
    elif how == "token":
        client.headers["Authorization"] = f"Bearer {TOKEN}"
    return client


TARGETS = ["../../token", "shadow", "another job's log"]
READERS = ["public", "cookie", "token"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("how", READERS)
@pytest.mark.parametrize("follow", [False, True])
def test_a_log_swapped_for_a_link_is_refused_and_its_target_never_served(daemon, state, target, how, follow):
    app = create_app(daemon, TOKEN, public_reads=how == "public", sign_in_token="sign-in")
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as owner:
        victim = owner.post("/v1/jobs", json={"command": ["echo", "victim"]}).json()["id"]
        job = owner.post("/v1/jobs", json={"command": ["sh", "-c", "ln -sf ../../token stdout.log"]}).json()
    folder = state / "jobs" / job["id"]
    folder.mkdir(parents=True, mode=0o700)
    secret = TOKEN
    if target == "shadow":
        link = str(state.parent / f"{state.name}-shadow")
        secret = SHADOW.strip()
    elif target == "another job's log":
        other = state / "jobs" / victim
        other.mkdir(parents=True, mode=0o700)
        (other / "stdout.log").write_text("the other job's private output\n")
        link = f"../{victim}/stdout.log"
        secret = "the other job's private output"
    else:
        link = target
    (folder / "stdout.log").symlink_to(link)
    (folder / "stderr.log").write_text("fine\n")
    with _reader(app, how) as reader:
        r = reader.get(f"/v1/jobs/{job['id']}/logs", params={"follow": follow})
        assert r.status_code == 409, r.text
        assert r.json()["type"] == "JobLogRefused"
        assert "symbolic link" in r.json()["detail"] and "stdout" in r.json()["detail"]
        assert secret not in r.text
        # the other stream alone is still the job's own
        assert reader.get(f"/v1/jobs/{job['id']}/logs", params={"stream": "stderr"}).text == "fine\n"
        # what a reader saw cannot write: there is nothing of the token to steal
        stolen = {"Authorization": f"Bearer {r.text}"}
        assert reader.post("/v1/jobs", json={"command": ["x"]}, headers=stolen).status_code == 401


def test_a_hard_link_to_the_token_and_a_fifo_are_refused_too(daemon, state):
    app = create_app(daemon, TOKEN, public_reads=True)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        ids = [client.post("/v1/jobs", json={"command": ["true"]}).json()["id"] for _ in range(2)]
        for job_id, make in zip(ids, ("hard link", "fifo"), strict=True):
            folder = state / "jobs" / job_id
            folder.mkdir(parents=True, mode=0o700)
            if make == "hard link":
                os.link(state / "token", folder / "stdout.log")
            else:
                os.mkfifo(folder / "stdout.log")  # a plain open would wait here for ever
            r = client.get(f"/v1/jobs/{job_id}/logs")
            assert r.status_code == 409 and TOKEN not in r.text, r.text
