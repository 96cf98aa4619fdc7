"""The quota hole against a real ``gpuslice serve --simulate dgx-h100``: memory-only shares under max_gpus.

One run: a fresh server; tenant ml gets ``max_gpus: 1``; another team (vision) fills the 8 GPUs with
low-priority whole-GPU jobs; ml submits four high-priority memory-only shares of 54 GiB (0.675 of an
80 GiB H100 each). A run fails when, once the queue has settled, ml holds more than its quota
(``gpus_in_use`` > 1, or more than one share running), when ml's usage is not the memory fraction its
share denies others, or when more than one vision job was preempted for ml. Before the one
GPU-equivalent (workload/equivalent.py) every run failed: the four shares counted 0.004 GPUs, ran, and
preempted four vision jobs.

``quota_hole(root, runs)`` returns {"runs", "failures", "details"}; serve_chaos.py may call it.
Usage: ``.venv/bin/python benchmarks/chaos_quota.py [--runs 3]``; exit status 1 if any run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from serve_chaos import Server, _kill_jobs

SHARE = 0.675  # of a GPU's memory, per ml share
SETTLE_SECONDS = 30.0


def _one(state_dir: Path) -> str:
    """One run; "" when it holds, else what went wrong."""
    state_dir.mkdir(parents=True)
    server = Server(state_dir)
    server.start()
    try:
        http = server.http
        http.put("/v1/tenants/ml", json={"max_gpus": 1}).raise_for_status()
        gpu_bytes = http.get("/v1/gpus").json()[0]["memory_total_bytes"]
        for i in range(8):
            body = {"command": ["sleep", "120"], "tenant": "vision", "priority": "low"}
            server.submit(body, f"vision-{i}")
        _wait(lambda: sum(j["state"] == "RUNNING" for j in server.jobs().values()) == 8, "vision to start")
        for i in range(4):
            memory = int(SHARE * gpu_bytes)
            body = {"command": ["sleep", "120"], "tenant": "ml", "priority": "high", "memory": memory}
            server.submit(body, f"ml-{i}")

        def settled() -> bool:
            jobs = list(server.jobs().values())
            ml = [j for j in jobs if j["tenant"] == "ml"]
            stopping = any(j["stopping"] for j in jobs)
            return not stopping and sum(j["state"] == "RUNNING" for j in ml) >= 1

        _wait(settled, "ml's first share to start")
        time.sleep(2.0)  # a few more passes: a hole would start (and preempt for) the other shares now
        jobs = list(server.jobs().values())
        ml_running = sum(j["tenant"] == "ml" and j["state"] == "RUNNING" for j in jobs)
        usage = next(t for t in http.get("/v1/tenants").json() if t["name"] == "ml")
        events = http.get("/v1/events", params={"limit": 10_000}).json()
        preempted = {e["job_id"] for e in events if e["reason"].startswith("preempted for job")}
        problems = []
        if ml_running > 1 or usage["gpus_in_use"] > 1 + 1e-9:
            problems.append(f"ml runs {ml_running} shares, {usage['gpus_in_use']} GPUs under max_gpus 1")
        if abs(usage["gpus_in_use"] - SHARE * ml_running) > 1e-3:
            problems.append(f"gpus_in_use {usage['gpus_in_use']} for {ml_running} shares of 0.675")
        if len(preempted) > 1:
            problems.append(f"{len(preempted)} vision jobs preempted for ml")
        return "; ".join(problems)
    finally:
        with contextlib.suppress(httpx.TransportError):
            for job in server.jobs().values():
                if job["state"] in ("PENDING", "RUNNING"):
                    server.http.post(f"/v1/jobs/{job['id']}/cancel")
        server.kill9()
        _kill_jobs(state_dir)


def _wait(ready: Any, what: str) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError, ValueError):
            if ready():
                return
        time.sleep(0.2)
    raise TimeoutError(f"waited {SETTLE_SECONDS:g} s for {what}")


def quota_hole(root: Path, runs: int = 3) -> dict[str, Any]:
    """``runs`` runs of the scenario (module docstring) under ``root``: runs, failures, and each failure."""
    details = []
    for n in range(runs):
        try:
            problem = _one(root / f"quota-{n}" / "state")
        except TimeoutError as err:
            problem = str(err)
        if problem:
            details.append(f"run {n}: {problem}")
    return {"runs": runs, "failures": len(details), "details": details}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuslice-quota-") as tmp:
        result = quota_hole(Path(tmp), args.runs)
    print(f"quota hole: {result['failures']} of {result['runs']} runs failed")
    for line in result["details"]:
        print(f"  {line}")
    raise SystemExit(1 if result["failures"] else 0)


if __name__ == "__main__":
    main()
