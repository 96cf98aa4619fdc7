"""The bad-input corpus (tests/cli/bad_inputs.toml) through the real console script: every case exits 2
with one ``error:`` line, no traceback, nothing written, within a time and a memory bound.

Each case runs in its own empty folder, which is also its working directory, its state directory and
its HOME, so a default output folder or a state directory created before the refusal is seen as a
file written. The memory bound is an address-space limit on the child; a run that grows without end
hits it (and fails with a MemoryError traceback or a kill) instead of taking the machine down.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

CORPUS = Path(__file__).with_name("bad_inputs.toml")
CASES = tomllib.loads(CORPUS.read_text(encoding="utf-8"))["case"]
TIME_LIMIT_S = 120  # a refusal takes about a second; this only catches hangs on a loaded machine
MEMORY_LIMIT_BYTES = 4 * 1024**3  # address space, not resident memory: numpy's imports reserve some


def _command() -> list[str]:
    script = Path(sys.executable).with_name("gpuslice")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from gpuslice.cli.main import main; main()"]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in folder.rglob("*")}


def test_the_corpus_holds_every_case_of_the_issue_and_more():
    names = [case["name"] for case in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    assert len(CASES) >= 34
    for case in CASES:
        assert set(case) <= {"name", "args", "error", "files", "env"}, case["name"]
        assert case["error"], case["name"]


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_bad_input_is_refused_with_one_error_line_and_nothing_written(case, tmp_path):
    for name, content in case.get("files", {}).items():
        if content.startswith("hex:"):
            (tmp_path / name).write_bytes(bytes.fromhex(content[4:]))
        else:
            (tmp_path / name).write_text(content, encoding="utf-8")
    before = _tree(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_")}
    env.update(
        HOME=str(tmp_path), COLUMNS="80", GPUSLICE_STATE_DIR=str(tmp_path / "state"),
        GPUSLICE_URL="http://127.0.0.1:9",  # the discard port: nothing answers there
    )  # fmt: skip
    env.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in case.get("env", {}).items()})
    args = [a.replace("{tmp}", str(tmp_path)) for a in case["args"]]
    done = subprocess.run(
        [*_command(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=TIME_LIMIT_S, preexec_fn=_limit_memory, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    err = done.stderr
    assert "Traceback" not in err + done.stdout, err
    assert done.returncode == 2, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {err}"
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, err
    assert case["error"] in errors[0], errors[0]
    assert _tree(tmp_path) == before, "a refused command left files behind"
