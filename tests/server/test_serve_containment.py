"""A real ``gpuslice serve --simulate`` keeps a job's GPUs until its last process has ended, re-adopts a
job's container after a restart, and tells a stopped supervisor from a stopped job, in every containment
mode that works here (the process group is run too, expected to fail: the tests catch its escapes)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from escape_jobs import ESCAPER, MODES, alive, escaper_pid, release


@pytest.fixture
def out(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    yield folder
    release(folder)


def _escaper(out: Path, kind: str, seconds: float, main: str) -> list[str]:
    return [sys.executable, "-c", ESCAPER, str(out), kind, str(seconds), main]


def _wait_pid(out: Path) -> int:
    deadline = time.monotonic() + 30
    while escaper_pid(out) is None:
        assert time.monotonic() < deadline, "the escaper did not start"
        time.sleep(0.05)
    return escaper_pid(out)  # type: ignore[return-value]


@pytest.mark.parametrize("mode", MODES)
def test_a_jobs_gpus_are_not_given_to_the_next_job_while_a_process_of_it_lives(serve, out, mode):
    server = serve("--containment", mode, "--grace", "60s")
    first = server.submit(_escaper(out, "setsid", 3, "exit"), gpus=8)  # its daemon outlives it by 3 s
    pid = _wait_pid(out)
    second = server.submit(["true"], gpus=8)
    while alive(pid):
        jobs = server.jobs()
        assert jobs[second["id"]]["state"] == "PENDING", "the next job got the GPUs while a process held them"
        assert jobs[first["id"]]["state"] == "RUNNING"
        time.sleep(0.2)
    server.wait(lambda: server.jobs()[second["id"]]["state"] == "SUCCEEDED", 30, "the next job to run")
    assert server.jobs()[first["id"]]["state"] == "SUCCEEDED"
    events = server.http.get("/v1/events", params={"job_id": first["id"]}).json()
    assert any(e["kind"] == "containment" and "still running" in e["reason"] for e in events)
    assert any(e["kind"] == "containment" and e["reason"] == mode for e in events)  # the mode, for show


@pytest.mark.parametrize("mode", MODES)
def test_a_restarted_server_cancels_the_whole_container_of_a_job_it_readopted(serve, out, tmp_path, mode):
    server = serve("--containment", mode, "--grace", "1s")
    job = server.submit(_escaper(out, "setsid", 600, "stay"))
    pid = _wait_pid(out)
    server.kill9()
    again = serve("--containment", mode, "--grace", "1s", state_dir=server.state_dir)
    r = again.http.post(f"/v1/jobs/{job['id']}/cancel", headers=again.auth)
    assert r.status_code == 200, r.text
    again.wait(lambda: again.jobs()[job["id"]]["state"] == "CANCELLED", 30, "the cancel")
    assert not alive(pid), "the re-adopted job is CANCELLED, yet its setsid child runs"


@pytest.mark.parametrize("mode", MODES)
def test_a_job_whose_supervisor_died_while_the_server_was_down_leaves_no_process(serve, out, mode):
    server = serve("--containment", mode, "--grace", "1s")
    job = server.submit(_escaper(out, "setsid", 600, "stay"))
    pid = _wait_pid(out)
    supervisor = server.jobs()[job["id"]]["pid"]
    server.kill9()
    os.kill(supervisor, signal.SIGKILL)
    again = serve("--containment", mode, "--grace", "1s", state_dir=server.state_dir)
    again.wait(lambda: again.jobs()[job["id"]]["state"] == "FAILED", 30, "the job to be found lost")
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the lost job's setsid child still runs"


def _children(parent: int) -> set[int]:
    children: set[int] = set()
    for task in Path(f"/proc/{parent}/task").iterdir():
        children.update(int(p) for p in (task / "children").read_text().split())
    return children


def _wait_exited_children(parent: int, timeout: float = 30.0) -> None:
    """Until every child of ``parent`` has exited (a zombie its stopped parent has not reaped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = _children(parent)
        states = []
        for child in children:
            try:
                states.append(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # gone
        if children and all(state == "Z" for state in states):
            return
        time.sleep(0.05)
    raise AssertionError(f"a child of {parent} still runs after {timeout:g} s")


def test_cancel_with_a_stopped_supervisor_answers_at_once_and_the_true_exit_is_recorded(serve, tmp_path):
    server = serve("--grace", "30s")
    flag = tmp_path / "go"
    job = server.submit(["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exit 0"])
    server.wait(lambda: server.jobs()[job["id"]]["pid"] is not None, 30, "the job to start")
    supervisor = server.jobs()[job["id"]]["pid"]
    # its pid is known once the supervisor runs; on a loaded machine the job may not be forked yet
    server.wait(lambda: bool(_children(supervisor)), 30, "the supervisor to start the job")
    os.kill(supervisor, signal.SIGSTOP)
    try:
        flag.touch()  # the job exits 0 while its supervisor cannot see it
        _wait_exited_children(supervisor)  # on a loaded machine the job's loop may take a while to see it
        began = time.monotonic()
        r = server.http.post(f"/v1/jobs/{job['id']}/cancel", headers=server.auth)
        assert r.status_code == 200 and time.monotonic() - began < 5, r.text
        assert (r.json()["state"], r.json()["stopping"]) == ("RUNNING", "cancel")
        events = server.http.get("/v1/events", params={"job_id": job["id"]}).json()
        assert any("is stopped, no answer" in e["reason"] for e in events), events
    finally:
        os.kill(supervisor, signal.SIGCONT)
    server.wait(lambda: server.jobs()[job["id"]]["state"] != "RUNNING", 30, "the exit to be recorded")
    final = server.jobs()[job["id"]]
    assert (final["state"], final["exit_code"]) == ("SUCCEEDED", 0), final["reason"]
