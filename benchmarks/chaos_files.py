"""The log-symlink attack against a real ``gpuslice serve --simulate dgx-h100 --public-reads``, N times.

Each run submits one job with ``restart: on-failure``. Its first attempt swaps its stdout.log for a link
to the server's token (``../../token``), its stderr.log for a link to a 0600 stand-in for /etc/shadow
outside the state dir, and its report file for a link to another job's log, then fails; its second
attempt (the restart) prints a line and succeeds. All the while an anonymous reader (no token, no
cookie) reads the job's logs, whole and followed. A run fails if:

- any answer holds the token, the shadow stand-in or the other job's output, or is a 5xx;
- an answer's text, sent back as a bearer token, is taken for a write (anything but 401);
- the token file, the stand-in or the other job's log changed (appended or truncated);
- the job did not end SUCCEEDED with its second attempt's line in its readable stdout.

``run_attack(n, root) -> {"runs", "failures", "reasons", "seconds"}`` is what serve_chaos.py can call;
run alone: ``.venv/bin/python benchmarks/chaos_files.py [--runs 5]``; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from serve_chaos import Server, _kill_jobs, out

SHADOW = "root:$6$stand-in$for-etc-shadow:19000:0:99999:7:::\n"
OTHER = "the other job's private output\n"
# Attempt 1 (no marker yet): swap the logs for links and fail; attempt 2: print and succeed.
ATTACK = (
    'cd "$GPUSLICE_JOB_DIR"; '
    "if [ ! -e .swapped ]; then : > .swapped; "
    "ln -sf ../../token stdout.log; ln -sf {shadow} stderr.log; ln -sf {other} gpu_report.json; "
    "sleep 0.5; exit 1; fi; "
    "echo second-attempt"
)


def _snapshot(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def _one_run(server: Server, anonymous: httpx.Client, shadow: Path, other_log: Path) -> list[str]:
    """One attack; the reasons it failed (empty: it held)."""
    reasons: list[str] = []
    token_file = server.state_dir / "token"
    watched = [token_file, shadow, other_log]
    before = _snapshot(watched)
    secrets = [server.token, SHADOW.strip(), OTHER.strip()]
    command = ["sh", "-c", ATTACK.format(shadow=shadow, other=other_log)]
    body = {"command": command, "restart": "on-failure", "max_restarts": 1}
    job = server.submit(body, str(uuid.uuid4()))
    path = f"/v1/jobs/{job['id']}/logs"
    answers: list[httpx.Response] = []
    deadline = time.monotonic() + 60
    state = job["state"]
    while state not in ("SUCCEEDED", "FAILED", "CANCELLED") and time.monotonic() < deadline:
        for params in ({}, {"stream": "stderr"}):
            answers.append(anonymous.get(path, params=params))
        state = server.http.get(f"/v1/jobs/{job['id']}").json()["state"]
        time.sleep(0.05)
    with anonymous.stream("GET", path, params={"follow": True}) as r:  # the job has ended: it returns
        r.read()
        answers.append(r)
    for r in answers:
        if r.status_code >= 500 or r.status_code not in (200, 409):
            reasons.append(f"job {job['id']}: answered {r.status_code}")
        leaked = [s for s in secrets if s in r.text]
        if leaked:
            reasons.append(f"job {job['id']}: an anonymous read leaked {len(leaked)} secret(s)")
    for text in {r.text.strip().splitlines()[0][:200].strip() for r in answers if r.text.strip()}:
        try:
            stolen = {"Authorization": f"Bearer {text}"}
            w = anonymous.post("/v1/jobs", json={"command": ["true"]}, headers=stolen)
        except httpx.LocalProtocolError:
            continue  # not even a header value: it cannot be a token
        if w.status_code != 401:
            reasons.append(f"job {job['id']}: a read's text wrote ({w.status_code})")
    if _snapshot(watched) != before:
        reasons.append(f"job {job['id']}: a file outside its folder changed")
    final = server.http.get(f"/v1/jobs/{job['id']}").json()
    logs = anonymous.get(path)
    if final["state"] != "SUCCEEDED" or logs.status_code != 200 or "second-attempt" not in logs.text:
        reasons.append(f"job {job['id']}: ended {final['state']} with logs {logs.status_code}")
    return reasons


def run_attack(n: int, root: Path) -> dict[str, Any]:
    """``n`` attacks against one server under ``root``: runs, failures (runs with any reason), reasons."""
    server = Server(root / "files", "--public-reads")
    server.state_dir.mkdir(parents=True)
    shadow = root / "shadow"
    shadow.write_text(SHADOW)
    shadow.chmod(0o600)
    server.start()
    started = time.monotonic()
    reasons: list[str] = []
    failures = 0
    try:
        victim = server.submit({"command": ["sh", "-c", f'printf %s "{OTHER.strip()}"']}, str(uuid.uuid4()))
        other_log = server.state_dir / "jobs" / victim["id"] / "stdout.log"
        deadline = time.monotonic() + 30
        while not (other_log.exists() and other_log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        with httpx.Client(base_url=server.url, timeout=30) as anonymous:
            for _ in range(n):
                found = _one_run(server, anonymous, shadow, other_log)
                failures += bool(found)
                reasons += found
    finally:
        with contextlib.suppress(Exception):
            server.kill9()
        _kill_jobs(server.state_dir)
    return {"runs": n, "failures": failures, "reasons": reasons, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="attacks, one job each, against one server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuslice-chaos-files-") as tmp:
        result = run_attack(args.runs, Path(tmp))
    out.print(f"log-symlink attack: {result['runs']} runs, {result['failures']} failed, "
              f"{result['seconds']:.1f} s", markup=False)  # fmt: skip
    for reason in result["reasons"]:
        out.print(f"  {reason}", markup=False)
    if result["failures"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
