"""What a policy file may use: the import allow-list, the safe builtins, and the names and attributes
that are refused with the reason each message gives. The rule modules read these; the loader's
restricted namespace is built from ``ALLOWED_IMPORTS`` and ``SAFE_BUILTINS``."""

from __future__ import annotations

from gpuslice.programs import api

__all__ = [
    "ALLOWED_IMPORTS",
    "API_MODULE",
    "CONST_CALLS",
    "FAMILIES",
    "FILE_ATTRS",
    "FORBIDDEN_NAMES",
    "FRAME_ATTRS",
    "GETATTR_LIKE",
    "GROWERS",
    "HELPER_DUNDERS",
    "MAX_POW_EXPONENT",
    "MAX_SOURCE_BYTES",
    "MEMORY_KINDS",
    "METHOD_DECORATORS",
    "OPS_BASES",
    "OPS_DUNDERS",
    "SAFE_BUILTINS",
    "STATE_ATTRS",
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
FORBIDDEN_NAMES = {
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
GETATTR_LIKE = frozenset({"getattr", "hasattr"})
FRAME_ATTRS = frozenset(
    {
        "gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
        "f_globals", "f_locals", "f_builtins", "f_back", "f_code", "f_trace", "tb_frame", "tb_next",
        "co_code", "func_globals", "func_code", "mro",
    }
)  # fmt: skip
FILE_ATTRS = frozenset(
    {
        "load", "loads", "save", "savez", "savez_compressed", "loadtxt", "savetxt", "genfromtxt", "fromfile",
        "tofile", "fromregex", "memmap", "DataSource", "dump", "dumps", "ctypeslib", "ctypes", "lib", "core",
        "f2py", "testing", "distutils", "show_config", "show_runtime", "get_include", "lookfor", "info",
        "source",
    }
)  # fmt: skip
STATE_ATTRS = frozenset(
    {"flags", "setflags", "base", "data", "resize", "itemset", "seterr", "seterrcall", "setbufsize",
     "set_printoptions", "set_string_function", "seed", "format", "format_map"}
)  # fmt: skip
OPS_DUNDERS = frozenset({"__init__"})
HELPER_DUNDERS = frozenset(
    {"__init__", "__post_init__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__hash__"}
)
METHOD_DECORATORS = frozenset({"staticmethod", "classmethod", "property"})
GROWERS = frozenset({"append", "extend", "insert", "appendleft", "extendleft", "add", "update", "setdefault"})
CONST_CALLS = frozenset({"frozenset", "int", "float", "str", "bool"})
MAX_POW_EXPONENT = 64  # module constants are computed at load; a literal tower of powers would hang it
MEMORY_KINDS = {"evict": "eviction", "prefetch": "prefetch"}
OPS_BASES = ("PlacementOps", "QueueOps", "MemoryOps")  # the API classes an ops class extends
