"""Rules on expressions other than names, attributes and calls: lambdas, generators, ``await``,
comprehensions that grow what they walk, and ``:=`` on an argument. Each runs on one node; ``scope`` is
None at module and class level; ``lambda_args`` holds the ids of lambdas passed straight to a call."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.allowlists import GROWERS
from gpuslice.programs.verify.context import FileContext, Scope, load_copy

__all__ = [
    "constant_defaults",
    "lambda_only_as_argument",
    "no_await",
    "no_comprehension_growth",
    "no_rebound_argument",
    "no_yield",
]

Comprehension = ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp


def constant_defaults(ctx: FileContext, fn: ast.FunctionDef | ast.Lambda) -> None:
    """Default arguments are constants: a mutable default is state shared between calls."""
    for default in (*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)):
        if not ctx.is_constant(default):
            ctx.flag(
                default,
                f"default argument {ast.unparse(default)!r} is not a constant: a mutable default is state "
                "shared between calls",
            )


def lambda_only_as_argument(ctx: FileContext, node: ast.Lambda, lambda_args: set[int]) -> None:
    """A lambda only as an argument of a call (a sort key), never stored: stored, it can recurse unnamed."""
    constant_defaults(ctx, node)
    if id(node) not in lambda_args:
        ctx.flag(node, "a lambda may only be passed straight to a call (a sort key); define a method instead")


def no_yield(ctx: FileContext, node: ast.Yield | ast.YieldFrom) -> None:
    ctx.flag(node, "yield makes a generator, which may never end and is not an answer a hook may return")


def no_await(ctx: FileContext, node: ast.Await) -> None:
    ctx.flag(node, "await is not allowed: a hook runs to completion synchronously")


def no_comprehension_growth(ctx: FileContext, comp: Comprehension) -> None:
    """A comprehension may not append to the list (set, dict) it iterates over."""
    walked = {ast.dump(g.iter) for g in comp.generators if isinstance(g.iter, ast.Name | ast.Attribute)}
    for node in ast.walk(comp):
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in GROWERS
        ) and ast.dump(load_copy(node.func.value)) in walked:
            ctx.flag(
                node,
                f"the comprehension grows {ast.unparse(node.func.value)!r} while iterating over it, so it "
                "may never end",
            )
            return


def no_rebound_argument(ctx: FileContext, node: ast.NamedExpr, scope: Scope | None) -> None:
    if scope is not None and node.target.id in scope.params:
        ctx.flag(node, f"rebinds argument {node.target.id!r} inside an expression")
