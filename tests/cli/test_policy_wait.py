"""What the policy commands that change a server say when its answer does not come: a real HTTP server
in a thread takes the connection and the request, then holds its answer until the command has given up
(so no timing race decides the test), against a port where nothing accepts a connection at all.

The operator's view must be the truth: a request that reached a server may still be applied, so the
command says it was sent, that the outcome is unknown and which command shows it, and exits 4 — never
"no gpuslice server", which is kept for a connection that was refused."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from gpuslice.cli.main import main
from gpuslice.errors import exit_code
from gpuslice.server.client import ServeClient
from gpuslice.server.errors import OutcomeUnknown, ServerUnavailable

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "policies"
OUTCOME_UNKNOWN_EXIT = 4  # documented in each command's --wait help
HOLD_SECONDS = 30.0  # the most the server holds an answer; the test releases it as soon as the CLI is done


class SlowServer:
    """Takes every request, records it, and answers only once ``release()`` is called (or after
    HOLD_SECONDS): far longer than any --wait the tests give."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self._arrived = threading.Event()
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _hold_then_answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)  # the whole request arrived
                server.requests.append((self.command, self.path))
                server._arrived.set()
                server._release.wait(HOLD_SECONDS)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the client has gone

            do_GET = do_POST = do_PUT = do_DELETE = _hold_then_answer

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def received(self) -> list[tuple[str, str]]:
        """The requests it took (waiting for the first to be read, on a machine too busy to have yet)."""
        self._arrived.wait(HOLD_SECONDS)
        return self.requests

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self.release()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def slow_server() -> Iterator[SlowServer]:
    server = SlowServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port held by a socket that is bound but does not listen: every connection there is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(autouse=True)
def token(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUSLICE_TOKEN", "any")
    monkeypatch.setenv("GPUSLICE_STATE_DIR", str(tmp_path / "state"))  # no URL file from a real server
    monkeypatch.delenv("GPUSLICE_URL", raising=False)


def gpuslice(args: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the console script's ``main``."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


# Each command that changes the server: its arguments, the request it sends, the command that shows
# whether that request was applied.
CHANGES = {
    "load": (
        ["policy", "load", str(EXAMPLES / "small_first.py")],
        ("POST", "/v1/policies"),
        "gpuslice policy list",
    ),
    "unload": (["policy", "unload", "queue"], ("DELETE", "/v1/policies/queue"), "gpuslice policy list"),
    "map update": (
        ["policy", "map", "update", "boost", "alice", "2"],
        ("PUT", "/v1/policies/queue/maps/boost/alice"),
        "gpuslice policy map get boost alice --family queue",
    ),
    "map delete": (
        ["policy", "map", "delete", "boost", "alice"],
        ("DELETE", "/v1/policies/queue/maps/boost/alice"),
        "gpuslice policy map get boost alice --family queue",
    ),
}


@pytest.mark.parametrize(("args", "request_sent", "check"), CHANGES.values(), ids=CHANGES.keys())
def test_a_change_whose_answer_does_not_come_says_it_was_sent_and_how_to_check(
    args, request_sent, check, slow_server, capsys
):
    code, out, err = gpuslice([*args, "--url", slow_server.url, "--wait", "0.5"], capsys)
    assert slow_server.received() == [request_sent]  # the server did get it: it may well apply it
    slow_server.release()
    assert code == OUTCOME_UNKNOWN_EXIT, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: the request was sent to the gpuslice server")
    assert "no answer came within 0.5 s" in err
    assert "the server may still apply it, so the outcome is unknown" in err
    assert f"check with `{check} --url {slow_server.url}`" in err
    assert "no gpuslice server" not in err


@pytest.mark.parametrize("args", [a for a, _, _ in CHANGES.values()], ids=CHANGES.keys())
def test_a_change_with_nothing_listening_still_says_there_is_no_server(args, refused_url, capsys):
    code, _, err = gpuslice([*args, "--url", refused_url, "--wait", "0.5"], capsys)
    assert code == 2
    assert err.startswith(f"error: no gpuslice server at {refused_url} (the URL given with --url):")
    assert "gpuslice serve" in err and "sent" not in err and "unknown" not in err


@pytest.mark.parametrize("wait", ["0", "-1", "nan", "inf", "100000"])
def test_wait_must_be_a_positive_number_of_seconds(wait, refused_url, capsys):
    code, _, err = gpuslice(["policy", "unload", "queue", "--url", refused_url, f"--wait={wait}"], capsys)
    assert code == 2
    assert err.startswith(f"error: invalid --wait {wait}: use a positive number of seconds"), err
    assert "no gpuslice server" not in err  # refused before anything is sent


def test_wait_that_is_not_a_number_is_a_usage_error(refused_url, capsys):
    code, _, err = gpuslice(["policy", "unload", "queue", "--url", refused_url, "--wait", "soon"], capsys)
    assert code == 2 and "--wait" in err and "no gpuslice server" not in err


def test_each_change_documents_wait_and_its_exit_status(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    for args, _, _ in CHANGES.values():
        command = args[: 3 if args[1] == "map" else 2]
        code, out, _ = gpuslice([*command, "--help"], capsys)
        text = " ".join(out.split())
        assert code == 0 and "--wait NUMBER seconds to wait for the server's answer" in text
        assert f"exits {OUTCOME_UNKNOWN_EXIT}: the request was sent and the server may still apply it" in text


# The same rule for every request the client sends (one place decides it: ServeClient._transport_failed).


def test_a_cancel_whose_answer_does_not_come_names_the_job_to_look_at(slow_server):
    client = ServeClient(url=slow_server.url, token="any", timeout=0.5)
    with client, pytest.raises(OutcomeUnknown) as raised:
        client.cancel("j-7")
    slow_server.release()
    assert exit_code(raised.value) == OUTCOME_UNKNOWN_EXIT
    assert "(POST /v1/jobs/j-7/cancel)" in str(raised.value)
    assert f"check with `gpuslice show j-7 --url {slow_server.url}`" in str(raised.value)


def test_a_read_whose_answer_does_not_come_says_the_server_is_there(slow_server):
    client = ServeClient(url=slow_server.url, token="any", timeout=0.5)
    with client, pytest.raises(ServerUnavailable) as raised:
        client.policies()
    slow_server.release()
    text = str(raised.value)
    assert not isinstance(raised.value, OutcomeUnknown) and exit_code(raised.value) == 2
    assert text.startswith(f"the gpuslice server at {slow_server.url} took the connection, but no answer")
    assert "no gpuslice server" not in text


def test_a_submit_sent_once_stays_unknown_when_a_retry_finds_no_server(monkeypatch):
    """The first try reached the server and its answer was lost; the retry is refused (the server went
    away): the job may exist, so the error is the lost answer's, not "no server"."""
    tries = []

    def lost_then_refused(request: httpx.Request) -> httpx.Response:
        tries.append(request.headers["Idempotency-Key"])
        if len(tries) == 1:
            raise httpx.ReadTimeout("timed out", request=request)
        raise httpx.ConnectError("connection refused", request=request)

    monkeypatch.setattr("gpuslice.server.client._RETRY_SECONDS", 0.0)
    http = httpx.Client(transport=httpx.MockTransport(lost_then_refused), base_url="http://x")
    client = ServeClient(token="any", http=http)
    with pytest.raises(OutcomeUnknown) as raised:
        client.submit({"command": ["train"]}, idempotency_key="k-1", retries=2)
    assert tries == ["k-1"] * 3
    assert "(POST /v1/jobs)" in str(raised.value) and "check with `gpuslice ps --all`" in str(raised.value)
