"""Every command that takes a built-in policy name also takes a policy file: sim openb, memsim."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODES = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n-{i},32000,131072,{1 + i % 8},V100M16\n" for i in range(12)
)
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p-{i},{1000 + 300 * (i % 7)},1024,1,{100 * (1 + i % 9)}\n" for i in range(80)
)


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES)
    (tmp_path / "openb_pod_list_mini.csv").write_text(PODS)
    return tmp_path


def test_sim_openb_runs_a_policy_file_beside_the_builtin_with_equal_results(
    trace_dir: Path,
    tmp_path: Path,
    run_cli: Callable[[list[str]], tuple[int, str, str]],
    builtin_files: Path,
) -> None:
    fgd_file = str(builtin_files / "fgd.py")
    code, out, err = run_cli(
        [
            "sim",
            "openb",
            "--trace-dir",
            str(trace_dir),
            "--trace",
            "mini",
            "--policy",
            "fgd",
            "--policy",
            fgd_file,
            "--seeds",
            "42-43",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0, err
    assert fgd_file in out
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    by_policy: dict[str, list] = {}
    for row in rows:
        by_policy.setdefault(row["policy"], []).append(row)
    builtin, loaded = by_policy["fgd"], by_policy[fgd_file]
    strip = ("policy", "wall_seconds")
    assert [{k: v for k, v in r.items() if k not in strip} for r in loaded] == [
        {k: v for k, v in r.items() if k not in strip} for r in builtin
    ]


def test_sim_openb_refuses_a_rejected_file_before_any_run_with_file_and_line(
    tmp_path: Path, run_cli: Callable[[list[str]], tuple[int, str, str]]
) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\nfrom gpuslice.programs.api import PlacementOps\n\n\nclass P(PlacementOps):\n    pass\n"
    )
    code, _, err = run_cli(["sim", "openb", "--policy", str(bad), "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"{bad}:1: import of 'os' is not allowed" in err
    assert not (tmp_path / "o").exists()


def test_sim_openb_refuses_a_file_of_another_family(
    tmp_path: Path, run_cli: Callable[[list[str]], tuple[int, str, str]], builtin_files: Path
) -> None:
    lfu = str(builtin_files / "lfu.py")
    code, _, err = run_cli(["sim", "openb", "--policy", lfu, "--out", str(tmp_path)])
    assert code == 2 and "is a eviction policy; a placement policy is needed here" in err


def test_memsim_takes_eviction_and_prefetch_files_and_matches_the_builtins(
    run_cli: Callable[[list[str]], tuple[int, str, str]], builtin_files: Path
) -> None:
    common = ["memsim", "--workload", "hotspot", "--scale", "0.02", "--visibility", "full", "--json"]
    code, out, err = run_cli([*common, "--evict", "lfu", "--prefetch", "stride"])
    assert code == 0, err
    builtin = json.loads(out)[0]
    lfu, stride = str(builtin_files / "lfu.py"), str(builtin_files / "stride.py")
    files = ["--evict", lfu, "--prefetch", stride]
    code, out, err = run_cli([*common, *files])
    assert code == 0, err
    loaded = json.loads(out)[0]
    assert (loaded["evict"], loaded["prefetch"]) == (lfu, stride)
    different = {"evict", "prefetch", "wall_seconds"}
    assert {k: v for k, v in loaded.items() if k not in different} == {
        k: v for k, v in builtin.items() if k not in different
    }
