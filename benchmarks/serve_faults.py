"""The machine's faults against a real ``gpuslice serve``: run by ``serve_chaos.py --faults`` (root, for
the mount namespace), or alone: ``.venv/bin/python benchmarks/serve_faults.py [--markdown FILE]``.

Each fault gets a fresh server in a mount namespace of its own (``unshare --mount``), where:

- clock: while jobs run, a copy of /proc/stat with ``btime`` shifted +1 h, then -1 h, is bind-mounted
  over /proc/stat (what an NTP step or a VM resume shows every boot-time reader); jobs must end as their
  commands say, none lost, none run twice;
- disk: the state dir is a 2 MiB tmpfs; jobs fill it and exit 0, submits meet the full disk (503 with
  Retry-After, nothing stored), then the filler is removed: every job ends as its command says;
- fds: the server runs with 512 descriptors; 600 idle connections are opened, then a job is submitted:
  it must run and succeed (no EMFILE failure), and the idle ones must be gone within 20 s;
- lying job: a job writes exit records of its own (exit 0) and goes on, then exits 7: FAILED, 7;
- SIGTERM with 20 log followers: seconds to exit; a second SIGTERM with a slow request held open;
- damaged stores: a garbage state file (one error line, exit 2), a deleted one and a deleted WAL after
  kill -9 with a job running (re-adopted, no id reused);
- the webhook's and the extender's malformed corpus (tests/k8s/data), each through a real uvicorn
  process: status counts, 5xx must be 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx

BIN = Path(sys.executable).parent
CORPUS = Path(__file__).resolve().parent.parent / "tests" / "k8s" / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A server in its own mount namespace; ``inside(cmd)`` runs a shell command in that namespace."""

    def __init__(self, root: Path, *, tmpfs: str = "", nofile: int = 0) -> None:
        self.root, self.state = root, root / "state"
        self.port = free_port()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)
        self.tmpfs, self.nofile = tmpfs, nofile
        self.fives = 0  # unexpected 5xx: 500/502/504, or a 503 without Retry-After
        self.full_503 = 0  # the deliberate answer to a submit on a full disk: 503 with Retry-After
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Served:
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        mount = f"mount -t tmpfs -o size={self.tmpfs},mode=0700 tmpfs {self.state} && " if self.tmpfs else ""
        limit = f"ulimit -n {self.nofile} && " if self.nofile else ""
        serve = (f"exec {BIN / 'gpuslice'} serve --simulate dgx-h100 --grace 1s --state-dir {self.state} "
                 f"--port {self.port}")  # fmt: skip
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount + limit + serve]
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if self.http.get("/v1/health").status_code == 200:
                    token = self.inside(f"cat {self.state}/token").strip()
                    self.http.headers["Authorization"] = f"Bearer {token}"
                    return self
            time.sleep(0.2)
        raise SystemExit(f"no server: {(self.root / 'server.log').read_text()[-2000:]}")

    def inside(self, command: str) -> str:
        assert self.proc is not None
        result = subprocess.run(["nsenter", "-t", str(self.proc.pid), "-m", "sh", "-c", command],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        return result.stdout

    def submit(self, command: str, **body: Any) -> httpx.Response:
        r = self.http.post("/v1/jobs", json={"command": ["sh", "-c", command], **body})
        deliberate = r.status_code == 503 and "retry-after" in r.headers
        self.full_503 += deliberate
        self.fives += r.status_code >= 500 and not deliberate
        return r

    def jobs(self) -> dict[str, dict[str, Any]]:
        r = self.http.get("/v1/jobs", params={"limit": 10_000})
        self.fives += r.status_code >= 500
        return {j["id"]: j for j in r.json()} if r.status_code == 200 else {}

    def wait_ended(self, ids: list[str], timeout: float = 180) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs()
            if all(jobs.get(i, {}).get("state") in ("SUCCEEDED", "FAILED", "CANCELLED") for i in ids):
                return jobs
            time.sleep(0.5)
        return self.jobs()

    def stop(self) -> None:
        self.http.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
            if self.proc.poll() is None:
                self.proc.kill()


def _tally(jobs: dict[str, dict[str, Any]], expected: dict[str, tuple[str, int]]) -> dict[str, Any]:
    lost = [i for i in expected if i not in jobs or "lost" in (jobs[i]["reason"] or "")]
    wrong = [i for i, (state, code) in expected.items()
             if i in jobs and (jobs[i]["state"], jobs[i]["exit_code"]) != (state, code)]  # fmt: skip
    twice = [i for i in expected if i in jobs and jobs[i]["attempts"] > 1]
    return {"lost": lost, "wrong": wrong, "twice": twice}


def clock(root: Path) -> dict[str, Any]:
    s = Served(root).start()
    try:
        ids = {s.submit("echo run; sleep 6").json()["id"]: ("SUCCEEDED", 0) for _ in range(4)}
        ids[s.submit("echo run; sleep 6; exit 3").json()["id"]] = ("FAILED", 3)
        time.sleep(2)
        for shift in (3600, -3600):
            s.inside(f"umount /proc/stat 2>/dev/null; awk '/^btime/{{$2=$2+({shift})}}1' /proc/stat > "
                     f"{root}/stat{shift} && mount --bind {root}/stat{shift} /proc/stat")  # fmt: skip
            time.sleep(1.5)
        return {**_tally(s.wait_ended(list(ids)), ids), "jobs": len(ids), "fives": s.fives}
    finally:
        s.stop()


def disk(root: Path) -> dict[str, Any]:
    s = Served(root, tmpfs="2m").start()
    try:
        fill = 'cat /dev/zero > "$GPUSLICE_JOB_DIR/fill" 2>/dev/null; sleep 2; exit 0'
        ids = {s.submit(fill).json()["id"]: ("SUCCEEDED", 0)}
        time.sleep(1.5)
        for _ in range(5):  # the disk is full now: refused with 503 + Retry-After, nothing half-stored
            r = s.submit("echo later")
            if r.status_code in (200, 201):
                ids[r.json()["id"]] = ("SUCCEEDED", 0)
        jobs = s.wait_ended(list(ids)[:1], 60)
        filler = next(iter(ids))
        s.inside(f"rm -f {s.state}/jobs/{filler}/fill")
        for _ in range(3):
            r = s.submit("echo after")
            if r.status_code in (200, 201):
                ids[r.json()["id"]] = ("SUCCEEDED", 0)
        jobs = s.wait_ended(list(ids))
        return {**_tally(jobs, ids), "jobs": len(ids), "refused_503": s.full_503, "fives": s.fives}
    finally:
        s.stop()


def fds(root: Path) -> dict[str, Any]:
    s = Served(root, nofile=512).start()
    idle = []
    try:
        for _ in range(600):
            with contextlib.suppress(OSError):
                idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
        r = s.submit("echo run")
        ids = {r.json()["id"]: ("SUCCEEDED", 0)} if r.status_code in (200, 201) else {}
        jobs = s.wait_ended(list(ids), 60)
        started = time.monotonic()
        closed = 0
        for c in idle:
            c.settimeout(max(0.1, 20 - (time.monotonic() - started)))
            with contextlib.suppress(OSError):
                closed += c.recv(1) == b""
        return {**_tally(jobs, ids), "opened": len(idle), "closed_by_server": closed, "submit": r.status_code,
                "fives": s.fives}  # fmt: skip
    finally:
        for c in idle:
            c.close()
        s.stop()


def liar(root: Path) -> dict[str, Any]:
    s = Served(root).start()
    try:
        forged = '{"exit_code": 0, "signal": null, "finished_at": 9e9, "started_at": 9e9, "attempt": 1}'
        records = '"$GPUSLICE_JOB_DIR/../../records/$GPUSLICE_JOB_ID/exit.json"'
        script = f"printf '{forged}' | tee \"$GPUSLICE_JOB_DIR/exit.json\" > {records}; sleep 3; exit 7"
        ids = {s.submit(script, gpus=8).json()["id"]: ("FAILED", 7)}
        return {**_tally(s.wait_ended(list(ids)), ids), "fives": s.fives}
    finally:
        s.stop()


def sigterm(root: Path) -> dict[str, Any]:
    s = Served(root).start()
    job = s.submit("echo run; sleep 300").json()
    deadline = time.monotonic() + 60
    while s.jobs().get(job["id"], {}).get("pid") is None and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = int(s.jobs()[job["id"]]["pid"])
    clients = [
        httpx.Client(base_url=str(s.http.base_url), headers=s.http.headers, timeout=60) for _ in range(20)
    ]
    streams = [c.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"}) for c in clients]
    for stream in streams:
        stream.__enter__()
    assert s.proc is not None
    started = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    code = s.proc.wait(timeout=120)
    first = time.monotonic() - started
    for c in clients:
        c.close()
    again = Served(root)
    again.port = s.port
    again.http = httpx.Client(base_url=str(s.http.base_url), timeout=30)
    again.start()
    adopted = again.jobs().get(job["id"], {}).get("state") == "RUNNING"
    slow = socket.create_connection(("127.0.0.1", again.port))
    token = again.http.headers["Authorization"]
    slow.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {token}\r\n"
                 "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())  # fmt: skip
    time.sleep(0.5)
    assert again.proc is not None
    again.proc.send_signal(signal.SIGTERM)
    time.sleep(1)
    started = time.monotonic()
    again.proc.send_signal(signal.SIGTERM)
    code2 = again.proc.wait(timeout=120)
    second = time.monotonic() - started
    slow.close()
    forced = "timeout graceful shutdown exceeded" not in (again.root / "server.log").read_text()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # the job outlives its servers by design
    return {
        "first_s": first,
        "exit": code,
        "adopted": adopted,
        "second_s": second,
        "exit2": code2,
        "forced": forced,
    }


def stores(root: Path) -> dict[str, Any]:
    garbage = root / "garbage"
    garbage.mkdir(mode=0o700)
    (garbage / "gpuslice.db").write_bytes(b"not a database" * 100)
    r = subprocess.run([str(BIN / "gpuslice"), "serve", "--simulate", "dgx-h100", "--state-dir", str(garbage),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = r.stderr.strip().splitlines()
    found: dict[str, Any] = {"garbage": (r.returncode, len(lines), lines[-1][:90] if lines else "")}
    for case in ("deleted", "wal"):
        s = Served(root / case).start()
        job = s.submit("echo run; sleep 300").json()
        deadline = time.monotonic() + 60
        while s.jobs().get(job["id"], {}).get("pid") is None and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = s.jobs()[job["id"]]["pid"]
        assert s.proc is not None
        s.proc.kill()
        s.proc.wait()
        db = s.state / "gpuslice.db"
        if case == "deleted":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
        else:
            with sqlite3.connect(db) as conn:
                conn.execute("UPDATE jobs SET state='PENDING', attempts=0, pid=NULL WHERE id=?", (job["id"],))
        s.http.close()
        again = Served(root / case)
        again.port = s.port
        again.http = httpx.Client(base_url=str(s.http.base_url), timeout=30)
        again.start()
        after = again.jobs().get(job["id"], {})
        fresh = again.submit("echo new").json()["id"]
        found[case] = {"adopted": after.get("state") == "RUNNING" and after.get("pid") == pid,
                       "new_id_above": int(fresh) > int(job["id"])}  # fmt: skip
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        again.stop()
    return found


_CORPUS_SERVER = textwrap.dedent("""
    import sys, uvicorn
    from gpuslice.k8s.webhook import create_app as webhook
    from gpuslice.k8s.extender import ClusterState, create_app as extender
    sys.path.insert(0, sys.argv[3])
    if sys.argv[1] == "webhook":
        app = webhook()
    else:
        from test_extender import FakeApi, inventory, make_state
        app = extender(make_state(FakeApi(), {"node-1": inventory(), "node-2": inventory()}))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="critical")
""")


def corpus(root: Path) -> dict[str, Any]:
    found = {}
    for name in ("webhook", "extender"):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-c", _CORPUS_SERVER, name, str(port), str(CORPUS.parent)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        statuses: dict[int, int] = {}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    with contextlib.suppress(httpx.TransportError):
                        http.get("/healthz")
                        break
                    time.sleep(0.2)
                for case in json.loads((CORPUS / f"malformed_{name}.json").read_text()):
                    text = case["body"]
                    if case.get("deep"):
                        text = text.replace('"__DEEP__"', "[" * 100_000 + "]" * 100_000)
                    path = "/mutate" if name == "webhook" else "/" + case["name"].split(":")[0]
                    r = http.post(path, content=text.encode("utf-8", "surrogatepass"),
                                  headers={"Content-Type": "application/json"})  # fmt: skip
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        found[name] = statuses
    return found


FAULTS = {"clock": clock, "disk": disk, "fds": fds, "liar": liar, "sigterm": sigterm, "stores": stores,
          "corpus": corpus}  # fmt: skip


def run_faults(root: Path, only: list[str] | None = None) -> dict[str, Any]:
    results = {}
    for name, fault in FAULTS.items():
        if only and name not in only:
            continue
        (root / name).mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        results[name] = fault(root / name)
        results[name + "_seconds"] = round(time.monotonic() - started, 1)
        print(name, json.dumps(results[name], default=str), flush=True)
    return results


def fault_failures(r: dict[str, Any]) -> int:
    """How many of the fault checks failed (0 when none ran)."""
    bad = sum(
        len(r[k][c]) for k in ("clock", "disk", "fds", "liar") if k in r for c in ("lost", "wrong", "twice")
    )
    bad += sum(r[k]["fives"] for k in ("clock", "disk", "fds", "liar") if k in r)
    if "sigterm" in r:
        s = r["sigterm"]
        bad += (s["exit"], s["exit2"]) != (0, 0) or s["first_s"] > 10 or not s["forced"] or not s["adopted"]
    if "stores" in r:
        st = r["stores"]
        bad += list(st["garbage"][:2]) != [2, 1]
        bad += sum(not all(st[c].values()) for c in ("deleted", "wal"))
    if "corpus" in r:
        bad += sum(n for verb in r["corpus"].values() for code, n in verb.items() if int(code) >= 500)
    return int(bad)


def fault_rows(r: dict[str, Any]) -> list[str]:
    """Table rows (markdown) for what ``run_faults`` found."""
    rows = []
    for k, what in (("clock", "wall clock stepped +1 h then -1 h while jobs ran"),
                    ("liar", "a job writing exit records of its own (exit 0), then exiting 7"),
                    ("fds", "600 idle connections against 512 descriptors, then a submit")):  # fmt: skip
        if k in r:
            x = r[k]
            extra = f", idle closed by the server {x['closed_by_server']}/{x['opened']}" if k == "fds" else ""
            rows.append(f"| {what} | lost {len(x['lost'])}, wrong {len(x['wrong'])}, run twice "
                        f"{len(x['twice'])}, 5xx {x['fives']}{extra} |")  # fmt: skip
    if "disk" in r:
        x = r["disk"]
        rows.append(f"| state dir on a full 2 MiB tmpfs ({x['jobs']} jobs) | lost {len(x['lost'])}, wrong "
                    f"{len(x['wrong'])}, run twice {len(x['twice'])}; submits on the full disk: "
                    f"deliberate 503 + Retry-After {x['refused_503']}, nothing stored; "
                    f"unexpected 5xx (500/502/504, 503 without Retry-After) {x['fives']} |")  # fmt: skip
    if "sigterm" in r:
        x = r["sigterm"]
        rows.append(f"| SIGTERM with 20 log followers | exit {x['exit']} in {x['first_s']:.1f} s; job "
                    f"re-adopted: {x['adopted']}; 2nd SIGTERM during a held request: exit {x['exit2']} in "
                    f"{x['second_s']:.1f} s |")  # fmt: skip
    if "stores" in r:
        x = r["stores"]
        rows.append(f"| damaged stores | garbage: exit {x['garbage'][0]}, {x['garbage'][1]} line; deleted: "
                    f"{x['deleted']}; WAL lost: {x['wal']} |")  # fmt: skip
    if "corpus" in r:
        rows.append(f"| malformed corpus (real uvicorn) | webhook {r['corpus']['webhook']}, extender "
                    f"{r['corpus']['extender']} (status: count) |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(FAULTS), help="run these faults only")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "out" / "serve_faults.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuslice-faults-") as tmp:
        results = run_faults(Path(tmp), args.only)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
