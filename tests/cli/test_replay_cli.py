"""``gpuslice sim replay`` and ``gpuslice predict``: result files; one error line, exit 2, on bad input."""

from __future__ import annotations

import csv
import json
import os
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
    # three pods: too few to predict run times from (each half by arrival needs two finished pods)
    (folder / "openb_pod_list_three.csv").write_text(HEADER + "\n" + "\n".join(rows[:3]) + "\n")
    # a spreadsheet's Latin-1 export: "é" as the byte 0xe9
    (folder / "openb_pod_list_latin1.csv").write_bytes(
        (HEADER + "\n" + rows[0] + ",caf\xe9\n").encode("latin-1")
    )
    (folder / "openb_pod_list_folder.csv").mkdir()  # a folder where the CSV should be
    os.mkfifo(folder / "openb_pod_list_fifo.csv")  # reading it would block forever
    return folder


def test_replay_writes_results_with_jct_and_waits_per_qos(trace_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["sim", "replay", "--trace-dir", str(trace_dir), "--trace", "t", "--policy", "bestfit"]
    code, stdout, stderr = _run(
        [*args, "--queue", "fifo", "--queue", "sjf-oracle", "--out", str(out), "--plot"], capsys
    )
    assert code == 0
    assert stderr.splitlines()[0] == "sim replay: 2 runs, 80 pods"  # piped: what it does, on stderr
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
        (["--repeat", "1000000000"], "invalid --repeat 1000000000: use a whole number from 1 to 1,000"),
        (["--seed", "-1"], "invalid --seed -1: use a whole number from 0 to 4,294,967,295"),
        (["--seed", "4294967296"], "invalid --seed 4294967296"),
        (["--node-stride", "0"], "invalid --node-stride 0"),
        (["--trace", "three", "--queue", "sjf-predicted"], "at least two finished pods in each half"),
        (["--trace", "latin1"], "openb_pod_list_latin1.csv: not UTF-8 text"),
        (["--trace", "folder"], "openb_pod_list_folder.csv is a folder, not a CSV file"),
        (["--trace", "fifo"], "openb_pod_list_fifo.csv is a FIFO, not a CSV file"),
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


def test_a_replay_where_no_pod_waits_says_so_and_a_smaller_cluster_makes_queues_form(
    trace_dir: Path, tmp_path: Path, capsys
) -> None:
    """Forty pods on two nodes of one GPU, arriving 10 s apart and running ~100 s: on every second node
    (one GPU) they queue; at a pace a thousand times slower none waits, and the report says why the setups
    cannot differ and what to change."""
    with (trace_dir / NODE_FILE).open("a") as nodes:
        nodes.write("n1,96000,393216,1,V100M16\n")
    base = ["sim", "replay", "--trace-dir", str(trace_dir), "--trace", "t", "--out", str(tmp_path / "o")]
    code, out, _ = _run([*base, "--load", "0.001"], capsys)
    assert code == 0 and "No pod waited in any run" in out and "--node-stride" in out
    code, out, _ = _run([*base, "--node-stride", "2"], capsys)
    assert code == 0 and "No pod waited" not in out
    (record,) = json.loads((tmp_path / "o" / "results.json").read_text())
    assert record["trace"] == "t-every2" and record["wait_s"]["all"]["mean"] > 0


def test_the_replay_table_keeps_every_digit_at_60_80_and_120_columns(
    trace_dir: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """The printed table at three widths: each run's figures from results.json appear whole (digits may
    fold onto a second line only below 80 columns), and at 80 columns no line is wider."""
    base = ["sim", "replay", "--trace-dir", str(trace_dir), "--trace", "t", "--out", str(tmp_path / "o")]
    setups = [
        "--queue",
        "fifo",
        "--queue",
        "sjf-oracle",
        "--queue",
        "easy-backfill",
        "--load",
        "1",
        "--load",
        "3",
    ]
    for width in (60, 80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        code, out, _ = _run([*base, *setups], capsys)
        assert code == 0
        table = out.split("wrote")[0]
        assert max(len(line) for line in table.splitlines()) <= width
        records = json.loads((tmp_path / "o" / "results.json").read_text())
        figures = [f"{r['jct_s']['all']['p99']:,.0f}" for r in records] + [
            f"{r['busy_allocation_pct']:.2f}" for r in records
        ]
        flat = "".join(table.split())  # a number folded over two lines reads whole without blanks
        if width >= 80:
            assert all(f in table for f in figures), (width, figures, table)
        assert all(f.replace(",", "") in flat.replace(",", "") for f in figures), (width, table)


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
