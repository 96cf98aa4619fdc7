"""The driver: parse the file, walk it once, and hand each node to the rules that are about it.

```text
check_source(text) -> size and syntax checks -> FileContext (bindings, classes, functions)
    module statement -> imports.check_import | function | class | declaration | "not allowed here"
    class            -> classes.class_bases, CLASS_RULES, then each member: classes.class_member, then
                        function | declaration
    function         -> classes.method_decorators, expressions.constant_defaults, annotations, then each
                        statement: STATEMENT_RULES, then its statements and expressions
    expression       -> per node: names.*, calls.CALL_RULES, expressions.*, recursion.record_*
    file             -> classes.one_ops_class, recursion.no_recursion
```

The driver decides only where to look; every refusal is made by one rule function in the modules named
above, so each rule can be read, tested and changed alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpuslice.inputs import read_text
from gpuslice.programs.verify.allowlists import MAX_SOURCE_BYTES
from gpuslice.programs.verify.calls import CALL_RULES
from gpuslice.programs.verify.classes import (
    CLASS_RULES,
    class_bases,
    class_member,
    method_decorators,
    one_ops_class,
)
from gpuslice.programs.verify.context import FileContext, Scope, is_docstring, params
from gpuslice.programs.verify.declarations import declared_names, map_declaration, record_constant
from gpuslice.programs.verify.expressions import (
    constant_defaults,
    lambda_only_as_argument,
    no_await,
    no_comprehension_growth,
    no_rebound_argument,
    no_yield,
)
from gpuslice.programs.verify.imports import check_import
from gpuslice.programs.verify.names import attribute_access, defined_name, getattr_only_called
from gpuslice.programs.verify.recursion import no_recursion, record_attribute_call, record_name_call
from gpuslice.programs.verify.report import CheckReport, Violation
from gpuslice.programs.verify.statements import NOT_DESCENDED, STATEMENT_RULES

__all__ = ["FILE_RULES", "check_file", "check_source"]

FILE_RULES = (one_ops_class, no_recursion)  # once the whole file has been read


def check_file(path: str | Path) -> CheckReport:
    """Verify the policy file at ``path``; UserError if it cannot be read as UTF-8 text."""
    return check_source(read_text(path, "policy file"), str(path))  # a FIFO, binary …: one message


def check_source(source: str, filename: str) -> CheckReport:
    """Verify policy source text; ``filename`` is used in the messages. Violations come sorted by line."""
    report = CheckReport(filename)
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        message = f"the file is larger than {MAX_SOURCE_BYTES // 1024} KiB; a policy is a page or two"
        report.violations.append(Violation(filename, 1, message))
        return report
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as err:
        report.violations.append(Violation(filename, err.lineno or 1, f"syntax error: {err.msg}"))
        return report
    except ValueError as err:  # e.g. NUL bytes
        report.violations.append(Violation(filename, 1, f"the file cannot be parsed: {err}"))
        return report
    ctx = FileContext(tree, report)
    for stmt in tree.body:
        _module_statement(ctx, stmt)
    for rule in FILE_RULES:
        rule(ctx)
    report.violations.sort(key=lambda v: v.line)
    return report


def _module_statement(ctx: FileContext, stmt: ast.stmt) -> None:
    if is_docstring(stmt):
        return
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        check_import(ctx, stmt)
    elif isinstance(stmt, ast.FunctionDef):
        if stmt.name.startswith("__"):
            ctx.flag(
                stmt, f"module-level function {stmt.name!r} has a dunder name, which Python calls implicitly"
            )
        _function(ctx, stmt, owner="")
    elif isinstance(stmt, ast.ClassDef):
        _class(ctx, stmt)
    elif isinstance(stmt, ast.Assign | ast.AnnAssign):
        _declaration(ctx, stmt, where="module")
    elif isinstance(stmt, ast.AsyncFunctionDef):
        ctx.flag(stmt, "async functions are not allowed: a hook runs to completion synchronously")
    else:
        ctx.flag(
            stmt,
            "module-level code runs once at load; only imports, constants, Map declarations, functions and "
            "classes are allowed here",
        )


def _class(ctx: FileContext, cls: ast.ClassDef) -> None:
    ops = class_bases(ctx, cls)
    if ops:
        ctx.ops_classes.append(cls)
    for rule in CLASS_RULES:
        rule(ctx, cls)
    for stmt in cls.body:
        class_member(ctx, cls, stmt, ops)
        if isinstance(stmt, ast.FunctionDef):
            _function(ctx, stmt, owner=cls.name)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            _declaration(ctx, stmt, where=f"class {cls.name}")


def _declaration(ctx: FileContext, stmt: ast.Assign | ast.AnnAssign, where: str) -> None:
    names = declared_names(ctx, stmt, where)
    if names is None:
        return
    if isinstance(stmt, ast.AnnAssign):
        _expression(ctx, stmt.annotation, scope=None)  # evaluated at load without future annotations
    if stmt.value is None:
        return  # a bare annotation (dataclass field without default)
    _expression(ctx, stmt.value, scope=None)
    if ctx.is_map_call(stmt.value):
        map_declaration(ctx, stmt, names)
    else:
        record_constant(ctx, stmt, names, where)


def _function(ctx: FileContext, fn: ast.FunctionDef, owner: str) -> None:
    method_decorators(ctx, fn)
    constant_defaults(ctx, fn)
    for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg):
        if arg is not None and arg.annotation is not None:
            _expression(ctx, arg.annotation, scope=None)
    if fn.returns is not None:
        _expression(ctx, fn.returns, scope=None)
    scope = Scope(key=(owner, fn.name), owner=owner, params=set(params(fn)) - {"self", "cls"})
    for stmt in fn.body:
        _statement(ctx, stmt, scope)


def _statement(ctx: FileContext, stmt: ast.stmt, scope: Scope) -> None:
    for rule in STATEMENT_RULES:
        rule(ctx, stmt, scope)
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        check_import(ctx, stmt)
    if isinstance(stmt, NOT_DESCENDED):
        return
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            _statement(ctx, child, scope)
        elif isinstance(child, ast.expr):
            _expression(ctx, child, scope)
        elif isinstance(child, ast.ExceptHandler | ast.match_case):
            for sub in ast.iter_child_nodes(child):
                if isinstance(sub, ast.stmt):
                    _statement(ctx, sub, scope)
                elif isinstance(sub, ast.expr):
                    _expression(ctx, sub, scope)
        elif isinstance(child, ast.withitem):
            _expression(ctx, child.context_expr, scope)
            if child.optional_vars is not None:
                _expression(ctx, child.optional_vars, scope)


def _expression(ctx: FileContext, node: ast.expr, scope: Scope | None) -> None:
    """Every node of one expression tree, each to its rules; ``scope`` is None at module and class level."""
    lambda_args: set[int] = set()  # lambdas passed straight to a call
    called: set[int] = set()  # the function part of every call
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            lambda_args.update(
                id(a) for a in (*sub.args, *(k.value for k in sub.keywords)) if isinstance(a, ast.Lambda)
            )
            called.add(id(sub.func))
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            getattr_only_called(ctx, sub, called)
            record_name_call(ctx, sub, scope)
            defined_name(ctx, sub)
        elif isinstance(sub, ast.Attribute):
            record_attribute_call(ctx, sub, scope)
            attribute_access(ctx, sub)
        elif isinstance(sub, ast.Call):
            for rule in CALL_RULES:
                rule(ctx, sub, scope)
        elif isinstance(sub, ast.Lambda):
            lambda_only_as_argument(ctx, sub, lambda_args)
        elif isinstance(sub, ast.Yield | ast.YieldFrom):
            no_yield(ctx, sub)
        elif isinstance(sub, ast.Await):
            no_await(ctx, sub)
        elif isinstance(sub, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            no_comprehension_growth(ctx, sub)
        elif isinstance(sub, ast.NamedExpr):
            no_rebound_argument(ctx, sub, scope)
