"""``gpuslice serve`` under chaos: a bounded crash campaign, a hostile-request set, and 100 log followers.

Setup: a real ``gpuslice serve --simulate dgx-h100 --grace 1s`` process on a free port, fresh state dir.

1. Crash campaign. ``--jobs`` mixed jobs (succeed, fail, fail and restart once, 1/2/4/8 GPUs, memory
   shares, cancelled) are submitted with an Idempotency-Key each (a submit cut by a kill is retried with
   its key), then ``--burst`` one-second jobs from 8 clients at once. Until every job has ended, at random
   moments: ``kill -9`` of the server (``--server-kills``, then a restart), ``kill -9`` of a running
   job's supervisor (``--supervisor-kills``), ``kill -9`` of a running job's command (``--job-kills``).
   All the while the real process table is sampled: every process carrying a job's environment, grouped
   by process group. Checks at the end:
   - lost: a submitted job missing from the store, or one that never ended;
   - doubled: a key that made two jobs, or two process groups of one job alive at once;
   - over-commit: at any sample, the GPU memory of the live process groups on one GPU over its size
     (each group's GPUs and slice from its own environment, not from the server's word);
   - state and exit code: every job nobody killed ends as its command says; a job whose command or
     supervisor was killed ends FAILED, or SUCCEEDED after a restart;
   - attempts vs starts: the "run" lines a job's command printed equal its attempts, less the attempts
     the server recorded as "never started" (it died between storing RUNNING and the launch).
2. Hostile requests: each must be answered 4xx (never 5xx, never a hang); the server is healthy after,
   and its memory did not grow by the size of a body it refused.
3. ``--followers`` clients follow the log of a silent running job; /v1/health is timed while they are
   attached (p50, max of 20 calls) and after they hung up.

4. With ``--faults`` (root: mount namespaces), the machine's faults of ``serve_faults.py``: wall-clock
   steps both ways, a full disk, descriptor exhaustion, a lying job, SIGTERM with followers, damaged
   stores, and the webhook's and the extender's malformed corpus.

Usage: ``.venv/bin/python benchmarks/serve_chaos.py [--jobs 30] [--server-kills 5] [--seed 1] [--faults]
[--markdown FILE]`` (FILE defaults to benchmarks/out/serve_chaos.md). Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from serve_faults import fault_failures, fault_rows, run_faults

BIN = Path(sys.executable).parent
GPU_BYTES = 80 * 2**30  # dgx-h100: 8 × H100 80 GB
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}
out = Console(highlight=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """The server process, restarted on the same state dir and port after each kill; ``extra``: more
    ``gpuslice serve`` options (e.g. --public-reads)."""

    def __init__(self, state_dir: Path, *extra: str) -> None:
        self.state_dir = state_dir
        self.extra = extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def start(self) -> None:
        command = [
            str(BIN / "gpuslice"),
            "serve",
            "--simulate",
            "dgx-h100",
            "--state-dir",
            str(self.state_dir),
            "--port",
            str(self.port),
            "--grace",
            "1s",
            *self.extra,
        ]
        log = open(self.state_dir.parent / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/v1/health").status_code == 200:
                    self.token = (self.state_dir / "token").read_text().strip()
                    self.http.headers["Authorization"] = f"Bearer {self.token}"
                    return
            time.sleep(0.1)
        raise SystemExit("the server did not start in 60 s")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["id"]: j for j in self.http.get("/v1/jobs", params={"limit": 10_000}).json()}

    def submit(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        """Submit with an idempotency key; a transport error (the server was killed) is retried with it."""
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                r = self.http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                if r.status_code in (200, 201):
                    return r.json()
                raise SystemExit(f"submit refused: {r.status_code} {r.text}")
            time.sleep(0.1)
        raise SystemExit("the server did not take a submit in 60 s")


class ProcessTable:
    """Samples the real process table: live job process groups, doubles, and GPU memory per GPU."""

    def __init__(self, state_dir: Path) -> None:
        self.prefix = str(state_dir / "jobs")
        self.samples = 0
        self.doubled: set[str] = set()
        self.overcommits: list[str] = []
        self.max_groups = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def groups(self) -> dict[int, tuple[str, list[int], int]]:
        """pgid -> (job id, GPUs, memory bytes per GPU) of every live process carrying a job's env."""
        found: dict[int, tuple[str, list[int], int]] = {}
        for p in psutil.process_iter(["pid", "status"]):
            with contextlib.suppress(psutil.Error, OSError):
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                env = p.environ()
                if not env.get("GPUSLICE_JOB_DIR", "").startswith(self.prefix):
                    continue
                gpus = [int(g) for g in env.get("GPUSLICE_GPUS", "").split(",") if g]
                found[os.getpgid(p.pid)] = (
                    env["GPUSLICE_JOB_ID"],
                    gpus,
                    int(env["GPUSLICE_GPU_MEMORY_BYTES"]),
                )
        return found

    def sample(self) -> None:
        groups = self.groups()
        self.samples += 1
        self.max_groups = max(self.max_groups, len(groups))
        per_job: dict[str, int] = defaultdict(int)
        per_gpu: dict[int, int] = defaultdict(int)
        for job, gpus, memory in groups.values():
            per_job[job] += 1
            for g in gpus:
                per_gpu[g] += memory
        self.doubled |= {job for job, n in per_job.items() if n > 1}
        self.overcommits += [f"GPU {g}: {b / 2**30:.0f} GiB" for g, b in per_gpu.items() if b > GPU_BYTES]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(0.2)

    def __enter__(self) -> ProcessTable:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def sh(script: str) -> list[str]:
    return ["sh", "-c", f"echo run; {script}"]


def mixed_jobs(n: int, rng: random.Random) -> list[tuple[str, dict[str, Any], tuple[str, int | None]]]:
    """(kind, body, expected (state, exit code) when nobody kills it) for ``n`` jobs."""
    jobs = []
    for i in range(n):
        seconds = rng.choice([1, 2, 3, 5, 8])
        kind = ["ok", "fail", "restart", "wide", "share", "cancel"][i % 6]
        if kind == "ok":
            jobs.append((kind, {"command": sh(f"sleep {seconds}")}, ("SUCCEEDED", 0)))
        elif kind == "fail":
            jobs.append((kind, {"command": sh(f"sleep {seconds}; exit 3")}, ("FAILED", 3)))
        elif kind == "restart":
            body = {"command": sh(f"sleep {seconds}; exit 5"), "restart": "on-failure", "max_restarts": 1}
            jobs.append((kind, body, ("FAILED", 5)))
        elif kind == "wide":
            body = {"command": sh(f"sleep {seconds}"), "gpus": rng.choice([2, 4, 8])}
            jobs.append((kind, body, ("SUCCEEDED", 0)))
        elif kind == "share":
            body = {"command": sh(f"sleep {seconds}"), "memory": f"{rng.choice([10, 20, 40])}GiB"}
            jobs.append((kind, body, ("SUCCEEDED", 0)))
        else:
            jobs.append((kind, {"command": sh("sleep 600"), "gpus": 8}, ("CANCELLED", None)))
    return jobs


def campaign(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    server = Server(root / "state")
    server.state_dir.mkdir()
    server.start()
    plan = mixed_jobs(args.jobs, rng)
    keys: dict[str, tuple[str, dict[str, Any], tuple[str, int | None]]] = {}
    ids: dict[str, str] = {}  # key -> job id
    touched: set[str] = set()  # jobs whose command or supervisor was killed
    actions = (
        ["server"] * args.server_kills + ["supervisor"] * args.supervisor_kills + ["job"] * args.job_kills
    )
    rng.shuffle(actions)
    done = defaultdict(int)
    started = time.monotonic()
    with ProcessTable(server.state_dir) as table:
        for kind, body, expected in plan:
            key = str(uuid.uuid4())
            keys[key] = (kind, body, expected)
            ids[key] = server.submit(body, key)["id"]
        burst: list[str] = []

        def burst_client(count: int) -> None:
            for _ in range(count):
                key = str(uuid.uuid4())
                keys[key] = ("burst", {"command": sh("sleep 1")}, ("SUCCEEDED", 0))
                burst.append(key)
                ids[key] = server.submit(keys[key][1], key)["id"]

        threads = [threading.Thread(target=burst_client, args=(args.burst // 8,)) for _ in range(8)]
        for t in threads:
            t.start()
        while actions or not all(j["state"] in ENDED for j in _jobs(server)):
            if time.monotonic() - started > args.time_limit:
                break
            time.sleep(rng.uniform(0.5, 2.0))
            for key, job_id in list(ids.items()):  # cancel the cancel-kind jobs once they are stored
                if keys[key][0] == "cancel" and done[f"cancel-{job_id}"] == 0:
                    with contextlib.suppress(httpx.TransportError):
                        r = server.http.post(f"/v1/jobs/{job_id}/cancel")
                        done[f"cancel-{job_id}"] = int(r.status_code in (200, 409))
            if not actions:
                continue
            action = actions.pop()
            if action == "server":
                server.kill9()
                done["server kills"] += 1
                time.sleep(rng.uniform(0.2, 2.0))
                server.start()
                continue
            with contextlib.suppress(httpx.TransportError, ValueError):
                running = [j for j in _jobs(server) if j["state"] == "RUNNING" and j["pid"]]
                if not running:
                    actions.append(action)
                    continue
                victim = rng.choice(running)
                touched.add(victim["id"])
                with contextlib.suppress(ProcessLookupError):
                    if action == "supervisor":
                        os.kill(victim["pid"], signal.SIGKILL)
                    else:  # the command: every process of the group but its supervisor
                        for pid in psutil.Process(victim["pid"]).children(recursive=True):
                            with contextlib.suppress(psutil.Error):
                                pid.kill()
                done[f"{action} kills"] += 1
        for t in threads:
            t.join()
        wait_until = time.monotonic() + 120
        while time.monotonic() < wait_until and not all(j["state"] in ENDED for j in _jobs(server)):
            time.sleep(0.5)
        table.sample()
    final = server.jobs()
    events = server.http.get("/v1/events", params={"limit": 10_000}).json()
    never_started = defaultdict(int)
    for e in events:
        if e["new_state"] == "FAILED" and "never started" in e["reason"]:
            never_started[e["job_id"]] += 1
    wrong, mismatched = [], []
    for key, (kind, _, expected) in keys.items():
        job = final.get(ids[key])
        if job is None:
            continue
        got = (job["state"], job["exit_code"])
        if job["id"] in touched:
            if job["state"] not in ("FAILED", "SUCCEEDED", "CANCELLED"):
                wrong.append(f"{job['id']} ({kind}, killed): {got}")
        elif got != expected:
            wrong.append(f"{job['id']} ({kind}): {got}, expected {expected}")
        log = server.state_dir / "jobs" / job["id"] / "stdout.log"
        runs = log.read_text().count("run") if log.exists() else 0
        if runs != job["attempts"] - never_started[job["id"]]:
            mismatched.append(f"{job['id']}: {runs} runs, {job['attempts']} attempts")
    server.kill9()
    _kill_jobs(server.state_dir)
    return {
        "jobs": len(keys),
        "seconds": time.monotonic() - started,
        "actions": dict(done),
        "lost": [k for k in keys if ids[k] not in final]
        + [j for j, v in final.items() if v["state"] not in ENDED],
        "doubled": sorted(table.doubled)
        + ([f"{len(final)} jobs for {len(keys)} keys"] if len(final) > len(keys) else []),
        "overcommits": table.overcommits,
        "samples": table.samples,
        "wrong": wrong,
        "mismatched": mismatched,
        "never_started": sum(never_started.values()),
    }


def _jobs(server: Server) -> list[dict[str, Any]]:
    try:
        return list(server.jobs().values())
    except (httpx.TransportError, ValueError):
        return [{"state": "?"}]


def _kill_jobs(state_dir: Path) -> None:
    for pgid in ProcessTable(state_dir).groups():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def hostile(root: Path) -> dict[str, Any]:
    server = Server(root / "hostile")
    server.state_dir.mkdir()
    server.start()
    auth = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    lone = '"\\ud800"'
    requests: list[tuple[str, str, str, dict[str, str], bytes | str]] = [
        ("lone surrogate in command", "POST", "/v1/jobs", auth, '{"command": [' + lone + "]}"),
        ("lone surrogate in env", "POST", "/v1/jobs", auth, '{"command": ["x"], "env": {"A": ' + lone + "}}"),
        (
            "lone surrogate in env name",
            "POST",
            "/v1/jobs",
            auth,
            '{"command": ["x"], "env": {' + lone + ': "1"}}',
        ),
        ("2 MB argument", "POST", "/v1/jobs", auth, json.dumps({"command": ["x", "a" * 2_000_000]})),
        ("10 MB argument", "POST", "/v1/jobs", auth, json.dumps({"command": ["x", "a" * 10_000_000]})),
        (
            "2,000 env variables",
            "POST",
            "/v1/jobs",
            auth,
            json.dumps({"command": ["x"], "env": {f"V{i}": "1" for i in range(2000)}}),
        ),
        ("memory 1e400", "POST", "/v1/jobs", auth, '{"command": ["x"], "memory": 1e400}'),
        (
            "memory of 400 digits",
            "POST",
            "/v1/jobs",
            auth,
            '{"command": ["x"], "memory": "' + "9" * 400 + 'TiB"}',
        ),
        ("memory true", "POST", "/v1/jobs", auth, '{"command": ["x"], "memory": true}'),
        ("runtime NaN", "POST", "/v1/jobs", auth, '{"command": ["x"], "max_runtime": NaN}'),
        ("runtime Infinity", "POST", "/v1/jobs", auth, '{"command": ["x"], "max_runtime": Infinity}'),
        ("tenant memory 2^63", "PUT", "/v1/tenants/t", auth, '{"max_gpu_memory": 9223372036854775808}'),
        ("tenant timing NaN", "PUT", "/v1/tenants/t", auth, '{"response": {"kill_after_seconds": NaN}}'),
        ("tenant timing true", "PUT", "/v1/tenants/t", auth, '{"response": {"kill_after_seconds": true}}'),
        ("tenant weight 1e400", "PUT", "/v1/tenants/t", auth, '{"weight": 1e400}'),
        ("not JSON", "POST", "/v1/jobs", auth, "{command"),
        ("JSON nested 100,000 deep", "POST", "/v1/jobs", auth, "[" * 100_000 + "]" * 100_000),
        ("empty program", "POST", "/v1/jobs", auth, '{"command": [""]}'),
        ("NUL in an argument", "POST", "/v1/jobs", auth, '{"command": ["x", "a\\u0000b"]}'),
        ("unknown field", "POST", "/v1/jobs", auth, '{"command": ["x"], "gpu": 2}'),
        ("bad idempotency key", "POST", "/v1/jobs", {**auth, "Idempotency-Key": "a b"}, '{"command": ["x"]}'),
        ("no token, 50 MB body", "POST", "/v1/jobs", {"Content-Type": "application/json"}, b"x" * 50_000_000),
        ("token, 50 MB body", "POST", "/v1/jobs", auth, b"x" * 50_000_000),
        ("wrong token", "POST", "/v1/jobs", {**auth, "Authorization": "Bearer nope"}, '{"command": ["x"]}'),
        ("read without token", "GET", "/v1/jobs", {}, b""),
        ("logs without token", "GET", "/v1/jobs/1/logs?follow=true", {}, b""),
        ("foreign Host", "GET", "/v1/health", {"Host": "attacker.example"}, b""),
        ("wrong method", "DELETE", "/v1/jobs", auth, b""),
        ("unknown path", "GET", "/v1/nothing", auth, b""),
        ("unknown job", "GET", "/v1/jobs/999999", auth, b""),
        ("job id with a lone surrogate", "GET", "/v1/jobs/%ED%A0%80", auth, b""),
        ("GPU 2^70 health", "POST", f"/v1/gpus/{2**70}/health", auth, '{"healthy": false}'),
        ("events after 2^70", "GET", f"/v1/events?after={2**70}", auth, b""),
        ("limit 0", "GET", "/v1/jobs?limit=0", auth, b""),
        ("used sign-in token", "GET", "/?token=not-the-one", {}, b""),
    ]
    rss_before = psutil.Process(server.proc.pid).memory_info().rss
    rows, fives = [], 0
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name, method, path, headers, body in requests:
            try:
                r = http.request(method, path, headers=headers, content=body if body else None)
                status, kind = (
                    r.status_code,
                    (
                        r.json().get("type", "")
                        if r.headers.get("content-type", "").startswith("application/json")
                        else ""
                    ),
                )
            except (
                httpx.HTTPError
            ) as err:  # a refused body may end the connection early: that is an answer too
                status, kind = 0, type(err).__name__
            fives += status >= 500 or (status == 0 and kind != "RemoteProtocolError")
            rows.append((name, status, kind))
        health = http.get("/v1/health").status_code
        listing = http.get("/v1/jobs", headers={"Authorization": f"Bearer {server.token}"}).status_code
    rss_after = psutil.Process(server.proc.pid).memory_info().rss
    jobs = len(server.jobs())
    server.kill9()
    return {
        "rows": rows,
        "fives": fives,
        "health": health,
        "listing": listing,
        "jobs_stored": jobs,
        "rss_growth_mib": (rss_after - rss_before) / 2**20,
    }


def followers(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = Server(root / "followers")
    server.state_dir.mkdir()
    server.start()
    job = server.submit({"command": ["sleep", "600"]}, "follow")
    while server.jobs()[job["id"]]["state"] != "RUNNING":
        time.sleep(0.1)

    def timed(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            assert server.http.get("/v1/health", timeout=30).status_code == 200
            times.append(time.perf_counter() - t)
            time.sleep(0.05)
        return times

    limits = httpx.Limits(max_connections=args.followers + 10, max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, headers=server.http.headers, limits=limits, timeout=30) as http:
        with contextlib.ExitStack() as stack:
            for _ in range(args.followers):
                r = stack.enter_context(http.stream("GET", f"/v1/jobs/{job['id']}/logs?follow=true"))
                assert r.status_code == 200
            threads = len(psutil.Process(server.proc.pid).threads())
            attached = timed(20)
        after = timed(20)
    server.http.post(f"/v1/jobs/{job['id']}/cancel")
    time.sleep(2)
    server.kill9()
    _kill_jobs(server.state_dir)
    return {"attached": attached, "after": after, "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="mixed jobs in the crash campaign")
    parser.add_argument(
        "--burst", type=int, default=96, help="one-second jobs submitted by 8 clients at once"
    )
    parser.add_argument("--server-kills", type=int, default=5)
    parser.add_argument("--supervisor-kills", type=int, default=3)
    parser.add_argument("--job-kills", type=int, default=3)
    parser.add_argument("--followers", type=int, default=100)
    parser.add_argument("--time-limit", type=float, default=300, help="seconds for the chaos loop")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", action="store_true", help="also the machine's faults (serve_faults.py)")
    parser.add_argument(
        "--trust", type=int, default=0, metavar="N",
        help="also each trust scenario (serve_trust.py) N times (20 for the record)",
    )  # fmt: skip
    parser.add_argument("--trust-only", action="store_true", help="only the trust scenarios (needs --trust)")
    parser.add_argument("--markdown", type=Path, default=Path(__file__).parent / "out" / "serve_chaos.md")
    args = parser.parse_args()
    if args.trust_only:
        trust_main(args)
        return
    with tempfile.TemporaryDirectory(prefix="gpuslice-chaos-") as tmp:
        root = Path(tmp)
        out.print("crash campaign …")
        c = campaign(args, root)
        out.print("hostile requests …")
        h = hostile(root)
        out.print(f"{args.followers} log followers …")
        f = followers(args, root)
        faults = run_faults(root / "faults") if args.faults else {}
    failures = sum(len(c[k]) for k in ("lost", "doubled", "overcommits", "wrong", "mismatched"))
    failures += h["fives"] + (h["health"] != 200) + (h["listing"] != 200) + (max(f["attached"]) >= 1.0)
    failures += fault_failures(faults)
    load = os.getloadavg()
    fours = sum(1 for _, s, _ in h["rows"] if 400 <= s < 500)
    actions = ", ".join(f"{v} {k}" for k, v in sorted(c["actions"].items()) if not k.startswith("cancel-"))
    lines = [
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} "
        f"at the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; seed {args.seed}.",
        "",
        "| check | result |",
        "|---|---|",
        f"| jobs (mixed + burst) | {c['jobs']} in {c['seconds']:.0f} s |",
        f"| chaos actions | {actions} |",
        f"| lost | {len(c['lost'])} {c['lost'][:5] or ''} |",
        f"| doubled | {len(c['doubled'])} {c['doubled'][:5] or ''} |",
        f"| over-commits (process-table samples) | {len(c['overcommits'])} in {c['samples']} samples |",
        f"| wrong final state or exit code | {len(c['wrong'])} {c['wrong'][:5] or ''} |",
        f"| attempts ≠ starts | {len(c['mismatched'])} {c['mismatched'][:5] or ''} "
        f"(attempts never started: {c['never_started']}) |",
        f"| hostile requests | {len(h['rows'])}: {fours} answered 4xx, {h['fives']} 5xx or no answer |",
        f"| after them | health {h['health']}, job list {h['listing']}, {h['jobs_stored']} jobs stored, "
        f"RSS {h['rss_growth_mib']:+.0f} MiB |",
        f"| health with {args.followers} followers | p50 {statistics.median(f['attached']) * 1000:.1f} ms, "
        f"max {max(f['attached']) * 1000:.1f} ms ({f['threads']} server threads) |",
        f"| health after they hung up | p50 {statistics.median(f['after']) * 1000:.1f} ms, "
        f"max {max(f['after']) * 1000:.1f} ms |",
        *fault_rows(faults),
        "",
        "| hostile request | status | type |",
        "|---|---|---|",
        *[f"| {name} | {status} | {kind} |" for name, status, kind in h["rows"]],
    ]
    text = "\n".join(lines) + "\n"
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    table = Table(title="serve chaos")
    table.add_column("check")
    table.add_column("result")
    for line in lines[4 : lines.index("", 4)]:
        _, check, result, _ = line.split("|", 3)
        table.add_row(check.strip(), result.strip())
    out.print(table)
    out.print(f"markdown: {args.markdown}")
    if args.trust:
        failures += trust_main(args, exit_on_failure=False)
    if failures:
        out.print(f"[red]{failures} check(s) failed[/red]")
        sys.exit(1)


def trust_main(args: argparse.Namespace, exit_on_failure: bool = True) -> int:
    """The trust scenarios, ``args.trust`` runs each: a table, and ``args.markdown`` with -trust added."""
    from serve_trust import trust_rows  # imports the scenario modules, which import this one

    if args.trust < 1:
        sys.exit("error: --trust N needs N >= 1")
    with tempfile.TemporaryDirectory(prefix="gpuslice-trust-") as tmp:
        rows, failures = trust_rows(args.trust, Path(tmp))
    load = os.getloadavg()
    lines = [
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, load average {load[0]:.1f}/{load[1]:.1f}/"
        f"{load[2]:.1f} at the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| scenario | runs | failures | note |",
        "|---|---:|---:|---|",
        *[f"| {name} | {runs} | {failed} | {note} |" for name, runs, failed, note in rows],
    ]
    path = args.markdown.with_name(args.markdown.stem + "-trust.md")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    table = Table(title="serve trust scenarios")
    for column in ("scenario", "runs", "failures", "note"):
        table.add_column(column)
    for name, runs, failed, note in rows:
        table.add_row(name, str(runs), str(failed), note)
    out.print(table)
    out.print(f"markdown: {path}")
    if failures and exit_on_failure:
        out.print(f"[red]{failures} run(s) broke a promise[/red]")
        sys.exit(1)
    return failures


if __name__ == "__main__":
    main()
