"""Render the timed-replay comparison from the rows ``sim_replay_table.py`` wrote: the load levels, the
JCT/wait table, the ordering check against Alibaba's GPU-cluster simulator, and the predictor's error.

Usage: .venv/bin/python benchmarks/render_replay_table.py [--rows benchmarks/out/sim_replay_levels.jsonl]
       [--predict-dir benchmarks/out/predict] [--into benchmarks/RESULTS.md]
With --into, the text between the two marker comments in that file is replaced (no hand copying);
otherwise the markdown goes to stdout. The last row of a repeated run (same key) wins.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sim_replay_table import KEY, SETUPS

BEGIN, END = "<!-- sim_replay_levels:begin -->", "<!-- sim_replay_levels:end -->"
PLACEMENTS = ("fgd", "bestfit")
CHECKED = ("sjf-oracle", "sjf-predicted", "fifo")  # expected order of mean JCT, lowest first


def load_rows(path: Path) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
    """(runs by KEY, levels by (trace, level)); later lines replace earlier ones."""
    runs: dict[tuple, dict] = {}
    levels: dict[tuple, dict] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("kind") == "level":
            levels[(row["trace"], row["level"])] = row
        elif "level" in row:
            runs[tuple(row[k] for k in KEY)] = row
    return runs, levels


def ordering(oracle: float, predicted: float, fifo: float) -> str:
    """How the three mean JCTs compare with the published order oracle < predicted < FIFO."""
    if oracle < predicted < fifo:
        return "holds"
    if oracle == predicted == fifo:
        return "tie (no queue)"
    parts = []
    if not oracle < predicted:
        parts.append("oracle ≥ predicted" if oracle > predicted else "oracle = predicted")
    if not predicted < fifo:
        parts.append("predicted ≥ FIFO" if predicted > fifo else "predicted = FIFO")
    return "differs: " + ", ".join(parts)


def _n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def render(runs: dict[tuple, dict], levels: dict[tuple, dict], predict_dir: Path | None) -> str:
    order = list(dict.fromkeys(levels))  # (trace, level) in the order they were run
    by_level: dict[tuple, dict[tuple[str, str], dict]] = {}
    for row in runs.values():
        by_level.setdefault((row["trace"], row["level"]), {})[(row["queue"], row["placement"])] = row
    out = ["| trace | level | copies × pods | nodes (GPUs) | compression | peak GPUs asked | offered |"]
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for key in order:
        lv = levels[key]
        out.append(
            f"| {lv['trace']} | {lv['level']} | {lv['repeat']} × {lv['base_pods']:,} | {lv['nodes']} "
            f"({lv['cluster_gpus']}) | {lv['load']:,.0f} | {lv['peak_gpus']:,.0f} | {lv['offered']:.2f} |"
        )
    out += ["", "| trace | level | queue | " + " | ".join(
        f"{p} JCT mean | {p} JCT p99 | {p} wait mean | {p} wait p99 | {p} preempt" for p in PLACEMENTS
    ) + " |", "|---|---|---|" + "---:|" * (5 * len(PLACEMENTS))]  # fmt: skip
    for key in order:
        rows = by_level.get(key, {})
        for setup in SETUPS:
            cells = []
            for placement in PLACEMENTS:
                r = rows.get((setup, placement))
                if r is None:
                    cells += ["not run"] + ["—"] * 4
                    continue
                cells += [_n(r["jct_mean"]), _n(r["jct_p99"]), _n(r["wait_mean"]), _n(r["wait_p99"])]
                cells.append(
                    f"{r['preemptions']:,}" + (f" ({r['never_started']} never)" if r["never_started"] else "")
                )
            out.append(f"| {key[0]} | {key[1]} | {setup} | " + " | ".join(cells) + " |")
    out += ["", "| trace | level | placement | SJF-oracle | SJF-predicted | FIFO | FIFO wait mean | order |"]
    out.append("|---|---|---|---:|---:|---:|---:|---|")
    held = total = 0
    for key in order:
        for placement in PLACEMENTS:
            rows = [by_level.get(key, {}).get((s, placement)) for s in CHECKED]
            if any(r is None for r in rows):
                continue
            verdict = ordering(*(r["jct_mean"] for r in rows))
            total += 1
            held += verdict == "holds"
            means = " | ".join(_n(r["jct_mean"], 1) for r in rows)
            out.append(
                f"| {key[0]} | {key[1]} | {placement} | {means} | {_n(rows[2]['wait_mean'], 1)} | {verdict} |"
            )
    out += ["", f"The order SJF-oracle < SJF-predicted < FIFO on mean JCT holds in **{held} of {total}**."]
    if predict_dir is not None:
        out += ["", "| trace | MAE model / constant (s) | median AE model / constant (s) | mean \\|log "
                "ratio\\| model / constant | Spearman (held out) | Spearman (window, cross-fitted) |",
                "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        corr = {lv["trace"]: lv.get("estimate_rank_corr") for lv in levels.values()}
        for trace in dict.fromkeys(k[0] for k in order):
            path = predict_dir / trace / "errors.json"
            if not path.exists():
                continue
            e = json.loads(path.read_text())
            out.append(
                f"| {trace} | {e['mae_s']:,.0f} / {e['baseline_mae_s']:,.0f} | {e['median_ae_s']:,.0f} / "
                f"{e['baseline_median_ae_s']:,.0f} | {e['log_mae']:.2f} / {e['baseline_log_mae']:.2f} | "
                f"{e['rank_correlation']:.3f} | {_n(corr.get(trace), 3)} |"
            )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=Path, default=Path("benchmarks/out/sim_replay_levels.jsonl"))
    parser.add_argument("--predict-dir", type=Path, default=Path("benchmarks/out/predict"))
    parser.add_argument("--into", type=Path, default=None)
    args = parser.parse_args()
    if not args.rows.is_file():
        print(f"error: --rows {args.rows}: no such file", file=sys.stderr)
        sys.exit(2)
    text = render(*load_rows(args.rows), args.predict_dir if args.predict_dir.is_dir() else None)
    if args.into is None:
        sys.stdout.write(text)
        return
    doc = args.into.read_text()
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        print(f"error: --into {args.into}: needs one {BEGIN} line before one {END} line", file=sys.stderr)
        sys.exit(2)
    head, rest = doc.split(BEGIN)
    args.into.write_text(head + BEGIN + "\n" + text + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    main()
