"""A built-in policy as a policy file: its own module's source, with its gpuslice imports taken from the
policy API instead (``gpuslice policy export NAME``).

Each built-in is written once, in its module under ``policies/`` or ``memory/policies/``. A module that
defines one ops class and imports from gpuslice only names the policy API re-exports is already a valid
policy file except for where those names come from, so the file is derived from it rather than kept as
a second copy:

```text
policies/bestfit.py ── "from gpuslice.policies.base import X" -> "from gpuslice.programs.api import X"
                    ── "__all__ = [...]" dropped (a module-level dunder the verifier refuses)
                    ── verified like any file; a built-in the verifier refuses is not exportable
```

The tests load the exported files and check that they decide exactly as the built-ins, which is what
shows that verifying, loading and guarding a policy leaves its decisions alone.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Mapping

from gpuslice.errors import UnknownPolicy, UserError
from gpuslice.programs import api
from gpuslice.programs.verify import API_MODULE, check_source

__all__ = ["BuiltinNotExportable", "builtin_registries", "export_source", "exportable"]


class BuiltinNotExportable(UserError):
    """The built-in's module is not a valid policy file (it imports another policy, or holds two)."""


def builtin_registries() -> dict[str, Mapping[str, type]]:
    """The built-in policies a file can stand in for, by family (the policy file families)."""
    from gpuslice.memory.policies import EVICTION, PREFETCH  # the memory engine, only when asked
    from gpuslice.policies import PLACEMENT
    from gpuslice.policies.queue import QUEUE

    return {"placement": PLACEMENT, "queue": QUEUE, "eviction": EVICTION, "prefetch": PREFETCH}


def _find(name: str, family: str | None) -> tuple[str, type]:
    registries = builtin_registries()
    if family is not None:
        if family not in registries:
            raise UserError(f"{family!r} is not a policy family; known: {', '.join(registries)}")
        return family, registries[family][name]  # UnknownPolicy lists the family's names
    found = [(f, reg[name]) for f, reg in registries.items() if name in reg]
    if not found:
        known = ", ".join(sorted({n for reg in registries.values() for n in reg}))
        raise UnknownPolicy(f"{name!r} is not a built-in policy; known: {known}")
    if len(found) > 1:
        families = " or ".join(f for f, _ in found)
        raise UserError(f"{name!r} is a built-in {families} policy: say which with --family")
    return found[0]


def export_source(name: str, family: str | None = None) -> str:
    """The policy file for built-in ``name`` (``family`` when the name is in several families).

    UnknownPolicy for an unknown name; BuiltinNotExportable, with the verifier's reasons, for a built-in
    whose module is not a valid policy file."""
    family, cls = _find(name, family)
    source = inspect.getsource(sys.modules[cls.__module__])
    cannot = f"built-in {family} policy {name!r} cannot be written as a file"
    try:
        text = _point_imports_at_api(source, cls.__module__)
    except ValueError as err:
        raise BuiltinNotExportable(f"{cannot}: {err}") from None
    report = check_source(text, f"{name}.py")
    if not report.ok or report.family != family:
        reasons = "; ".join(v.message for v in report.violations[:3]) or f"it is a {report.family} policy"
        raise BuiltinNotExportable(f"{cannot}: {reasons}")
    return text


def exportable(family: str) -> list[str]:
    """The built-ins of ``family`` that ``export_source`` can write."""
    names = []
    for name in builtin_registries()[family]:
        try:
            export_source(name, family)
        except BuiltinNotExportable:
            continue
        names.append(name)
    return names


def _point_imports_at_api(source: str, module: str) -> str:
    """Every ``from gpuslice... import`` becomes one import from the API (where the first one was);
    ``__all__`` goes. ValueError when a gpuslice name is not in the API."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()  # line numbers, 1-based
    first_import = 0
    names: list[str] = []
    for node in ast.parse(source).body:
        span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuslice."):
            missing = [a.name for a in node.names if a.name not in api.__all__]
            if missing:
                raise ValueError(
                    f"{module} imports {', '.join(missing)} from {node.module}, which a policy file cannot "
                    f"import ({API_MODULE} has no such names)"
                )
            names += [a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names]
            first_import = first_import or node.lineno
            drop |= span
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            last = max(span)
            blank_after = last < len(lines) and not lines[last].strip()
            drop |= span | ({last + 1} if blank_after else set())
    out = []
    for number, line in enumerate(lines, start=1):
        if number == first_import:
            out.append(_import_line(names))
        if number not in drop:
            out.append(line)
    return re.sub(r"\n{4,}", "\n\n\n", "".join(out))


def _import_line(names: list[str]) -> str:
    """One import statement, names in isort's order (constants, classes, functions), wrapped at 110."""
    ordered = sorted(set(names), key=lambda n: (not n.isupper(), not n[:1].isupper(), n.lower()))
    line = f"from {API_MODULE} import {', '.join(ordered)}\n"
    if len(line) <= 111:
        return line
    return f"from {API_MODULE} import (\n" + "".join(f"    {n},\n" for n in ordered) + ")\n"
