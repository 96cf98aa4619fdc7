"""The command-line fuzzer, on what commands read: hostile contents of every input file a command
takes, through ``cli_fuzz.check`` (refused with exit 2 and one ``error:`` line before any work and with
nothing written, or accepted up to where the work starts, within the time bound).

Each file starts as a small valid sample of its format and is mutated by up to two drawn edits: cut
short, a field or key replaced by a hostile value (NaN, infinities, 1e400, an integer of 5,000 digits, a
negative, text, null, a list, 10,000 levels of nesting), a line deleted or repeated (a duplicated key or
row), an unknown column, non-UTF-8 or NUL bytes, a byte-order mark, CRLF line ends, a line of 200,000
characters, 10,000 brackets anywhere; or replaced whole by nothing, blanks or binary. CI runs a third of
``GPUSLICE_FUZZ_EXAMPLES`` per file (every file shares its edits with the others);
``benchmarks/fuzz_inputs.py`` runs more.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from cli_fuzz import STATE, Command, check, fuzz_settings, tls_pair
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.data import __file__ as _data_init

HTTP = ("httpx.Client.send",)
EXTENDER = ("gpuslice.k8s.extender.KubernetesApi",)
SWEEP = ("gpuslice.sim.sweep.RunSpec",)
OPENB_ARGS = ["sim", "openb", "--trace-dir", "traces", "--trace", "default"]
K8S_API = ("gpuslice.k8s.kube_client.api_client", "gpuslice.k8s.dra.kube.DraApi")
OPENB = Path(_data_init).parent / "openb"

NEST = 10_000
HOSTILE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "9" * 5000, "-1", "-0", "0", "", " ", '"x"',
           "null", "[]", "{}", "true", "é", "0x10", "1_000", "٤٢", "\u202e", "a,b", '"', "'", "\\", "&a",
           "*a", "!!python/object:os.system", "- x", "{{", "1.5e308", "-9" * 3,
           "[" * NEST + "]" * NEST]  # fmt: skip
_TOKEN = re.compile(r"[A-Za-z0-9_.+-]+")


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _apply(text: str, edit: tuple[str, int, str]) -> str | bytes:
    """``text`` with one edit made (``at`` picks the place, modulo what there is)."""
    kind, at, value = edit
    lines = _lines(text)
    row = at % max(1, len(lines))
    if kind == "cut":
        return text[: at % max(1, len(text))]
    if kind == "token":
        found = list(_TOKEN.finditer(text))
        if not found:
            return text
        m = found[at % len(found)]
        return text[: m.start()] + value + text[m.end() :]
    if kind == "delete line":
        return "\n".join(lines[:row] + lines[row + 1 :])
    if kind == "repeat line":
        return "\n".join(lines[: row + 1] + lines[row:])
    if kind == "extra column":
        return "\n".join([*lines[:row], lines[row] + ",extra", *lines[row + 1 :]])
    if kind == "long line":
        return "\n".join([*lines[:row], "9" * 200_000, *lines[row:]])
    if kind == "nest":
        return text[: at % max(1, len(text))] + "[" * NEST + "]" * NEST + text[at % max(1, len(text)) :]
    if kind == "nest open":
        return text[: at % max(1, len(text))] + "{" * NEST
    if kind == "bom":
        return "\ufeff" + text
    if kind == "crlf":
        return text.replace("\n", "\r\n")
    raw = text.encode()
    cut = at % max(1, len(raw))
    if kind == "byte":
        return (
            raw[:cut]
            + {"nul": b"\0", "ff": b"\xff", "latin": "é".encode("latin-1")}.get(value, b"\x80")
            + raw[cut:]
        )
    return {"empty": b"", "blank": b" \n\t\n", "binary": bytes(range(256)) * 8}[value]


EDITS = st.one_of(
    st.tuples(st.sampled_from(["token"]), st.integers(0, 10_000), st.sampled_from(HOSTILE)),
    st.tuples(st.sampled_from(["cut", "delete line", "repeat line", "extra column", "long line", "nest",
                               "nest open", "bom", "crlf"]), st.integers(0, 10_000), st.just("9")),
    st.tuples(st.just("byte"), st.integers(0, 10_000), st.sampled_from(["nul", "ff", "latin", "80"])),
    st.tuples(st.just("whole"), st.just(0), st.sampled_from(["empty", "blank", "binary"])),
)  # fmt: skip


def edited(sample: str, edits: list[tuple[str, int, str]]) -> bytes:
    """``sample`` with ``edits`` made in turn (after a whole-file or byte edit the rest are skipped).
    The edits, not the bytes, are what Hypothesis draws and shows: a 200,000-character line stays a
    short tuple in a report."""
    text: str | bytes = sample
    for edit in edits:
        if isinstance(text, bytes):
            break
        text = _apply(text, edit)
    return text if isinstance(text, bytes) else text.encode()


@dataclass(frozen=True)
class InputFile:
    """A file a command reads: where it goes in the example's folder, and a valid sample of it."""

    command: Command
    path: str
    sample: str


def _head(path: Path, rows: int) -> str:
    return "\n".join(path.read_text().splitlines()[: rows + 1]) + "\n"


@cache
def _policy_sample() -> str:
    from gpuslice.programs.export import export_source

    return export_source("bestfit", None)


SMI_MATRIX = """\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tNV2\tSYS\tSYS\t0-11
GPU1\tNV2\t X \tSYS\tSYS\t0-11
GPU2\tSYS\tSYS\t X \tNV2\t12-23
GPU3\tSYS\tSYS\tNV2\t X \t12-23
"""
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: default}
current-context: x
"""
COST_PROFILE = json.dumps(
    {"format": 1, "link_bytes_per_s": 1.2e10, "batch_overhead_s": 2e-5, "per_access_s": 1e-9, "name": "lab",
     "source": {"how": "measured"}},
    indent=1,
)  # fmt: skip
HF_CONFIG = json.dumps(
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
     "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 32,
     "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "vocab_size": 128256,
     "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    indent=1,
)  # fmt: skip
MEMSIM_TRACE = "tenant,block,page,op,time\n0,1,2,r,0\n1,2,3,w,5\n0,1,4,0,7\n1,3,1,1,9.5\n"
TRACES = "traces"

FILES: dict[str, InputFile] = {
    "memsim trace": InputFile(
        Command(["memsim", "--trace", "input.csv"], {}, work=("gpuslice.cli.memsim._simulate",)),
        "input.csv",
        MEMSIM_TRACE,
    ),
    "memsim cost profile": InputFile(
        Command(
            ["memsim", "--scale", "0.05", "--cost-profile", "input.json"],
            {},
            work=("gpuslice.cli.memsim._simulate",),
        ),
        "input.json",
        COST_PROFILE,
    ),
    "policy check": InputFile(Command(["policy", "check", "policy.py"], {}), "policy.py", ""),
    "estimate config.json": InputFile(Command(["estimate", "config.json"], {}), "config.json", HF_CONFIG),
    "topo assign --machine": InputFile(
        Command(["topo", "assign", "--machine", "topo.txt", "--jobs", "2,2"], {}), "topo.txt", SMI_MATRIX
    ),
    "kubeconfig": InputFile(
        Command(["k8s", "extender", "--kubeconfig", "kubeconfig"], {}, work=EXTENDER),
        "kubeconfig",
        KUBECONFIG,
    ),
    "webhook --cert": InputFile(
        Command(
            ["k8s", "webhook", "--cert", "cert.pem", "--key", "key.pem"],
            {},
            work=(*K8S_API, "gpuslice.k8s.webhook.run"),
        ),
        "cert.pem",
        "",
    ),
    "token file": InputFile(Command(["cancel", "1"], {}, work=HTTP), f"{STATE}/token", "fuzz-token-01234\n"),
    "url file": InputFile(Command(["ps"], {}, work=HTTP), f"{STATE}/url", "http://127.0.0.1:8787\n"),
    "--target-workload": InputFile(
        Command(["k8s", "extender", "--target-workload", "workload.csv"], {}, work=EXTENDER),
        "workload.csv",
        _head(OPENB / "openb_pod_list_default.csv", 8),
    ),
    "--trace-dir pod list": InputFile(
        Command(OPENB_ARGS, {}, work=SWEEP),
        f"{TRACES}/openb_pod_list_default.csv",
        _head(OPENB / "openb_pod_list_default.csv", 12),
    ),
    "--trace-dir node list": InputFile(
        Command(OPENB_ARGS, {}, work=SWEEP),
        f"{TRACES}/openb_node_list_gpu_node.csv",
        _head(OPENB / "openb_node_list_gpu_node.csv", 6),
    ),
}


def _sample(name: str) -> str:
    """The valid file that is mutated (some made on first use: a policy, a certificate)."""
    if name == "policy check":
        return _policy_sample()
    if name == "webhook --cert":
        return tls_pair()[0].decode()
    return FILES[name].sample


def _companions(name: str) -> dict[str, bytes | str]:
    """The other files the command needs, valid: the trace folder's other list."""
    if name.startswith("--trace-dir"):
        other = {"--trace-dir pod list": "--trace-dir node list"}.get(name, "--trace-dir pod list")
        return {FILES[other].path: FILES[other].sample}
    return {}


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_drawn_file_content_is_refused_cleanly_before_any_work_or_accepted(
    name, tmp_path_factory
) -> None:
    target = FILES[name]
    chosen = fuzz_settings()
    chosen = settings(chosen, max_examples=max(1, chosen.max_examples // 3))

    sample = _sample(name)

    @chosen
    @given(edits=st.lists(EDITS, max_size=2))
    def run(edits: list[tuple[str, int, str]]) -> None:
        extra = {**_companions(name), target.path: edited(sample, edits)}
        check(target.command, [*target.command.args], tmp_path_factory.mktemp("file"), extra)

    run()
