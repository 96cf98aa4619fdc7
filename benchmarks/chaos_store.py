"""``gpuslice serve`` under store and process faults, against real server processes.

Each scenario returns its runs, its failures (what broke a promise, in words) and its figures:

1. locked store (``--rounds``): another SQLite connection holds ``BEGIN IMMEDIATE`` while a submit
   waits; /v1/health is timed meanwhile (p50, p99; it must never touch SQLite). Checks: the submit is
   answered 503 with Retry-After within the bound, health 200 throughout, a submit works again soon
   after the lock is released (recovery time).
2. EIO store (root, /dev/fuse, libfuse 3 and mfusepy; skipped with the reason otherwise): the state
   file on a FUSE disk that answers EIO on demand. Checks: every submit 503, health "degraded" with the
   reason, at most one "store failing" log line, no traceback; after the disk is back, a submit works.
3. port race (``--races``): two servers started together on one port. Checks: one serves, the other
   exits 3 with one line naming the port, prints no "listening", writes no url file.
4. token rotation (``--rotations``): the token file replaced while serving; time until the old token is
   refused (the watcher looks twice a second), and the new one works; once more through SIGHUP.

Usage: ``nice .venv/bin/python benchmarks/chaos_store.py [--rounds 5] [--races 3] [--rotations 5]
[--markdown FILE]`` (default benchmarks/out/chaos_store.md). Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from serve_chaos import BIN, Server, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from failing_fs import available, mounted  # the tests' failing disk, reused

out = Console(highlight=False)
SUBMIT_BOUND_SECONDS = 20.0


@dataclass
class Outcome:
    name: str
    runs: int = 0
    failures: list[str] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    skipped: str = ""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _stop(server: Server) -> None:
    if server.proc is not None and server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill9()
    server.http.close()


def _timed_submit(server: Server, answers: list[tuple[float, httpx.Response]]) -> None:
    began = time.monotonic()
    r = server.http.post("/v1/jobs", json={"command": ["true"]}, timeout=120)
    answers.append((time.monotonic() - began, r))


def _started(state_dir: Path) -> Server:
    """A real server on a fresh state folder, up and answering."""
    server = Server(state_dir)
    server.state_dir.mkdir(parents=True)
    server.start()
    return server


def locked_store(root: Path, rounds: int) -> Outcome:
    result = Outcome("locked store")
    server = _started(root / "locked" / "state")
    health_ms: list[float] = []
    submit_s: list[float] = []
    recovery_s: list[float] = []
    try:
        for i in range(rounds):
            result.runs += 1
            other = sqlite3.connect(server.state_dir / "gpuslice.db", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            answers: list[tuple[float, httpx.Response]] = []
            waiting = threading.Thread(target=_timed_submit, args=(server, answers))
            waiting.start()
            while waiting.is_alive():
                began = time.monotonic()
                health = server.http.get("/v1/health", timeout=120)
                health_ms.append((time.monotonic() - began) * 1000)
                if health.status_code != 200:
                    result.failures.append(f"round {i}: health answered {health.status_code}")
                time.sleep(0.05)
            waiting.join()
            other.rollback()
            other.close()
            ((seconds, r),) = answers
            submit_s.append(seconds)
            if r.status_code != 503 or "Retry-After" not in r.headers:
                result.failures.append(f"round {i}: the submit got {r.status_code} {r.text[:120]}")
            if seconds > SUBMIT_BOUND_SECONDS:
                result.failures.append(f"round {i}: the submit waited {seconds:.1f} s")
            released = time.monotonic()
            while time.monotonic() - released < 60:
                if server.http.post("/v1/jobs", json={"command": ["true"]}).status_code == 201:
                    recovery_s.append(time.monotonic() - released)
                    break
                time.sleep(0.05)
            else:
                result.failures.append(f"round {i}: no submit worked within 60 s of the release")
    finally:
        _stop(server)
    result.figures = {
        "health p50 (ms)": f"{statistics.median(health_ms):.1f}",
        "health p99 (ms)": f"{percentile(health_ms, 99):.1f}",
        "health calls": str(len(health_ms)),
        "submit 503 after (s, median / max)": f"{statistics.median(submit_s):.2f} / {max(submit_s):.2f}",
        "first 201 after release (s, max)": f"{max(recovery_s):.2f}" if recovery_s else "-",
    }
    return result


def eio_store(root: Path, calls: int) -> Outcome:
    result = Outcome("EIO store")
    why = available()
    if why is not None:
        result.skipped = why
        return result
    with mounted(root / "eio") as (mount, switch):
        server = Server(mount / "state")
        server.state_dir.mkdir(parents=True)
        server.start()
        try:
            result.runs = 1
            switch.touch()
            began = time.monotonic()
            body = {"command": ["true"]}
            codes = [server.http.post("/v1/jobs", json=body).status_code for _ in range(calls)]
            per_call_ms = (time.monotonic() - began) * 1000 / calls
            health = server.http.get("/v1/health").json()
            if set(codes) != {503}:
                result.failures.append(f"submits answered {sorted(set(codes))}, not only 503")
            if health["status"] != "degraded" or not health.get("reason"):
                result.failures.append(f"health said {health['status']!r} ({health.get('reason')})")
            time.sleep(2)  # ten daemon passes on the failing disk
            log = (mount / "server.log").read_text()
            lines = log.count("store failing")
            if lines > 1 or "Traceback" in log:
                result.failures.append(f"{lines} 'store failing' lines, traceback: {'Traceback' in log}")
            switch.unlink()
            back = time.monotonic()
            while time.monotonic() - back < 60:
                if server.http.post("/v1/jobs", json={"command": ["true"]}).status_code == 201:
                    break
                time.sleep(0.05)
            else:
                result.failures.append("no submit worked within 60 s of the disk coming back")
            result.figures = {
                "failing submits": str(calls),
                "503 answer (ms per call)": f"{per_call_ms:.1f}",
                "log lines": str(lines),
                "first 201 after the disk is back (s)": f"{time.monotonic() - back:.2f}",
            }
        finally:
            _stop(server)
    return result


def port_race(root: Path, races: int) -> Outcome:
    result = Outcome("port race")
    loser_s: list[float] = []
    for i in range(races):
        result.runs += 1
        port = free_port()
        dirs = [root / f"race{i}" / name for name in ("a", "b")]
        began = time.monotonic()
        procs = [subprocess.Popen(
            [str(BIN / "gpuslice"), "serve", "--simulate", "dgx-h100", "--state-dir", str(d),
             "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        ) for d in dirs]  # fmt: skip
        try:
            while all(p.poll() is None for p in procs) and time.monotonic() - began < 180:
                time.sleep(0.05)
            ended = [p for p in procs if p.poll() is not None]
            if len(ended) != 1:
                result.failures.append(f"race {i}: {len(ended)} servers exited")
                continue
            loser_s.append(time.monotonic() - began)
            loser = ended[0]
            text, err = loser.communicate(timeout=30)
            lost_dir = dirs[procs.index(loser)]
            lines = err.strip().splitlines()
            if loser.returncode != 3 or len(lines) != 1 or str(port) not in lines[0]:
                result.failures.append(f"race {i}: exit {loser.returncode}, stderr {err[:200]!r}")
            if "listening" in text or (lost_dir / "url").exists():
                result.failures.append(f"race {i}: the loser announced itself")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=60)
                p.communicate()
    median = f"{statistics.median(loser_s):.1f}" if loser_s else "-"
    result.figures = {"loser exits after (s, median)": median}
    return result


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _replace_token(path: Path, token: str) -> None:
    partial = path.with_name(".token.new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(partial, path)


def _refused_after(server: Server, old: str, began: float) -> float | None:
    while time.monotonic() - began < 30:
        r = server.http.post("/v1/jobs", json={"command": ["true"]}, headers=_bearer(old))
        if r.status_code == 401:
            return time.monotonic() - began
        time.sleep(0.02)
    return None


def token_rotation(root: Path, rotations: int) -> Outcome:
    result = Outcome("token rotation")
    server = _started(root / "token" / "state")
    refused_s: list[float] = []
    try:
        old = server.token
        for i in range(rotations + 1):
            result.runs += 1
            new = f"rotation-{i}-" + "x" * 32
            path = server.state_dir / "token"
            began = time.monotonic()
            if i < rotations:
                _replace_token(path, new)
            else:  # the last one in place with the mtime put back: only SIGHUP tells the server
                before = path.stat()
                path.write_text(new + "\n")
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
                assert server.proc is not None
                os.kill(server.proc.pid, signal.SIGHUP)
            seconds = _refused_after(server, old, began)
            if seconds is None:
                result.failures.append(f"rotation {i}: the old token still works after 30 s")
                continue
            refused_s.append(seconds)
            ok = server.http.post("/v1/jobs", json={"command": ["true"]}, headers=_bearer(new))
            if ok.status_code != 201:
                result.failures.append(f"rotation {i}: the new token got {ok.status_code}")
            old = new
    finally:
        _stop(server)
    figure = f"{statistics.median(refused_s):.2f} / {max(refused_s):.2f}" if refused_s else "-"
    result.figures = {"old token refused after (s, median / max)": figure}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="locked-store rounds")
    parser.add_argument("--eio-calls", type=int, default=50, help="submits against the failing disk")
    parser.add_argument("--races", type=int, default=3, help="port races (two servers each)")
    parser.add_argument("--rotations", type=int, default=5, help="token rotations (and one SIGHUP)")
    parser.add_argument("--markdown", type=Path, default=Path(__file__).parent / "out" / "chaos_store.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-store-") as tmp:
        root = Path(tmp)
        outcomes = [locked_store(root, args.rounds), eio_store(root, args.eio_calls),
                    port_race(root, args.races), token_rotation(root, args.rotations)]  # fmt: skip
    table = Table(title="serve under store and process faults")
    for column in ("scenario", "runs", "failures", "figures"):
        table.add_column(column)
    rows = []
    for o in outcomes:
        figures = "; ".join(f"{k}: {v}" for k, v in o.figures.items()) or f"skipped: {o.skipped}"
        failures = "; ".join(o.failures) or "0"
        table.add_row(o.name, str(o.runs), failures, figures)
        rows.append(f"| {o.name} | {o.runs} | {failures} | {figures} |")
    out.print(table)
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    text = "\n".join(["| scenario | runs | failures | figures |", "|---|---|---|---|", *rows, "",
                      f"machine: {machine}", f"command: {' '.join(sys.argv)}"])  # fmt: skip
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text + "\n")
    out.print(f"markdown: {args.markdown}")
    raise SystemExit(1 if any(o.failures for o in outcomes) else 0)


if __name__ == "__main__":
    main()
