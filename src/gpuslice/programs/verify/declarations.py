"""Rules on module- and class-level assignments: plain names, no dunders, and only constants or ``Map``
declarations, so no state hides outside the maps the loader can see and carry over a hot swap."""

from __future__ import annotations

import ast

from gpuslice.programs.maps import MAP_TYPES, MapSpec
from gpuslice.programs.verify.context import FileContext

__all__ = ["declared_names", "map_declaration", "map_spec", "record_constant"]

MAX_MAP_ENTRIES = 1 << 24


def declared_names(ctx: FileContext, stmt: ast.Assign | ast.AnnAssign, where: str) -> list[str] | None:
    """The names an assignment declares; None (flagged) if a target is not a plain, non-dunder name."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    names: list[str] = []
    for target in targets:
        for elt in target.elts if isinstance(target, ast.Tuple) else [target]:
            if not isinstance(elt, ast.Name):
                ctx.flag(
                    stmt,
                    f"{where}-level assignment to {ast.unparse(elt)!r}: only plain names may be declared",
                )
                return None
            if elt.id.startswith("__"):
                ctx.flag(
                    stmt,
                    f"{where}-level name {elt.id!r} is a dunder, which changes how Python treats the {where}",
                )
                return None
            names.append(elt.id)
    return names


def map_declaration(ctx: FileContext, stmt: ast.Assign | ast.AnnAssign, names: list[str]) -> None:
    """``NAME = Map(key=..., value=..., max_entries=...)``: one map per assignment, each name once."""
    single = len(names) == 1 and not (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple))
    if not single:
        ctx.flag(stmt, "declare one Map per assignment: NAME = Map(key=..., value=..., max_entries=...)")
        return
    assert isinstance(stmt.value, ast.Call)  # is_map_call said so
    spec = map_spec(ctx, stmt.value)
    if spec is not None:
        if names[0] in ctx.report.maps:
            ctx.flag(stmt, f"map {names[0]!r} is declared twice")
        ctx.report.maps[names[0]] = spec


def map_spec(ctx: FileContext, call: ast.Call) -> MapSpec | None:
    """key= and value= among int, float, str, bool; max_entries= a literal int (or int constant) in range."""
    roles = ("key", "value", "max_entries")
    given: dict[str, ast.expr] = dict(zip(roles, call.args, strict=False))
    for kw in call.keywords:
        if kw.arg in roles and kw.arg not in given:
            given[kw.arg] = kw.value
        else:
            ctx.flag(call, f"Map takes key=, value= and max_entries= once each, not {kw.arg!r}")
            return None
    if len(call.args) > 3 or set(given) != set(roles):
        ctx.flag(
            call,
            "a Map declares all of key=, value= and max_entries=, e.g. Map(key=int, value=float, "
            "max_entries=4096)",
        )
        return None
    types = []
    for role in ("key", "value"):
        node = given[role]
        if not (isinstance(node, ast.Name) and node.id in MAP_TYPES):
            ctx.flag(call, f"Map {role}= must be int, float, str or bool, not {ast.unparse(node)!r}")
            return None
        types.append(MAP_TYPES[node.id])
    size = given["max_entries"]
    value = size.value if isinstance(size, ast.Constant) else ctx.constants.get(getattr(size, "id", ""))
    if type(value) is not int or not 1 <= value <= MAX_MAP_ENTRIES:
        ctx.flag(
            call,
            f"Map max_entries= must be a literal int from 1 to {MAX_MAP_ENTRIES}, not {ast.unparse(size)!r}",
        )
        return None
    return MapSpec(types[0], types[1], value)


def record_constant(ctx: FileContext, stmt: ast.Assign | ast.AnnAssign, names: list[str], where: str) -> bool:
    """Anything else declared is a constant (numbers, strings, tuples, frozensets); module constants are
    remembered (a literal int may size a Map). False (flagged) when the value is not a constant."""
    assert stmt.value is not None
    if not ctx.is_constant(stmt.value):
        ctx.flag(
            stmt,
            f"{where}-level {', '.join(names)} is not a constant: state kept between calls must be a "
            "declared Map; constants are numbers, strings, tuples and frozensets",
        )
        return False
    if where == "module":
        literal = stmt.value.value if isinstance(stmt.value, ast.Constant) else None
        for name in names:
            ctx.constants[name] = literal
    return True
