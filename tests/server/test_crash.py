"""Acceptance: ``kill -9`` the server while jobs run and finish; after a restart every job has
the right state and exit code, and none is lost or run twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


RESTART_ONCE = {"restart": "on-failure", "max_restarts": 1}
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_kill_9_with_jobs_running_and_finishing_loses_and_duplicates_nothing(serve, tmp_path):
    first = serve("--grace", "2s")
    # Jobs run until the test lets them go, not for a fixed time: on a loaded machine the jobs may take
    # longer to all start, and the second server longer to come up, than any fixed sleep would last.
    down, release = tmp_path / "down", tmp_path / "release"

    def until(gate: Path, then: str = "") -> list[str]:
        return sh(f"echo run; while [ ! -e {gate} ]; do sleep 0.1; done; {then}")

    plan = {
        # name: (command, body, expected state, expected exit code)
        "ends-ok-while-down": (until(down), {}, "SUCCEEDED", 0),
        "fails-while-down": (until(down, "exit 3"), {}, "FAILED", 3),
        "outlives-the-restart": (until(release), {}, "SUCCEEDED", 0),
        "restarts-after-failing": (until(down, "exit 5"), RESTART_ONCE, "FAILED", 5),
        # Runs when cancelled: the command's own exit code, 128 + SIGTERM (shell convention).
        "cancelled-while-running": (sh("echo run; sleep 30"), {}, "CANCELLED", 143),
        "waits-for-all-gpus": (sh("echo run"), {"gpus": 8}, "SUCCEEDED", 0),
        # Needs every GPU, so it is still queued when cancelled: no process, no exit code.
        "cancelled-while-queued": (sh("echo run; sleep 30"), {"gpus": 8}, "CANCELLED", None),
    }  # fmt: skip
    ids = {name: first.submit(cmd, **body)["id"] for name, (cmd, body, _, _) in plan.items()}
    running = ["ends-ok-while-down", "fails-while-down", "outlives-the-restart", "restarts-after-failing",
               "cancelled-while-running"]  # fmt: skip
    first.wait(lambda: all(first.jobs()[ids[n]]["state"] == "RUNNING" for n in running), 30, "jobs to start")
    started = first.state_dir / "jobs" / ids["cancelled-while-running"] / "stdout.log"
    first.wait(lambda: started.exists() and "run" in started.read_text(), 30, "the command to print")
    for name in ("cancelled-while-queued", "cancelled-while-running"):
        assert first.http.post(f"/v1/jobs/{ids[name]}/cancel", headers=first.auth).status_code == 200
    assert first.jobs()[ids["cancelled-while-queued"]]["state"] == "CANCELLED"
    pids = {n: first.jobs()[ids[n]]["pid"] for n in running}

    first.kill9()
    down.touch()
    time.sleep(3.5)  # three jobs end while no server is there to see it

    second = serve("--grace", "2s", state_dir=first.state_dir)
    back = second.jobs()
    assert back[ids["outlives-the-restart"]]["state"] == "RUNNING"
    assert back[ids["outlives-the-restart"]]["pid"] == pids["outlives-the-restart"]  # adopted, not relaunched
    release.touch()
    second.wait(lambda: all(j["state"] in ENDED for j in second.jobs().values()), 30, "every job to end")

    final = second.jobs()
    assert sorted(final) == sorted(ids.values())  # none lost, none added
    for name, (_, _, state, code) in plan.items():
        job = final[ids[name]]
        assert (job["state"], job["exit_code"]) == (state, code), (name, job)
        log = first.state_dir / "jobs" / job["id"] / "stdout.log"
        runs = log.read_text().count("run") if log.exists() else 0
        assert runs == job["attempts"], (name, job)  # every launch ran its command once, no more
        assert runs == {"restarts-after-failing": 2, "cancelled-while-queued": 0}.get(name, 1), name
    assert final[ids["restarts-after-failing"]]["attempts"] == 2
