"""``gpuslice serve`` refuses a machine, sharing mode or policy it does not know before it touches its
state folder: found by the command-line fuzzer (``test_fuzz_inputs.py``), each was refused only after
the server had made the folder, its lock, its token and its URL file (and, for a policy, its database)."""

from __future__ import annotations

from unittest import mock

import pytest

from gpuslice.cli.main import main


class Listened(BaseException):
    """The server got as far as its listening socket: the input was accepted."""


def _listen(*_args: object) -> None:
    raise Listened


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--simulate", "no-such-machine", "not a built-in system"),
        ("--simulate", "dgx-a100@no-such-gpu", "not a known GPU model"),
        ("--sharing", "bogus", "--sharing"),
        ("--queue-policy", "no-such-queue", "not a queue policy"),
        ("--placement", "no-such-placement", "placement"),
        ("--queue-policy", "missing.py", "missing.py"),
    ],
)
def test_an_unknown_machine_sharing_or_policy_is_refused_before_the_state_folder_is_made(
    tmp_path, capsys, monkeypatch, option, value, named
) -> None:
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "state"
    args = ["serve", "--state-dir", str(state), "--containment", "subreaper", option, value]
    with mock.patch("gpuslice.server.run.listen", _listen), pytest.raises(SystemExit) as ended:
        main(args)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert ended.value.code == 2
    assert len(errors) == 1 and named in errors[0]
    assert not state.exists()


def test_a_pids_limit_the_containment_cannot_hold_is_refused_before_the_state_folder_is_made(
    tmp_path, capsys
) -> None:
    state = tmp_path / "state"
    args = ["serve", "--state-dir", str(state), "--containment", "subreaper", "--pids-max", "5"]
    with mock.patch("gpuslice.server.run.listen", _listen), pytest.raises(SystemExit) as ended:
        main(args)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert ended.value.code == 2 and len(errors) == 1 and "--pids-max" in errors[0]
    assert not state.exists()


@pytest.mark.parametrize(
    "host", ["é" * 70, "\u202e", "\ud800"], ids=["label too long", "bidi mark", "surrogate"]
)
def test_a_host_the_resolver_cannot_encode_is_one_error_line(host, tmp_path, capsys) -> None:
    state = tmp_path / "state"
    args = ["serve", "--state-dir", str(state), "--containment", "subreaper", "--host", host]
    with mock.patch("gpuslice.server.run.listen", _listen), pytest.raises(SystemExit) as ended:
        main(args)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert ended.value.code == 2 and len(errors) == 1 and "--host" in errors[0]
    assert not state.exists()
