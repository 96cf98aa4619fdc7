"""A property-based fuzzer of the command line: hostile values drawn for one option (or input file) of a
command at a time, the others left at their defaults, and the contract every input surface keeps:

- the command refuses the input before any work, with exit status 2, exactly one ``error:`` line on
  stderr, no traceback, and nothing written in its folder; or
- it accepts it and reaches its work (stood in for here by an exception where the work would start:
  the replay, the sweep's runs, the study, the model's fit), within the time bound either way.

The values come from a grammar of what an attacker or a tired user types (huge, negative, zero, NaN and
infinities, non-ASCII digits, empty, blank, very long, a folder, a FIFO, a device, binary or empty
files, a missing folder's child). CI runs a bounded number of examples per command (``GPUSLICE_FUZZ_
EXAMPLES``, default 25); ``benchmarks/fuzz_inputs.py`` runs many more and records what it found.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuslice.cli.main import main
from gpuslice.cli.mig import REJECTED_EXIT

EXAMPLES = int(os.environ.get("GPUSLICE_FUZZ_EXAMPLES", "25"))
# CI draws the same examples every run (a failure there is a defect, never luck); the benchmark draws
# fresh ones (GPUSLICE_FUZZ_RANDOM=1)
RANDOM = os.environ.get("GPUSLICE_FUZZ_RANDOM") == "1"
TIME_LIMIT_S = 10


class Reached(Exception):
    """The command got past its checks to where its work starts."""


def _reached(*_args: object, **_kwargs: object) -> None:
    raise Reached


# Where each command's work starts: patched to raise Reached.
WORK = {
    "sim openb": ("gpuslice.sim.sweep._run",),
    # the declared run times of every pod (a stream of many copies: seconds) come before the replays
    "sim replay": ("gpuslice.cli.replay.replay_timed", "gpuslice.cli.replay.estimates_for"),
    "tune": ("gpuslice.cli.tune.run_study",),
    "predict": ("gpuslice.sim.duration_model.held_out_errors",),
    # quick commands run whole: exit 0 is their answer
    "topo assign": (),
    "mig plan": (),
    "estimate": (),
}

# Exit codes a command documents for accepted input besides 0 (`mig plan`: some requests were rejected).
ANSWERS = {"mig plan": {0, REJECTED_EXIT}}

NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["0", "-1", "1", "2", "nan", "inf", "-inf", "1e400", "-0", "0x10", "1_000", "٤٢", "²",
                     "１２", "1.5", ".5", "5.", "", " ", "9" * 5000, "-" + "9" * 400, "1e-400", "+3"]),
    st.text(max_size=12),
)  # fmt: skip
TEXT = st.one_of(
    st.sampled_from(["", " ", "default", "fgd", "bestfit", "../../etc/passwd", "a" * 10_000, "x\ny", "é",
                     "fifo", "sjf-predicted", "default@1", "default@x", "default@99999999999999", "@", "-"]),
    st.text(max_size=40).filter(lambda s: "\x00" not in s),
)  # fmt: skip
# Paths are names in the example's folder, made by ``_files`` below.
PATHS = st.sampled_from(["folder", "fifo", "binary", "empty", "latin1", "missing/child", "/dev/zero", "out",
                         "folder/new", "readonly/x", "a" * 300])  # fmt: skip

# command -> (fixed arguments, {option: strategy})
COMMANDS: dict[str, tuple[list[str], dict[str, st.SearchStrategy[str]]]] = {
    "sim openb": (
        ["sim", "openb"],
        {"--seeds": NUMBERS, "--jobs": NUMBERS, "--tune": NUMBERS, "--policy": TEXT, "--trace": TEXT,
         "--trace-dir": PATHS, "--out": PATHS},
    ),
    "sim replay": (
        ["sim", "replay"],
        {"--load": NUMBERS, "--repeat": NUMBERS, "--node-stride": NUMBERS, "--seed": NUMBERS,
         "--queue": TEXT, "--policy": TEXT, "--trace": TEXT, "--trace-dir": PATHS, "--out": PATHS,
         "--topology": TEXT},
    ),
    "tune": (
        ["tune"],
        {"--objective": TEXT, "--train": TEXT, "--holdout": TEXT, "--sample": NUMBERS,
         "--node-stride": NUMBERS, "--load": NUMBERS, "--trials": NUMBERS, "--jobs": NUMBERS,
         "--seed": NUMBERS, "--study": PATHS, "--out": PATHS},
    ),
    "topo assign": (
        ["topo", "assign", "--machine", "dgx1", "--jobs", "2,2"],
        {"--machine": st.one_of(TEXT, PATHS), "--jobs": st.one_of(NUMBERS, TEXT),
         "--busy": st.one_of(NUMBERS, TEXT)},
    ),
    "mig plan": (
        ["mig", "plan", "--gpu", "a100-80gb", "--request", "3g.40gb"],
        {"--gpu": TEXT, "--request": st.one_of(NUMBERS, TEXT, NUMBERS.map(lambda n: n + "GiB")),
         "--policy": TEXT, "--from-layout": TEXT, "--gpu-index": NUMBERS},
    ),
    "estimate": (
        ["estimate", "llama-3-8b"],
        {"--params": NUMBERS, "--dtype": TEXT, "--tp": NUMBERS, "--context": NUMBERS, "--batch": NUMBERS,
         "--kv-dtype": TEXT, "--gpus": NUMBERS, "--zero": NUMBERS, "--recompute": TEXT,
         "--micro-batch": NUMBERS, "--seq-len": NUMBERS},
    ),
    "predict": (
        ["predict"],
        {"--trace": TEXT, "--trace-dir": PATHS, "--train-fraction": NUMBERS, "--seed": NUMBERS,
         "--out": PATHS},
    ),
}  # fmt: skip


@contextlib.contextmanager
def _files(folder: Path) -> Iterator[None]:
    """The example's folder with the things PATHS names, as its working directory."""
    (folder / "folder").mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "binary").write_bytes(bytes(range(256)) * 4)
    (folder / "empty").write_bytes(b"")
    (folder / "latin1").write_bytes("name,cpu_milli\ncafé,1\n".encode("latin-1"))
    (folder / "readonly").mkdir(mode=0o500)
    old = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)
        (folder / "readonly").chmod(0o700)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in folder.rglob("*")
            if not p.is_fifo()}  # fmt: skip


def _alarm(_signum: int, _frame: object) -> None:
    raise TimeoutError(f"no answer within {TIME_LIMIT_S} s")


def _check(command: str, option: str, value: str, folder: Path) -> None:
    fixed, _ = COMMANDS[command]
    args = [
        *fixed,
        f"{option}={value}" if value.startswith("-") else option,
        *([] if value.startswith("-") else [value]),
    ]
    with _files(folder):
        before = _tree(folder)
        out, err = io.StringIO(), io.StringIO()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(TIME_LIMIT_S)
        started = time.monotonic()
        try:
            with contextlib.ExitStack() as stack:
                for target in WORK[command]:
                    stack.enter_context(mock.patch(target, _reached))
                stack.enter_context(contextlib.redirect_stdout(out))
                stack.enter_context(contextlib.redirect_stderr(err))
                main(args)
            code = 0
        except Reached:
            return  # accepted: its work would start now
        except SystemExit as ended:
            code = int(ended.code or 0)
            if code in ANSWERS.get(command, {0}) and not WORK[command]:
                return  # a quick command that ran whole: accepted
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        said = err.getvalue()
        where = f"{' '.join(args)[:300]!r} ({time.monotonic() - started:.1f} s)"
        assert "Traceback" not in said + out.getvalue(), f"{where}: {said[-2000:]}"
        assert code == 2, f"{where}: exit {code}: {said[-1000:]}"
        errors = [line for line in said.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, f"{where}: {said[-1000:]}"
        assert _tree(folder) == before, f"{where}: a refused command left files behind"


def _fuzz(command: str) -> Callable[..., None]:
    _, options = COMMANDS[command]
    pairs = st.sampled_from(sorted(options)).flatmap(lambda o: st.tuples(st.just(o), options[o]))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=not RANDOM,
    )
    @given(pair=pairs)
    def run(tmp_path_factory: pytest.TempPathFactory, pair: tuple[str, str]) -> None:
        option, value = pair
        _check(command, option, value, tmp_path_factory.mktemp("fuzz"))

    return run


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_drawn_input_is_refused_cleanly_before_any_work_or_accepted(command, tmp_path_factory) -> None:
    _fuzz(command)(tmp_path_factory)
