"""Rules on statements inside functions and methods: loops that end, no hidden state, no closures, no
swallowing the guard's interruption, no writes into hook arguments. Each runs on one statement with the
``Scope`` of its function; the driver descends into the statement afterwards (except where
``NOT_DESCENDED`` says the statement was refused whole)."""

from __future__ import annotations

import ast

from gpuslice.programs.verify.allowlists import GROWERS
from gpuslice.programs.verify.context import FileContext, Scope, load_copy, root_name

__all__ = [
    "NOT_DESCENDED",
    "STATEMENT_RULES",
    "no_async_statement",
    "no_base_exception_handler",
    "no_global",
    "no_loop_growth",
    "no_nested_definition",
    "no_while",
    "no_write_into_arguments",
]

# Statements refused whole (or checked elsewhere, imports): the driver does not look inside them.
NOT_DESCENDED = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Global,
    ast.Nonlocal,
    ast.Import,
    ast.ImportFrom,
)


def no_while(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    if isinstance(stmt, ast.While):
        ctx.flag(
            stmt,
            "while loops are not allowed: their end cannot be checked; loop with for over range(limit) "
            "and break",
        )


def no_nested_definition(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        ctx.flag(
            stmt,
            f"{stmt.name} is defined inside a function: closures hide calls from the verifier; use a "
            "method or a module function",
        )


def no_global(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    if isinstance(stmt, ast.Global | ast.Nonlocal):
        keyword = "global" if isinstance(stmt, ast.Global) else "nonlocal"
        ctx.flag(
            stmt,
            f"'{keyword} {', '.join(stmt.names)}' writes state outside the function; keep state in a "
            "declared Map",
        )


def no_async_statement(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    if isinstance(stmt, ast.AsyncFor | ast.AsyncWith):
        ctx.flag(stmt, "async statements are not allowed: a hook runs to completion synchronously")


def no_base_exception_handler(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    """No bare ``except:`` or ``except BaseException``: they would swallow the guard's HookTimeout."""
    if not isinstance(stmt, ast.Try | ast.TryStar):
        return
    for handler in stmt.handlers:
        if _catches_base_exception(handler.type):
            caught = "a bare except" if handler.type is None else f"'except {ast.unparse(handler.type)}'"
            ctx.flag(
                handler,
                f"{caught} would swallow the guard's interruption of an overrunning hook; catch Exception or "
                "narrower",
            )


def no_loop_growth(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    """A ``for`` loop may not grow the list (set, dict) it walks."""
    if not isinstance(stmt, ast.For) or not isinstance(stmt.iter, ast.Name | ast.Attribute):
        return
    walked = ast.dump(stmt.iter)
    for node in ast.walk(ast.Module(body=stmt.body, type_ignores=[])):
        grown = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in GROWERS:
            grown = node.func.value
        elif isinstance(node, ast.AugAssign):
            grown = node.target
        if grown is not None and ast.dump(load_copy(grown)) == walked:
            ctx.flag(
                node,
                f"the loop grows {ast.unparse(stmt.iter)!r} while iterating over it, so it may never end",
            )
            return


def no_write_into_arguments(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    """No ``arg.x = ...``, ``arg[i] = ...`` or ``del arg.x``: hook arguments are the mechanism's state."""
    if isinstance(stmt, NOT_DESCENDED):
        return
    targets: list[ast.expr] = []
    if isinstance(stmt, ast.Assign | ast.Delete):
        targets = list(stmt.targets)
    elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
        targets = [stmt.target]
    elif isinstance(stmt, ast.With):
        targets = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Attribute | ast.Subscript) and isinstance(sub.ctx, ast.Store | ast.Del):
                root = root_name(sub)
                if root in scope.params:
                    ctx.flag(
                        stmt,
                        f"writes into argument {root!r}: hook arguments are the mechanism's read-only state",
                    )
                    break


def _catches_base_exception(node: ast.expr | None) -> bool:
    if node is None:
        return True
    if isinstance(node, ast.Tuple):
        return any(_catches_base_exception(e) for e in node.elts)
    return isinstance(node, ast.Name) and node.id == "BaseException"


# In this order on every statement of a function body (imports go to the import rules instead).
STATEMENT_RULES = (
    no_while,
    no_nested_definition,
    no_global,
    no_async_statement,
    no_base_exception_handler,
    no_loop_growth,
    no_write_into_arguments,
)
