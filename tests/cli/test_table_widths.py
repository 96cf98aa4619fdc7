"""Every table the README's commands print keeps every digit at 60, 80 and 120 columns.

Each command runs as the CLI runs it (``main``, ``COLUMNS`` set), so a table that chooses its layout by
the terminal's width chooses it here too. Every table it prints is recorded and rendered again, the same
object, at 300 columns: the reference, the same figures (a wall-clock time included) with room for all.
At the narrow width every number of the reference must be there whole: no ``…`` beside a digit, and with
the whitespace of both renderings taken out, each number at least as often as in the reference (a number
folded over two lines has the next column's text between its halves, so it no longer reads whole). Lines
are no wider than the terminal. ``tests/server/test_cli_width.py`` checks what ``ps``, ``gpus`` and ``topo
assign`` show at 80 columns (a command wrapped whole, sizes on one line); this checks the digits of every
table, those of the server's commands (``ps``, ``queue``, ``gpus``, ``tenants``, ``policy list``) too.
"""

from __future__ import annotations

import io
import re
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from gpuslice.cli import jobs, policy, terminal
from gpuslice.cli.main import main

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))  # the server tests' fake node and machine
from server_helpers import FakeNode, h100_machine

from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient
from gpuslice.server.daemon import Daemon
from gpuslice.server.store import Store

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

WIDTHS = (60, 80, 120)
REFERENCE = 300
ROOT = Path(__file__).parents[2]
MIG = ["--trace-dir", str(ROOT / "examples" / "traces" / "mig"), "--trace", "mig"]
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
CUT = re.compile(r"[\d.,]…|…[\d.,]")
TOKEN = "width-token"
_PRINT = Console.print


def _render(renderable: Any, width: int) -> str:
    # a plain Console (the recorded table's cells went through terminal.visible() when it was printed),
    # printing as rich does, not through the recorder
    console = Console(width=width, file=io.StringIO(), color_system=None, force_terminal=False)
    _PRINT(console, renderable)
    return console.file.getvalue()


def lost_digits(renderable: Any, width: int) -> list[str]:
    """What of ``renderable``'s numbers at ``REFERENCE`` columns is not whole at ``width``: a number cut
    with an ellipsis, or one that occurs fewer times in the narrow rendering (whitespace taken out)."""
    wide, narrow = _render(renderable, REFERENCE), _render(renderable, width)
    lost = [f"cut: {m.group()!r}" for m in CUT.finditer(narrow)]
    flat_wide, flat_narrow = "".join(wide.split()), "".join(narrow.split())
    for number, times in Counter(NUMBER.findall(wide)).items():
        if flat_narrow.count(number) < flat_wide.count(number) or flat_narrow.count(number) < times:
            lost.append(f"{number} ({flat_narrow.count(number)} of {times})")
    too_wide = [line for line in narrow.splitlines() if len(line.rstrip()) > width]
    return lost + [f"wider than {width}: {line!r}" for line in too_wide]


def _keeps_every_digit(table: Any, width: int, name: str) -> None:
    lost = lost_digits(table, width)
    assert not lost, f"{name} at {width} columns: {lost}\n{_render(table, width)}"


@pytest.fixture
def tables(monkeypatch) -> list[Any]:
    """Every table the CLI prints from here on, as rich is given it (after the CLI's console has fitted it
    to the width): rich's Console.print, recorded and passed on."""
    printed: list[Any] = []

    def record(self, *objects: Any, **kwargs: Any) -> None:
        printed.extend(o for o in objects if isinstance(o, Table))
        _PRINT(self, *objects, **kwargs)

    monkeypatch.setattr(Console, "print", record)
    return printed


def _run(capsys, monkeypatch, width: int, args: list[str]) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(args)
    out = capsys.readouterr()
    assert int(ended.value.code or 0) == 0, out.err
    return out.out


def _tune_traces(folder: Path) -> Path:
    folder.mkdir()
    (folder / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\na,8000,393216,2,V100M16\nb,64000,393216,1,V100M16\n"
    )
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
    header += "deletion_time,scheduled_time\n"
    rows = "long,1000,1024,1,1000,,LS,Running,0,10000,0\nwide,1000,1024,2,1000,,LS,Running,1,11,1\n"
    for name in ("t", "h"):
        (folder / f"openb_pod_list_{name}.csv").write_text(header + rows)
    return folder


# The README's commands that print a table and need no server, with small inputs. {tmp} is a fresh
# folder per run.
OFFLINE = {
    "sim openb": ["sim", "openb", *MIG, "--policy", "fgd", "--policy", "bestfit", "--seeds", "42"],
    "sim replay": ["sim", "replay", *MIG, "--load", "30", "--queue", "fifo", "--queue", "fair-share"],
    "topo show": ["topo", "show", "--simulate", "dgx1-v100"],
    "topo pick": ["topo", "pick", "--simulate", "dgx1-v100", "--gpus", "4", "--busy", "0,3"],
    "topo assign": ["topo", "assign", "--machine", "dgx1", "--jobs", "2,2", "--busy", "0,1,2,5"],
    "mig profiles": ["mig", "profiles", "--gpu", "a100-80gb"],
    "mig plan": ["mig", "plan", "--gpu", "a100-80gb", "--request", "3g.40gb", "--request", "12GiB"],
    "memsim": ["memsim", "--workload", "hotspot", "--scale", "0.02"],
    "memsim compare": ["memsim", "--compare", "all", "--workload", "hotspot", "--scale", "0.01"],
    "estimate": ["estimate", "llama-3-70b", "--tp", "4", "--context", "8192", "--batch", "8"],
    "estimate train": ["estimate", "llama-3-8b", "--train", "--gpus", "8", "--zero", "3"],
}
WITH_OUT = {"sim openb", "sim replay"}


@pytest.mark.parametrize("name", OFFLINE)
@pytest.mark.parametrize("width", WIDTHS)
def test_offline_tables_keep_every_digit(name, width, tables, capsys, monkeypatch, tmp_path) -> None:
    args = list(OFFLINE[name]) + (["--out", str(tmp_path / "out")] if name in WITH_OUT else [])
    out = _run(capsys, monkeypatch, width, args)
    assert tables, f"{name} printed no table:\n{out}"
    for table in tables:
        _keeps_every_digit(table, width, name)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_tune_table_keeps_every_digit(width, tables, capsys, monkeypatch, tmp_path) -> None:
    folder = _tune_traces(tmp_path / "traces")
    args = ["tune", "--trace-dir", str(folder), "--train", "t", "--holdout", "h", "--sample", "2"]
    args += ["--node-stride", "1", "--load", "1", "--trials", "2", "--out", str(tmp_path / "best.py")]
    _run(capsys, monkeypatch, width, args)
    (table,) = tables
    _keeps_every_digit(table, width, "tune")


@pytest.fixture
def server(tmp_path, monkeypatch):
    """The CLI against an in-process server on a simulated 8 × H100 machine, with jobs of every state."""
    store = Store(tmp_path / "state.db")
    daemon = Daemon(store, h100_machine(), FakeNode(), tmp_path, grace_seconds=2.0, monitor_seconds=0.0)
    http = TestClient(create_app(daemon, TOKEN))
    for module in (jobs, policy):
        monkeypatch.setattr(module, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=http))
    yield http
    http.close()
    store.close()


SERVER = {
    "ps": ["ps", "-a"],
    "queue": ["queue"],
    "gpus": ["gpus"],
    "tenants list": ["tenants", "list"],
    "policy list": ["policy", "list"],
}


@pytest.mark.usefixtures("server")
@pytest.mark.parametrize("width", WIDTHS)
def test_server_tables_keep_every_digit(width, tables, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    for args in (
        ["tenants", "set", "vision", "--max-gpus", "4", "--weight", "2"],
        ["submit", "--mem", "20GiB", "--tenant", "vision", "--", "python", "train.py", "--epochs", "90"],
        ["submit", "--mem", "10GiB", "--cores", "50", "--", "python", "serve.py"],
        ["submit", "--gpus", "8", "--priority", "high", "--", "torchrun", "--nproc-per-node", "8", "x.py"],
        ["submit", "--gpus", "4", "--tenant", "vision", "--", "sleep", "100"],
        ["policy", "load", str(ROOT / "examples" / "policies" / "small_first.py")],
    ):
        _run(capsys, monkeypatch, 300, args)
    for name, args in SERVER.items():
        tables.clear()
        out = _run(capsys, monkeypatch, width, args)
        assert tables, f"{name} printed no table:\n{out}"
        for table in tables:
            _keeps_every_digit(table, width, name)


def test_a_number_cut_or_folded_is_seen() -> None:
    table = Table("name", "figure")
    table.add_row("a-long-name-that-takes-the-room", "1,234,567.891")
    assert lost_digits(table, 120) == []
    narrow = Table("name", "figure")
    narrow.add_column("more", no_wrap=True, overflow="ellipsis")
    narrow.add_row("a-long-name-that-takes-the-room", "1,234,567.891", "98,765,432.1 " * 4)
    assert lost_digits(narrow, 60)  # the last column is cut with an ellipsis


def test_a_table_too_wide_to_keep_its_numbers_is_stacked_and_a_folding_column_is_not() -> None:
    wide = Table("pod", *(f"figure {i}" for i in range(8)), title="wide")
    wide.add_row("p0", *(f"{123_456.789 * (i + 1):,.3f}" for i in range(8)))
    console = terminal.console(width=60, file=io.StringIO())
    stacked = terminal.fitted(wide, console)
    assert stacked is not wide and stacked.title == "wide"
    assert not lost_digits(stacked, 60) and lost_digits(wide, 60)
    assert "figure 7" in _render(stacked, 60) and "987,654.312" in _render(stacked, 60)
    folding = Table("ID", "STATE")
    folding.add_column("COMMAND", overflow="fold", min_width=8)
    folding.add_row(
        "7", "RUNNING", "python train.py --config configs/a-rather-long-experiment-name.yaml " * 2
    )
    assert terminal.fitted(folding, console) is folding  # the command folds; ID and STATE fit
