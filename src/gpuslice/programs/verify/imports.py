"""Import rules: only the allow-list, by name, absolute, no ``*`` (no file, network, process or environment
access). An import's names are recorded in ``ctx.imported`` even when refused, so a refused module is
reported once, at its import, not again where it is used."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.allowlists import ALLOWED_IMPORTS, API_MODULE
from gpuslice.programs.verify.context import FileContext
from gpuslice.programs.verify.names import attribute_name

__all__ = ["check_import", "import_from", "import_module"]


def check_import(ctx: FileContext, stmt: ast.Import | ast.ImportFrom) -> None:
    """``import m`` or ``from m import n``, at any level of the file."""
    if isinstance(stmt, ast.Import):
        import_module(ctx, stmt)
    else:
        import_from(ctx, stmt)


def import_module(ctx: FileContext, stmt: ast.Import) -> None:
    """``import m``: m is allowed whole (math, numpy, ...); a package is bound under an ``as`` name."""
    for alias in stmt.names:
        allowed = ALLOWED_IMPORTS.get(alias.name, frozenset())
        if alias.name not in ALLOWED_IMPORTS:
            ctx.flag(stmt, not_allowed_message(alias.name))
            ctx.imported[alias.asname or alias.name.split(".")[0]] = alias.name  # reported once
        elif allowed is not None and alias.name != API_MODULE:
            ctx.flag(
                stmt,
                f"import names from {alias.name} one by one: 'from {alias.name} import "
                f"{', '.join(sorted(allowed))}' (only these)",
            )
        elif "." in alias.name and alias.asname is None:
            ctx.flag(
                stmt, f"'import {alias.name}' binds the whole package; write 'import {alias.name} as ...'"
            )
        else:
            ctx.imported[alias.asname or alias.name] = alias.name


def import_from(ctx: FileContext, stmt: ast.ImportFrom) -> None:
    """``from m import n``: absolute, m on the allow-list, n one of m's allowed names, never ``*``."""
    module = stmt.module or ""
    if stmt.level:
        ctx.flag(stmt, "relative imports are not allowed: a policy file is not part of a package")
        return
    if module not in ALLOWED_IMPORTS:
        ctx.flag(stmt, not_allowed_message(module))
        for alias in stmt.names:  # its names are reported once, here, not again where they are used
            ctx.imported[alias.asname or alias.name] = f"{module}.{alias.name}"
        return
    allowed = ALLOWED_IMPORTS[module]
    for alias in stmt.names:
        if alias.name == "*":
            ctx.flag(stmt, f"'from {module} import *' hides which names the policy uses; import them by name")
        elif allowed is not None and alias.name not in allowed:
            ctx.flag(
                stmt,
                f"{alias.name!r} may not be imported from {module}; allowed: {', '.join(sorted(allowed))}",
            )
        elif module != "__future__":
            attribute_name(ctx, stmt, alias.name, f"{module}.{alias.name}")
            ctx.imported[alias.asname or alias.name] = f"{module}.{alias.name}"


def not_allowed_message(module: str) -> str:
    shown = sorted(m for m in ALLOWED_IMPORTS if m != "__future__")
    return (
        f"import of {module!r} is not allowed: a policy may import only {', '.join(shown)} "
        "(no file, network, process or environment access)"
    )
