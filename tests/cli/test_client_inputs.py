"""The server's client commands (ps, submit, policy, tenants, top …) refuse a bad --url, --state-dir or
state folder with one ``error:`` line and exit 2 before any request: found by the command-line fuzzer
(``test_fuzz_inputs.py``), each was a traceback or a hang before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuslice.cli.main import main


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as ended:
        main(args)
    err = capsys.readouterr().err
    return int(ended.value.code or 0), [line for line in err.splitlines() if line.startswith("error: ")]


@pytest.fixture(autouse=True)
def _no_server_in_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("GPUSLICE_URL", "GPUSLICE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "state"))


@pytest.mark.parametrize(
    "url",
    ["http://\nx", "http://[::1", "ftp://example.org", "127.0.0.1:8787", "http://", "http://h:99999"],
    ids=["line break", "unclosed bracket", "not http", "no scheme", "no host", "port past 65535"],
)
def test_a_server_url_that_is_not_http_host_port_is_refused_naming_it(url, capsys) -> None:
    code, errors = _run(["ps", "--url", url], capsys)
    assert code == 2
    assert len(errors) == 1 and "invalid server URL" in errors[0] and "--url" in errors[0]


def test_a_state_dir_name_too_long_to_look_up_is_refused_in_one_line(capsys) -> None:
    code, errors = _run(["cancel", "1", "--state-dir", "a" * 300], capsys)
    assert code == 2
    assert len(errors) == 1 and "no token" in errors[0]


def test_a_fifo_in_place_of_the_url_file_is_not_waited_on(tmp_path, capsys) -> None:
    """The state folder's ``url`` file is read to find the server: a FIFO there would block the read
    for ever (no writer comes)."""
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "url")
    code, errors = _run(["ps", "--state-dir", str(state), "--url", "ftp://x"], capsys)
    assert code == 2 and len(errors) == 1
