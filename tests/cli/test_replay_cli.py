"""``gpuslice sim replay`` and ``gpuslice predict``: result files; one error line, exit 2, on bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpuslice.cli.main import main
from gpuslice.sim.trace import NODE_FILE

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / NODE_FILE).write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,1,V100M16\n")
    rows = [
        f"p{i},1000,1024,1,1000,,{'LS' if i % 2 else 'BE'},Running,{10 * i},{10 * i + 100 + i},{10 * i}"
        for i in range(40)
    ]
    (folder / "openb_pod_list_t.csv").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    (folder / "openb_pod_list_notime.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,1,1000\n"
    )
    (folder / "openb_pod_list_negative.csv").write_text(HEADER + "\np,1000,1024,1,1000,,LS,Running,0,5,9\n")
    return folder


def test_replay_writes_results_with_jct_and_waits_per_qos(trace_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["sim", "replay", "--trace-dir", str(trace_dir), "--trace", "t", "--policy", "bestfit"]
    code, stdout, _ = _run(
        [*args, "--queue", "fifo", "--queue", "sjf-oracle", "--out", str(out), "--plot"], capsys
    )
    assert code == 0
    records = json.loads((out / "results.json").read_text())
    assert [r["queue"] for r in records] == ["fifo", "sjf-oracle"]
    assert set(records[0]["jct_s"]) == {"all", "BE", "LS"}
    assert records[0]["wait_s"]["all"]["mean"] > 0  # one GPU, overlapping pods: they queue
    assert records[1]["jct_s"]["all"]["mean"] <= records[0]["jct_s"]["all"]["mean"]
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    assert len(rows) == 2 and rows[0]["wait_mean_s"]
    assert (out / "replay_over_time_t_load1.png").stat().st_size > 10_000
    assert "wrote" in stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--load", "0"], "--load 0"),
        (["--load", "-3"], "--load -3"),
        (["--load", "inf"], "--load inf"),
        (["--load", "nan"], "--load nan"),
        (["--queue", "nope"], "not a queue setup"),
        (["--policy", "nope"], "nope"),
        (["--trace", "notime"], "no timestamps"),
        (["--trace", "negative"], "negative duration"),
        (["--repeat", "0"], "--repeat"),
    ],
)
def test_bad_replay_input_is_one_error_line_and_exit_2(
    trace_dir: Path, tmp_path: Path, capsys, extra, needle
) -> None:
    args = [
        "sim",
        "replay",
        "--trace-dir",
        str(trace_dir),
        "--trace",
        "t",
        "--out",
        str(tmp_path / "o"),
        *extra,
    ]
    code, _, err = _run(args, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_predict_reports_held_out_errors(trace_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pred"
    code, stdout, _ = _run(
        ["predict", "--trace-dir", str(trace_dir), "--trace", "t", "--out", str(out)], capsys
    )
    assert code == 0
    errors = json.loads((out / "errors.json").read_text())
    # 40 pods, 28 / 12 by arrival; the last pod ends at the trace's last instant, so it is censored
    # (still running when the trace ends) and left out of the held-out figures
    assert errors["test_pods"] == 11 and errors["train_pods"] == 28
    assert errors["mae_s"] >= 0 and "held-out" in stdout
    assert len(list(csv.DictReader((out / "predictions.csv").read_text().splitlines()))) == 11


@pytest.mark.parametrize("fraction", ["0", "1", "nan"])
def test_predict_refuses_a_train_fraction_outside_0_1(
    trace_dir: Path, tmp_path: Path, capsys, fraction
) -> None:
    args = ["predict", "--trace-dir", str(trace_dir), "--trace", "t", "--train-fraction", fraction]
    code, _, err = _run([*args, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err.startswith("error: --train-fraction")
