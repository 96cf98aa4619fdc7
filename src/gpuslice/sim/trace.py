"""openb trace files: node and pod CSVs from Alibaba's cluster-trace-gpu-v2023.

Node CSV: ``sn,cpu_milli,memory_mib,gpu,model``. Pod CSV: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli``
then, except in the ``multigpu*`` files, ``gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time``. ``gpu_spec`` lists allowed models separated by "|". The default trace and the node list
ship inside the package; every other trace is read from a directory (``--trace-dir``).

MIG (not in openb; gpuslice's own optional columns): a node's ``mig_gpus`` is how many of its GPUs, the
first ones, are in MIG mode (its model needs a MIG table: A100, H100, H200); a pod's ``mig_profile``
asks for one MIG instance of that profile ("1g.10gb"), with ``num_gpu`` 1 (``gpu_milli`` is not read:
the profile says how much of the GPU it takes). Empty cells mean none.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpuslice.errors import GpusliceError, TraceFormatError, UnknownTrace, UserError
from gpuslice.hardware.node import NodeSpec
from gpuslice.inputs import file_kind
from gpuslice.units import MiB
from gpuslice.workload.request import MILLI_PER_GPU, Request
from gpuslice.workload.target import TargetWorkload

__all__ = [
    "BUNDLED_TRACES",
    "DEFAULT_TRACE",
    "NODE_FILE",
    "OPENB_TRACES",
    "POD_COLUMNS",
    "OpenbTrace",
    "PodReader",
    "TracePod",
    "bundled_dir",
    "check_mig_profiles",
    "csv_rows",
    "load_nodes",
    "load_pods",
    "load_target_workload",
    "load_trace",
    "trace_files",
]

NODE_FILE = "openb_node_list_gpu_node.csv"
# The openb trace `sim openb` replays when none is named: the one bundled with the package.
DEFAULT_TRACE = "default"
BUNDLED_TRACES = (DEFAULT_TRACE,)
# Every pod list of the openb data set (alibaba/clusterdata cluster-trace-gpu-v2023), as the FGD paper
# replays them; all but the default one are read from --trace-dir.
OPENB_TRACES = (
    "default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
    "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "multigpu20", "multigpu30",
    "multigpu40", "multigpu50",
)  # fmt: skip
_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
# How often (in rows) a long read tells its caller how far it is.
_PROGRESS_ROWS = 16_384


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    request: Request


@dataclass(frozen=True)
class OpenbTrace:
    """A named pod list and the node list it is replayed on."""

    name: str
    nodes: tuple[NodeSpec, ...]
    pods: tuple[TracePod, ...]

    @property
    def total_gpu_milli(self) -> int:
        """The capacity of the GPUs not in MIG mode (MIG-mode GPUs serve MIG instances only)."""
        return sum(n.gpu_count - n.mig_gpus for n in self.nodes) * MILLI_PER_GPU


def bundled_dir() -> Path:
    """Directory of the trace files shipped inside the package."""
    return Path(str(resources.files("gpuslice.data") / "openb"))


def csv_rows(
    path: Path,
    required: tuple[str, ...],
    missing: str = "header lacks column(s)",
    *,
    also: tuple[tuple[str, ...], str] | None = None,
    read: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of the CSV file at ``path``, whose header must have the ``required`` columns
    (TraceFormatError: "<path>: <missing> <the columns>"), then ``also``'s columns (with its own
    message). A folder or FIFO where the file should be, a file that is not UTF-8 text, a NUL byte or a
    field past the csv module's limit: TraceFormatError naming the file and the row, never a
    UnicodeDecodeError or a read that blocks. ``read`` is told the bytes read so far every few thousand
    rows (a million-pod trace takes tens of seconds)."""
    kind = file_kind(path)
    if kind != "file":
        raise TraceFormatError(f"{path} is {kind}, not a CSV file")
    try:
        raw = path.open("rb")
    except OSError as e:
        raise UnknownTrace(f"cannot read {path}: {e.strerror}") from None
    with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            for columns, message in ((required, missing), *([also] if also else [])):
                absent = [c for c in columns if c not in (reader.fieldnames or ())]
                if absent:
                    raise TraceFormatError(f"{path}: {message} {', '.join(absent)}")
            for row in reader:
                yield reader.line_num, row
                if read is not None and reader.line_num % _PROGRESS_ROWS == 0:
                    read(raw.tell())
        except UnicodeDecodeError as e:  # decoded a chunk at a time: no exact row to name
            raise TraceFormatError(
                f"{path}: not UTF-8 text ({e.reason}); save the trace as UTF-8 CSV"
            ) from None
        except csv.Error as e:
            raise TraceFormatError(f"{path}, row {reader.line_num}: not CSV ({e})") from None


def _int(path: Path, line: int, row: dict[str, str], column: str, empty: int | None = None) -> int:
    text = row.get(column)
    if empty is not None and not (text or "").strip():
        return empty
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceFormatError(f"{path}, row {line}: {column} is {text!r}, expected an integer") from None


def load_nodes(path: Path) -> tuple[NodeSpec, ...]:
    nodes = []
    for line, row in csv_rows(path, _NODE_COLUMNS):
        try:
            nodes.append(
                NodeSpec(
                    name=row["sn"],
                    cpu_milli=_int(path, line, row, "cpu_milli"),
                    memory_bytes=_int(path, line, row, "memory_mib") * MiB,
                    gpu_count=_int(path, line, row, "gpu"),
                    gpu_model=row["model"] or "",
                    mig_gpus=_int(path, line, row, "mig_gpus", empty=0),
                )
            )
        except TraceFormatError:
            raise
        except GpusliceError as e:
            raise TraceFormatError(f"{path}, row {line}: {e}") from None
    if not nodes:
        raise TraceFormatError(f"{path}: no nodes")
    return tuple(nodes)


class PodReader:
    """A pod CSV's rows as TracePods. Equal resource cells give one shared Request (it is frozen): a
    trace of a million pods holds a few thousand requests, each parsed and checked once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._requests: dict[tuple[str | None, ...], Request] = {}

    def pod(self, line: int, row: dict[str, str]) -> TracePod:
        key = tuple(row.get(c) for c in _REQUEST_CELLS)
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = self._request(line, row)
        return TracePod(name=row["name"], request=request)

    @property
    def requests(self) -> Iterable[Request]:
        """Every distinct request read so far."""
        return self._requests.values()

    def _request(self, line: int, row: dict[str, str]) -> Request:
        path = self.path
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if num_gpu > 0 and gpu_milli > MILLI_PER_GPU:
            gpu_milli = MILLI_PER_GPU  # the artifact's pod_csv_to_yaml.py caps a GPU at 1000 milli
        spec = row.get("gpu_spec") or ""
        mig = (row.get("mig_profile") or "").strip()
        if mig and num_gpu != 1:
            raise TraceFormatError(
                f"{path}, row {line}: a MIG pod ({mig}) uses one GPU's instance: "
                f"num_gpu must be 1, not {num_gpu}"
            )
        try:
            return Request(
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_bytes=_int(path, line, row, "memory_mib") * MiB,
                num_gpu=0 if mig else num_gpu,
                gpu_milli=0 if mig else gpu_milli,
                gpu_models=tuple(m for m in spec.split("|") if m),
                mig_profile=mig,
            )
        except GpusliceError as e:
            raise TraceFormatError(f"{path}, row {line}: {e}") from None


# The cells a pod's Request is made of (PodReader shares one Request among rows equal in these).
_REQUEST_CELLS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "mig_profile")


def load_pods(path: Path) -> tuple[TracePod, ...]:
    reader = PodReader(path)
    pods = tuple(reader.pod(line, row) for line, row in csv_rows(path, POD_COLUMNS))
    if not pods:
        raise TraceFormatError(f"{path}: no pods")
    return pods


def load_trace(name: str = DEFAULT_TRACE, trace_dir: Path | None = None) -> OpenbTrace:
    """Trace ``name`` (``openb_pod_list_NAME.csv``) with the GPU node list, from ``trace_dir`` or the
    bundled copy. UnknownTrace names what exists when the file is missing."""
    pod_path, node_path = trace_files(name, trace_dir)
    nodes = load_nodes(node_path)
    pods = load_pods(pod_path)
    check_mig_profiles(nodes, (p.request for p in pods), pod_path)
    return OpenbTrace(name=name, nodes=nodes, pods=pods)


def trace_files(name: str, trace_dir: Path | None) -> tuple[Path, Path]:
    """The pod CSV and the node list of trace ``name``, checked to be regular files (UnknownTrace names
    the traces that exist when the pod CSV is missing)."""
    directory = Path(trace_dir) if trace_dir is not None else bundled_dir()
    pod_path = directory / f"openb_pod_list_{name}.csv"
    kind = file_kind(pod_path)
    if kind == "missing":
        known = sorted(
            p.name[len("openb_pod_list_") : -4]
            for p in directory.glob("openb_pod_list_*.csv")
            if file_kind(p) == "file"
        )
        hint = f"; known here: {', '.join(known)}" if known else ""
        where = "the bundled data (use --trace-dir for the other traces)" if trace_dir is None else directory
        raise UnknownTrace(f"no trace {name!r} in {where}{hint}")
    if kind != "file":
        raise UnknownTrace(f"trace {name!r}: {pod_path} is {kind}, not a CSV file")
    node_path = directory / NODE_FILE
    kind = file_kind(node_path)
    if kind != "file":
        have = "has no node list" if kind == "missing" else f"has {kind} where the node list should be:"
        raise UnknownTrace(f"{directory} {have} {NODE_FILE}")
    return pod_path, node_path


def check_mig_profiles(nodes: tuple[NodeSpec, ...], requests: Iterable[Request], pod_path: Path) -> None:
    """A MIG pod whose profile no MIG-mode GPU of the node list offers could never run: say so at load."""
    asked = sorted({r.mig_profile for r in requests if r.mig_profile})
    if not asked:
        return
    tables = {n.mig_geometry.key: n.mig_geometry for n in nodes if n.mig_geometry is not None}
    for profile in asked:
        if not any(table.named(profile) is not None for table in tables.values()):
            have = f"their MIG tables: {', '.join(sorted(tables))}" if tables else "no node has mig_gpus"
            raise TraceFormatError(  # by name, as the placer matches it: "1g.10gb", not its ID
                f"{pod_path}: no MIG-mode GPU of the node list offers MIG profile {profile!r} ({have})"
            )


def load_target_workload(path: Path, option: str = "--target-workload") -> TargetWorkload:
    """The GPU part of a pod list in openb's format: the workload FGD-style policies keep room for (the
    same file serve and the Kubernetes extender take). UserError when no pod in it asks for a GPU."""
    try:
        return TargetWorkload.gpu_part(p.request for p in load_pods(path))
    except ValueError:  # parsed, but not one pod asks for a GPU
        raise UserError(f"{option} {path}: no pod in it asks for a GPU") from None
