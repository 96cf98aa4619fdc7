"""No recursion, direct or mutual, on the call graph of the file's functions and methods.

The driver records an edge for every call it can attribute (by name, ``self.m``, ``cls.m``, ``C.m``,
``super().m``; a method name is matched in every class of the file, conservatively, without type
inference); ``no_recursion`` then looks for cycles once the whole file has been read."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.context import FileContext, Key, Scope

__all__ = ["no_recursion", "record_attribute_call", "record_name_call"]


def record_name_call(ctx: FileContext, node: ast.Name, scope: Scope | None) -> None:
    """A module function or a class (its ``__init__``/``__post_init__``) named inside a function."""
    if scope is None or not isinstance(node.ctx, ast.Load):
        return
    if node.id in ctx.functions:
        ctx.edges.append((scope.key, ("", node.id), node.lineno))
    elif node.id in ctx.classes:
        for init in ("__init__", "__post_init__"):
            ctx.edges.append((scope.key, (node.id, init), node.lineno))


def record_attribute_call(ctx: FileContext, node: ast.Attribute, scope: Scope | None) -> None:
    """A method reached through ``self``, ``cls``, a class of the file, or ``super()``."""
    if scope is None:
        return
    attr = node.attr
    receiver = node.value.id if isinstance(node.value, ast.Name) else None
    if receiver in ("self", "cls") or receiver in ctx.classes:
        for cls_name, cls in ctx.classes.items():
            if any(isinstance(s, ast.FunctionDef) and s.name == attr for s in cls.body):
                ctx.edges.append((scope.key, (cls_name, attr), node.lineno))
    is_super = (
        isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "super"
    )
    if is_super and scope.owner in ctx.classes:
        for base in ctx.classes[scope.owner].bases:
            if isinstance(base, ast.Name) and base.id in ctx.classes:
                ctx.edges.append((scope.key, (base.id, attr), node.lineno))


def no_recursion(ctx: FileContext) -> None:
    """Every cycle of the recorded call graph is reported once, at the call that closes it."""
    graph: dict[Key, list[tuple[Key, int]]] = {}
    defined = {("", f) for f in ctx.functions}
    for cls_name, cls in ctx.classes.items():
        defined.update((cls_name, s.name) for s in cls.body if isinstance(s, ast.FunctionDef))
    for src, dst, line in ctx.edges:
        if dst in defined:
            graph.setdefault(src, []).append((dst, line))
    state: dict[Key, int] = {}  # 1 on the stack, 2 done
    stack: list[Key] = []
    reported: set[frozenset[Key]] = set()

    def visit(node: Key) -> None:  # depth ≤ number of functions in one file
        state[node] = 1
        stack.append(node)
        for nxt, line in graph.get(node, []):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :]
                members = frozenset(cycle)
                if members not in reported:
                    reported.add(members)
                    path = " → ".join(_label(k) for k in (*cycle, nxt))
                    kind = "recursion" if len(cycle) == 1 else "mutual recursion"
                    ctx.flag(line, f"{kind} {path}: a hook must finish in a bounded number of steps")
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def _label(key: Key) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]
