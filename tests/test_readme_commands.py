"""The README's shell commands work as written: every ```sh / ```bash block that needs no GPU or
cluster runs, in order, in a fresh shell (no activated environment, no GPUSLICE_* variables, a new
HOME) in a folder laid out like a clone after the Quickstart (``.venv`` is this test run's environment).

A block that cannot run here says why on the line before its fence:
``<!-- readme-test: skip: REASON -->``. A block that talks to a server runs against
``gpuslice serve --simulate dgx-h100``, which this test starts as the README says (on a free port: the
clients find it through the URL the server writes into its state dir); a block for another simulated
machine says ``<!-- readme-test: serve --simulate SPEC -->``. The Kubernetes section needs a cluster and
is left out.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>sh|bash)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
MARK = re.compile(r"<!-- readme-test: (?P<what>.*?) -->\s*$")
NEEDS_CLUSTER = ("## Kubernetes",)
DEFAULT_SERVER = "dgx-h100"

pytestmark = pytest.mark.slow


def _blocks() -> list[tuple[str, str, str]]:
    """(id, directive, body) per shell block, in README order; directive is '', 'skip: …' or 'serve …'."""
    text = README.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()]
        section = before[before.rfind("\n## ") + 1 :].split("\n", 1)[0]
        previous = before.rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(previous)
        directive = mark["what"] if mark else ""
        if section.startswith(NEEDS_CLUSTER):
            directive = "skip: needs a Kubernetes cluster"
        line = text.count("\n", 0, match.start()) + 1
        body = "\n".join(row[len(match["indent"]) :] for row in match["body"].splitlines())
        found.append((f"README.md:{line}", directive, body))
    return found


BLOCKS = _blocks()


class _Server:
    """``.venv/bin/gpuslice serve --simulate SPEC`` in the work folder, with its own HOME."""

    def __init__(self, work: Path, home: Path, spec: str) -> None:
        self.home = home
        home.mkdir(parents=True)
        command = [str(work / ".venv" / "bin" / "gpuslice"), "serve", "--simulate", spec]
        self.proc = subprocess.Popen(
            [*command, "--port", str(_free_port())],
            cwd=work, env=_fresh_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        url_file = home / ".local" / "share" / "gpuslice" / "url"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the server stopped"
            with contextlib.suppress(OSError, httpx.HTTPError):
                url = url_file.read_text().strip()
                if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError(f"gpuslice serve --simulate {spec} did not come up in 30 s")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        # the jobs the README submitted run under their own supervisors: end them with the test
        for process in psutil.process_iter(["pid", "cmdline", "environ"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                if (process.info["environ"] or {}).get("HOME") == str(self.home):
                    os.killpg(os.getpgid(process.info["pid"]), signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_env(home: Path) -> dict[str, str]:
    """A new login's environment: the system PATH (no activated venv), a new HOME, no GPUSLICE_*."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "COLUMNS": "100",
            "TERM": "dumb"}  # fmt: skip


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder like the clone after the Quickstart: the repository's files, and .venv installed."""
    folder = tmp_path_factory.mktemp("clone")
    for entry in REPO.iterdir():
        if entry.name.startswith((".venv", ".git")) or entry.name in ("results", "clusterdata"):
            continue
        (folder / entry.name).symlink_to(entry)
    (folder / ".venv").symlink_to(Path(sys.prefix))
    return folder


@pytest.fixture(scope="module")
def servers(work):
    started: dict[str, _Server] = {}

    def get(spec: str) -> _Server:
        if spec not in started:
            started[spec] = _Server(work, work.parent / f"home-{spec.replace(':', '-')}", spec)
        return started[spec]

    yield get
    for server in started.values():
        server.stop()


def test_the_readme_has_shell_blocks_and_every_skip_says_why():
    assert len(BLOCKS) >= 10
    for where, directive, _ in BLOCKS:
        assert directive == "" or re.fullmatch(r"skip: .+|serve --simulate \S+", directive), where


@pytest.mark.parametrize(("where", "directive", "body"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_readme_block_runs_as_written(where, directive, body, work, servers):
    if directive.startswith("skip: "):
        pytest.skip(directive.removeprefix("skip: "))
    spec = directive.removeprefix("serve --simulate ") if directive else DEFAULT_SERVER
    server = servers(spec)
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", body], cwd=work, env=_fresh_env(server.home),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{where} failed ({done.returncode}):\n{body}\n--- stdout\n{done.stdout[-3000:]}\n"
        f"--- stderr\n{done.stderr[-3000:]}"
    )
