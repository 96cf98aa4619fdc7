"""Rules on names and attributes: what a policy may reach. Each runs on one ``ast.Name`` or
``ast.Attribute`` (or an attribute named in an import or a literal ``getattr``)."""

from __future__ import annotations

import ast

from gpuslice.programs import api
from gpuslice.programs.verify.allowlists import (
    API_MODULE,
    FILE_ATTRS,
    FORBIDDEN_NAMES,
    FRAME_ATTRS,
    GETATTR_LIKE,
    SAFE_BUILTINS,
    STATE_ATTRS,
)
from gpuslice.programs.verify.context import FileContext

__all__ = ["attribute_access", "attribute_name", "defined_name", "getattr_only_called"]


def getattr_only_called(ctx: FileContext, node: ast.Name, called: set[int]) -> None:
    """``getattr``, ``hasattr`` and ``super`` are checked where they are called, so they are never values."""
    if node.id in (*GETATTR_LIKE, "super") and id(node) not in called and node.id not in ctx.imported:
        ctx.flag(
            node, f"passes {node.id!r} around as a value: the verifier checks it only where it is called"
        )


def defined_name(ctx: FileContext, node: ast.Name) -> None:
    """A name read is the file's own, an import, or a safe builtin; never a forbidden builtin or a dunder."""
    name = node.id
    if not isinstance(node.ctx, ast.Load):
        return
    if name in FORBIDDEN_NAMES and name not in ctx.imported:
        ctx.flag(node, f"uses {name!r}: {FORBIDDEN_NAMES[name]}")
    elif name.startswith("__"):
        ctx.flag(node, f"uses {name!r}: dunder names reach the interpreter's internals")
    elif name not in ctx.bound and name not in SAFE_BUILTINS:
        ctx.flag(
            node,
            f"name {name!r} is not defined: a policy may use only its imports, its own definitions and safe "
            "builtins",
        )


def attribute_access(ctx: FileContext, node: ast.Attribute) -> None:
    """``x.attr``: no dunder (except ``super().__init__``), no private attribute of another object."""
    attr = node.attr
    if attr.startswith("__"):
        if (
            isinstance(node.value, ast.Call)
            and _is_super(node.value)
            and attr in ("__init__", "__post_init__")
        ):
            return
        ctx.flag(node, f"reads {ast.unparse(node)!r}: dunder attributes reach the interpreter's internals")
        return
    root = node.value
    if attr.startswith("_") and not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
        ctx.flag(node, f"reads private attribute {ast.unparse(node)!r}: a policy reads the public view only")
        return
    attribute_name(ctx, node, attr, ctx.qualified(node))


def attribute_name(ctx: FileContext, node: ast.AST, attr: str, qualified: str | None) -> None:
    """Rules on an attribute name, wherever it is read (``x.attr``, ``getattr(x, "attr")``, imports)."""
    if attr.startswith("__"):
        ctx.flag(node, f"{attr!r} is a dunder attribute, which reaches the interpreter's internals")
    elif attr in FRAME_ATTRS:
        ctx.flag(node, f"{attr!r} reaches interpreter frames or code objects, and through them every module")
    elif attr in FILE_ATTRS:
        ctx.flag(node, f"{attr!r} reads or writes files, unpickles, or loads native code")
    elif attr in STATE_ATTRS:
        what = (
            "reads attributes named inside a string"
            if attr.startswith("format")
            else ("changes process-wide or read-only state (views are read-only by their flags)")
        )
        ctx.flag(node, f"{attr!r} {what}")
    elif qualified is not None and qualified.startswith(API_MODULE + "."):
        name = qualified[len(API_MODULE) + 1 :].split(".")[0]
        if name not in api.__all__:
            ctx.flag(node, f"{name!r} is not part of {API_MODULE}")


def _is_super(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == "super"
