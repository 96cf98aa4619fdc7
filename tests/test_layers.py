"""The layers of DESIGN.md, checked on the source: every import in src/gpuslice points down.

```text
rank 6  cli, server, k8s, sim     entry points
rank 5  node, observe, shim       the real machine; metrics (shim: the preloaded library the node uses)
rank 4  programs                  policy files
rank 3  scheduler                 and, beside it, memory and estimate (which use only rank 0)
        gpuslice                  the package root, which re-exports up to the scheduler
rank 2  policies
rank 1  ledger
rank 0  hardware, workload, units, inputs, errors, data
```

Every ``import`` and ``from … import`` counts wherever it is written: at module level, inside a
function (a lazy import), or under ``if TYPE_CHECKING``. A module's layer is its top-level package
under ``gpuslice`` (``gpuslice.policies.queue.fifo`` is in ``policies``). An import is allowed when it
stays in its package or points to a lower rank; imports between packages of the same rank are allowed
unless they close a cycle, and no two packages may import each other, directly or around a loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "gpuslice"

RANK: dict[str, int] = {
    "errors": 0,
    "registry": 0,  # name -> class for every policy family
    "advice": 0,  # the one advice check and fallback rule
    "units": 0,
    "inputs": 0,  # bounded numbers, text files and output folders at the edge
    "hardware": 0,
    "workload": 0,
    "data": 0,
    "ledger": 1,
    "policies": 2,
    "scheduler": 3,
    "memory": 3,
    "estimate": 3,
    PACKAGE: 3,  # the root module: re-exports errors, hardware, ledger, policies, scheduler, units, workload
    "programs": 4,
    "node": 5,
    "observe": 5,
    "shim": 5,
    "cli": 6,
    "server": 6,
    "k8s": 6,
    "sim": 6,
}
BOTTOM = frozenset(layer for layer, rank in RANK.items() if rank == 0)
# Beside the scheduler, sharing only the bottom layer (DESIGN.md).
BESIDE_SCHEDULER = frozenset({"memory", "estimate"})
ENTRY_POINTS = frozenset({"cli", "server", "k8s", "sim"})


class Edge(NamedTuple):
    """One import: the file it is written in, the importing module, and the module it names."""

    path: str
    importer: str
    imported: str


def layer(module: str) -> str:
    """``gpuslice.policies.queue.fifo`` -> ``policies``; ``gpuslice`` -> ``gpuslice``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _module_name(path: Path) -> tuple[str, bool]:
    relative = path.relative_to(SRC).with_suffix("")
    parts = list(relative.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _is_module(name: str) -> bool:
    base = SRC.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> Iterator[Edge]:
    """Every gpuslice module ``path`` imports, wherever in the file the import is written."""
    module, is_package = _module_name(path)
    here = module if is_package else module.rpartition(".")[0]
    shown = str(path.relative_to(SRC.parent))
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=shown)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield Edge(shown, module, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield Edge(shown, module, sub if _is_module(sub) else base)


def source_edges() -> list[Edge]:
    return [edge for path in sorted((SRC / PACKAGE).rglob("*.py")) for edge in imports_of(path)]


def violations(edges: Iterable[Edge]) -> list[str]:
    """One line per import that points up the layers or breaks a named rule of DESIGN.md."""
    found = []
    for path, importer, imported in edges:
        src, dst = layer(importer), layer(imported)
        if src == dst:
            continue
        if src not in RANK or dst not in RANK:
            found.append(f"{path}: {importer} imports {imported}: package {src or dst} has no layer in RANK")
            continue
        if RANK[dst] > RANK[src]:
            found.append(
                f"{path}: {importer} imports {imported}, which is above it ({src}: rank {RANK[src]}, "
                f"{dst}: rank {RANK[dst]})"
            )
        elif src in BESIDE_SCHEDULER and dst not in BOTTOM:
            found.append(
                f"{path}: {importer} imports {imported}; {src} sits beside the scheduler and may import only "
                f"the bottom layer ({', '.join(sorted(BOTTOM))})"
            )
        elif dst in BESIDE_SCHEDULER and RANK[src] <= RANK[dst] and src != PACKAGE:
            found.append(f"{path}: {importer} imports {imported}; {dst} is beside {src}, not below it")
    return found


def package_graph(edges: Iterable[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for _, importer, imported in edges:
        src, dst = layer(importer), layer(imported)
        graph.setdefault(src, set())
        graph.setdefault(dst, set())
        if src != dst:
            graph[src].add(dst)
    return graph


def package_cycles(edges: Iterable[Edge]) -> list[list[str]]:
    """Groups of packages that import each other, directly or around a loop (Tarjan's SCC)."""
    graph = package_graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _edges_between(edges: Iterable[Edge], group: list[str]) -> list[str]:
    members = set(group)
    return sorted(
        f"{e.path}: {e.importer} imports {e.imported}"
        for e in edges
        if layer(e.importer) in members
        and layer(e.imported) in members
        and layer(e.importer) != layer(e.imported)
    )


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return source_edges()


# -- the checker itself ------------------------------------------------------------------------------------


def test_checker_finds_lazy_imports() -> None:
    found = {e.imported for e in imports_of(SRC / PACKAGE / "cli" / "serve.py")}
    assert "gpuslice.server.run" in found  # imported inside serve(), not at module level
    assert len(source_edges()) > 500


def test_an_upward_import_is_reported_with_file_and_module() -> None:
    fake = Edge("src/gpuslice/scheduler/placer.py", "gpuslice.scheduler.placer", "gpuslice.node.machine")
    [message] = violations([fake])
    assert "src/gpuslice/scheduler/placer.py" in message
    assert "gpuslice.node.machine" in message
    assert "above it" in message


def test_memory_importing_the_scheduler_is_reported() -> None:
    fake = Edge("src/gpuslice/memory/uvm.py", "gpuslice.memory.uvm", "gpuslice.scheduler.placer")
    [message] = violations([fake])
    assert "beside the scheduler" in message


def test_a_downward_import_is_not_reported() -> None:
    assert violations([Edge("x.py", "gpuslice.server.daemon", "gpuslice.scheduler.node_scheduler")]) == []


def test_a_cycle_between_packages_is_reported() -> None:
    fake = [
        Edge("a.py", "gpuslice.node.mig_manager", "gpuslice.observe.health"),
        Edge("b.py", "gpuslice.observe.health", "gpuslice.node.telemetry"),
        Edge("c.py", "gpuslice.server.app", "gpuslice.node.launcher"),
    ]
    assert package_cycles(fake) == [["node", "observe"]]


# -- the source ------------------------------------------------------------------------------------------


def test_every_package_has_a_layer(edges: list[Edge]) -> None:
    packages = {p.name for p in (SRC / PACKAGE).iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (SRC / PACKAGE).glob("*.py") if p.stem != "__init__"}
    assert packages | modules <= set(RANK), sorted((packages | modules) - set(RANK))


def test_no_import_points_up_the_layers(edges: list[Edge]) -> None:
    found = violations(edges)
    assert not found, "imports against DESIGN.md's layers:\n" + "\n".join(found)


def test_no_import_cycle_between_packages(edges: list[Edge]) -> None:
    cycles = package_cycles(edges)
    detail = "\n".join(f"{' <-> '.join(g)}:\n  " + "\n  ".join(_edges_between(edges, g)) for g in cycles)
    assert not cycles, "packages that import each other:\n" + detail


@pytest.mark.parametrize(
    ("importers", "forbidden"),
    [
        ({"errors", "units", "hardware", "workload", "data", "ledger", "policies"}, ENTRY_POINTS | {"node"}),
        ({"scheduler"}, ENTRY_POINTS | {"node"}),
        ({"node"}, {"server", "k8s"}),
    ],
    ids=["below-scheduler", "scheduler", "node"],
)
def test_named_rules_of_design(edges: list[Edge], importers: set[str], forbidden: set[str]) -> None:
    found = [
        f"{e.path}: {e.importer} imports {e.imported}"
        for e in edges
        if layer(e.importer) in importers and layer(e.imported) in forbidden
    ]
    assert not found, "\n".join(found)
