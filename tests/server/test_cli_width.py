"""What `ps`, `gpus` and `topo assign` print fits the terminal: at 80 columns no line is wider, no size is
split over two lines, a job's command is shown whole (wrapped, not cut) and no number loses a digit."""

from __future__ import annotations

import pytest
from test_cli_terminal import client  # noqa: F401 - the fixture: the CLI against an in-process server

from gpuslice.cli.main import main

LONG = "python train.py --config configs/a-rather-long-experiment-name.yaml --epochs 90"


def _run(capsys, monkeypatch, width: int, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(list(args))
    out = capsys.readouterr()
    assert int(ended.value.code or 0) == 0, out.err
    return out.out


def _column(table: str, header: str, next_header: str) -> str:
    """The text of one column of a printed table (between its header's start and the next one's),
    every line joined without blanks: a value wrapped over several lines reads whole."""
    lines = table.splitlines()
    top = next(line for line in lines if header in line and next_header in line)
    start, end = top.index(header), top.index(next_header)
    return "".join("".join(line[start:end].split()) for line in lines[lines.index(top) + 1 :])


def _lines_fit(text: str, width: int) -> None:
    wide = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not wide, f"wider than {width}: {wide}"


@pytest.mark.usefixtures("client")
def test_ps_at_80_columns_wraps_the_command_whole_and_drops_columns_every_job_shares(
    capsys, monkeypatch
) -> None:
    for command in (LONG.split(), ["sleep", "100"]):
        _run(capsys, monkeypatch, 300, "submit", "--gpus", "8", "--", *command)
    out = _run(capsys, monkeypatch, 80, "ps")
    _lines_fit(out, 80)
    assert _column(out, "COMMAND", "REASON").count("".join(LONG.split())) == 1  # every character, wrapped
    assert "PRIORITY" not in out and "all jobs: priority normal, tenant default" in out
    _run(capsys, monkeypatch, 300, "submit", "--priority", "high", "--tenant", "ml", "--", "true")
    out = _run(capsys, monkeypatch, 80, "ps")
    _lines_fit(out, 80)
    assert "PRIORITY" in out and "TENANT" in out and "all jobs:" not in out


@pytest.mark.usefixtures("client")
def test_gpus_at_80_columns_keeps_each_size_on_one_line(capsys, monkeypatch) -> None:
    _run(capsys, monkeypatch, 300, "submit", "--mem", "20GiB", "--", "sleep", "100")
    out = _run(capsys, monkeypatch, 80, "gpus")
    _lines_fit(out, 80)
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and all(" / " in line and line.count("GiB") >= 2 for line in rows), out


@pytest.mark.parametrize("width", [60, 80, 120])
def test_topo_assign_keeps_every_digit(capsys, monkeypatch, width: int) -> None:
    args = ("topo", "assign", "--machine", "dgx1", "--jobs", "2,2", "--busy", "0,1,2,5")
    out = _run(capsys, monkeypatch, width, *args)
    _lines_fit(out, width)
    flat = "".join(out.split())
    assert flat.count("158.73") == 2 and flat.count("178.73") == 2, out  # folded, never cut
