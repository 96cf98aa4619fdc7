"""Every command's --help, as a newcomer reads it in an 80-column terminal: no traceback, no word cut
off with an ellipsis, no Python type names, no markup left over, no stray space before punctuation."""

from __future__ import annotations

import re

import pytest

from gpuslice.cli.main import build_command, main


def _paths(command, prefix=()):
    yield prefix
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _paths(sub, (*prefix, name))


PATHS = list(_paths(build_command()))


def test_the_walk_reaches_every_command_family():
    names = {" ".join(p) for p in PATHS}
    for expected in ("sim openb", "mig plan", "mig profiles", "topo pick", "k8s webhook", "memsim",
                     "estimate", "serve", "submit", "policy map update"):  # fmt: skip
        assert expected in names


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "gpuslice")
def test_help_reads_cleanly_at_80_columns(path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 0, err
    assert "Traceback" not in out + err
    assert out.startswith("Usage: gpuslice")
    for line in out.splitlines():
        assert len(line) <= 80, line
        assert not re.search(r"\w…", line), f"cut word: {line!r}"
        assert not re.search(r"<(bool|str|int|float|list\[)", line), f"Python type: {line!r}"
        assert "[/" not in line and "[bold" not in line, f"markup: {line!r}"
        assert not re.search(r"\w \.(\s|$)|\w ,", line), f"stray space: {line!r}"


@pytest.mark.parametrize("group", [[], ["mig"], ["sim"], ["topo"], ["k8s"], ["policy"]], ids=" ".join)
def test_a_command_group_called_bare_prints_its_help(group, capsys):
    with pytest.raises(SystemExit):
        main(group)
    out, err = capsys.readouterr()
    assert out.startswith(f"Usage: gpuslice{''.join(' ' + g for g in group)} [OPTIONS] COMMAND")
    assert "error" not in err
