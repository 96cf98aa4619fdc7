"""``scripts/gpu-acceptance``: the stages, their limits, and the command line.

Stages (in order; limits in seconds, 8 minutes in all by default):

| stage | limit | what it does |
|---|---:|---|
| env | 30 | nvidia-smi's GPU and driver; which Python packages import |
| gpu_tests | 75 | every pytest test marked ``gpu`` |
| discovery | 30 | discovery, topology and telemetry through NVML against nvidia-smi |
| um | 110 | unified-memory microbenchmarks (``um_worker.py``), then the cost profile built from them |
| memsim | 50 | the measured sweeps replayed by ``gpuslice memsim --cost-profile``, side by side |
| directions | 40 | gpu_ext's always-max and stride + LFU directions rerun with the measured profile |
| serve_soft / serve_mps / serve_shim | 70 each | ``serve_check``: two PyTorch jobs with slices per mode |
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_acceptance import serve_check, um
from gpu_acceptance.runner import Context, Stage, render_table, run_command, run_stages, write_outputs
from gpu_acceptance.smi import (
    GPU_FIELDS,
    check,
    compare_discovery,
    compare_telemetry,
    compare_topology,
    parse_gpus,
)

__all__ = ["STAGES", "main"]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "benchmarks" / "out" / "gpu_acceptance.json"
PROFILE_NAME = "gpu_cost_profile.json"
MODULES = ("gpuslice", "pynvml", "torch", "cupy", "numba", "fastapi", "uvicorn", "pytest", "httpx")


def _smi(ctx: Context, *args: str, timeout: float = 20) -> str:
    cmd = run_command(ctx, [ctx.options.get("nvidia_smi", "nvidia-smi"), *args], timeout)
    if cmd.returncode != 0:
        raise RuntimeError(
            f"nvidia-smi {' '.join(args)} failed ({cmd.returncode}): {cmd.stderr.strip()[:300]}"
        )
    return cmd.stdout


# -- env --------------------------------------------------------------------------------------------


_PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = getattr(importlib.import_module(name), "__version__", "present")
    except Exception as e:
        found[name] = None
print(json.dumps(found))
"""


def env_stage(ctx: Context) -> dict[str, Any]:
    probe = run_command(ctx, [ctx.python, "-c", _PROBE, *MODULES], 25)
    modules = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {}
    record: dict[str, Any] = {"python": ctx.python, "modules": modules}
    checks = [check("gpuslice imports", bool(modules.get("gpuslice")), error=probe.stderr.strip()[-300:])]
    try:
        gpus = parse_gpus(_smi(ctx, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"))
        record["gpus"] = [
            {
                "index": g.index,
                "name": g.name,
                "memory_mib": g.memory_total_bytes >> 20,
                "mig": g.mig_mode,
                "bus_id": g.bus_id,
            }
            for g in gpus
        ]
        record["driver"] = gpus[0].driver_version if gpus else ""
        checks.append(check("nvidia-smi lists a GPU", bool(gpus), gpus=len(gpus)))
    except Exception as e:
        checks.append(check("nvidia-smi lists a GPU", False, error=str(e)))
    record["checks"] = checks
    return record


# -- gpu-marked tests -------------------------------------------------------------------------------

_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def gpu_test_files(tests: Path) -> list[str]:
    """Test files that use the ``gpu`` marker. Only these are collected: the GPU machine need not have
    what the rest of the suite imports (kubernetes, selenium, …)."""
    return sorted(
        str(p.relative_to(tests.parent))
        for p in tests.rglob("test_*.py")
        if "pytest.mark.gpu" in p.read_text()
    )


def gpu_tests_stage(ctx: Context) -> dict[str, Any]:
    files = gpu_test_files(ctx.repo / "tests")
    args = [ctx.python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs", *files]
    cmd = run_command(ctx, args, ctx.remaining())
    tail = cmd.stdout.strip().splitlines()[-1] if cmd.stdout.strip() else ""
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in _PYTEST_COUNT.findall(tail)}
    skips = [line for line in cmd.stdout.splitlines() if line.startswith("SKIPPED")]
    return {
        "command": " ".join(args[1:]),
        "files": files,
        "counts": counts,
        "skipped": skips[:20],
        "timed_out": cmd.timed_out,
        "checks": [
            check(
                "no gpu test failed",
                cmd.returncode in (0, 5) and not counts.get("failed") and not counts.get("error"),
                returncode=cmd.returncode,
                summary=tail,
            ),
            check("some gpu test ran", counts.get("passed", 0) > 0, summary=tail),
        ],
    }


# -- discovery, topology, telemetry ------------------------------------------------------------------


def discovery_stage(ctx: Context) -> dict[str, Any]:
    from gpuslice.hardware.topology_nvml import read_nvml_topology
    from gpuslice.hardware.topology_smi import parse_topo_matrix
    from gpuslice.node.discovery import catalogue_model, discover, gpu_telemetry

    nvml = ctx.options.get("nvml")  # a fake module in tests; None = the real pynvml
    machine = discover(None, nvml=nvml)
    smi_gpus = parse_gpus(_smi(ctx, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"))
    readings = gpu_telemetry(nvml)
    smi_again = parse_gpus(_smi(ctx, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"))
    topo = read_nvml_topology(nvml, name="nvml")
    smi_topo = parse_topo_matrix(_smi(ctx, "topo", "-m"), name="nvidia-smi")
    checks = compare_discovery(machine, smi_gpus, catalogue_model)
    checks += compare_telemetry(readings, smi_again)
    checks += compare_topology(topo, smi_topo)
    return {
        "gpus": [
            {"index": g.index, "model": g.model, "memory_bytes": g.memory_bytes, "uuid": g.uuid}
            for g in machine.gpus
        ],
        "topology": [[topo.label(i, j) for j in range(topo.n_gpus)] for i in range(topo.n_gpus)],
        "checks": checks,
    }


def _discovery_summary(r: dict[str, Any]) -> str:
    gpus = r.get("gpus", [])
    models = ", ".join(sorted({g["model"] for g in gpus}))
    return f"{len(gpus)} GPU(s) {models}; {len(r.get('checks', []))} checks"


# -- unified memory and the cost profile -------------------------------------------------------------


CUDA13_MIN_DRIVER = (
    580  # CUDA 13.0 needs driver 580 or later (CUDA toolkit release notes; docs/references.md)
)


def ensure_cupy(ctx: Context) -> str:
    """'present', or install CuPy for this driver's CUDA from PyPI; what happened, in words. A machine
    without internet access fails fast (no retries, 15 s socket timeout) and the worker reports the rest."""
    if run_command(ctx, [ctx.python, "-c", "import cupy"], 60).returncode == 0:
        return "present"
    driver = str(ctx.records.get("env", {}).get("driver", ""))
    major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
    package = "cupy-cuda13x" if major >= CUDA13_MIN_DRIVER else "cupy-cuda12x"
    args = [ctx.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--retries", "0",
            "--timeout", "15", package]  # fmt: skip
    cmd = run_command(ctx, args, max(5.0, min(90.0, ctx.remaining() - 30)))
    if cmd.returncode == 0:
        return f"installed {package} from PyPI"
    why = "timed out" if cmd.timed_out else (cmd.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return f"missing; pip install {package} failed: {why}"


def um_stage(ctx: Context) -> dict[str, Any]:
    plan = um.make_plan(
        capacity_bytes=ctx.options.get("capacity_bytes", um.DEFAULT_CAPACITY),
        allow_oversubscription=ctx.options.get("allow_oversubscription", False),
    )
    canned = ctx.options.get("fake_um")
    if canned:
        text, source = Path(canned).read_text(), {"measured": False, "canned": str(canned)}
    else:
        cupy = ensure_cupy(ctx)
        plan_path = ctx.out_dir / "um_plan.json"
        plan_path.write_text(json.dumps(plan))
        worker = Path(__file__).with_name("um_worker.py")
        cmd = run_command(ctx, [ctx.python, str(worker), str(plan_path)], ctx.remaining() - 5)
        text, source = cmd.stdout, {"measured": True, "cupy": cupy}
        if cmd.returncode != 0:
            source["worker_exit"] = "timeout" if cmd.timed_out else cmd.returncode
            source["worker_stderr"] = cmd.stderr.strip()[-600:]
    m = um.parse_measurements(text)
    env = ctx.records.get("env", {})
    source.update(
        gpu=m.env.get("gpu") or (env.get("gpus") or [{}])[0].get("name", ""),
        driver=env.get("driver", ""),
        date=dt.date.today().isoformat(),
        script="scripts/gpu-acceptance",
    )
    record: dict[str, Any] = {
        "plan": plan,
        "source": source,
        "measurements": m.as_dict(),
    }
    checks = [
        check(
            "worker finished",
            source.get("worker_exit") is None,
            **{k: source[k] for k in ("worker_exit", "worker_stderr") if k in source},
        )
    ]
    checks.append(check("no measurement failed", not m.errors, errors=m.errors[:5]))
    if "none" in m.advise:
        # first touch of every page after each hint, against no hint: > 1 means the hint made it faster
        none_s = m.advise["none"]["seconds"]
        record["advise_speedup"] = {v: none_s / r["seconds"] for v, r in sorted(m.advise.items())}
    checks.append(
        check(
            "every planned sweep measured",
            len(m.sweeps) == len(plan["sweeps"]),
            measured=len(m.sweeps),
            planned=len(plan["sweeps"]),
        )
    )
    try:
        name = "measured " + (source["gpu"] or "gpu") if source["measured"] else "canned (not a measurement)"
        profile = um.build_cost_profile(m, name=name, source=source)
        path = ctx.out_dir / PROFILE_NAME
        path.write_text(json.dumps(profile, indent=1) + "\n")
        record["profile"] = {
            "path": str(path),
            **{k: profile[k] for k in ("link_bytes_per_s", "batch_overhead_s", "per_access_s")},
        }
        checks.append(check("cost profile built", True, path=str(path)))
    except um.MeasurementError as e:
        checks.append(check("cost profile built", False, error=str(e)))
    record["checks"] = checks
    return record


def _um_summary(r: dict[str, Any]) -> str:
    p = r.get("profile")
    if not p:
        return ""
    return (
        f"link {p['link_bytes_per_s'] / 1e9:.1f} GB/s, batch {p['batch_overhead_s'] * 1e6:.1f} us, "
        f"access {p['per_access_s'] * 1e9:.2f} ns"
    )


def memsim_stage(ctx: Context) -> dict[str, Any]:
    from gpuslice.memory.workloads import write_trace_csv

    um_record = ctx.records.get("um", {})
    profile = um_record.get("profile", {}).get("path")
    if not profile:
        raise RuntimeError("no cost profile: the um stage did not build one")
    sweeps = um_record["measurements"]["sweeps"]
    if not sweeps:
        raise RuntimeError("no measured sweep to replay")
    work = Path(tempfile.mkdtemp(prefix="gpuslice-accept-memsim-"))

    planned = um_record["plan"]["sweeps"]

    def replay(measured: dict[str, Any]) -> tuple[tuple[str, float], float | None, str]:
        key = (measured["pattern"], float(measured["ratio"]))
        try:
            s = {**um.planned_sweep(planned, measured), **measured}
        except um.MeasurementError as e:
            return key, None, str(e)
        trace = um.sweep_trace(s)
        path = work / f"{s['pattern']}-{s['ratio']}.csv"
        write_trace_csv(trace, path)
        oversub = um.memsim_oversub(trace.working_set_blocks, int(s["capacity_bytes"]))
        args = [
            ctx.python,
            "-c",
            "from gpuslice.cli.main import main; main()",
            "memsim",
            "--trace",
            str(path),
            "--oversub",
            f"{oversub:.9f}",
            "--cost-profile",
            profile,
            "--json",
        ]
        cmd = run_command(ctx, args, ctx.remaining())
        try:
            rows = json.loads(cmd.stdout)
            row = next(r for r in rows if r["evict"] == "default" and r["prefetch"] == "tree")
            return key, row["estimated_seconds"], ""
        except (json.JSONDecodeError, StopIteration, KeyError, TypeError):
            return key, None, (cmd.stderr or cmd.stdout).strip()[-300:]

    workers = max(1, min(len(sweeps), (os.cpu_count() or 2) - 1))
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(replay, sweeps))
    predicted = {key: sec for key, sec, _ in results if sec is not None}
    problems = {f"{k[0]} {k[1]}": err for k, sec, err in results if sec is None}
    rows = um.compare_sweeps(sweeps, predicted)
    checks = [check("memsim replayed every sweep", not problems, problems=problems)]
    checks += [
        check(
            f"{r['pattern']} {r['ratio']}: memsim within 25 % of measured",
            r["error"] is not None and abs(r["error"]) <= 0.25,
            measured_s=r["measured_s"],
            memsim_s=r["memsim_s"],
            error=r["error"],
        )
        for r in rows
    ]
    return {"profile": profile, "rows": rows, "checks": checks}


def _memsim_summary(r: dict[str, Any]) -> str:
    errors = [abs(x["error"]) for x in r.get("rows", []) if x["error"] is not None]
    return f"{len(errors)} sweeps, median abs. error {sorted(errors)[len(errors) // 2]:.0%}" if errors else ""


# gpu_ext's two directions that hinge on the cost model (tests/memory/test_directions.py):
# (workload, scale, oversubscription, policy pair compared with the driver's default/tree)
DIRECTIONS = (
    ("rand-stream", 0.25, 1.2, ("default", "always-max")),
    ("llm-moe-decode", 0.5, 1.8, ("lfu", "stride")),
)


def directions_stage(ctx: Context) -> dict[str, Any]:
    """The two directions rerun with the measured profile: speedup over the driver default (>1 = wins).
    Findings, not checks: which way they go with measured costs is what the run is for."""
    from gpuslice.memory import SimConfig, make_workload, simulate
    from gpuslice.memory.cost import load_cost_profile
    from gpuslice.programs.loader import memory_ops

    profile = ctx.records.get("um", {}).get("profile", {}).get("path")
    if not profile:
        raise RuntimeError("no cost profile: the um stage did not build one")
    cost = load_cost_profile(profile)
    rows = []
    for workload, scale, oversub, (evict, prefetch) in DIRECTIONS:
        trace = make_workload(workload, scale=scale)
        cfg = SimConfig(oversub=oversub, cost=cost)
        base = simulate(trace, memory_ops("default", "tree"), cfg, "default", "tree")
        ours = simulate(trace, memory_ops(evict, prefetch), cfg, evict, prefetch)
        rows.append(
            {
                "workload": workload,
                "scale": scale,
                "oversub": oversub,
                "policy": f"{evict}+{prefetch}",
                "default_s": base.estimated_seconds,
                "policy_s": ours.estimated_seconds,
                "speedup": base.estimated_seconds / ours.estimated_seconds,
                "batches": [base.batches, ours.batches],
                "migrated_bytes": [base.migrated_bytes, ours.migrated_bytes],
            }
        )
    return {"profile": profile, "rows": rows, "checks": []}


def _directions_summary(r: dict[str, Any]) -> str:
    return "; ".join(f"{x['policy']} on {x['workload']} {x['speedup']:.2f}x" for x in r.get("rows", []))


STAGES: tuple[Stage, ...] = (
    Stage(
        "env",
        env_stage,
        30,
        lambda r: f"{(r.get('gpus') or [{}])[0].get('name', '?')}, driver {r.get('driver', '?')}",
    ),
    Stage(
        "gpu_tests",
        gpu_tests_stage,
        75,
        lambda r: ", ".join(f"{n} {k}" for k, n in r.get("counts", {}).items()),
    ),
    Stage("discovery", discovery_stage, 30, _discovery_summary),
    Stage("um", um_stage, 110, _um_summary),
    Stage("memsim", memsim_stage, 50, _memsim_summary),
    Stage("directions", directions_stage, 40, _directions_summary),
    Stage("serve_soft", serve_check.serve_stage("soft"), 70, serve_check.summary),
    Stage("serve_mps", serve_check.serve_stage("mps"), 70, serve_check.summary),
    Stage("serve_shim", serve_check.serve_stage("shim"), 70, serve_check.summary),
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/gpu-acceptance",
        description="Prove every GPU path of gpuslice on this machine's NVIDIA GPU; write JSON and a table.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"the JSON (default {DEFAULT_OUT.relative_to(REPO)}); the table goes beside it as .md",
    )
    p.add_argument(
        "--stages",
        default=",".join(s.name for s in STAGES),
        help="comma-separated stages to run, in the order above",
    )
    p.add_argument("--budget", type=float, default=470.0, help="seconds for the whole run (default 470)")
    p.add_argument(
        "--capacity",
        default="512MiB",
        help="GPU memory left free for the unified-memory sweeps (default 512MiB)",
    )
    p.add_argument(
        "--python", default=sys.executable, help="interpreter for jobs and subprocesses (needs torch, cupy)"
    )
    p.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi program (tests pass a fake)")
    p.add_argument(
        "--fake-um",
        type=Path,
        help="canned worker output instead of the GPU (testing only; marks the run fake)",
    )
    p.add_argument(
        "--limit-factor",
        type=float,
        default=1.0,
        help="multiply every stage's time limit and the budget (a slow or loaded machine; default 1)",
    )
    p.add_argument(
        "--allow-oversubscription",
        action="store_true",
        help="sweep managed memory up to 2x the free GPU memory (can hang some GPUs; default: up to 0.85x)",
    )
    return p


def main(argv: list[str] | None = None, *, nvml: Any = None) -> int:
    """Run the stages; 0 when every stage that ran passed, 1 otherwise, 2 on bad arguments."""
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.stages.split(",") if n.strip()]
    known = {s.name: s for s in STAGES}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown stage {unknown[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not 0 < args.limit_factor <= 100:
        print(
            f"error: --limit-factor {args.limit_factor}: use a number above 0 and at most 100",
            file=sys.stderr,
        )
        return 2
    if args.fake_um is not None and not args.fake_um.is_file():
        print(f"error: --fake-um {args.fake_um}: no such file", file=sys.stderr)
        return 2
    from gpuslice.errors import UserError
    from gpuslice.units import parse_size

    try:
        capacity = parse_size(args.capacity)
    except UserError as e:
        print(f"error: --capacity: {e}", file=sys.stderr)
        return 2
    stages = [known[n] for n in names]
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    ctx = Context(
        repo=REPO,
        out_dir=out_dir,
        python=args.python,
        env=env,
        options={
            "nvidia_smi": args.nvidia_smi,
            "fake_um": args.fake_um,
            "nvml": nvml,
            "allow_oversubscription": args.allow_oversubscription,
            "capacity_bytes": capacity,
        },
    )
    started = time.monotonic()
    if args.limit_factor != 1.0:  # a slow machine: every stage's limit and the budget grow alike
        stages = [dataclasses.replace(s, timeout_s=s.timeout_s * args.limit_factor) for s in stages]
    budget = args.budget * args.limit_factor
    records = run_stages(ctx, stages, budget, lambda line: print(f"gpu-acceptance: {line}", flush=True))
    env_record = records.get("env", {})
    document = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fake": args.fake_um is not None or nvml is not None,
        "gpu": (env_record.get("gpus") or [{}])[0].get("name", ""),
        "driver": env_record.get("driver", ""),
        "command": " ".join(["scripts/gpu-acceptance", *(argv if argv is not None else sys.argv[1:])]),
        "total_seconds": round(time.monotonic() - started, 1),
        "stages": records,
    }
    table = render_table(records, stages)
    md = write_outputs(args.out, document, table)
    print(table, end="")
    print(f"wrote {args.out} and {md}")
    return 0 if all(r["status"] in ("ok", "not available") for r in records.values()) else 1
