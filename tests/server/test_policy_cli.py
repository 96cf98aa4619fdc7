"""``gpuslice policy load|list|unload|events|map …`` against the real app in process (daemon over the
fake node): what each prints, the rejection output, exit codes, and the token. (``policy check`` needs no
server: tests/cli/test_policy_check.py.)"""

from __future__ import annotations

import warnings

import pytest
from policy_sources import BOOST, BOOST_V2, REJECTED, write
from typer.testing import CliRunner

from gpuslice.cli import policy
from gpuslice.cli.main import app
from gpuslice.errors import GpusliceError, exit_code
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "cli-policy-token"


@pytest.fixture
def http(daemon):
    with TestClient(create_app(daemon, TOKEN)) as client:
        yield client


@pytest.fixture
def cli(http, monkeypatch):
    """cli(*args, token=TOKEN) -> (exit code, stdout, stderr) of ``gpuslice …`` talking to the app here."""
    runner = CliRunner()

    def run(*args: str, token: str = TOKEN) -> tuple[int, str, str]:
        monkeypatch.setattr(policy, "_client", lambda url, state_dir: ServeClient(token=token, http=http))
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        if isinstance(result.exception, GpusliceError):  # what main() prints and returns
            return exit_code(result.exception), result.stdout, f"error: {result.exception}"
        return result.exit_code, result.stdout, result.stderr

    return run


def test_load_list_map_and_unload_print_one_clear_answer_each(cli, daemon, tmp_path):
    path = write(tmp_path, "boost.py", BOOST)
    code, out, _ = cli("policy", "load", str(path))
    assert code == 0 and out.startswith(f"loaded queue policy tenant-boost from {path} (sha256 ")
    assert "boost (0 entries)" in out

    code, out, _ = cli("policy", "map", "update", "boost", "vision", "1")
    assert code == 0 and out.strip() == "boost['vision'] = 1"
    code, out, _ = cli("policy", "map", "update", "boost", "vision", "2")
    assert code == 0 and out.strip() == "boost['vision'] = 2 (was 1)"
    code, out, _ = cli("policy", "map", "get", "boost", "vision")
    assert code == 0 and out.strip() == "2"
    code, out, _ = cli("policy", "map", "dump", "boost", "--family", "queue")
    assert code == 0 and "str → int, max 64, 1 entry" in out and "vision" in out

    code, out, _ = cli("policy", "map", "update", "boost", "ml", "3")
    code, out, _ = cli("policy", "map", "delete", "boost", "ml")
    assert code == 0 and out.strip() == "boost['ml'] deleted (was 3)"
    code, _, err = cli("policy", "map", "delete", "boost", "ml")
    assert code == 2 and "map boost has no key 'ml'" in err

    code, out, _ = cli("policy", "list")
    assert code == 0
    row = next(line for line in out.splitlines() if line.strip().startswith("queue"))
    assert "tenant-boost" in row and str(path) in row and "active" in row and "boost 1/64" in row

    code, out, _ = cli("policy", "unload", "queue")
    assert code == 0 and out.strip() == "queue: built-in policy priority-fair restored"
    code, out, _ = cli("policy", "list")
    assert "priority-fair" in out and "built-in" in out
    code, out, _ = cli("policy", "events")
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "tenant-boost" in lines[0] and "loaded" in lines[0] and "unloaded" in lines[1]


def test_a_swap_keeps_the_map_values_the_operator_wrote(cli, tmp_path):
    cli("policy", "load", str(write(tmp_path, "v1.py", BOOST)))
    cli("policy", "map", "update", "boost", "ml", "3")
    code, out, _ = cli("policy", "load", str(write(tmp_path, "v2.py", BOOST_V2)))
    assert code == 0 and "tenant-boost-v2" in out and "boost (1 entry)" in out
    assert cli("policy", "map", "get", "boost", "ml")[1].strip() == "3"


def test_a_rejected_file_prints_each_violation_and_exits_2(cli, daemon, tmp_path):
    path = write(tmp_path, "sneaky.py", REJECTED)
    code, out, err = cli("policy", "load", str(path))
    assert code == 2
    lines = out.strip().splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{path}:2", f"{path}:11"]
    assert err.strip() == f"error: policy {path} rejected (2 violation(s))"
    assert daemon.policy_admin.slots["queue"].info()["builtin"] is True


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("policy", "unload", "queue"), "no queue policy is loaded"),
        (("policy", "unload", "placement"), "placement policy (bestfit) is fixed at the server's start"),
        (("policy", "unload", "prefetch"), "runs no prefetch policy; its policy families: queue"),
        (("policy", "map", "dump", "boost"), "no queue policy is loaded"),
        (("policy", "map", "get", "boost", "ml"), "no queue policy is loaded"),
        (("policy", "load", "/nonexistent/p.py"), "cannot read policy file /nonexistent/p.py"),
    ],
    ids=[
        "unload with nothing loaded",
        "placement fixed at start",
        "unknown family",
        "dump",
        "get",
        "missing file",
    ],
)
def test_refusals_are_one_error_line_and_exit_2(cli, args, words):
    code, out, err = cli(*args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and words in err and "\n" not in err.strip()


def test_map_errors_name_the_map_key_or_type(cli, tmp_path):
    cli("policy", "load", str(write(tmp_path, "boost.py", BOOST)))
    code, _, err = cli("policy", "map", "get", "boost", "nobody")
    assert code == 2 and "map boost has no key 'nobody'" in err
    code, _, err = cli("policy", "map", "update", "boost", "ml", "lots")
    assert code == 2 and "'lots' is not a int" in err
    code, _, err = cli("policy", "map", "update", "nosuch", "ml", "1")
    assert code == 2 and "no map 'nosuch'" in err


def test_changes_without_the_right_token_are_refused_and_change_nothing(cli, daemon, tmp_path):
    path = write(tmp_path, "boost.py", BOOST)
    code, _, err = cli("policy", "load", str(path), token="wrong")
    assert code == 2 and "token" in err.lower()
    assert daemon.policy_admin.slots["queue"].info()["builtin"] is True
    cli("policy", "load", str(path))
    for args in (("policy", "unload", "queue"), ("policy", "map", "update", "boost", "ml", "1")):
        code, _, err = cli(*args, token="wrong")
        assert code == 2 and "token" in err.lower()
    assert daemon.policy_admin.slots["queue"].info()["name"] == "tenant-boost"
    assert daemon.policy_admin.slots["queue"].map_dump("boost") == []
    code, _, err = cli("policy", "list", token="wrong")  # reads need the token too
    assert code == 2 and "token" in err.lower()
    code, out, _ = cli("policy", "list")
    assert code == 0 and "tenant-boost" in out
