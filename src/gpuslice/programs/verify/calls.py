"""Rules on calls: a call goes to a named function, method, class or builtin the verifier can see, so
recursion cannot hide in higher-order calls. Each runs on one ``ast.Call``; ``scope`` is None at module
and class level."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.allowlists import FORBIDDEN_NAMES, GETATTR_LIKE, SAFE_BUILTINS
from gpuslice.programs.verify.context import FileContext, Scope
from gpuslice.programs.verify.names import attribute_name

__all__ = ["CALL_RULES", "callee_is_visible", "getattr_literal_name", "no_map_in_function", "plain_super"]


def no_map_in_function(ctx: FileContext, node: ast.Call, scope: Scope | None) -> None:
    """A Map is declared at module or class level, where the loader can see and carry it."""
    if scope is not None and ctx.is_map_call(node):
        ctx.flag(node, "a Map is declared at module or class level, where the loader can see and carry it")


def getattr_literal_name(ctx: FileContext, node: ast.Call, scope: Scope | None) -> None:
    """``getattr(x, "name")`` only with a literal, public name, checked like ``x.name``."""
    if not (isinstance(node.func, ast.Name) and node.func.id in GETATTR_LIKE):
        return
    name = node.func.id
    if len(node.args) < 2 or not (
        isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
    ):
        ctx.flag(node, f"{name}() with a computed attribute name: the verifier cannot see what it reads")
        return
    attr = node.args[1].value
    attribute_name(ctx, node, attr, None)
    if attr.startswith("_"):
        ctx.flag(node, f"{name}() of private attribute {attr!r}: a policy reads the public view only")


def plain_super(ctx: FileContext, node: ast.Call, scope: Scope | None) -> None:
    """``super()`` without arguments, so it can only mean the class being defined."""
    if isinstance(node.func, ast.Name) and node.func.id == "super" and (node.args or node.keywords):
        ctx.flag(node, "super() takes no arguments in a policy")


def callee_is_visible(ctx: FileContext, node: ast.Call, scope: Scope | None) -> None:
    """The callee is a name the file defines or imports, a builtin, or an attribute; never an argument,
    a variable holding a function, a lambda, or a value computed at run time."""
    func = node.func
    if isinstance(func, ast.Name):
        name = func.id
        if name in GETATTR_LIKE or (name == "super" and (node.args or node.keywords)):
            return  # getattr_literal_name and plain_super
        if scope is not None and name in scope.params:
            ctx.flag(
                node,
                f"calls argument {name!r}: calling a function passed in hides recursion from the verifier",
            )
        elif (
            name not in ctx.functions
            and name not in ctx.classes
            and name not in ctx.imported
            and name not in SAFE_BUILTINS
            and name not in FORBIDDEN_NAMES
            and name in ctx.bound
        ):
            ctx.flag(
                node, f"calls {name!r}, a function held in a variable: the verifier cannot see what it runs"
            )
    elif isinstance(func, ast.Lambda):
        ctx.flag(node, "calls a lambda directly: self-applied lambdas recurse without a name")
    elif not isinstance(func, ast.Attribute):
        ctx.flag(
            node,
            f"calls {ast.unparse(func)!r}, a function value computed at run time: the verifier cannot see "
            "what it runs",
        )


CALL_RULES = (no_map_in_function, getattr_literal_name, plain_super, callee_is_visible)
