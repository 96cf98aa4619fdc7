"""Rules on classes: what a class may extend and hold, and the one ops class a file defines (which also
gives the policy's family). ``class_bases`` says whether a class is an ops class; the driver walks the
bodies and calls ``class_member`` on each statement of one."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.allowlists import (
    API_MODULE,
    HELPER_DUNDERS,
    MEMORY_KINDS,
    METHOD_DECORATORS,
    OPS_BASES,
    OPS_DUNDERS,
)
from gpuslice.programs.verify.context import FileContext, is_docstring

__all__ = [
    "CLASS_RULES",
    "class_bases",
    "class_decorators",
    "class_member",
    "method_decorators",
    "no_class_keywords",
    "one_ops_class",
]


def class_bases(ctx: FileContext, cls: ast.ClassDef) -> bool:
    """A class extends only an API ops base or a class of this file. True when it is an ops class."""
    ops = False
    for base in cls.bases:
        qualified = ctx.qualified(base)
        if (
            qualified is not None
            and qualified.startswith(API_MODULE + ".")
            and qualified.rsplit(".", 1)[1] in OPS_BASES
        ):
            ops = True
        elif isinstance(base, ast.Name) and base.id in ctx.classes:
            ops = ops or any(ctx.is_ops_base(b) for b in ctx.classes[base.id].bases)
        else:
            ctx.flag(
                cls,
                f"class {cls.name} extends {ast.unparse(base)!r}: a class may extend only an ops base from "
                f"{API_MODULE} or a class of this file",
            )
    return ops


def no_class_keywords(ctx: FileContext, cls: ast.ClassDef) -> None:
    """No metaclass or class keywords: code the mechanism would run outside a guarded hook."""
    if cls.keywords:
        ctx.flag(
            cls,
            f"class {cls.name} passes {ast.unparse(cls.keywords[0])!r}: metaclasses and class keywords are "
            "not allowed",
        )


def class_decorators(ctx: FileContext, cls: ast.ClassDef) -> None:
    """Only ``@dataclass``, with literal keyword arguments."""
    for deco in cls.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ctx.qualified(target) != "dataclasses.dataclass":
            ctx.flag(deco, f"class decorator {ast.unparse(deco)!r} is not allowed: only @dataclass")
        elif isinstance(deco, ast.Call) and (
            deco.args or not all(isinstance(k.value, ast.Constant) for k in deco.keywords)
        ):
            ctx.flag(deco, "@dataclass(...) takes literal keyword arguments only")


CLASS_RULES = (no_class_keywords, class_decorators)


def class_member(ctx: FileContext, cls: ast.ClassDef, stmt: ast.stmt, ops: bool) -> None:
    """A class body holds a docstring, constants, Map declarations and methods; the only dunder methods
    are ``__init__`` (ops class) and ``__init__``, ``__post_init__`` and comparisons (helper classes)."""
    if is_docstring(stmt) or isinstance(stmt, ast.Pass | ast.Assign | ast.AnnAssign):
        return
    if isinstance(stmt, ast.FunctionDef):
        allowed = OPS_DUNDERS if ops else HELPER_DUNDERS
        if stmt.name.startswith("__") and stmt.name not in allowed:
            why = " (the mechanism would call it outside a guarded hook)" if ops else ""
            ctx.flag(
                stmt,
                f"method {stmt.name} is not allowed in class {cls.name}{why}; allowed dunder methods: "
                f"{', '.join(sorted(allowed))}",
            )
    elif isinstance(stmt, ast.AsyncFunctionDef):
        ctx.flag(stmt, "async methods are not allowed: a hook runs to completion synchronously")
    else:
        ctx.flag(
            stmt,
            f"class {cls.name}'s body may hold only a docstring, constants, Map declarations and methods",
        )


def method_decorators(ctx: FileContext, fn: ast.FunctionDef) -> None:
    """Functions and methods take only ``staticmethod``, ``classmethod`` and ``property``."""
    for deco in fn.decorator_list:
        if not (isinstance(deco, ast.Name) and deco.id in METHOD_DECORATORS):
            ctx.flag(
                deco,
                f"decorator {ast.unparse(deco)!r} is not allowed: only staticmethod, classmethod and "
                "property",
            )


def one_ops_class(ctx: FileContext) -> None:
    """Exactly one ops class per file; a memory policy says which half it is (``kind``). Sets the
    report's class name and family."""
    found = ctx.ops_classes
    if not found:
        ctx.flag(
            1,
            "the file defines no ops class: exactly one class must extend PlacementOps, QueueOps or "
            f"MemoryOps from {API_MODULE}",
        )
        return
    if len(found) > 1:
        for extra in found[1:]:
            ctx.flag(
                extra,
                f"class {extra.name} is a second ops class (the first is {found[0].name} on line "
                f"{found[0].lineno}); a file holds exactly one",
            )
        return
    cls = found[0]
    ctx.report.class_name = cls.name
    base = next(ctx.qualified(b) for b in cls.bases if ctx.is_ops_base(b))
    kind_name = (base or "").rsplit(".", 1)[-1]
    if kind_name == "PlacementOps":
        ctx.report.family = "placement"
    elif kind_name == "QueueOps":
        ctx.report.family = "queue"
    elif kind_name == "MemoryOps":
        kind = _memory_kind(cls)
        if kind not in MEMORY_KINDS:
            ctx.flag(
                cls,
                f'memory policy {cls.name} must say which half it implements: kind = "evict" or kind = '
                '"prefetch"',
            )
        else:
            ctx.report.family = MEMORY_KINDS[kind]
    else:
        ctx.flag(cls, f"class {cls.name} must extend PlacementOps, QueueOps or MemoryOps directly")


def _memory_kind(cls: ast.ClassDef) -> object:
    kind = None
    for stmt in cls.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "kind" for t in stmt.targets)
            and isinstance(stmt.value, ast.Constant)
        ):
            kind = stmt.value.value
    return kind
