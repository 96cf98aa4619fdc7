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
        assert not re.search(r"\w-$", line), f"word broken at a hyphen: {line!r}"
        assert "..." not in re.sub(r"(\[ARGS\]|COMMAND\}?)\.\.\.", "", line), f"cut: {line!r}"


@pytest.mark.parametrize("group", [[], ["mig"], ["sim"], ["topo"], ["k8s"], ["policy"]], ids=" ".join)
def test_a_command_group_called_bare_prints_its_help(group, capsys):
    with pytest.raises(SystemExit):
        main(group)
    out, err = capsys.readouterr()
    assert out.startswith(f"Usage: gpuslice{''.join(' ' + g for g in group)} [OPTIONS] COMMAND")
    assert "error" not in err


def test_the_top_level_list_shows_every_summary_whole_at_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split("Commands:")[1].split())
    command = build_command()
    for name, sub in command.commands.items():
        summary = " ".join(sub.help.split("\n\n")[0].split())
        assert f"{name} {summary}" in listing, name


@pytest.mark.parametrize("path", [[], ["sim", "openb"], ["submit"], ["mig", "plan"]], ids=" ".join)
def test_dash_h_is_help_everywhere(path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "-h"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("Usage: gpuslice")


def test_option_help_names_one_default_and_no_impossible_range(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["mig", "plan", "--help"])
    policy_help = capsys.readouterr().out.split("--policy")[1].split("--from-layout")[0]
    assert policy_help.count("default") == 1 and "[default: keep-largest]" in policy_help
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "1..100; default: no compute limit" in text and "[default: 0]" not in text
