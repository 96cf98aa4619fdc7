"""``gpuslice top`` (cli/top.py) against the real app in-process (daemon over the fake node), against no
server, and its frame for GPU data with health and telemetry. Here rather than in tests/cli to share the
fake node of tests/server/conftest.py, like test_cli_jobs.py."""

from __future__ import annotations

import time
import warnings

import pytest
from rich.console import Console
from server_helpers import free_port
from typer.testing import CliRunner

from gpuslice.cli import jobs, top
from gpuslice.cli.main import app
from gpuslice.errors import GpusliceError, exit_code
from gpuslice.server.app import create_app
from gpuslice.server.client import ServeClient
from gpuslice.server.errors import ServerUnavailable
from gpuslice.units import GiB

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # starlette asks for httpx2; httpx works the same here
    from fastapi.testclient import TestClient

TOKEN = "top-token"


@pytest.fixture
def http(daemon):
    with TestClient(create_app(daemon, TOKEN)) as client:
        yield client


@pytest.fixture
def cli(http, monkeypatch):
    """cli(*args) -> (exit code, output) of ``gpuslice …`` talking to the app in this process."""
    monkeypatch.setattr(jobs, "_client", lambda url, state_dir: ServeClient(token=TOKEN, http=http))

    def run(*args: str, columns: int = 200) -> tuple[int, str]:
        result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})
        if isinstance(result.exception, GpusliceError):  # what main() does with it
            return exit_code(result.exception), f"error: {result.exception}"
        return result.exit_code, result.output

    return run


def rendered(renderable, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    console.file.close()
    return console.export_text()


def gpu_rows(out: str) -> dict[int, str]:
    """GPU table lines by index: the lines whose first field is a GPU index, before RUNNING."""
    rows = {}
    for line in out.split("RUNNING")[0].splitlines():
        first = line.split(maxsplit=1)
        if first and first[0].isdigit():
            rows[int(first[0])] = line
    return rows


def test_once_shows_every_gpu_its_slices_the_running_jobs_and_why_the_queue_waits(cli, daemon):
    cli("submit", "--mem", "20GiB", "--cores", "50", "--tenant", "vision", "--", "python", "train.py")
    cli("submit", "--gpus", "8", "--priority", "low", "--", "big")
    daemon.tick()
    code, out = cli("top", "--once")
    assert code == 0, out
    assert "test-h100 · 8 × H100" in out and "1 running · 1 pending" in out

    rows = gpu_rows(out)
    assert sorted(rows) == list(range(8))
    (placed,) = [g for g in daemon.views.gpus() if g["jobs"]]
    assert "1 20 GiB · 50%  python train.py" in rows[placed["index"]]
    assert "60 GiB" in rows[placed["index"]]  # its free memory (80 - 20)
    assert all("idle" in line for i, line in rows.items() if i != placed["index"])
    assert all(" ok " in line for line in rows.values())

    running = out.split("RUNNING (1)")[1].split("QUEUE")[0]
    assert "20 GiB · 50%" in running and "vision" in running and "python train.py" in running
    queue = out.split("QUEUE (1)")[1]
    (_, reason), *_ = daemon.queue()
    assert reason and reason in queue and "big" in queue


def test_commands_are_shown_as_typed_not_as_markup(cli, daemon):
    cli("submit", "--mem", "1GiB", "--", "echo", "[bold red]boom[/]", "<img src=x onerror=alert(1)>")
    daemon.tick()
    code, out = cli("top", "--once")
    assert code == 0 and "echo [bold red]boom[/] <img src=x onerror=alert(1)>" in out


def test_a_narrow_terminal_keeps_every_gpu_on_one_line_and_leaves_the_slices_to_the_job_table(cli, daemon):
    cli("submit", "--mem", "20GiB", "--", "python", "train.py")
    daemon.tick()
    code, out = cli("top", "--once", columns=80)
    assert code == 0
    rows = gpu_rows(out)
    assert sorted(rows) == list(range(8)) and all(len(line) <= 80 for line in rows.values())
    assert "SLICES" not in out and "python train.py" in out.split("RUNNING (1)")[1]


def test_no_server_is_one_error_line_and_exit_2():
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["top", "--once", "--url", url])
    assert isinstance(result.exception, ServerUnavailable) and exit_code(result.exception) == 2
    assert str(result.exception).startswith(f"no gpuslice server at {url}")
    assert "\n" not in str(result.exception)


def test_interval_below_the_floor_is_refused(cli):
    code, out = cli("top", "--interval", "0")
    assert code == 2 and "interval" in out


def test_when_the_server_goes_away_the_last_frame_stays_under_a_red_line(http, daemon):
    daemon.tick()
    with ServeClient(token=TOKEN, http=http) as up:
        frame, last = top.next_frame(up, None, 2.0)
    assert "GPU" in rendered(frame)
    with ServeClient(url=f"http://127.0.0.1:{free_port()}", timeout=2) as down:
        frame, kept = top.next_frame(down, last, 2.0)
        assert kept is last
        text = rendered(frame)
        assert text.startswith("no gpuslice server at") and "retrying every 2 s" in text
        assert sorted(gpu_rows(text)) == list(range(8))  # the last frame, still on screen
        with pytest.raises(ServerUnavailable):  # never reached at all: the command's one-line error
            top.next_frame(down, None, 2.0)


def test_live_mode_redraws_until_ctrl_c(cli, daemon, monkeypatch):
    sleeps = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    taken = []
    real = top.snapshot
    monkeypatch.setattr(top, "_sleep", sleep)
    monkeypatch.setattr(top, "snapshot", lambda client: taken.append(real(client)) or taken[-1])
    code, out = cli("top", "--interval", "0.5")
    assert code == 0 and sleeps == [0.5, 0.5, 0.5]
    assert len(taken) == 3  # the first frame, then one after each of the two completed sleeps
    assert "every 0.5 s, Ctrl-C quits" in out and sorted(gpu_rows(out)) == list(range(8))  # the last frame


def snapshot(**gpu_fields) -> top.Snapshot:
    gpu = {
        "index": 3, "uuid": "GPU-3", "model": "H100", "memory_total_bytes": 80 * GiB,
        "memory_free_bytes": 40 * GiB, "compute_free_percent": 50.0, "external_memory_bytes": 0,
        "jobs": [{"id": "7", "memory_bytes": 40 * GiB, "compute_percent": 50, "mig": "",
                  "used_memory_bytes": 31 * GiB}],
        **gpu_fields,
    }  # fmt: skip
    health = {"machine": "m", "gpus": 1, "simulated": True, "sharing": "soft", "jobs": {"RUNNING": 1}}
    return top.Snapshot(health, [gpu], [], [], time.time())


def test_a_gpu_marked_unhealthy_through_the_api_shows_as_unhealthy(cli, http, daemon):
    mark = {"healthy": False, "reason": "XID 48: double-bit ECC error"}
    r = http.post("/v1/gpus/2/health", json=mark, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    code, out = cli("top", "--once")
    rows = gpu_rows(out)
    assert code == 0 and "UNHEALTHY" in rows[2] and all(" ok " in rows[i] for i in rows if i != 2)
    assert "GPU 2 is unhealthy: XID 48: double-bit ECC error; no new jobs are placed there" in out


def test_an_unhealthy_gpu_is_marked_with_its_reason():
    text = rendered(top.render(snapshot(healthy=False, unhealthy_reason="XID 79: GPU fell off the bus")))
    assert "UNHEALTHY" in gpu_rows(text)[3]
    assert "GPU 3 is unhealthy: XID 79: GPU fell off the bus; no new jobs are placed there" in text
    assert "1 UNHEALTHY" in text.splitlines()[0]
    healthy = rendered(top.render(snapshot(healthy=True, unhealthy_reason=None)))
    assert "UNHEALTHY" not in healthy and " ok " in gpu_rows(healthy)[3]


def test_telemetry_columns_appear_when_the_server_reports_them():
    text = rendered(
        top.render(snapshot(utilization_percent=87.4, temperature_celsius=66.0, power_watts=412.0))
    )
    assert "UTIL" in text and "87%" in text and "66°C" in text and "412W" in text
    assert "UTIL" not in rendered(top.render(snapshot()))  # older servers: no empty columns


def test_memory_bar_shows_slices_external_memory_and_free_in_proportion():
    gpu = {
        "memory_total_bytes": 80 * GiB, "external_memory_bytes": 20 * GiB,
        "jobs": [{"id": "1", "memory_bytes": 30 * GiB}, {"id": "2", "memory_bytes": 10 * GiB}],
    }  # fmt: skip
    bar = top.memory_bar(gpu, width=16)
    assert bar.plain == "█" * 6 + "█" * 2 + "▒" * 4 + "·" * 4
    assert len(top.memory_bar({**gpu, "external_memory_bytes": 0, "jobs": []}, width=16).plain) == 16
