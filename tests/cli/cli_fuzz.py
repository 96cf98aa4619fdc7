"""The command-line fuzzer's engine: one drawn input at a time, run through ``gpuslice`` in-process, and
the contract every input surface keeps:

- the command refuses the input before any work, with exit status 2, exactly one ``error:`` line on
  stderr, no traceback, and nothing written in its folder; or
- it accepts it and reaches its work (stood in for by ``Reached``, raised where the work would start:
  a replay, an HTTP call to the server, a socket that listens, a connection to the Kubernetes API),
  within the time bound either way.

``tests/cli/test_fuzz_inputs.py`` draws hostile option values and ``test_fuzz_file_contents.py`` hostile
contents of the files commands read; both describe their commands with ``Command``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpuslice.cli.main import main

EXAMPLES = int(os.environ.get("GPUSLICE_FUZZ_EXAMPLES", "25"))
# CI draws the same examples every run (a failure there is a defect, never luck); the benchmark draws
# fresh ones (GPUSLICE_FUZZ_RANDOM=1)
RANDOM = os.environ.get("GPUSLICE_FUZZ_RANDOM") == "1"
TIME_LIMIT_S = 10
# The client commands find their server and token here (a folder the example makes, see ``_files``).
STATE = "state"
TOKEN = "fuzz-token-0123456789abcdef"
# Variables that would point a command elsewhere than the example's folder, or name a node or pod.
_CLEARED_ENV = ("GPUSLICE_URL", "GPUSLICE_TOKEN", "GPUSLICE_STATE_DIR", "GPUSLICE_CONTAINMENT", "NODE_NAME",
                "POD_UID", "GPUSLICE_DAEMONSET", "KUBECONFIG")  # fmt: skip


class Reached(BaseException):
    """The command got past its checks to where its work starts. A BaseException: a command's own
    ``except Exception`` (a probe that reports any failure) must not take it for a refusal."""


def reached(*_args: object, **_kwargs: object) -> None:
    raise Reached


@dataclass(frozen=True)
class Command:
    """A command line to fuzz: ``args`` (a positional named in ``options`` is replaced by the drawn
    value), ``tail`` after the drawn option (``-- true`` for submit), where its work starts (``work``:
    targets patched to raise Reached; none for a quick command that runs whole), the exit codes of an
    accepted input (``answers``), and the environment it runs in."""

    args: list[str]
    options: Mapping[str, st.SearchStrategy[str]]
    work: tuple[str, ...] = ()
    answers: frozenset[int] = frozenset({0})
    env: Mapping[str, str] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


NUMBERS = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from(["0", "-1", "1", "2", "nan", "inf", "-inf", "1e400", "-0", "0x10", "1_000", "٤٢", "²",
                     "１２", "1.5", ".5", "5.", "", " ", "9" * 5000, "-" + "9" * 400, "1e-400", "+3",
                     "65536", "4294967297"]),
    st.text(max_size=12),
)  # fmt: skip
TEXT = st.one_of(
    st.sampled_from(["", " ", "default", "fgd", "bestfit", "../../etc/passwd", "a" * 10_000, "x\ny", "é",
                     "fifo", "sjf-predicted", "default@1", "default@x", "default@99999999999999", "@", "-",
                     "http://[::1", "http://127.0.0.1:99999", "ftp://x", "http://a b", "\x1b[2J",
                     "ns/name", "/", "a/b/c", "Node_A", "node-a", "x" * 300]),
    st.text(max_size=40).filter(lambda s: "\x00" not in s),
)  # fmt: skip
# Paths are names in the example's folder, made by ``_files`` below.
PATHS = st.sampled_from(["folder", "fifo", "binary", "empty", "latin1", "missing/child", "/dev/zero", "out",
                         "folder/new", "readonly/x", "a" * 300, "link-to-fifo", "dangling"])  # fmt: skip


@cache
def tls_pair() -> tuple[bytes, bytes]:
    """A certificate and its key (PEM) for the commands that serve TLS, made once per run."""
    import trustme

    cert = trustme.CA().issue_cert("localhost")
    return cert.cert_chain_pems[0].bytes(), cert.private_key_pem.bytes()


@contextlib.contextmanager
def _files(folder: Path, extra: Mapping[str, bytes | str]) -> Iterator[None]:
    """The example's folder with the things PATHS names, a server state folder with a token, and
    ``extra`` (name -> contents; "FIFO" and "FOLDER" make those), as its working directory."""
    (folder / "folder").mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "binary").write_bytes(bytes(range(256)) * 4)
    (folder / "empty").write_bytes(b"")
    (folder / "latin1").write_bytes("name,cpu_milli\ncafé,1\n".encode("latin-1"))
    (folder / "readonly").mkdir(mode=0o500)
    (folder / "link-to-fifo").symlink_to("fifo")
    (folder / "dangling").symlink_to("nowhere")
    (folder / STATE).mkdir(mode=0o700)
    cert, key = tls_pair()
    (folder / "cert.pem").write_bytes(cert)
    (folder / "key.pem").write_bytes(key)
    fd = os.open(folder / STATE / "token", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(TOKEN + "\n")
    for name, contents in extra.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        if contents == "FIFO":
            os.mkfifo(path)
        elif contents == "FOLDER":
            path.mkdir()
        else:
            path.write_bytes(contents.encode() if isinstance(contents, str) else contents)
            path.chmod(0o600)
    old = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)
        (folder / "readonly").chmod(0o700)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            for p in folder.rglob("*") if not p.is_fifo()}  # fmt: skip


def _alarm(_signum: int, _frame: object) -> None:
    raise TimeoutError(f"no answer within {TIME_LIMIT_S} s")


def command_line(command: Command, option: str | None, value: str) -> list[str]:
    """``command``'s arguments with ``value`` for ``option`` (an option, or a positional in args)."""
    if option is None:
        return [*command.args, *command.tail]
    if option in command.args:
        return [value if a == option else a for a in command.args] + command.tail
    drawn = [f"{option}={value}"] if value.startswith("-") else [option, value]
    return [*command.args, *drawn, *command.tail]


def check(
    command: Command,
    args: list[str],
    folder: Path,
    extra: Mapping[str, bytes | str] | None = None,
    refused: bool = False,
) -> None:
    """Run ``gpuslice args`` in ``folder`` (with ``extra`` files) and assert the contract; with
    ``refused``, that the input is refused (not accepted)."""
    env = {**dict.fromkeys(_CLEARED_ENV, ""), "GPUSLICE_STATE_DIR": STATE, **command.env}
    with _files(folder, extra or {}), mock.patch.dict(os.environ, env):
        for name in _CLEARED_ENV:
            if not env.get(name):
                os.environ.pop(name, None)
        before = _tree(folder)
        out, err = io.StringIO(), io.StringIO()
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(TIME_LIMIT_S)
        started = time.monotonic()
        try:
            with contextlib.ExitStack() as stack:
                for target in command.work:
                    stack.enter_context(mock.patch(target, reached))
                stack.enter_context(contextlib.redirect_stdout(out))
                stack.enter_context(contextlib.redirect_stderr(err))
                main(args)
            code = 0
        except Reached:
            assert not refused, f"{' '.join(args)[:300]!r} was accepted: its work started"
            return  # accepted: its work would start now
        except SystemExit as ended:
            code = int(ended.code or 0)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        said = err.getvalue()
        where = f"{' '.join(args)[:300]!r} ({time.monotonic() - started:.1f} s)"
        assert "Traceback" not in said + out.getvalue(), f"{where}: {said[-2000:]}"
        if code in command.answers and code != 2 and not command.work and not refused:
            return  # a quick command that ran whole: its exit is its answer
        assert code == 2, f"{where}: exit {code}: {said[-1000:]}"
        errors = [line for line in said.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, f"{where}: {said[-1000:]}"
        assert _tree(folder) == before, f"{where}: a refused command left files behind"


def fuzz_settings() -> settings:
    """Hypothesis settings of every fuzz test: ``EXAMPLES`` per command, fixed draws in CI."""
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        derandomize=not RANDOM,
    )
