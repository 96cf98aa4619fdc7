"""Reproduce the FGD paper's openb results: every policy × seeds × traces, side by side with the paper.

    .venv/bin/python benchmarks/openb_repro.py           # 4 fidelity traces × 6 policies × 10 seeds
    .venv/bin/python benchmarks/openb_repro.py --traces all --jobs 2 --markdown out.md

Prints (and with --markdown writes) a Markdown table: per trace and policy our mean ± sd of unallocated
GPU % at 100 % arrival, the published mean ± sd (column ``100`` of the artifact's
``analysis_allo_discrete.csv``), the difference, the tolerance max(0.5, 2 × published sd), whether we are
within it, and the mean wall time per run; then whether the policy ranking matches (FGD lowest).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
from rich.progress import Progress

from gpuslice.sim.openb import ReplayResult
from gpuslice.sim.published import FGD_PAPER_POLICIES, PUBLISHED_FILE, published_results
from gpuslice.sim.sweep import run_sweep

REPO = Path(__file__).resolve().parents[1]
SHARED_OPENB = REPO.parent / "shared" / "data" / "openb"
FIDELITY_TRACES = ("default", "cpu200", "gpushare60", "multigpu50")


def all_traces(trace_dir: Path) -> list[str]:
    return sorted(p.name[len("openb_pod_list_") : -4] for p in trace_dir.glob("openb_pod_list_*.csv"))


def summarize(results: list[ReplayResult], published_path: Path | None) -> tuple[list[dict], str]:
    published = published_results(published_path)
    rows: list[dict] = []
    groups: dict[tuple[str, str], list[ReplayResult]] = {}
    for r in results:
        groups.setdefault((r.trace, r.policy), []).append(r)
    for (trace, policy), runs in groups.items():
        ours = np.array([r.unallocated_pct_at(100) for r in runs])
        pub = published.get((trace, policy))
        row = {
            "trace": trace,
            "policy": policy,
            "seeds": len(runs),
            "ours_mean": float(ours.mean()),
            "ours_sd": float(ours.std(ddof=1)) if len(ours) > 1 else 0.0,
            "wall_mean": float(np.mean([r.wall_seconds for r in runs])),
        }
        if pub is not None:
            row |= {
                "pub_mean": pub.mean,
                "pub_sd": pub.sd,
                "diff": row["ours_mean"] - pub.mean,
                "tolerance": max(0.5, 2 * pub.sd),
            }
            row["within"] = abs(row["diff"]) <= row["tolerance"]
        rows.append(row)

    lines = [
        "| trace | policy | ours (mean ± sd) | published (mean ± sd) | diff | tolerance | within "
        "| wall s/run |",
        "|---|---|---:|---:|---:|---:|:---:|---:|",
    ]
    for row in rows:
        pub = f"{row['pub_mean']:.2f} ± {row['pub_sd']:.2f}" if "pub_mean" in row else "—"
        diff = f"{row['diff']:+.2f}" if "diff" in row else "—"
        tol = f"{row['tolerance']:.2f}" if "tolerance" in row else "—"
        within = ("yes" if row["within"] else "**no**") if "within" in row else "—"
        lines.append(
            f"| {row['trace']} | {row['policy']} | {row['ours_mean']:.2f} ± {row['ours_sd']:.2f} | {pub} | "
            f"{diff} | {tol} | {within} | {row['wall_mean']:.2f} |"
        )
    lines.append("")
    for trace in dict.fromkeys(r["trace"] for r in rows):
        mine = sorted((r for r in rows if r["trace"] == trace), key=lambda r: r["ours_mean"])
        ranked = [r["policy"] for r in mine]
        theirs = [r["policy"] for r in sorted(mine, key=lambda r: r.get("pub_mean", np.inf))]
        lines.append(
            f"- {trace}: our ranking {' < '.join(ranked)}; published {' < '.join(theirs)}; "
            f"FGD lowest: {'yes' if ranked[0] == 'fgd' else 'no'}; "
            f"same order: {'yes' if ranked == theirs else 'no'}"
        )
    return rows, "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--traces", nargs="+", default=list(FIDELITY_TRACES), help="trace names, or 'all'")
    parser.add_argument("--policies", nargs="+", default=list(FGD_PAPER_POLICIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(42, 52)))
    parser.add_argument("--trace-dir", type=Path, default=SHARED_OPENB if SHARED_OPENB.is_dir() else None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="write the per-run records here")
    args = parser.parse_args()
    traces = all_traces(args.trace_dir) if args.traces == ["all"] else args.traces
    published_path = None
    if args.trace_dir is not None and (args.trace_dir / "fgd_expected_results" / PUBLISHED_FILE).is_file():
        published_path = args.trace_dir / "fgd_expected_results" / PUBLISHED_FILE

    started = time.perf_counter()
    total = len(traces) * len(args.policies) * len(args.seeds)
    with Progress() as progress:
        task = progress.add_task("replaying", total=total)
        results = run_sweep(
            traces,
            args.policies,
            args.seeds,
            args.trace_dir,
            jobs=args.jobs,
            on_result=lambda _: progress.advance(task),
        )
    elapsed = time.perf_counter() - started
    rows, table = summarize(results, published_path)
    header = (
        f"{date.today().isoformat()} · {platform.node()} ({platform.machine()}, {args.jobs} jobs) · "
        f"{total} runs in {elapsed:.0f} s · "
        f"command: python benchmarks/openb_repro.py {' '.join(sys.argv[1:])}"
    )
    text = f"{header}\n\n{table}\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": [r.record() for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
