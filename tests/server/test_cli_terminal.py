"""What the operator reads is what runs: job output, job fields and errors reach the terminal with their
control characters written out and their rich markup and emoji codes as text."""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from gpuslice.cli import jobs, terminal
from gpuslice.cli.main import app, main
from gpuslice.errors import UserError
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "terminal-token"
# A window title, a screen clear, the clipboard through OSC 52, an 8-bit CSI, a line hidden behind a
# carriage return, a bell, and a right-to-left override.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\u009b31m ls\rrm -rf ~\u202e"
MARKUP = ":x: [bold]loud[/bold] [/] [link=http://evil]x[/link]"


@pytest.fixture
def client(daemon, monkeypatch):
    http = TestClient(create_app(daemon, TOKEN))
    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=http))
    yield http
    http.close()


@pytest.fixture
def run(capsys, monkeypatch):
    """run(*args) -> (exit code, stdout + stderr) of ``gpuslice …`` as main() runs it, errors printed by
    its one error printer."""
    monkeypatch.setenv("COLUMNS", "300")

    def invoke(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as ended:
            main(list(args))
        out = capsys.readouterr()
        return int(ended.value.code or 0), out.out + out.err

    return invoke


def _no_raw_controls(text: str) -> None:
    controls = [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert not controls, f"raw control characters reached the terminal: {controls!r}"
    assert "\u202e" not in text and "❌" not in text


def test_visible_writes_out_every_control_but_newline_and_tab():
    assert terminal.visible("a\tb\nc\x1b[31md\x07\x7f\x9b\r\u202e") == (
        "a\tb\nc\\x1b[31md\\x07\\x7f\\x9b\\x0d\\u202e"
    )
    assert terminal.visible(terminal.visible(HOSTILE)) == terminal.visible(HOSTILE)


def test_visible_bytes_decodes_a_character_split_between_chunks_and_shows_bad_bytes():
    shown = terminal.VisibleBytes()
    e, tick = "é".encode(), "✓".encode()
    chunks = [e[:1], e[1:] + b"\x1b[0m\x9b" + tick[:2], tick[2:]]
    out = b"".join(shown.feed(chunk) for chunk in chunks) + shown.end()
    assert out.decode() == "é\\x1b[0m\\x9b✓"
    assert shown.feed(b"\xe2\x9c") + shown.end() == b"\\xe2\\x9c"  # cut off at the end: shown, not lost


def test_logs_show_escape_sequences_as_text_and_raw_gives_the_bytes(client, run, daemon, tmp_path):
    assert run("submit", "--", "train")[0] == 0
    (tmp_path / "jobs" / "1").mkdir(parents=True)
    output = f"epoch 1\tok\n{HOSTILE}\n".encode()
    (tmp_path / "jobs" / "1" / "stdout.log").write_bytes(output)
    code, shown = run("logs", "1")
    assert code == 0
    _no_raw_controls(shown)
    assert shown.startswith("epoch 1\tok\n")
    assert "\\x1b]0;pwned\\x07" in shown and "\\x1b]52;c;" in shown and "\\x0drm -rf ~" in shown
    result = CliRunner().invoke(app, ["logs", "1", "--raw"])  # the bytes, as a file would get them
    assert result.exit_code == 0 and result.stdout_bytes == output


@pytest.mark.parametrize("command", ["show", "ps", "queue"])
def test_job_fields_are_printed_as_text_not_markup_emoji_or_escapes(client, run, daemon, command):
    code, out = run("submit", "--gpus", "8", "--", "sh", "-c", MARKUP, HOSTILE)
    assert code == 0
    code, _ = run("submit", "--gpus", "8", "--", "sh", "-c", MARKUP, HOSTILE)  # waits: in the queue
    daemon.tick()
    code, out = run(command, "2" if command == "show" else "--all" if command == "ps" else "")
    if command == "queue":
        code, out = run("queue")
    assert code == 0, out
    _no_raw_controls(out)
    if command == "queue":
        return  # the queue shows no command; its fields were checked above
    assert ":x:" in out and "[bold]loud[/bold]" in out and "[/]" in out
    if command == "show":
        assert "\\x1b]0;pwned\\x07" in out


def test_an_error_that_echoes_input_shows_it_as_typed(run, monkeypatch):
    def refuse(url, state_dir):
        raise UserError(f"cannot read /etc/passwd: root:x:0:0 [bold]loud[/] {HOSTILE}")

    monkeypatch.setattr(jobs, "_client", refuse)
    code, err = run("ps")
    assert code == 2
    _no_raw_controls(err)
    assert "root:x:0:0 [bold]loud[/]" in err and "\\x1b]0;pwned" in err


def test_a_job_id_with_controls_is_refused_as_unknown_not_a_crash(client, run):
    """httpx refuses a URL with control characters: the client quotes the id (one path segment)."""
    for command in ("show", "cancel", "logs"):
        code, out = run(command, f"root:x:0:0 [bold] {HOSTILE}")
        assert code == 2 and "no job 'root:x:0:0 [bold] \\x1b]0;pwned" in out, out
        _no_raw_controls(out)


def test_no_cli_module_makes_its_own_console():
    """Every rich Console of the CLI comes from terminal.console (emoji codes off, controls visible)."""
    import pathlib
    import re

    folder = pathlib.Path(jobs.__file__).parent
    own = [p.name for p in folder.glob("*.py") if p.name != "terminal.py"
           and re.search(r"(?<![\w.])Console\(", p.read_text())]  # fmt: skip
    assert own == []
