"""The job commands (cli/jobs.py) against the real app in-process (daemon over a fake node), and without
a server. They live here, not in tests/cli, to share the fake node of tests/server/conftest.py."""

from __future__ import annotations

import warnings

import httpx
import pytest
from server_helpers import free_port
from typer.testing import CliRunner

from gpuslice.cli import jobs
from gpuslice.cli.main import app
from gpuslice.errors import GpusliceError, exit_code
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient
from gpuslice.server.errors import ServerUnavailable

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "cli-token"


@pytest.fixture
def cli(daemon, monkeypatch):
    """cli(*args) -> (exit code, output) of ``gpuslice …`` talking to the app in this process."""
    http = TestClient(create_app(daemon, TOKEN))
    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=http))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
        if isinstance(result.exception, GpusliceError):  # what main() does with it
            return exit_code(result.exception), f"error: {result.exception}"
        return result.exit_code, result.output

    yield run
    http.close()


def test_submit_sends_the_slice_and_prints_the_job(cli, daemon):
    code, out = cli("submit", "--mem", "20GiB", "--cores", "50", "--priority", "high", "--tenant", "vision",
                    "--max-runtime", "1h", "--", "python", "train.py", "--lr", "3")  # fmt: skip
    assert code == 0
    assert out.strip() == "job 1 submitted: PENDING (20 GiB · 50%; --mem 20GiB read as 21,474,836,480 bytes)"
    spec = daemon.store.get("1").spec
    assert spec.command == ("python", "train.py", "--lr", "3")
    assert (spec.gpu_memory_bytes, spec.compute_percent, spec.tenant) == (20 * 2**30, 50, "vision")
    assert spec.max_runtime_seconds == 3600


def test_a_decimal_unit_is_echoed_in_bytes_so_it_cannot_pass_for_a_binary_one(cli, daemon):
    code, out = cli("submit", "--mem", "20GB", "--", "x")
    assert code == 0 and "(18.6 GiB; --mem 20GB read as 20,000,000,000 bytes)" in out
    assert daemon.store.get("1").spec.gpu_memory_bytes == 20 * 10**9


@pytest.mark.parametrize("mem", ["20", "0", "0GiB", "٢٠GiB"])
def test_a_bare_zero_or_non_ascii_size_is_refused_before_any_job_exists(cli, daemon, mem):
    code, out = cli("submit", "--mem", mem, "--", "x")
    assert code == 2 and "--mem: invalid size" in out
    assert daemon.store.jobs() == []


def test_bad_submit_is_one_error_line_naming_the_field_and_exit_2(cli, daemon):
    code, out = cli("submit", "--mem", "20GB?", "--", "x")
    assert code == 2 and "--mem: invalid size" in out  # the flag, not the API field
    assert daemon.store.jobs() == []


def test_ps_gpus_queue_show_cancel_and_logs(cli, daemon, node, tmp_path):
    cli("submit", "--gpus", "8", "--", "big")
    cli("submit", "--mem", "10GiB", "--", "small")
    daemon.tick()
    code, ps = cli("ps")
    assert code == 0 and "RUNNING" in ps and "PENDING" in ps and "big" in ps
    code, gpus = cli("gpus")
    assert code == 0 and gpus.count("H100") == 8 and "1: 80 GiB" in gpus
    code, queue = cli("queue")
    assert code == 0 and "2" in queue and "GPU" in queue  # the reason names what it waits for
    code, show = cli("show", "1")
    assert code == 0 and "PENDING→RUNNING" in show
    (tmp_path / "jobs" / "1").mkdir(parents=True, exist_ok=True)
    (tmp_path / "jobs" / "1" / "stdout.log").write_text("epoch 1\n")
    code, logs = cli("logs", "1")
    assert code == 0 and logs == "epoch 1\n"
    code, cancelled = cli("cancel", "2")
    assert code == 0 and "CANCELLED" in cancelled
    code, missing = cli("show", "99")
    assert code == 2 and "no job '99'" in missing


def test_host_limits_are_sent_stored_and_shown_with_the_containment_mode(cli, daemon, node):
    node.containment = "cgroup1"
    code, _ = cli("submit", "--host-memory", "8GiB", "--cpus", "1.5", "--", "train")
    assert code == 0
    spec = daemon.store.get("1").spec
    assert (spec.host_memory_bytes, spec.cpus) == (8 * 2**30, 1.5)
    daemon.tick()
    code, show = cli("show", "1")
    assert code == 0 and "8 GiB RAM · 1.5 CPUs" in show
    assert "containment  cgroup1" in show


@pytest.mark.parametrize(
    ("flag", "value", "said"), [("--cpus", "-1", "--cpus"), ("--host-memory", "8", "--host-memory")]
)
def test_a_bad_host_limit_is_refused_naming_its_flag(cli, daemon, flag, value, said):
    code, out = cli("submit", flag, value, "--", "x")
    assert code == 2 and said in out
    assert daemon.store.jobs() == []


def test_without_a_server_the_error_says_how_to_start_one(tmp_path):
    port_nobody_uses = "http://127.0.0.1:9"
    result = CliRunner().invoke(app, ["ps", "--url", port_nobody_uses])
    assert result.exit_code != 0
    assert isinstance(result.exception, Exception) and "start one with `gpuslice serve`" in str(
        result.exception
    )


def test_mark_unhealthy_then_healthy_and_the_table_shows_it(cli, daemon):
    code, out = cli("gpus", "--mark-unhealthy", "2", "--reason", "XID 79")
    assert code == 0
    line = next(x for x in out.splitlines() if x.strip().startswith("2 "))
    assert "unhealthy: XID 79" in line
    assert not daemon.watch.health[2].healthy and daemon.watch.health[2].kind == "manual"
    code, out = cli("gpus", "--mark-healthy", "2")
    assert code == 0 and "unhealthy" not in out and daemon.watch.health[2].healthy


def test_an_unknown_gpu_or_both_options_are_user_errors(cli, daemon):
    code, out = cli("gpus", "--mark-unhealthy", "12")
    assert code == 2 and "no GPU 12" in out
    code, out = cli("gpus", "--mark-unhealthy", "1", "--mark-healthy", "1")
    assert code == 2 and "not both" in out
    assert daemon.watch.health.unhealthy() == {}


def test_ps_cuts_a_command_past_80_characters_with_an_ellipsis(cli, daemon):
    """`ps` shows 80 characters of a command (wrapped in its column; `show` prints it whole)."""
    long_command = ["python", "train.py", "--config", "configs/a-very-long-experiment-name.yaml", "--seed"]
    long_command += ["1234567890" * 3]
    assert cli("submit", "--mem", "1GiB", "--", *long_command)[0] == 0
    code, ps = cli("ps")
    assert code == 0
    shown = " ".join(long_command)[:79] + "…"
    assert shown in ps and " ".join(long_command) not in ps


def test_submit_checks_its_arguments_before_the_token_and_names_the_flag(cli, monkeypatch, tmp_path):
    from gpuslice.server.client import ServeClient

    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(state_dir=tmp_path))  # no token
    code, out = cli("submit", "--mem", "-5GiB", "--", "true")
    assert code == 2 and out.startswith("error: --mem:") and "token" not in out
    code, out = cli("submit", "--gpus", "2", "--cores", "50", "--", "true")
    assert code == 2 and out.startswith("error: --gpus:") and "compute_percent" not in out


def test_a_submit_whose_answer_is_lost_is_retried_with_its_key_and_makes_one_job(daemon, monkeypatch):
    """The server took the submit, then the connection broke before its answer (a crash): the client
    sends it again with the same Idempotency-Key and gets the job the first try made."""
    http = TestClient(create_app(daemon, TOKEN))
    calls = []

    def lossy(request):
        calls.append(request.headers.get("Idempotency-Key"))
        answer = http.request(
            request.method, request.url.path, headers=request.headers, content=request.content
        )
        if len(calls) == 1:
            raise httpx.ReadError("connection reset by peer", request=request)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    monkeypatch.setattr("gpuslice.server.client._RETRY_SECONDS", 0.0)
    client = ServeClient(
        token=TOKEN, http=httpx.Client(transport=httpx.MockTransport(lossy), base_url="http://x")
    )
    job = client.submit({"command": ["train"]}, idempotency_key="key-1", retries=3)
    assert len(calls) == 2 and calls[0] == calls[1] == "key-1"
    assert [j.id for j in daemon.store.jobs()] == [job["id"]]


def test_a_submit_with_no_server_there_fails_at_once(monkeypatch):
    import types

    sleeps = []
    # the client module's own clock only: other tests' daemon threads may still sleep on time.sleep
    monkeypatch.setattr("gpuslice.server.client.time", types.SimpleNamespace(sleep=sleeps.append))
    client = ServeClient(url=f"http://127.0.0.1:{free_port()}", token=TOKEN, timeout=2)
    with pytest.raises(ServerUnavailable):
        client.submit({"command": ["train"]}, idempotency_key="key-2", retries=5)
    assert sleeps == []
