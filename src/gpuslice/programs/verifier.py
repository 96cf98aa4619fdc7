"""The policy verifier: the Python counterpart of the eBPF verifier, run before a policy file is loaded.

It reads the file's syntax tree and never runs it. A file passes when it defines exactly one ops class
of a known family and stays inside a small, analysable subset of Python. Every violation names the file,
the line and the problem in one sentence. Each rule, and what it blocks:

- Exactly one class extends ``PlacementOps``, ``QueueOps`` or ``MemoryOps`` from the API module, and a
  memory policy says ``kind = "evict"`` or ``"prefetch"``: files the loader could not attach.
- Imports only ``math``, ``numpy``, ``collections``, ``heapq``, a few names of ``dataclasses`` and
  ``typing``, and ``gpuslice.programs.api`` (absolute, by name, no ``*``): file, network, process and
  environment access (``os``, ``socket``, ``subprocess`` …).
- Names are the file's own, its imports or safe builtins (no ``open``, ``exec``, ``eval``, ``compile``,
  ``__import__``, ``globals``, ``type``, ``iter``, ``print`` …); ``getattr``/``hasattr`` only with a
  literal name, never ``setattr``/``delattr``: running unverified code, reaching namespaces, unbounded
  ``iter(f, sentinel)``.
- No dunder attributes (``x.__class__``, ``__globals__``, ``__subclasses__``), no private attributes of
  other objects (``view._lists``), no frame/generator internals (``gi_frame``, ``f_globals``), no numpy
  file or flag access (``np.load``, ``tofile``, ``flags``, ``setflags``, ``base``, ``seterr``), no
  ``str.format``: escaping through the object graph; making a read-only view writeable.
- No recursion, direct or mutual, on the call graph of the file's functions and methods (calls by name,
  ``self.m``, ``cls.m``, ``C.m``, ``super().m``): hooks that never return.
- No ``while``; a ``for`` or comprehension may not grow the list it walks; no ``yield``, ``async`` or
  ``await``: loops that may not end.
- Module and class level hold only imports, constants (numbers, strings, tuples, frozensets),
  ``Map(...)`` declarations, functions and classes; no ``global``/``nonlocal``, mutable default
  arguments or closures: hidden state outside declared maps, code that runs at import.
- Calls go to named functions, methods, classes or builtins, not to a variable or a lambda; a lambda
  only as an argument (a sort key): recursion hidden in higher-order calls.
- No bare ``except:`` or ``except BaseException``: swallowing the guard's interruption of an overrun.
- No writes into hook arguments (``view.x = …``, ``view.arr[i] = …``): changing the mechanism's state.
- No ``__del__`` or other dunder methods beyond ``__init__`` (ops class) and comparisons (helper
  classes); decorators only ``staticmethod``/``classmethod``/``property``/``dataclass``; no metaclass:
  code the mechanism would run outside a guarded hook.

What is left to run time, honestly: Python cannot be fully analysed, so the loader also runs the file
with a restricted ``__builtins__`` and an allow-list importer (defence in depth), the guard times every
hook and interrupts one that overruns, and Python's recursion limit turns recursion the call graph cannot
see (a method reached through another object that happens to be ``self``) into an exception the guard
counts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from gpuslice.errors import UserError
from gpuslice.programs import api
from gpuslice.programs.maps import MAP_TYPES, MapSpec

__all__ = [
    "ALLOWED_IMPORTS",
    "API_MODULE",
    "FAMILIES",
    "MAX_SOURCE_BYTES",
    "SAFE_BUILTINS",
    "CheckReport",
    "Violation",
    "check_file",
    "check_source",
]

API_MODULE = "gpuslice.programs.api"
FAMILIES = ("placement", "queue", "eviction", "prefetch")
MAX_SOURCE_BYTES = 64 * 1024  # a policy is a page or two; eBPF bounds program size too
# module -> names that may be imported from it (None: the whole module)
ALLOWED_IMPORTS: dict[str, frozenset[str] | None] = {
    "__future__": frozenset({"annotations"}),
    "math": None,
    "numpy": None,
    "collections": None,
    "collections.abc": None,
    "heapq": None,
    "dataclasses": frozenset({"dataclass", "field", "replace", "asdict", "astuple", "fields"}),
    "typing": frozenset({"Any", "ClassVar", "Final", "Optional", "Union"}),
    API_MODULE: frozenset(api.__all__),
}
# Builtins a policy may name; the loader's restricted __builtins__ holds exactly these (+ class building).
SAFE_BUILTINS = frozenset(
    {
        "abs", "all", "any", "bool", "callable", "chr", "dict", "divmod", "enumerate", "filter", "float",
        "format", "frozenset", "getattr", "hasattr", "hash", "int", "isinstance", "issubclass", "len",
        "list", "map", "max", "min", "ord", "pow", "range", "repr", "reversed", "round", "set", "slice",
        "sorted", "str", "sum", "tuple", "zip", "super", "property", "staticmethod", "classmethod",
        "NotImplemented", "Ellipsis",
        "ArithmeticError", "AssertionError", "Exception", "IndexError", "KeyError", "LookupError",
        "NotImplementedError", "OverflowError", "RuntimeError", "TypeError", "ValueError",
        "ZeroDivisionError",
    }
)  # fmt: skip
_FORBIDDEN_NAMES = {
    "open": "open() reads and writes files",
    "exec": "exec() runs code the verifier has not seen",
    "eval": "eval() runs code the verifier has not seen",
    "compile": "compile() builds code the verifier has not seen",
    "__import__": "__import__() imports modules around the allow-list",
    "globals": "globals() exposes the module namespace",
    "locals": "locals() exposes a frame's namespace",
    "vars": "vars() exposes an object's namespace",
    "dir": "dir() lists an object's internals",
    "type": "type() reaches class internals and builds classes at run time",
    "object": "object gives access to every class through its internals",
    "iter": "iter(callable, sentinel) can loop forever",
    "next": "next() drives iterators the verifier cannot bound",
    "print": "print() writes to the terminal; a policy returns advice and records state in maps",
    "input": "input() reads the terminal",
    "breakpoint": "breakpoint() starts a debugger",
    "help": "help() reads documentation files",
    "exit": "exit() stops the process",
    "quit": "quit() stops the process",
    "memoryview": "memoryview() exposes raw memory",
    "id": "id() exposes memory addresses",
    "setattr": "setattr() sets attributes by computed name; assign them directly",
    "delattr": "delattr() removes attributes by computed name",
    "__builtins__": "__builtins__ reaches every builtin, including open and exec",
    "__loader__": "__loader__ reaches the import machinery",
    "__spec__": "__spec__ reaches the import machinery",
    "__file__": "__file__ names the file system",
}
_GETATTR_LIKE = frozenset({"getattr", "hasattr"})
_FRAME_ATTRS = frozenset(
    {
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
        "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "f_trace", "tb_frame", "tb_next",
        "co_code", "func_globals", "func_code", "mro",
    }
)  # fmt: skip
_FILE_ATTRS = frozenset(
    {
        "load", "loads", "save", "savez", "savez_compressed", "loadtxt", "savetxt", "genfromtxt", "fromfile",
        "tofile", "fromregex", "memmap", "DataSource", "dump", "dumps", "ctypeslib", "ctypes", "lib", "core",
        "f2py", "testing", "distutils", "show_config", "show_runtime", "get_include", "lookfor", "info",
        "source",
    }
)  # fmt: skip
_STATE_ATTRS = frozenset(
    {"flags", "setflags", "base", "data", "resize", "itemset", "seterr", "seterrcall", "setbufsize",
     "set_printoptions", "set_string_function", "seed", "format", "format_map"}
)  # fmt: skip
_OPS_DUNDERS = frozenset({"__init__"})
_HELPER_DUNDERS = frozenset(
    {"__init__", "__post_init__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__hash__"}
)
_METHOD_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
_GROWERS = frozenset(
    {"append", "extend", "insert", "appendleft", "extendleft", "add", "update", "setdefault"}
)
_CONST_CALLS = frozenset({"frozenset", "int", "float", "str", "bool"})
_MAX_POW_EXPONENT = 64  # module constants are computed at load; a literal tower of powers would hang it
_MEMORY_KINDS = {"evict": "eviction", "prefetch": "prefetch"}


@dataclass(frozen=True)
class Violation:
    """One rule broken at one place; ``message`` is one sentence."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class CheckReport:
    """The verifier's answer for one file: the ops class it found, its maps, and every violation."""

    filename: str
    family: str | None = None
    class_name: str | None = None
    maps: dict[str, MapSpec] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        """One line for ``policy check`` when the file passes."""
        maps = ", ".join(f"{n}: {s}" for n, s in self.maps.items()) or "no maps"
        return f"{self.filename}: ok — {self.family} policy {self.class_name} ({maps})"


def check_file(path: str | Path) -> CheckReport:
    """Verify the policy file at ``path``; UserError if it cannot be read as UTF-8 text."""
    path = Path(path)
    try:
        source = path.read_text(encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot read policy file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise UserError(f"policy file {path} is not UTF-8 text") from None
    return check_source(source, str(path))


def check_source(source: str, filename: str) -> CheckReport:
    """Verify policy source text; ``filename`` is used in the messages."""
    report = CheckReport(filename)
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        report.violations.append(
            Violation(
                filename,
                1,
                f"the file is larger than {MAX_SOURCE_BYTES // 1024} KiB; a policy is a page or two",
            )
        )
        return report
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as err:
        report.violations.append(Violation(filename, err.lineno or 1, f"syntax error: {err.msg}"))
        return report
    except ValueError as err:  # e.g. NUL bytes
        report.violations.append(Violation(filename, 1, f"the file cannot be parsed: {err}"))
        return report
    _Checker(tree, report).run()
    report.violations.sort(key=lambda v: v.line)
    return report


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _root_name(node: ast.expr) -> str | None:
    """The name a target like ``a.b[c].d`` starts from."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_super_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return names


class _Checker:
    """One pass over one module's tree; fills the report."""

    def __init__(self, tree: ast.Module, report: CheckReport) -> None:
        self.tree = tree
        self.report = report
        self.imported: dict[str, str] = {}  # local name -> qualified ("numpy", "gpuslice.programs.api.Map")
        self.constants: dict[str, object] = {}  # module constant -> literal value (None if not a literal)
        self.functions: set[str] = set()  # module-level functions
        self.classes: dict[str, ast.ClassDef] = {}
        self.bound: set[str] = set()
        self.ops_classes: list[ast.ClassDef] = []
        self.edges: list[tuple[tuple[str, str], tuple[str, str], int]] = []

    def flag(self, node: ast.AST | int, message: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        self.report.violations.append(Violation(self.report.filename, line, message))

    # -- driver -----------------------------------------------------------------------------------------
    def run(self) -> None:
        self._collect_bindings()
        for stmt in self.tree.body:
            self._module_statement(stmt)
        self._check_ops_class()
        self._check_recursion()

    def _collect_bindings(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                self.bound.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.bound.update(_params(node))
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

    # -- module level -----------------------------------------------------------------------------------
    def _module_statement(self, stmt: ast.stmt) -> None:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            return  # docstring or a bare string
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            self._import(stmt)
        elif isinstance(stmt, ast.FunctionDef):
            if stmt.name.startswith("__"):
                self.flag(
                    stmt,
                    f"module-level function {stmt.name!r} has a dunder name, which Python calls implicitly",
                )
            self._function(stmt, owner="", ops=False)
        elif isinstance(stmt, ast.ClassDef):
            self._class(stmt)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            self._declaration(stmt, owner="")
        elif isinstance(stmt, ast.AsyncFunctionDef):
            self.flag(stmt, "async functions are not allowed: a hook runs to completion synchronously")
        else:
            self.flag(
                stmt,
                "module-level code runs once at load; only imports, constants, Map declarations, functions "
                "and classes are allowed here",
            )

    def _import(self, stmt: ast.Import | ast.ImportFrom) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                allowed = ALLOWED_IMPORTS.get(alias.name, frozenset())
                if alias.name not in ALLOWED_IMPORTS:
                    self.flag(stmt, self._import_message(alias.name))
                    self.imported[alias.asname or alias.name.split(".")[0]] = alias.name  # reported once
                elif allowed is not None and alias.name != API_MODULE:
                    self.flag(
                        stmt,
                        f"import names from {alias.name} one by one: 'from {alias.name} import "
                        f"{', '.join(sorted(allowed))}' (only these)",
                    )
                elif "." in alias.name and alias.asname is None:
                    self.flag(
                        stmt,
                        f"'import {alias.name}' binds the whole package; write 'import {alias.name} as ...'",
                    )
                else:
                    self.imported[alias.asname or alias.name] = alias.name
            return
        module = stmt.module or ""
        if stmt.level:
            self.flag(stmt, "relative imports are not allowed: a policy file is not part of a package")
            return
        if module not in ALLOWED_IMPORTS:
            self.flag(stmt, self._import_message(module))
            for alias in stmt.names:  # its names are reported once, here, not again where they are used
                self.imported[alias.asname or alias.name] = f"{module}.{alias.name}"
            return
        allowed = ALLOWED_IMPORTS[module]
        for alias in stmt.names:
            if alias.name == "*":
                self.flag(
                    stmt, f"'from {module} import *' hides which names the policy uses; import them by name"
                )
            elif allowed is not None and alias.name not in allowed:
                self.flag(
                    stmt,
                    f"{alias.name!r} may not be imported from {module}; allowed: "
                    f"{', '.join(sorted(allowed))}",
                )
            elif module != "__future__":
                self._attribute_rules(stmt, alias.name, f"{module}.{alias.name}")
                self.imported[alias.asname or alias.name] = f"{module}.{alias.name}"

    @staticmethod
    def _import_message(module: str) -> str:
        shown = sorted(m for m in ALLOWED_IMPORTS if m != "__future__")
        return (
            f"import of {module!r} is not allowed: a policy may import only {', '.join(shown)} "
            "(no file, network, process or environment access)"
        )

    # -- declarations (module and class level) ----------------------------------------------------------
    def _declaration(self, stmt: ast.Assign | ast.AnnAssign, owner: str) -> None:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        where = "module" if not owner else f"class {owner}"
        names: list[str] = []
        for target in targets:
            elts = target.elts if isinstance(target, ast.Tuple) else [target]
            for elt in elts:
                if not isinstance(elt, ast.Name):
                    self.flag(
                        stmt,
                        f"{where}-level assignment to {ast.unparse(elt)!r}: only plain names may be declared",
                    )
                    return
                if elt.id.startswith("__"):
                    self.flag(
                        stmt,
                        f"{where}-level name {elt.id!r} is a dunder, which changes how Python treats the "
                        f"{where}",
                    )
                    return
                names.append(elt.id)
        if isinstance(stmt, ast.AnnAssign):
            self._expression(stmt.annotation, scope=None)  # evaluated at load without future annotations
        value = stmt.value
        if value is None:
            return  # a bare annotation (dataclass field without default)
        self._expression(value, scope=None)
        if self._is_map_call(value):
            if len(names) != 1 or isinstance(targets[0], ast.Tuple):
                self.flag(
                    stmt, "declare one Map per assignment: NAME = Map(key=..., value=..., max_entries=...)"
                )
                return
            spec = self._map_spec(value)
            if spec is not None:
                if names[0] in self.report.maps:
                    self.flag(stmt, f"map {names[0]!r} is declared twice")
                self.report.maps[names[0]] = spec
            return
        if not self._is_constant(value):
            self.flag(
                stmt,
                f"{where}-level {', '.join(names)} is not a constant: state kept between calls must be a "
                "declared Map; constants are numbers, strings, tuples and frozensets",
            )
            return
        if not owner:
            literal = value.value if isinstance(value, ast.Constant) else None
            for name in names:
                self.constants[name] = literal

    def _is_map_call(self, node: ast.expr) -> bool:
        if not isinstance(node, ast.Call):
            return False
        qualified = self._qualified(node.func)
        return qualified == f"{API_MODULE}.Map"

    def _qualified(self, node: ast.expr) -> str | None:
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.imported:
            return None
        return self.imported[head] + ("." + rest if rest else "")

    def _map_spec(self, call: ast.Call) -> MapSpec | None:
        names = ("key", "value", "max_entries")
        given: dict[str, ast.expr] = dict(zip(names, call.args, strict=False))
        for kw in call.keywords:
            if kw.arg in names and kw.arg not in given:
                given[kw.arg] = kw.value
            else:
                self.flag(call, f"Map takes key=, value= and max_entries= once each, not {kw.arg!r}")
                return None
        if len(call.args) > 3 or set(given) != set(names):
            self.flag(
                call,
                "a Map declares all of key=, value= and max_entries=, e.g. Map(key=int, value=float, "
                "max_entries=4096)",
            )
            return None
        types = []
        for role in ("key", "value"):
            node = given[role]
            if not (isinstance(node, ast.Name) and node.id in MAP_TYPES):
                self.flag(call, f"Map {role}= must be int, float, str or bool, not {ast.unparse(node)!r}")
                return None
            types.append(MAP_TYPES[node.id])
        size = given["max_entries"]
        value = size.value if isinstance(size, ast.Constant) else self.constants.get(getattr(size, "id", ""))
        if type(value) is not int or not 1 <= value <= 1 << 24:
            self.flag(
                call, f"Map max_entries= must be a literal int from 1 to {1 << 24}, not {ast.unparse(size)!r}"
            )
            return None
        return MapSpec(types[0], types[1], value)

    def _is_constant(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Tuple):
            return all(self._is_constant(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return self._is_constant(node.operand)
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant)
                and type(node.right.value) is int
                and abs(node.right.value) <= _MAX_POW_EXPONENT
            ):
                return False
            if isinstance(node.op, ast.Mult) and any(
                isinstance(side, ast.Tuple)
                or (isinstance(side, ast.Constant) and isinstance(side.value, str | bytes))
                for side in (node.left, node.right)
            ):
                return False  # sequence repetition: a literal could ask for gigabytes at load
            return self._is_constant(node.left) and self._is_constant(node.right)
        if isinstance(node, ast.Name):
            return node.id in self.constants or node.id in self.imported or node.id in MAP_TYPES
        if isinstance(node, ast.Attribute):
            root = _root_name(node)
            return root in self.imported
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CONST_CALLS:
            if node.keywords or len(node.args) > 1:
                return False
            if not node.args:
                return True
            arg = node.args[0]
            if node.func.id == "frozenset" and isinstance(arg, ast.Set | ast.List | ast.Tuple):
                return all(self._is_constant(e) for e in arg.elts)
            return self._is_constant(arg)
        return False

    # -- classes --------------------------------------------------------------------------------------
    def _class(self, cls: ast.ClassDef) -> None:
        ops = False
        for base in cls.bases:
            qualified = self._qualified(base)
            if (
                qualified is not None
                and qualified.startswith(API_MODULE + ".")
                and qualified.rsplit(".", 1)[1] in ("PlacementOps", "QueueOps", "MemoryOps")
            ):
                ops = True
            elif isinstance(base, ast.Name) and base.id in self.classes:
                ops = ops or any(self._is_ops_base(b) for b in self.classes[base.id].bases)
            else:
                self.flag(
                    cls,
                    f"class {cls.name} extends {ast.unparse(base)!r}: a class may extend only an ops base "
                    f"from {API_MODULE} or a class of this file",
                )
        if ops:
            self.ops_classes.append(cls)
        if cls.keywords:
            self.flag(
                cls,
                f"class {cls.name} passes {ast.unparse(cls.keywords[0])!r}: metaclasses and class "
                "keywords are not allowed",
            )
        for deco in cls.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            if self._qualified(target) != "dataclasses.dataclass":
                self.flag(deco, f"class decorator {ast.unparse(deco)!r} is not allowed: only @dataclass")
            elif isinstance(deco, ast.Call) and (
                deco.args or not all(isinstance(k.value, ast.Constant) for k in deco.keywords)
            ):
                self.flag(deco, "@dataclass(...) takes literal keyword arguments only")
        allowed_dunders = _OPS_DUNDERS if ops else _HELPER_DUNDERS
        for stmt in cls.body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                continue
            if isinstance(stmt, ast.Pass):
                continue
            if isinstance(stmt, ast.FunctionDef):
                if stmt.name.startswith("__") and stmt.name not in allowed_dunders:
                    why = " (the mechanism would call it outside a guarded hook)" if ops else ""
                    self.flag(
                        stmt,
                        f"method {stmt.name} is not allowed in class {cls.name}{why}; allowed dunder "
                        f"methods: {', '.join(sorted(allowed_dunders))}",
                    )
                self._function(stmt, owner=cls.name, ops=ops)
            elif isinstance(stmt, ast.Assign | ast.AnnAssign):
                self._declaration(stmt, owner=cls.name)
            elif isinstance(stmt, ast.AsyncFunctionDef):
                self.flag(stmt, "async methods are not allowed: a hook runs to completion synchronously")
            else:
                self.flag(
                    stmt,
                    f"class {cls.name}'s body may hold only a docstring, constants, Map declarations and "
                    "methods",
                )

    def _is_ops_base(self, base: ast.expr) -> bool:
        qualified = self._qualified(base)
        if qualified is not None and qualified.rsplit(".", 1)[-1] in (
            "PlacementOps",
            "QueueOps",
            "MemoryOps",
        ):
            return True
        if isinstance(base, ast.Name) and base.id in self.classes:
            return any(self._is_ops_base(b) for b in self.classes[base.id].bases)
        return False

    def _check_ops_class(self) -> None:
        found = self.ops_classes
        if not found:
            self.flag(
                1,
                "the file defines no ops class: exactly one class must extend PlacementOps, QueueOps or "
                f"MemoryOps from {API_MODULE}",
            )
            return
        if len(found) > 1:
            for extra in found[1:]:
                self.flag(
                    extra,
                    f"class {extra.name} is a second ops class (the first is {found[0].name} on line "
                    f"{found[0].lineno}); a file holds exactly one",
                )
            return
        cls = found[0]
        self.report.class_name = cls.name
        base = next(self._qualified(b) for b in cls.bases if self._is_ops_base(b))
        kind_name = (base or "").rsplit(".", 1)[-1]
        if kind_name == "PlacementOps":
            self.report.family = "placement"
        elif kind_name == "QueueOps":
            self.report.family = "queue"
        elif kind_name == "MemoryOps":
            kind = None
            for stmt in cls.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "kind" for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant)
                ):
                    kind = stmt.value.value
            if kind not in _MEMORY_KINDS:
                self.flag(
                    cls,
                    f'memory policy {cls.name} must say which half it implements: kind = "evict" or kind '
                    '= "prefetch"',
                )
            else:
                self.report.family = _MEMORY_KINDS[kind]
        else:
            self.flag(cls, f"class {cls.name} must extend PlacementOps, QueueOps or MemoryOps directly")

    # -- functions --------------------------------------------------------------------------------------
    def _function(self, fn: ast.FunctionDef, owner: str, ops: bool) -> None:
        for deco in fn.decorator_list:
            if not (isinstance(deco, ast.Name) and deco.id in _METHOD_DECORATORS):
                self.flag(
                    deco,
                    f"decorator {ast.unparse(deco)!r} is not allowed: only staticmethod, classmethod and "
                    "property",
                )
        self._defaults(fn)
        for arg in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg):
            if arg is not None and arg.annotation is not None:
                self._expression(arg.annotation, scope=None)
        if fn.returns is not None:
            self._expression(fn.returns, scope=None)
        params = set(_params(fn)) - {"self", "cls"}
        scope = _Scope(key=(owner, fn.name), owner=owner, params=params)
        for stmt in fn.body:
            self._statement(stmt, scope)

    def _defaults(self, fn: ast.FunctionDef | ast.Lambda) -> None:
        for default in (*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)):
            if not self._is_constant(default):
                self.flag(
                    default,
                    f"default argument {ast.unparse(default)!r} is not a constant: a mutable default is "
                    "state shared between calls",
                )

    def _statement(self, stmt: ast.stmt, scope: _Scope) -> None:
        if isinstance(stmt, ast.While):
            self.flag(
                stmt,
                "while loops are not allowed: their end cannot be checked; loop with for over "
                "range(limit) and break",
            )
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.flag(
                stmt,
                f"{stmt.name} is defined inside a function: closures hide calls from the verifier; use a "
                "method or a module function",
            )
            return
        elif isinstance(stmt, ast.Global | ast.Nonlocal):
            keyword = "global" if isinstance(stmt, ast.Global) else "nonlocal"
            self.flag(
                stmt,
                f"'{keyword} {', '.join(stmt.names)}' writes state outside the function; keep state in a "
                "declared Map",
            )
            return
        elif isinstance(stmt, ast.AsyncFor | ast.AsyncWith):
            self.flag(stmt, "async statements are not allowed: a hook runs to completion synchronously")
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for handler in stmt.handlers:
                if self._catches_base_exception(handler.type):
                    caught = (
                        "a bare except" if handler.type is None else f"'except {ast.unparse(handler.type)}'"
                    )
                    self.flag(
                        handler,
                        f"{caught} would swallow the guard's interruption of an overrunning hook; catch "
                        "Exception or narrower",
                    )
        elif isinstance(stmt, ast.For):
            self._loop_growth(stmt)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            self._import(stmt)
            return
        # targets: no writes into hook arguments
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
            targets = [stmt.target]
        elif isinstance(stmt, ast.Delete):
            targets = list(stmt.targets)
        elif isinstance(stmt, ast.With):
            targets = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute | ast.Subscript) and isinstance(
                    sub.ctx, ast.Store | ast.Del
                ):
                    root = _root_name(sub)
                    if root in scope.params:
                        self.flag(
                            stmt,
                            f"writes into argument {root!r}: hook arguments are the mechanism's read-only "
                            "state",
                        )
                        break
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.stmt):
                self._statement(child, scope)
            elif isinstance(child, ast.expr):
                self._expression(child, scope)
            elif isinstance(child, ast.ExceptHandler | ast.match_case):
                for sub in ast.iter_child_nodes(child):
                    if isinstance(sub, ast.stmt):
                        self._statement(sub, scope)
                    elif isinstance(sub, ast.expr):
                        self._expression(sub, scope)
            elif isinstance(child, ast.withitem):
                self._expression(child.context_expr, scope)
                if child.optional_vars is not None:
                    self._expression(child.optional_vars, scope)

    def _catches_base_exception(self, node: ast.expr | None) -> bool:
        if node is None:
            return True
        if isinstance(node, ast.Tuple):
            return any(self._catches_base_exception(e) for e in node.elts)
        return isinstance(node, ast.Name) and node.id == "BaseException"

    def _loop_growth(self, loop: ast.For) -> None:
        walked = ast.dump(loop.iter)
        if not isinstance(loop.iter, ast.Name | ast.Attribute):
            return
        for node in ast.walk(ast.Module(body=loop.body, type_ignores=[])):
            grown = None
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _GROWERS
            ):
                grown = node.func.value
            elif isinstance(node, ast.AugAssign):
                grown = node.target
            if grown is not None and ast.dump(_load(grown)) == walked:
                self.flag(
                    node,
                    f"the loop grows {ast.unparse(loop.iter)!r} while iterating over it, so it may never end",
                )
                return

    def _comprehension_growth(
        self, comp: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
    ) -> None:
        walked = {ast.dump(g.iter) for g in comp.generators if isinstance(g.iter, ast.Name | ast.Attribute)}
        for node in ast.walk(comp):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _GROWERS
            ) and ast.dump(_load(node.func.value)) in walked:
                self.flag(
                    node,
                    f"the comprehension grows {ast.unparse(node.func.value)!r} while iterating over "
                    "it, so it may never end",
                )
                return

    # -- expressions ------------------------------------------------------------------------------------
    def _expression(self, node: ast.expr, scope: _Scope | None) -> None:
        """Every rule on expressions; ``scope`` is None at module and class level."""
        lambda_args: set[int] = set()
        called: set[int] = set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                lambda_args.update(
                    id(a) for a in (*sub.args, *(k.value for k in sub.keywords)) if isinstance(a, ast.Lambda)
                )
                called.add(id(sub.func))
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                if (
                    sub.id in (*_GETATTR_LIKE, "super")
                    and id(sub) not in called
                    and sub.id not in self.imported
                ):
                    self.flag(
                        sub,
                        f"passes {sub.id!r} around as a value: the verifier checks it only where it is "
                        "called",
                    )
                self._name(sub, scope)
            elif isinstance(sub, ast.Attribute):
                self._attribute(sub, scope)
            elif isinstance(sub, ast.Call):
                self._call(sub, scope)
            elif isinstance(sub, ast.Lambda):
                self._defaults(sub)
                if id(sub) not in lambda_args:
                    self.flag(
                        sub,
                        "a lambda may only be passed straight to a call (a sort key); define a method "
                        "instead",
                    )
            elif isinstance(sub, ast.Yield | ast.YieldFrom):
                self.flag(
                    sub, "yield makes a generator, which may never end and is not an answer a hook may return"
                )
            elif isinstance(sub, ast.Await):
                self.flag(sub, "await is not allowed: a hook runs to completion synchronously")
            elif isinstance(sub, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
                self._comprehension_growth(sub)
            elif isinstance(sub, ast.NamedExpr) and scope is not None and sub.target.id in scope.params:
                self.flag(sub, f"rebinds argument {sub.target.id!r} inside an expression")

    def _name(self, node: ast.Name, scope: _Scope | None) -> None:
        name = node.id
        if not isinstance(node.ctx, ast.Load):
            return
        if scope is not None:
            if name in self.functions:
                self.edges.append((scope.key, ("", name), node.lineno))
            elif name in self.classes:
                for init in ("__init__", "__post_init__"):
                    self.edges.append((scope.key, (name, init), node.lineno))
        if name in _FORBIDDEN_NAMES and name not in self.imported:
            self.flag(node, f"uses {name!r}: {_FORBIDDEN_NAMES[name]}")
        elif name.startswith("__"):
            self.flag(node, f"uses {name!r}: dunder names reach the interpreter's internals")
        elif name not in self.bound and name not in SAFE_BUILTINS:
            self.flag(
                node,
                f"name {name!r} is not defined: a policy may use only its imports, its own definitions "
                "and safe builtins",
            )

    def _attribute(self, node: ast.Attribute, scope: _Scope | None) -> None:
        attr = node.attr
        if scope is not None:
            # Calls of the file's own methods go through self, cls, a class of the file or super(); any
            # class of the file may own the method (by name: conservative, no type inference).
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver in ("self", "cls") or receiver in self.classes:
                for cls_name, cls in self.classes.items():
                    if any(isinstance(s, ast.FunctionDef) and s.name == attr for s in cls.body):
                        self.edges.append((scope.key, (cls_name, attr), node.lineno))
            if _is_super_call(node.value) and scope.owner in self.classes:
                for base in self.classes[scope.owner].bases:
                    if isinstance(base, ast.Name) and base.id in self.classes:
                        self.edges.append((scope.key, (base.id, attr), node.lineno))
        if attr.startswith("__"):
            if _is_super_call(node.value) and attr in ("__init__", "__post_init__"):
                return
            self.flag(
                node, f"reads {ast.unparse(node)!r}: dunder attributes reach the interpreter's internals"
            )
            return
        root = node.value
        if attr.startswith("_") and not (isinstance(root, ast.Name) and root.id in ("self", "cls")):
            self.flag(
                node, f"reads private attribute {ast.unparse(node)!r}: a policy reads the public view only"
            )
            return
        qualified = self._qualified(node)
        self._attribute_rules(node, attr, qualified)

    def _attribute_rules(self, node: ast.AST, attr: str, qualified: str | None) -> None:
        """Rules on an attribute name, wherever it is read (``x.attr``, ``getattr(x, "attr")``, imports)."""
        if attr.startswith("__"):
            self.flag(node, f"{attr!r} is a dunder attribute, which reaches the interpreter's internals")
        elif attr in _FRAME_ATTRS:
            self.flag(
                node, f"{attr!r} reaches interpreter frames or code objects, and through them every module"
            )
        elif attr in _FILE_ATTRS:
            self.flag(node, f"{attr!r} reads or writes files, unpickles, or loads native code")
        elif attr in _STATE_ATTRS:
            what = (
                "reads attributes named inside a string"
                if attr.startswith("format")
                else ("changes process-wide or read-only state (views are read-only by their flags)")
            )
            self.flag(node, f"{attr!r} {what}")
        elif qualified is not None and qualified.startswith(API_MODULE + "."):
            name = qualified[len(API_MODULE) + 1 :].split(".")[0]
            if name not in api.__all__:
                self.flag(node, f"{name!r} is not part of {API_MODULE}")

    def _call(self, node: ast.Call, scope: _Scope | None) -> None:
        func = node.func
        if scope is not None and self._is_map_call(node):
            self.flag(
                node, "a Map is declared at module or class level, where the loader can see and carry it"
            )
        if isinstance(func, ast.Name):
            name = func.id
            if name in _GETATTR_LIKE:
                if len(node.args) < 2 or not (
                    isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                ):
                    self.flag(
                        node,
                        f"{name}() with a computed attribute name: the verifier cannot see what it reads",
                    )
                else:
                    self._attribute_rules(node, node.args[1].value, None)
                    if node.args[1].value.startswith("_"):
                        self.flag(
                            node,
                            f"{name}() of private attribute {node.args[1].value!r}: a policy reads the "
                            "public view only",
                        )
            elif name == "super" and (node.args or node.keywords):
                self.flag(node, "super() takes no arguments in a policy")
            elif scope is not None and name in scope.params:
                self.flag(
                    node,
                    f"calls argument {name!r}: calling a function passed in hides recursion from the "
                    "verifier",
                )
            elif (
                name not in self.functions
                and name not in self.classes
                and name not in self.imported
                and name not in SAFE_BUILTINS
                and name not in _FORBIDDEN_NAMES
                and name in self.bound
            ):
                self.flag(
                    node,
                    f"calls {name!r}, a function held in a variable: the verifier cannot see what it runs",
                )
        elif isinstance(func, ast.Lambda):
            self.flag(node, "calls a lambda directly: self-applied lambdas recurse without a name")
        elif not isinstance(func, ast.Attribute):
            self.flag(
                node,
                f"calls {ast.unparse(func)!r}, a function value computed at run time: the verifier cannot "
                "see what it runs",
            )

    # -- recursion --------------------------------------------------------------------------------------
    def _check_recursion(self) -> None:
        graph: dict[tuple[str, str], list[tuple[tuple[str, str], int]]] = {}
        defined = {("", f) for f in self.functions}
        for cls_name, cls in self.classes.items():
            defined.update((cls_name, s.name) for s in cls.body if isinstance(s, ast.FunctionDef))
        for src, dst, line in self.edges:
            if dst in defined:
                graph.setdefault(src, []).append((dst, line))
        state: dict[tuple[str, str], int] = {}  # 1 on the stack, 2 done
        stack: list[tuple[str, str]] = []
        reported: set[frozenset[tuple[str, str]]] = set()

        def label(key: tuple[str, str]) -> str:
            return f"{key[0]}.{key[1]}" if key[0] else key[1]

        def visit(node: tuple[str, str]) -> None:  # depth ≤ number of functions in one file
            state[node] = 1
            stack.append(node)
            for nxt, line in graph.get(node, []):
                if state.get(nxt) == 1:
                    cycle = stack[stack.index(nxt) :]
                    members = frozenset(cycle)
                    if members not in reported:
                        reported.add(members)
                        path = " → ".join(label(k) for k in (*cycle, nxt))
                        kind = "recursion" if len(cycle) == 1 else "mutual recursion"
                        self.flag(line, f"{kind} {path}: a hook must finish in a bounded number of steps")
                elif nxt not in state:
                    visit(nxt)
            stack.pop()
            state[node] = 2

        for node in sorted(graph):
            if node not in state:
                visit(node)


@dataclass
class _Scope:
    key: tuple[str, str]
    owner: str
    params: set[str]


def _load(node: ast.expr) -> ast.expr:
    """A copy of a target expression in Load context, to compare it with a loop's iterable."""
    return ast.parse(ast.unparse(node), mode="eval").body
