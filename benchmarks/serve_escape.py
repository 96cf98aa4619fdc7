"""``gpuslice serve`` against jobs that try to outlive themselves, in each containment mode; and what
containment costs.

Setup: a real ``gpuslice serve --simulate dgx-h100 --containment MODE --grace 1s`` per mode, on a free
port with a fresh state dir. The escaping jobs are ``tests/escape_jobs.py``'s program (read from there).

1. Escapes, ``--runs`` times each, per mode (failures counted per scenario):
   - setsid daemon: an 8-GPU job whose main process exits 0 leaving a setsid daemon that ignores SIGTERM;
     then a second 8-GPU job. A failure: the second job starts, or the first is recorded ended, while the
     daemon lives.
   - setsid child on cancel: a running job with a setsid child is cancelled; a failure: the child lives
     once the job is CANCELLED.
   - re-forker on cancel: a process that ignores SIGTERM and forks a new child every millisecond (its
     parent exiting); a failure: it still beats 1 s after the job is CANCELLED.
   - double fork: the main process exits 0 after a double-forked daemon; a failure: the daemon lives
     once the job has ended.
2. Cost, with the best mode here and with ``pgroup`` (the process-group way, no containment), side by
   side: submit→start p50 / p99 over ``--probes`` one-GPU ``true`` jobs submitted one at a time (the
   server's started_at − submitted_at), and the throughput of ``--jobs`` one-GPU ``true`` jobs submitted
   at once (jobs per second, first submit to last end).

Usage: ``.venv/bin/python benchmarks/serve_escape.py [--runs 20] [--probes 50] [--jobs 1000]
[--modes cgroup2,cgroup1,subreaper,pgroup] [--markdown FILE]`` (FILE: benchmarks/out/serve_escape.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from gpuslice.node import containment

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
out = Console(highlight=False)


def _escaper_source() -> str:
    """ESCAPER from tests/escape_jobs.py, the same program the tests run."""
    namespace: dict[str, Any] = {}
    exec((ROOT / "tests" / "escape_jobs.py").read_text(), namespace)
    return str(namespace["ESCAPER"])


ESCAPER = _escaper_source()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, mode: str, root: Path) -> None:
        self.state_dir = root / f"state-{mode}"
        self.port = free_port()
        command = [str(BIN / "gpuslice"), "serve", "--simulate", "dgx-h100", "--state-dir",
                   str(self.state_dir), "--port", str(self.port), "--grace", "1s",
                   "--containment", mode]  # fmt: skip
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/v1/health").status_code == 200:
                    token = (self.state_dir / "token").read_text().strip()
                    self.http.headers["Authorization"] = f"Bearer {token}"
                    return
            time.sleep(0.2)
        raise SystemExit(f"the {mode} server did not start in 120 s")

    def submit(self, command: list[str], gpus: int = 1, **body: Any) -> str:
        r = self.http.post("/v1/jobs", json={"command": command, "gpus": gpus, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/v1/jobs/{job_id}").json())

    def wait(self, job_id: str, states: set[str], timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.05)
        raise SystemExit(f"job {job_id} did not reach {states} in {timeout} s: {self.job(job_id)}")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _escaper(folder: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int((folder / "escaper").read_text())
        time.sleep(0.02)
    raise SystemExit(f"no escaper started in {folder}")


def _beating(folder: Path, seconds: float = 1.0) -> bool:
    before = (folder / "beat").stat().st_mtime_ns
    time.sleep(seconds)
    return (folder / "beat").stat().st_mtime_ns != before


def _release(folder: Path) -> None:
    """Whatever escaped: the re-forker stops by its file, a daemon by its PID."""
    (folder / "stop").touch()
    with contextlib.suppress(OSError, ValueError, ProcessLookupError):
        os.kill(int((folder / "escaper").read_text()), 9)


def _program(folder: Path, kind: str, seconds: float, main: str) -> list[str]:
    folder.mkdir(parents=True)
    return [sys.executable, "-c", ESCAPER, str(folder), kind, str(seconds), main]


def setsid_daemon(server: Server, folder: Path) -> bool:
    first = server.submit(_program(folder, "setsid", 600, "exit"), gpus=8)
    pid = _escaper(folder)
    second = server.submit(["true"], gpus=8)
    failed = False
    while True:
        a, b = server.job(first), server.job(second)
        if _alive(pid) and (b["started_at"] is not None or a["state"] in ENDED):
            failed = True
        if a["state"] in ENDED and b["state"] in ENDED:
            return failed
        if failed:
            _release(folder)
        time.sleep(0.05)


def cancel_setsid_child(server: Server, folder: Path) -> bool:
    job = server.submit(_program(folder, "setsid", 600, "stay"))
    pid = _escaper(folder)
    server.http.post(f"/v1/jobs/{job}/cancel")
    server.wait(job, ENDED)
    return _alive(pid)


def cancel_reforker(server: Server, folder: Path) -> bool:
    job = server.submit(_program(folder, "refork", 0, "stay"))
    _escaper(folder)
    server.http.post(f"/v1/jobs/{job}/cancel")
    server.wait(job, ENDED)
    return _beating(folder)


def double_fork(server: Server, folder: Path) -> bool:
    job = server.submit(_program(folder, "double", 600, "exit"))
    pid = _escaper(folder)
    server.wait(job, ENDED)
    return _alive(pid)


SCENARIOS = {
    "setsid daemon (GPUs reused?)": setsid_daemon,
    "setsid child on cancel": cancel_setsid_child,
    "re-forker on cancel": cancel_reforker,
    "double fork": double_fork,
}


def escapes(mode: str, runs: int, root: Path) -> dict[str, int]:
    server = Server(mode, root)
    failures = dict.fromkeys(SCENARIOS, 0)
    try:
        for name, scenario in SCENARIOS.items():
            for i in range(runs):
                folder = root / f"{mode}-{scenario.__name__}-{i}"
                try:
                    failures[name] += bool(scenario(server, folder))
                finally:
                    _release(folder)
            out.print(f"  {mode}: {name}: {failures[name]} of {runs} failed")
    finally:
        server.stop()
    return failures


def cost(mode: str, probes: int, jobs: int, root: Path) -> tuple[float, float, float]:
    """(submit→start p50 s, p99 s, jobs per second) with ``mode``."""
    server = Server(mode, root / "cost")
    try:
        latencies = []
        for _ in range(probes):
            job = server.wait(server.submit(["true"], priority="high"), ENDED)
            latencies.append(job["started_at"] - job["submitted_at"])
        latencies.sort()
        began = time.perf_counter()
        ids = [server.submit(["true"]) for _ in range(jobs)]
        for job_id in ids:
            server.wait(job_id, ENDED, timeout=3600)
        rate = jobs / (time.perf_counter() - began)
    finally:
        server.stop()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return pick(0.5), pick(0.99), rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each escape scenario, per mode")
    parser.add_argument("--probes", type=int, default=50, help="jobs for submit→start latency, per mode")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs for the throughput, per mode")
    working = []
    for mode in ("cgroup2", "cgroup1", "systemd", "subreaper"):
        with contextlib.suppress(containment.ContainmentUnavailable):
            working.append(containment.detect(mode))
    parser.add_argument("--modes", default=",".join([*working, "pgroup"]), help="modes to run the escapes in")
    parser.add_argument("--markdown", type=Path, default=Path("benchmarks/out/serve_escape.md"))
    args = parser.parse_args()
    modes = args.modes.split(",")
    best = containment.detect()
    with tempfile.TemporaryDirectory(prefix="gpuslice-escape-") as tmp:
        root = Path(tmp)
        table = Table("scenario", *[f"{m}: failed / runs" for m in modes], title="escapes")
        found = {}
        for mode in modes:
            out.print(f"escapes, containment {mode} ({args.runs} runs each)")
            found[mode] = escapes(mode, args.runs, root / mode)
        for name in SCENARIOS:
            table.add_row(name, *[f"{found[m][name]} / {args.runs}" for m in modes])
        out.print(table)
        costs = {}
        for mode in (best, "pgroup"):
            out.print(f"cost, containment {mode}: {args.probes} probes, {args.jobs} jobs")
            costs[mode] = cost(mode, args.probes, args.jobs, root / f"cost-{mode}")
    load = os.getloadavg()[0]
    lines = [
        "## gpuslice serve: escaping jobs and the cost of containment",
        "",
        f"`.venv/bin/python benchmarks/serve_escape.py --runs {args.runs} --probes {args.probes} --jobs "
        f"{args.jobs} --modes {args.modes}` on {platform.node()} ({os.cpu_count()} CPUs, Linux "
        f"{platform.release()}, Python {platform.python_version()}), {time.strftime('%Y-%m-%d')}, 1-minute "
        f"load average {load:.1f} at the end; server `--simulate dgx-h100 --grace 1s`.",
        "",
        "| scenario | " + " | ".join(f"{m}: failed / runs" for m in modes) + " |",
        "|---|" + "---:|" * len(modes),
    ]
    for name in SCENARIOS:
        lines.append(f"| {name} | " + " | ".join(f"{found[m][name]} / {args.runs}" for m in modes) + " |")
    lines += [
        "",
        "| containment | submit→start p50 (ms) | p99 (ms) | throughput (jobs/s) |",
        "|---|---:|---:|---:|",
    ]
    for mode, (p50, p99, rate) in costs.items():
        lines.append(f"| {mode} | {p50 * 1000:.0f} | {p99 * 1000:.0f} | {rate:.1f} |")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text("\n".join(lines) + "\n")
    out.print("\n".join(lines))


if __name__ == "__main__":
    main()
