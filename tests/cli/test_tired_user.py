"""Bad inputs the corpus (bad_inputs.toml) cannot express, through the real console script: a FIFO where
a file is read or written (its read would block forever), an output folder that does not exist yet,
and Ctrl-C during a parallel run. Each refusal is one ``error:`` line naming the input, exit 2, nothing
written; a hang shows up as the generous timeout, not as a slow pass.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

TIME_LIMIT_S = 120  # a refusal takes about a second; this only catches hangs on a loaded machine


def _command() -> list[str]:
    script = Path(sys.executable).with_name("gpuslice")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from gpuslice.cli.main import main; main()"]


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
    env.update(HOME=str(folder), COLUMNS="80", GPUSLICE_STATE_DIR=str(folder / "state"))
    env["GPUSLICE_URL"] = "http://127.0.0.1:9"  # the discard port: nothing answers there
    return subprocess.run(
        [*_command(), *args], cwd=folder, env=env, capture_output=True, text=True,
        timeout=TIME_LIMIT_S, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _refused(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.returncode == 2, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def _fifo(folder: Path, name: str) -> Path:
    path = folder / name
    os.mkfifo(path)
    return path


FIFO_READS = {
    "policy check": ("policy", "check", "{fifo}"),
    "estimate": ("estimate", "{fifo}"),
    "dra-allocator --kubeconfig": ("k8s", "dra-allocator", "--kubeconfig", "{fifo}"),
    "extender --kubeconfig": ("k8s", "extender", "--kubeconfig", "{fifo}"),
    "webhook --cert": ("k8s", "webhook", "--cert", "{fifo}", "--key", "{fifo}"),
}


@pytest.mark.parametrize("args", FIFO_READS.values(), ids=FIFO_READS.keys())
def test_a_fifo_where_a_file_is_read_is_refused_not_waited_on(tmp_path, args):
    fifo = _fifo(tmp_path, "in.fifo")
    done = _run(tmp_path, *(a.replace("{fifo}", str(fifo)) for a in args))
    _refused(done, str(fifo), "is a FIFO", "give a regular file")


@pytest.mark.parametrize("kind", ["a folder", "a FIFO"])
def test_a_folder_or_fifo_where_a_trace_csv_should_be_is_named_as_such(tmp_path, kind):
    traces = tmp_path / "traces"
    traces.mkdir()
    pods = traces / "openb_pod_list_x.csv"
    pods.mkdir() if kind == "a folder" else os.mkfifo(pods)
    done = _run(tmp_path, "sim", "openb", "--trace-dir", str(traces), "--trace", "x")
    _refused(done, f"{pods} is {kind}")


@pytest.mark.parametrize(
    ("args", "result"),
    [(("sim", "openb", "--seeds", "1", "--policy", "random"), "results.csv"), (("predict",), "errors.json")],
    ids=["sim openb", "predict"],
)
@pytest.mark.parametrize("kind", ["a folder", "a FIFO"])
def test_a_folder_or_fifo_in_a_result_files_place_is_refused_before_the_work(tmp_path, args, result, kind):
    out = tmp_path / "out"
    out.mkdir()
    (out / result).mkdir() if kind == "a folder" else os.mkfifo(out / result)
    done = _run(tmp_path, *args, "--out", str(out))
    _refused(done, "--out", f"{out / result} is {kind}")
    assert [p.name for p in out.iterdir()] == [result]


@pytest.mark.parametrize("option", ["--out", "--study"])
def test_tune_refuses_a_fifo_as_its_output_or_study_file_before_any_work(tmp_path, option):
    fifo = _fifo(tmp_path, "out.fifo")
    args = ["--out", str(tmp_path / "p.py"), option, str(fifo)]
    _refused(_run(tmp_path, "tune", *args), option, "is a FIFO", "give a file name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo"]


HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
HEADER += "scheduled_time"


@pytest.mark.parametrize("where", ["out", "study"])
def test_tune_makes_the_folder_of_its_output_or_study_file_after_checking_it(tmp_path, where):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\na,8000,393216,2,V100M16\nb,64000,393216,1,V100M16\n"
    )
    rows = [f"p{i},1000,1024,1,1000,,LS,Running,{10 * i},{10 * i + 100},{10 * i}" for i in range(6)]
    (traces / "openb_pod_list_t.csv").write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    new = tmp_path / "newdir" / "sub" / ("T.py" if where == "out" else "study.db")
    out = new if where == "out" else tmp_path / "T.py"
    args = ["--trace-dir", str(traces), "--train", "t@0", "--holdout", "t@1", "--sample", "3"]
    args += ["--node-stride", "1", "--load", "1", "--trials", "1", "--out", str(out)]
    if where == "study":
        args += ["--study", str(new)]
    done = _run(tmp_path, "tune", *args)
    assert done.returncode == 0, done.stderr
    assert out.is_file() and out.with_name("T.py.json").is_file() and new.is_file()


def test_with_no_server_anywhere_the_first_error_is_one_plain_sentence(tmp_path, monkeypatch, capsys):
    from gpuslice.cli.main import main
    from gpuslice.server import client

    monkeypatch.setattr(client, "DEFAULT_URL", "http://127.0.0.1:9")  # the discard port: nothing answers
    for name in ("GPUSLICE_URL", "GPUSLICE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(SystemExit) as exit_info:
        main(["ps"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    plain = "no gpuslice server is running here: start one with `gpuslice serve` (or give --url)"
    assert err == f"error: {plain}\n"


def test_ctrl_c_on_a_parallel_sim_openb_stops_its_workers_at_once_and_writes_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
    env.update(HOME=str(tmp_path), COLUMNS="80")
    args = ["sim", "openb", "--jobs", "2", "--seeds", "1-8", "--out", str(tmp_path / "out")]
    child = subprocess.Popen(
        [*_command(), *args], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,  # its own group, as a terminal's job
    )  # fmt: skip
    watchdog = threading.Timer(TIME_LIMIT_S, child.kill)
    watchdog.start()
    try:
        seen = []
        for line in child.stderr:  # the first progress line: the workers are busy with the 48 runs
            seen.append(line)
            if "/48 runs" in line:
                break
        assert any("/48 runs" in line for line in seen), "".join(seen)
        pressed = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        _, err = child.communicate()
        took = time.monotonic() - pressed
    finally:
        watchdog.cancel()
    # Before: every queued run went on to the end (a minute here); now ~1 s, 20 on a loaded machine.
    assert took < 20, f"took {took:.1f} s to stop"
    assert child.returncode == 130, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "interrupted after" in errors[0] and "of 48 runs" in errors[0], err
    assert "nothing was written" in errors[0] and not (tmp_path / "out").exists()
