"""What the rules know about the file being checked: its bindings, imports, constants, classes and the
call edges seen so far, plus the small queries several rules share (``qualified``, ``is_constant``).

Rules never walk the tree themselves; the driver (``driver.py``) hands each one the node it is about and
the ``Scope`` of the function it is in (None at module and class level).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from gpuslice.programs.maps import MAP_TYPES
from gpuslice.programs.verify.allowlists import API_MODULE, CONST_CALLS, MAX_POW_EXPONENT, OPS_BASES
from gpuslice.programs.verify.report import CheckReport, Violation

__all__ = [
    "Edge",
    "FileContext",
    "Key",
    "Scope",
    "dotted",
    "is_docstring",
    "load_copy",
    "params",
    "root_name",
]

Key = tuple[str, str]  # (class name or "" for a module function, function name)
Edge = tuple[Key, Key, int]  # caller, callee, line of the call


@dataclass
class Scope:
    """The function a statement is in: its call-graph key, its class ("" at module level), its arguments."""

    key: Key
    owner: str
    params: set[str]


@dataclass
class FileContext:
    """One file under check. ``flag`` records a violation; the rest is read by the rules."""

    tree: ast.Module
    report: CheckReport
    imported: dict[str, str] = field(
        default_factory=dict
    )  # local name -> "numpy", "gpuslice.programs.api.Map"
    constants: dict[str, object] = field(default_factory=dict)  # module constant -> literal value or None
    functions: set[str] = field(default_factory=set)  # module-level functions
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)  # every name the file binds anywhere
    ops_classes: list[ast.ClassDef] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._collect_bindings()

    def flag(self, node: ast.AST | int, message: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        self.report.violations.append(Violation(self.report.filename, line, message))

    def _collect_bindings(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                self.bound.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.bound.update(params(node))
                if not isinstance(node, ast.Lambda):
                    self.bound.add(node.name)
            elif isinstance(node, ast.ClassDef) or (isinstance(node, ast.ExceptHandler) and node.name):
                self.bound.add(node.name)
            elif isinstance(node, ast.alias):
                self.bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
                self.bound.add(node.name)
        for stmt in self.tree.body:
            if isinstance(stmt, ast.FunctionDef):
                self.functions.add(stmt.name)
            elif isinstance(stmt, ast.ClassDef):
                self.classes[stmt.name] = stmt

    def qualified(self, node: ast.expr) -> str | None:
        """The imported name ``node`` refers to (``np.sum`` -> ``numpy.sum``), else None."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head not in self.imported:
            return None
        return self.imported[head] + ("." + rest if rest else "")

    def is_map_call(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Call) and self.qualified(node.func) == f"{API_MODULE}.Map"

    def is_ops_base(self, base: ast.expr) -> bool:
        """Whether ``base`` is an API ops class, or a class of this file that extends one."""
        qualified = self.qualified(base)
        if qualified is not None and qualified.rsplit(".", 1)[-1] in OPS_BASES:
            return True
        if isinstance(base, ast.Name) and base.id in self.classes:
            return any(self.is_ops_base(b) for b in self.classes[base.id].bases)
        return False

    def is_constant(self, node: ast.expr) -> bool:
        """Numbers, strings, tuples, frozensets and names of those, computed cheaply at load."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Tuple):
            return all(self.is_constant(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return self.is_constant(node.operand)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant)
                and type(node.right.value) is int
                and abs(node.right.value) <= MAX_POW_EXPONENT
            ):
                return False
            if isinstance(node.op, ast.Mult) and any(
                isinstance(side, ast.Tuple)
                or (isinstance(side, ast.Constant) and isinstance(side.value, str | bytes))
                for side in (node.left, node.right)
            ):
                return False  # sequence repetition: a literal could ask for gigabytes at load
            return self.is_constant(node.left) and self.is_constant(node.right)
        if isinstance(node, ast.Name):
            return node.id in self.constants or node.id in self.imported or node.id in MAP_TYPES
        if isinstance(node, ast.Attribute):
            return root_name(node) in self.imported
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CONST_CALLS:
            if node.keywords or len(node.args) > 1:
                return False
            if not node.args:
                return True
            arg = node.args[0]
            if node.func.id == "frozenset" and isinstance(arg, ast.Set | ast.List | ast.Tuple):
                return all(self.is_constant(e) for e in arg.elts)
            return self.is_constant(arg)
        return False


def dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def root_name(node: ast.expr) -> str | None:
    """The name a target like ``a.b[c].d`` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names


def is_docstring(stmt: ast.stmt) -> bool:
    """A bare string statement (a docstring or a comment-like string)."""
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def load_copy(node: ast.expr) -> ast.expr:
    """A copy of a target expression in Load context, to compare it with a loop's iterable."""
    return ast.parse(ast.unparse(node), mode="eval").body
