"""``gpuslice serve`` benchmark: submit throughput through the API, submit-to-start latency with 1,000
jobs pending, and the server's memory at rest.

Setup: a real ``gpuslice serve --simulate dgx-h100`` process on a free port with a fresh state dir.
1. RSS at rest: the server process (psutil) after start-up, before any job.
2. A blocker holds GPUs 0–6 (``sleep``); then ``--pending`` jobs of 8 GPUs each are submitted, one
   HTTP call at a time (sequential throughput), and another batch from ``--threads`` clients at once
   (concurrent throughput). None of them can start, so the queue holds them all.
3. ``--probes`` high-priority 1-GPU jobs (``true``) are submitted one at a time; each starts on GPU 7
   ahead of the pending ones. Latency = the job's started_at − submitted_at as the server recorded
   them (both on the server's clock), p50 / p99 / max.
4. RSS again, with the queue full.

Usage: ``.venv/bin/python benchmarks/serve.py [--pending 1000] [--probes 200] [--markdown FILE]``
(FILE defaults to benchmarks/out/serve.md).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(state_dir: Path, port: int) -> subprocess.Popen[bytes]:
    command = [str(BIN / "gpuslice"), "serve", "--simulate", "dgx-h100", "--state-dir", str(state_dir),
               "--port", str(port), "--grace", "2s"]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        for _ in range(200):
            try:
                if http.get("/v1/health").status_code == 200:
                    return proc
            except httpx.TransportError:
                time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start in 20 s")


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def submit_many(url: str, token: str, n: int, threads: int, progress: Progress, label: str) -> float:
    """Submit ``n`` 8-GPU jobs from ``threads`` clients; returns jobs per second."""
    task = progress.add_task(label, total=n)
    body = {"command": ["sleep", "1"], "gpus": 8, "priority": "normal"}
    per_thread = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]

    def run(count: int) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            for _ in range(count):
                r = http.post("/v1/jobs", json=body)
                assert r.status_code == 201, r.text
                progress.advance(task)

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, per_thread))
    return n / (time.perf_counter() - start)


def probe_latencies(http: httpx.Client, probes: int, progress: Progress) -> list[float]:
    task = progress.add_task("submit → start (probes)", total=probes)
    out = []
    for _ in range(probes):
        job = http.post("/v1/jobs", json={"command": ["true"], "gpus": 1, "priority": "high"}).json()
        while True:
            got = http.get(f"/v1/jobs/{job['id']}").json()
            if got["started_at"] is not None:
                out.append(got["started_at"] - got["submitted_at"])
                break
            time.sleep(0.002)
        while http.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING":  # GPU 7 free again
            time.sleep(0.005)
        progress.advance(task)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=1000, help="jobs kept pending (split in two batches)")
    parser.add_argument("--threads", type=int, default=8, help="clients for the concurrent batch")
    parser.add_argument("--probes", type=int, default=200, help="jobs timed from submit to start")
    parser.add_argument("--markdown", type=Path, default=Path("benchmarks/out/serve.md"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gpuslice-bench-") as tmp:
        state_dir, port = Path(tmp) / "state", free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(state_dir, port)
        try:
            time.sleep(1.0)
            rss_idle = rss_mib(proc.pid)
            token = (state_dir / "token").read_text().strip()
            http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            blocker = http.post(
                "/v1/jobs", json={"command": ["sleep", "3600"], "gpus": 7, "preemptible": False}
            )
            blocker_id = blocker.json()["id"]
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns) as progress:
                half = args.pending // 2
                sequential = submit_many(url, token, half, 1, progress, "submit, 1 client")
                concurrent = submit_many(url, token, args.pending - half, args.threads, progress,
                                         f"submit, {args.threads} clients")  # fmt: skip
                pending = len(http.get("/v1/queue").json())
                latencies = probe_latencies(http, args.probes, progress)
            rss_full = rss_mib(proc.pid)
            http.post(f"/v1/jobs/{blocker_id}/cancel")
            time.sleep(0.5)
            http.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
            for p in psutil.process_iter(["cmdline"]):  # the blocker's group, if the cancel did not reach it
                if str(state_dir) in " ".join(p.info.get("cmdline") or []):
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)

    ms = [x * 1000 for x in latencies]
    load = os.getloadavg()[0]  # other work on the machine shows up in every figure below
    lines = [
        "## gpuslice serve",
        "",
        f"`.venv/bin/python benchmarks/serve.py --pending {args.pending} --threads {args.threads} "
        f"--probes {args.probes}` on {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, 1-minute load average {load:.1f} at the end; server `--simulate "
        "dgx-h100`, loop tick 0.2 s (a submit wakes it).",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| submit throughput, 1 client (jobs/s) | {sequential:.0f} |",
        f"| submit throughput, {args.threads} clients (jobs/s) | {concurrent:.0f} |",
        f"| jobs pending while probing | {pending} |",
        f"| submit → start p50 (ms) | {statistics.median(ms):.1f} |",
        f"| submit → start p99 (ms) | {percentile(ms, 0.99):.1f} |",
        f"| submit → start max (ms) | {max(ms):.1f} |",
        f"| server RSS at rest, empty (MiB) | {rss_idle:.0f} |",
        f"| server RSS with {pending} pending (MiB) | {rss_full:.0f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)


if __name__ == "__main__":
    main()
