"""``gpuslice serve`` on the real GPU: two PyTorch jobs with memory slices under one sharing mode.

```text
start `gpuslice serve --sharing MODE` (own state dir and port); tenant "acceptance" is killed 3 s over
baseline job (no compute share) alone  -> matmuls/s of the whole GPU
jobs A (30 %) and B (60 %) together    -> while both compute: per-job memory from /metrics vs nvidia-smi
each job then asks for more than its slice twice: through PyTorch, and through the CUDA driver API
hard modes (mps, shim): both requests fail inside the job
soft mode: PyTorch's cap refuses the first; the second succeeds, and the monitor must catch it
achieved compute share = job's matmuls/s ÷ the baseline's, against the share asked
```
A mode the server does not offer (``shim`` before the shim exists) is recorded as not available.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from gpu_acceptance.runner import Context, NotAvailable, kill_group
from gpu_acceptance.smi import APP_FIELDS, check, compare_processes, parse_apps

__all__ = ["JOB_PROGRAM", "analyse", "serve_stage"]

GIB = 1 << 30
SLICE_BYTES = 4 * GIB
COMPUTE_SECONDS = 6.0
HOLD_SECONDS = 8.0  # how long a job holds memory beyond its slice: longer than the kill threshold below
KILL_AFTER_SECONDS = 3.0
SHARE_SLACK = 0.15  # an enforced share may be exceeded by this much (a fraction of the GPU) and still pass
CUDA_ERROR_OUT_OF_MEMORY = 2

# argv: slice bytes, compute seconds, hold seconds. Prints JSON lines: {"phase": "computing"} when the
# memory it holds inside its slice is allocated, then one result line.
JOB_PROGRAM = r"""
import ctypes, json, os, sys, time
import torch
slice_bytes, seconds, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
out = {"pid": os.getpid()}
dev = torch.device("cuda")
kept = torch.empty(slice_bytes // 2, dtype=torch.uint8, device=dev)  # half the slice: inside it
a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(3):
    c = a @ b
torch.cuda.synchronize()
print(json.dumps({"phase": "computing", "pid": os.getpid()}), flush=True)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    c = a @ b
    n += 1
    if n % 8 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
out["matmuls_per_s"] = n / (time.perf_counter() - start)
try:
    more = torch.empty(slice_bytes, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    out["beyond_torch"] = "allocated"
    del more
except torch.cuda.OutOfMemoryError:
    out["beyond_torch"] = "oom"
except RuntimeError as e:
    out["beyond_torch"] = "error: " + str(e).splitlines()[0][:200]
torch.cuda.empty_cache()
cuda = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_uint64()
out["beyond_driver"] = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(slice_bytes))
print(json.dumps(out), flush=True)
if out["beyond_driver"] == 0:
    time.sleep(hold)  # hold it, so that the monitor can see it
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _job_result(log: str) -> dict[str, Any]:
    results = [r for r in _lines(log) if "matmuls_per_s" in r]
    return results[-1] if results else {}


def analyse(mode: str, jobs: dict[str, dict[str, Any]], baseline_rate: float | None) -> list[dict[str, Any]]:
    """Checks from the jobs' results. ``jobs[name]`` holds ``result`` (the job's JSON line), ``asked``
    (compute share 0-1), ``events`` (the job's enforcement events) and ``state`` (its final state)."""
    checks = []
    hard = mode != "soft"
    for name, job in sorted(jobs.items()):
        r = job.get("result", {})
        checks.append(check(f"{name} ran inside its slice", "matmuls_per_s" in r, state=job.get("state")))
        if "matmuls_per_s" not in r:
            continue
        checks.append(
            check(
                f"{name}: PyTorch allocation beyond the slice fails",
                r.get("beyond_torch") == "oom",
                got=r.get("beyond_torch"),
            )
        )
        if hard:
            checks.append(
                check(
                    f"{name}: driver allocation beyond the slice fails",
                    r.get("beyond_driver") != 0,
                    got=r.get("beyond_driver"),
                )
            )
        else:
            caught = [e for e in job.get("events", []) if e.get("kind") == "enforcement"]
            checks.append(
                check(
                    f"{name}: driver allocation beyond the slice caught by the monitor",
                    r.get("beyond_driver") == 0 and bool(caught),
                    beyond_driver=r.get("beyond_driver"),
                    actions=[e.get("detail", {}).get("action") for e in caught],
                )
            )
        if baseline_rate and job.get("asked"):
            achieved = r["matmuls_per_s"] / baseline_rate
            job["achieved"] = achieved
            if hard:
                checks.append(
                    check(
                        f"{name}: compute share at most asked + {SHARE_SLACK:.2f}",
                        achieved <= job["asked"] + SHARE_SLACK,
                        asked=job["asked"],
                        achieved=round(achieved, 3),
                    )
                )
    return checks


def _metric_used(text: str) -> dict[str, int]:
    """Per job id: gpuslice_slice_memory_used_bytes summed over its GPUs."""
    from prometheus_client.parser import text_string_to_metric_families

    used: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpuslice_slice_memory_used_bytes":
                job = sample.labels.get("job", "")
                used[job] = used.get(job, 0) + int(sample.value)
    return used


def _job_pids(pid: int | None) -> set[int]:
    import psutil

    if not pid:
        return set()
    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return {pid}


def shim_library(repo: Path, shim: ModuleType) -> Path:
    """The shim library of ``shim`` (the ``gpuslice.shim`` package). A checkout that was not installed
    with pip has not built it: then it is built from ``native/shim`` with the machine's C compiler into
    the package's ``lib`` folder, through the package's own ``build.build_shim``."""
    try:
        return Path(shim.library_path())
    except Exception:
        build = importlib.import_module(f"{shim.__name__}.build")
        build.build_shim(repo / "native" / "shim", Path(shim.__file__).parent / "lib")
        return Path(shim.library_path())


def shim_available(repo: Path) -> str | None:
    """None if this gpuslice has ``--sharing shim`` and its library is (or could be) built; else why not."""
    from gpuslice.node.enforcement import SharingMode

    if "shim" not in {m.value for m in SharingMode}:
        return f"gpuslice serve has no --sharing shim (modes: {', '.join(m.value for m in SharingMode)})"
    try:
        path = shim_library(repo, importlib.import_module("gpuslice.shim"))
    except Exception as e:  # no package, no compiler, a failed build
        return f"the shim library is not available ({type(e).__name__}: {e})"
    return None if path.is_file() else f"the shim library {path} does not exist"


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM (serve stops its jobs and the MPS daemon it started), SIGKILL after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        kill_group(server)
        server.wait(timeout=10)


def serve_stage(mode: str):
    """The stage function for one sharing mode."""

    def run(ctx: Context) -> dict[str, Any]:
        import httpx

        from gpuslice.server.client import ServeClient

        if mode == "shim" and (why := shim_available(ctx.repo)):
            raise NotAvailable(why)
        smi = ctx.options.get("nvidia_smi", "nvidia-smi")
        state = Path(tempfile.mkdtemp(prefix=f"gpuslice-accept-{mode}-"))
        program = state / "job.py"
        program.write_text(ctx.options.get("serve_job_program", JOB_PROGRAM))  # tests pass a GPU-less one
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**ctx.env, "GPUSLICE_STATE_DIR": str(state)}
        cmd = [
            ctx.python,
            "-c",
            "from gpuslice.cli.main import main; main()",
            "serve",
            "--sharing",
            mode,
            "--port",
            str(port),
            "--state-dir",
            str(state),
            *(["--simulate", ctx.options["simulate"]] if ctx.options.get("simulate") else []),
        ]
        log = os.open(state / "serve.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        server = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ctx.repo,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        os.close(log)  # the server has its own copy
        record: dict[str, Any] = {"mode": mode, "state_dir": str(state)}
        client = ServeClient(url=url, state_dir=state)
        try:
            while True:
                try:
                    client.health()
                    break
                except Exception:
                    if server.poll() is not None:
                        text = (state / "serve.log").read_text()[-800:]
                        if mode == "shim" and "shim" in text:
                            raise NotAvailable(
                                f"serve refused --sharing shim: {text.strip()[-300:]}"
                            ) from None
                        raise RuntimeError(f"gpuslice serve exited ({server.returncode}): {text}") from None
                    if ctx.remaining() < 5:
                        raise RuntimeError("gpuslice serve did not answer in time") from None
                    time.sleep(0.3)
            client.put_tenant(
                "acceptance",
                {"response": {"kill_after_seconds": KILL_AFTER_SECONDS, "suspend_after_seconds": 600}},
            )

            def submit(share: int) -> str:
                body = {
                    "command": [
                        ctx.python,
                        str(program),
                        str(SLICE_BYTES),
                        str(COMPUTE_SECONDS),
                        str(HOLD_SECONDS),
                    ],
                    "memory": SLICE_BYTES,
                    "compute_percent": share,
                    "tenant": "acceptance",
                    "env": {"PYTHONUNBUFFERED": "1"},
                }
                return client.submit(body)["id"]

            def log_of(job_id: str) -> str:
                return b"".join(client.logs(job_id)).decode(errors="replace")

            def wait_done(ids: list[str]) -> None:
                while any(client.job(i)["state"] in ("PENDING", "RUNNING") for i in ids):
                    if ctx.remaining() < 3:
                        raise RuntimeError("jobs still running at the stage's limit")
                    time.sleep(0.5)

            base = submit(0)
            wait_done([base])
            baseline = _job_result(log_of(base))
            baseline_rate = baseline.get("matmuls_per_s")
            record["baseline"] = {"id": base, "state": client.job(base)["state"], **baseline}

            ids = {"job_a": (submit(30), 0.30), "job_b": (submit(60), 0.60)}
            while not all(
                any(r.get("phase") == "computing" for r in _lines(log_of(i))) for i, _ in ids.values()
            ):
                if any(client.job(i)["state"] not in ("PENDING", "RUNNING") for i, _ in ids.values()):
                    break
                if ctx.remaining() < 10:
                    raise RuntimeError("the two jobs did not both start computing in time")
                time.sleep(0.3)
            time.sleep(2.5)  # a monitor pass or two after both allocated
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
            smi_apps = subprocess.run(
                [smi, f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=15,
            ).stdout
            used = _metric_used(metrics)
            pids = {name: _job_pids(client.job(i)["pid"]) for name, (i, _) in ids.items()}
            memory_checks = compare_processes(
                {name: (used.get(i), pids[name]) for name, (i, _) in ids.items()}, parse_apps(smi_apps)
            )
            wait_done([i for i, _ in ids.values()])
            jobs = {}
            for name, (i, asked) in ids.items():
                job = client.job(i)
                jobs[name] = {
                    "id": i,
                    "asked": asked,
                    "state": job["state"],
                    "reason": job["reason"],
                    "result": _job_result(log_of(i)),
                    "events": [e for e in client.events(job_id=i) if e.get("kind") == "enforcement"],
                }
            checks = analyse(mode, jobs, baseline_rate) + memory_checks
            record.update(jobs=jobs, checks=checks, baseline_matmuls_per_s=baseline_rate)
            return record
        finally:
            client.close()
            _stop(server)

    return run


def summary(record: dict[str, Any]) -> str:
    jobs = record.get("jobs", {})
    shares = ", ".join(
        f"{n} asked {j['asked']:.2f} got {j['achieved']:.2f}"
        for n, j in sorted(jobs.items())
        if "achieved" in j
    )
    return shares
