"""Mutation testing of core modules with mutmut: do the tests of an area fail when its code is wrong?

    .venv/bin/python benchmarks/mutation.py                      # every target below
    .venv/bin/python benchmarks/mutation.py --target units       # one (repeatable)

For each target (a module and the tests of its area), mutmut changes the code one small edit at a time
(an operator, a constant, a string, a call's argument) and runs the tests; a mutant the tests still pass
"survived". Prints a Markdown table for ``benchmarks/RESULTS.md`` (mutants, killed, survived, score) and
every survivor's diff, to be killed by a new test or explained as equivalent.

How it runs: mutmut 3 imports the mutated copy it writes under ``mutants/``, so the package must not be
installed in the interpreter that runs it (an editable install's import hook would win). The script
clones this repository's HEAD into a temporary folder, makes a virtual environment there with the test
dependencies and mutmut, uninstalls gpuslice from it, and runs mutmut once per target. Processes the
tests start themselves (a policy file's worker: ``sys.executable -m gpuslice.programs.policy_worker``)
import the mutants too, through a ``.pth`` file in that environment naming ``mutants/src``: Python adds
a ``.pth`` folder only if it exists when the interpreter starts, so mutmut's own process (started
before it makes ``mutants/``) keeps the ``sys.path`` it sets up itself, and the workers, started while
a mutant is on, get the mutated package and the ``MUTANT_UNDER_TEST`` they inherit. (``PYTHONPATH``
instead made mutmut's stats run fail.) ``--work DIR`` keeps the clone and the environment in ``DIR``
for the next run, which only brings the clone to HEAD. Minutes per target on the project's 2-core VM
(the DRA allocator about an hour with ``--children 1``); not part of CI.

Outcomes other than killed and survived: "no tests" (no test of the area runs the mutated function:
listed with the survivors, as untested code), "timeout" (a test run hung past mutmut's limit: the
mutant was noticed, but the score counts it as not killed), and any crash.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTMUT = "mutmut>=3.3"

# target -> (module to mutate, the tests of its area)
TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "units": ("src/gpuslice/units.py", ("tests/test_units.py",)),
    "request": ("src/gpuslice/workload/request.py", ("tests/workload",)),
    "equivalent": ("src/gpuslice/workload/equivalent.py", ("tests/workload",)),
    "fit": ("src/gpuslice/ledger/fit.py", ("tests/ledger",)),
    "backfill": ("src/gpuslice/scheduler/backfill.py", ("tests/scheduler/test_backfill.py",)),
    "auth": ("src/gpuslice/server/auth.py", ("tests/server/test_auth.py", "tests/server/test_hardening.py")),
    "guard": ("src/gpuslice/programs/guard.py", ("tests/programs/test_guard.py",)),
    "extender-state": (
        "src/gpuslice/k8s/extender/state.py",
        (
            "tests/k8s/test_extender.py",
            "tests/k8s/test_extender_decide.py",
            "tests/k8s/test_extender_fit_rule.py",
            "tests/k8s/test_extender_mig_ledger.py",
            "tests/k8s/test_extender_bind_race.py",
            "tests/k8s/test_extender_containers.py",
            "tests/k8s/test_extender_state.py",
        ),
    ),
    "dra-allocator": (
        "src/gpuslice/k8s/dra/allocator.py",
        (
            "tests/k8s/test_dra_allocator.py",
            "tests/k8s/test_dra_robust.py",
            "tests/k8s/test_dra_parity.py",
            "tests/observe/test_cluster_metrics.py",  # the pending pods it keeps for the metrics
        ),
    ),
    "dra-claim-ask": ("src/gpuslice/k8s/dra/claim_ask.py", ("tests/k8s/test_dra_allocator.py",)),
    "ledger": ("src/gpuslice/ledger/", ("tests/ledger",)),
    "ledger-mig": ("src/gpuslice/ledger/mig.py", ("tests/ledger",)),
    "preemption": ("src/gpuslice/scheduler/preemption.py", ("tests/scheduler",)),
    "quota": ("src/gpuslice/scheduler/quota.py", ("tests/scheduler",)),
    "placer": ("src/gpuslice/scheduler/placer.py", ("tests/scheduler", "tests/sim/test_sim_mig.py")),
    "mig-choice": (
        "src/gpuslice/scheduler/mig_choice.py",
        ("tests/scheduler", "tests/sim/test_sim_mig.py", "tests/k8s/test_mig_parity.py"),
    ),
    "mig-planner": ("src/gpuslice/scheduler/mig_planner.py", ("tests/scheduler",)),
    "node-gpu-choice": ("src/gpuslice/scheduler/node_gpu_choice.py", ("tests/scheduler",)),
    "node-fit": ("src/gpuslice/scheduler/node_fit.py", ("tests/scheduler",)),
    "node-scheduler": ("src/gpuslice/scheduler/node_scheduler.py", ("tests/scheduler",)),
    "scheduler": ("src/gpuslice/scheduler/", ("tests/scheduler",)),
}


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, text=True, capture_output=True, check=False)


def _environment(work: Path) -> Path:
    """A clone of HEAD and a virtual environment with the test dependencies and mutmut, no gpuslice;
    one left in ``work`` by an earlier run is reused, its clone brought to HEAD."""
    clone = work / "repo"
    venv = work / "venv"
    python = str(venv / "bin" / "python")
    if (venv / "bin" / "mutmut").exists() and (clone / ".git").exists():
        subprocess.run(["git", "fetch", "-q", str(REPO), "HEAD"], cwd=clone, check=True)
        subprocess.run(["git", "reset", "-q", "--hard", "FETCH_HEAD"], cwd=clone, check=True)
        subprocess.run(["git", "clean", "-q", "-fdx", "-e", "mutants"], cwd=clone, check=True)
        return clone
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [python, "-m", "pip", "install", "-q"]
    print("installing the test dependencies and mutmut (minutes)...", file=sys.stderr, flush=True)
    subprocess.run([*pip, f"{clone}[test]", MUTMUT], check=True)
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "gpuslice"], check=True)
    # the tests' own child processes import the mutants (see the module docstring)
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True, capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "gpuslice-mutants.pth").write_text(f"{clone / 'mutants' / 'src'}\n")
    return clone


def _mutate(clone: Path, module: str, tests: tuple[str, ...], children: int) -> dict[str, list[str]]:
    """mutmut over ``module`` (a file or a folder) with ``tests``, ``children`` mutants at once: mutant
    names by outcome."""
    selection = "\n    ".join(tests)
    (clone / "setup.cfg").write_text(
        f"[mutmut]\nsource_paths={module}\npytest_add_cli_args_test_selection={selection}\n"
        "also_copy=src/\n    native/\n    examples/\n    deploy/\n    e2e/\n    docs/\n    scripts/\n"
    )
    mutmut = str(clone.parent / "venv" / "bin" / "mutmut")
    subprocess.run(["rm", "-rf", str(clone / "mutants")], check=True)
    done = _run([mutmut, "run", "--max-children", str(children)], clone)
    if done.returncode != 0:
        raise SystemExit(f"mutmut run failed on {module}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    results = _run([mutmut, "results", "--all", "true"], clone).stdout
    outcomes: dict[str, list[str]] = {}
    for line in results.splitlines():
        name, sep, outcome = line.strip().rpartition(": ")
        if sep:
            outcomes.setdefault(outcome, []).append(name)
    return outcomes


def _diff(clone: Path, mutant: str) -> str:
    shown = _run([str(clone.parent / "venv" / "bin" / "mutmut"), "show", mutant], clone).stdout
    changed = [line for line in shown.splitlines() if re.match(r"^[-+](?![-+])", line)]
    return " / ".join(line.strip() for line in changed[:2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="default: every target")
    parser.add_argument(
        "--children", type=int, default=os.cpu_count() or 1, help="mutants tested at once (default: the CPUs)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="keep the clone and its environment here and reuse them (default: a temporary folder)",
    )
    args = parser.parse_args()
    if args.children < 1:
        parser.error(f"--children {args.children}: at least 1")
    chosen = args.target or list(TARGETS)
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    survivors: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="gpuslice-mutation-") as tmp:
        work = args.work.resolve() if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        clone = _environment(work)
        commit = _run(["git", "log", "-1", "--format=%h %s"], clone).stdout.strip()
        print(f"commit {commit[:100]}\n")
        print("| module | tests | mutants | killed | survived | other | killed % |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for name in chosen:
            module, tests = TARGETS[name]
            outcomes = _mutate(clone, module, tests, args.children)
            total = sum(len(v) for v in outcomes.values())
            killed, survived = len(outcomes.get("killed", [])), outcomes.get("survived", [])
            other = total - killed - len(survived)
            score = 100.0 * killed / total if total else float("nan")
            print(f"| {module.removeprefix('src/gpuslice/')} | {', '.join(tests)} | {total} | {killed} | "
                  f"{len(survived)} | {other} | {score:.0f} |", flush=True)  # fmt: skip
            others = {k: len(v) for k, v in sorted(outcomes.items()) if k not in ("killed", "survived")}
            if others:
                print(f"<!-- other: {', '.join(f'{n} {k}' for k, n in others.items())} -->", flush=True)
            survivors += [(m, _diff(clone, m)) for m in survived]
            survivors += [
                (m, f"({kind}) {_diff(clone, m)}")
                for kind in ("no tests", "timeout")
                for m in outcomes.get(kind, [])
            ]
    if survivors:
        print("\nSurvivors:\n")
        for mutant, diff in survivors:
            print(f"- `{mutant}`: {diff}")


if __name__ == "__main__":
    main()
