"""Read the text of ``nvidia-smi topo -m`` into a ``Topology``.

Accepted: the header line (``GPU0 GPU1 … [NIC0 … | mlx5_0 …] [CPU Affinity] [NUMA Affinity] [GPU NUMA ID]``),
one row per GPU, optional NIC rows, then the legend, which is ignored. Cells are tab- or space-separated.
Codes: ``X``, ``NV#``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, and ``SOC`` from older drivers
(the legend nvidia-smi prints under the matrix). NIC columns are checked, then dropped: gpuslice places GPUs.

nvidia-smi prints only the best link of a pair, so the PCIe path under an ``NV#`` pair is inferred from
NUMA affinity (``build_topology``), and NVSwitch is detected from the link counts. Anything malformed
raises ``TopologyParseError`` naming the line and the cell.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuslice.hardware.topology import (
    BandwidthModel,
    LinkType,
    Topology,
    TopologyError,
    build_topology,
    parse_link_label,
)
from gpuslice.inputs import InvalidInput, read_text

__all__ = ["TopologyParseError", "parse_topo_matrix", "read_topo_file"]

# `nvidia-smi topo -m` of 16 GPUs is about 3 KB: a megabyte is no such output.
_MAX_FILE_BYTES = 2**20

# Trailing header columns nvidia-smi may print, in its order (after the GPU and NIC columns).
_EXTRA_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_GPU = re.compile(r"GPU(\d+)")


class TopologyParseError(TopologyError):
    """``nvidia-smi topo -m`` text is malformed; the message names the line and what was expected."""


def _fail(lineno: int, line: str, problem: str) -> TopologyParseError:
    shown = " ".join(line.split())
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TopologyParseError(
        f"line {lineno} ({shown!r}): {problem}; expected the unchanged output of `nvidia-smi topo -m`"
    )


def _split_header(lineno: int, line: str) -> tuple[list[str], list[str]]:
    tokens = line.split()
    text = " ".join(tokens)
    extras: list[str] = []
    for name in reversed(_EXTRA_COLUMNS):
        if text.endswith(" " + name):
            extras.insert(0, name)
            text = text[: -len(name) - 1]
    devices = text.split()
    if any(word in devices for word in ("CPU", "NUMA", "Affinity")):
        raise _fail(lineno, line, "unknown trailing columns in the header")
    n_gpu = 0
    while n_gpu < len(devices) and devices[n_gpu] == f"GPU{n_gpu}":
        n_gpu += 1
    if n_gpu == 0:
        raise _fail(lineno, line, "the header must start with the column GPU0")
    if any(_GPU.fullmatch(d) for d in devices[n_gpu:]):
        raise _fail(lineno, line, f"GPU columns must be GPU0, GPU1, … in order; GPU{n_gpu} is missing")
    return devices, extras


def parse_topo_matrix(
    text: str,
    name: str = "from-file",
    *,
    bandwidth: BandwidthModel | None = None,
    nvswitch: bool | None = None,
) -> Topology:
    """A ``Topology`` from ``nvidia-smi topo -m`` output; TopologyParseError names the bad line."""
    lines = text.splitlines()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    if not numbered:
        raise TopologyParseError("empty input: paste the output of `nvidia-smi topo -m`")
    header_no, header = numbered[0]
    devices, extras = _split_header(header_no, header)
    n_gpu = sum(1 for d in devices if _GPU.fullmatch(d))
    labels: dict[int, list[str]] = {}
    row_line: dict[int, int] = {}
    numa: list[int] = [-1] * n_gpu
    cpus: list[str] = [""] * n_gpu
    seen: set[str] = set()
    for lineno, line in numbered[1:]:
        tokens = line.split()
        if tokens[0].rstrip(":") == "Legend" or tokens[0] not in devices:
            if tokens[0].rstrip(":") == "Legend" or len(labels) == n_gpu:
                break  # the legend, or text after every GPU row (NIC rows are optional)
            raise _fail(lineno, line, f"{tokens[0]!r} is not a device of the header ({', '.join(devices)})")
        device = tokens[0]
        if device in seen:
            raise _fail(lineno, line, f"{device} has a second row")
        seen.add(device)
        cells = tokens[1 : 1 + len(devices)]
        is_gpu = _GPU.fullmatch(device) is not None
        wanted = len(devices) + (len(extras) if is_gpu else 0)
        if len(tokens) - 1 != wanted and not (not is_gpu and len(tokens) - 1 >= len(devices)):
            raise _fail(
                lineno,
                line,
                f"{device} has {len(tokens) - 1} cells, expected {len(devices)} link cells"
                + (f" and {len(extras)} for {', '.join(extras)}" if is_gpu and extras else ""),
            )
        for column, cell in zip(devices, cells, strict=True):
            try:
                _, level = parse_link_label(cell)
            except ValueError as err:
                raise _fail(lineno, line, f"column {column}: {err}") from None
            if (column == device) != (level is LinkType.SELF):
                raise _fail(lineno, line, f"column {column} is {cell!r}; X belongs on the diagonal only")
        if not is_gpu:
            continue
        g = int(device[3:])
        labels[g] = cells[:n_gpu]
        row_line[g] = lineno
        for column, value in zip(extras, tokens[1 + len(devices) :], strict=True):
            if column == "CPU Affinity":
                cpus[g] = "" if value == "N/A" else value
            elif column == "NUMA Affinity":
                numa[g] = int(value) if value.isdigit() else -1
    missing = [f"GPU{g}" for g in range(n_gpu) if g not in labels]
    if missing:
        raise TopologyParseError(
            f"no row for {', '.join(missing)} (header on line {header_no} names {n_gpu} GPUs); "
            "expected the unchanged output of `nvidia-smi topo -m`"
        )
    matrix = [labels[g] for g in range(n_gpu)]
    for i in range(n_gpu):
        for j in range(i + 1, n_gpu):
            if matrix[i][j] != matrix[j][i]:
                raise TopologyParseError(
                    f"GPU{i}→GPU{j} is {matrix[i][j]} on line {row_line[i]} but GPU{j}→GPU{i} is "
                    f"{matrix[j][i]} on line {row_line[j]}; links are symmetric, so the input is damaged"
                )
    return build_topology(
        name,
        matrix,
        nvswitch=nvswitch,
        numa=numa,
        cpu_affinity=cpus,
        bandwidth=bandwidth,
        source="nvidia-smi topo -m",
    )


def read_topo_file(path: Path, *, bandwidth: BandwidthModel | None = None) -> Topology:
    """``parse_topo_matrix`` on a file, named after it. A file that is not a small text file (a folder,
    a FIFO or ``/dev/zero``, binary, past 1 MiB) is refused before it is read (``inputs.read_text``)."""
    try:
        text = read_text(path, "topology file", max_bytes=_MAX_FILE_BYTES)
    except InvalidInput as err:
        raise TopologyParseError(str(err)) from None
    try:
        return parse_topo_matrix(text, name=path.stem, bandwidth=bandwidth)
    except TopologyParseError as err:
        raise TopologyParseError(f"{path}: {err}") from None
