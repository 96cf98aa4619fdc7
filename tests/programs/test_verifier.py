"""The verifier rejects each trick in the catalogue at its exact line, and accepts real policies.

Every bad policy is a small complete file; the offending line carries the marker ``# <-`` and the test
checks that a violation is reported on that line whose sentence names the problem.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuslice.programs.export import export_source, exportable
from gpuslice.programs.verify import MAX_SOURCE_BYTES, check_file, check_source

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("placement", "queue", "eviction", "prefetch")
EXPORTABLE = [(family, name) for family in FAMILIES for name in exportable(family)]
EXAMPLES = sorted((ROOT / "examples/policies").glob("*.py"))

HEAD = """\
from gpuslice.programs.api import PlacementOps
import numpy as np
"""


def hook(body: str, extra: str = "") -> str:
    """A placement policy whose score hook runs ``body``; ``extra`` goes into the class body."""
    return (
        HEAD
        + "\n\nclass P(PlacementOps):\n    name = 'p'\n"
        + textwrap.indent(textwrap.dedent(extra), "    ")
        + "\n    def score(self, view, req, nodes):\n"
        + textwrap.indent(textwrap.dedent(body), "        ")
        + "\n        return np.zeros(len(nodes))\n"
    )


def module(top: str, body: str = "pass") -> str:
    """A placement policy with ``top`` at module level (before the class)."""
    return (
        HEAD
        + textwrap.dedent(top)
        + "\n\nclass P(PlacementOps):\n    def score(self, view, req, nodes):\n        "
        + body
        + "\n"
    )


CATALOGUE: list[tuple[str, str, str]] = [
    # -- imports: file, network, process, environment ------------------------------------------------
    ("import_os", module("import os  # <-"), "import of 'os' is not allowed"),
    ("from_subprocess_import_run", module("from subprocess import run  # <-"), "import of 'subprocess'"),
    ("import_socket_inside_hook", hook("import socket  # <-"), "import of 'socket'"),
    ("import_pathlib_under_alias", module("import pathlib as p  # <-"), "import of 'pathlib'"),
    ("import_importlib", module("import importlib  # <-"), "import of 'importlib'"),
    ("import_ctypes", module("import ctypes  # <-"), "import of 'ctypes'"),
    ("relative_import", module("from . import sibling  # <-"), "relative imports"),
    ("star_import_hides_names", module("from math import *  # <-"), "import *"),
    (
        "typing_get_type_hints_evaluates_strings",
        module("from typing import get_type_hints  # <-"),
        "may not be imported from typing",
    ),
    (
        "import_typing_whole_reaches_get_type_hints",
        module("import typing  # <-"),
        "import names from typing one by one",
    ),
    (
        "import_whole_gpuslice_package",
        module("import gpuslice.programs.api  # <-"),
        "binds the whole package",
    ),
    (
        "api_name_that_does_not_exist",
        module("from gpuslice.programs.api import Ledger  # <-"),
        "may not be imported from gpuslice.programs.api",
    ),
    ("name_of_unimported_module", hook("os.system('true')  # <-"), "name 'os' is not defined"),
    # -- builtins that run code, touch files, or expose namespaces -----------------------------------
    ("open_a_file", hook("open('/etc/passwd')  # <-"), "open() reads and writes files"),
    ("exec_a_string", hook("exec('x = 1')  # <-"), "exec() runs code"),
    ("eval_a_string", hook("eval('1 + 1')  # <-"), "eval() runs code"),
    ("compile_code", hook("compile('1', 'f', 'eval')  # <-"), "compile() builds code"),
    ("dunder_import", hook("__import__('os')  # <-"), "__import__() imports modules"),
    ("globals_namespace", hook("globals()['P'] = None  # <-"), "globals() exposes"),
    ("vars_namespace", hook("vars(self)  # <-"), "vars() exposes"),
    ("builtins_dict", hook("__builtins__['open']  # <-"), "__builtins__ reaches every builtin"),
    ("type_reaches_class_internals", hook("type(self)  # <-"), "type() reaches class internals"),
    (
        "iter_with_sentinel",
        hook("for x in iter(int, 1):  # <-\n    pass"),
        "iter(callable, sentinel) can loop forever",
    ),
    ("print_does_io", hook("print(nodes)  # <-"), "print() writes to the terminal"),
    # -- attribute tricks ---------------------------------------------------------------------------
    ("getattr_with_computed_name", hook("getattr(view, 'fi' + 'ts')  # <-"), "computed attribute name"),
    ("getattr_passed_as_value", hook("g = getattr  # <-"), "passes 'getattr' around as a value"),
    ("setattr_by_name", hook("setattr(self, 'x', 1)  # <-"), "setattr() sets attributes by computed name"),
    ("getattr_of_dunder_literal", hook("getattr(self, '__class__')  # <-"), "dunder attribute"),
    (
        "class_subclasses_walk",
        hook("().__class__.__base__.__subclasses__()  # <-"),
        "dunder attributes reach",
    ),
    ("method_globals", hook("self.score.__globals__  # <-"), "dunder attributes reach"),
    ("private_attribute_of_the_view", hook("view._ledger  # <-"), "private attribute 'view._ledger'"),
    ("generator_frame_walk", hook("[x for x in nodes].copy().gi_frame  # <-"), "interpreter frames"),
    ("numpy_load_reads_a_file", hook("np.load('weights.npy')  # <-"), "reads or writes files"),
    ("masked_array_loads_unpickles", hook("np.ma.loads(b'')  # <-"), "reads or writes files"),
    ("ndarray_tofile_writes_a_file", hook("nodes.tofile('x')  # <-"), "reads or writes files"),
    (
        "make_read_only_view_writeable",
        hook("view.free_gpu_milli.flags.writeable = True  # <-"),
        "'flags' changes process-wide or read-only state",
    ),
    ("setflags_on_a_view", hook("view.free_cpu_milli.setflags(write=True)  # <-"), "'setflags' changes"),
    ("array_base_reaches_the_ledger", hook("view.free_cpu_milli.base  # <-"), "'base' changes"),
    (
        "numpy_seterr_changes_the_process",
        hook("np.seterr(all='raise')  # <-"),
        "'seterr' changes process-wide",
    ),
    (
        "str_format_reads_attributes",
        hook("'{0.view}'.format(self)  # <-"),
        "reads attributes named inside a string",
    ),
    ("write_into_the_view", hook("view.version[0] = 5  # <-"), "writes into argument 'view'"),
    # -- termination --------------------------------------------------------------------------------
    (
        "direct_recursion",
        hook("", extra="def helper(self, n):\n    return self.helper(n)  # <-\n"),
        "recursion P.helper → P.helper",
    ),
    (
        "mutual_recursion_through_self",
        hook(
            "",
            extra="def a(self):\n    return self.b()\ndef b(self):\n    return self.a()  # <-\n",
        ),
        "mutual recursion",
    ),
    (
        "mutual_recursion_of_module_functions",
        module(
            "def even(n):\n    return odd(n)\n\n\ndef odd(n):\n    return even(n)  # <-",
        ),
        "mutual recursion even → odd → even",
    ),
    (
        "recursion_through_a_passed_function",
        hook("", extra="def apply(self, f):\n    return f(f)  # <-\n"),
        "calls argument 'f'",
    ),
    ("self_applied_lambda", hook("(lambda f: f(f))(lambda f: f(f))  # <-"), "calls a lambda directly"),
    (
        "lambda_kept_in_a_variable",
        hook("f = lambda: 1  # <-"),
        "a lambda may only be passed straight to a call",
    ),
    ("while_true", hook("while True:  # <-\n    pass"), "while loops are not allowed"),
    (
        "loop_grows_the_list_it_walks",
        hook("xs = [1]\nfor x in xs:\n    xs.append(x)  # <-"),
        "grows 'xs' while iterating",
    ),
    (
        "comprehension_grows_its_list",
        hook("xs = [1]\n[xs.append(x) for x in xs]  # <-"),
        "grows 'xs' while iterating",
    ),
    ("generator_hook", hook("yield 1  # <-"), "yield makes a generator"),
    (
        "async_hook",
        module("", "pass")
        .replace("    def score", "    async def score  # <-\n    def score_", 1)
        .replace(
            "async def score  # <-\n    def score_(self, view, req, nodes):",
            "async def score(self, view, req, nodes):  # <-",
        ),
        "async methods are not allowed",
    ),
    # -- hidden state ------------------------------------------------------------------------------
    ("module_level_mutable_dict", module("CACHE = {}  # <-"), "module-level CACHE is not a constant"),
    (
        "module_level_code_runs_at_load",
        module("np.seterr(all='ignore')  # <-"),
        "module-level code runs once at load",
    ),
    ("module_level_power_tower", module("BIG = 10 ** 10 ** 10  # <-"), "module-level BIG is not a constant"),
    ("global_statement", hook("global COUNT  # <-"), "'global COUNT' writes state outside the function"),
    ("closure_inside_a_hook", hook("def inner():  # <-\n    return 1"), "defined inside a function"),
    ("class_level_mutable_list", hook("", extra="seen = []  # <-\n"), "class P-level seen is not a constant"),
    (
        "mutable_default_argument",
        module("", "pass").replace(
            "def score(self, view, req, nodes):", "def score(self, view, req, nodes, cache={}):  # <-"
        ),
        "default argument '{}' is not a constant",
    ),
    (
        "map_created_in_a_hook",
        HEAD.replace("PlacementOps", "PlacementOps, Map")
        + textwrap.dedent("""

        class P(PlacementOps):
            def __init__(self, view, context):
                super().__init__(view, context)
                self.m = Map(key=int, value=int, max_entries=4)  # <-
        """),
        "a Map is declared at module or class level",
    ),
    (
        "map_of_unsupported_type",
        HEAD.replace("PlacementOps", "PlacementOps, Map")
        + "\n\nclass P(PlacementOps):\n    m = Map(key=list, value=int, max_entries=4)  # <-\n",
        "Map key= must be int, float, str or bool",
    ),
    (
        "map_without_a_bound",
        HEAD.replace("PlacementOps", "PlacementOps, Map")
        + "\n\nclass P(PlacementOps):\n    m = Map(key=int, value=int)  # <-\n",
        "declares all of key=, value= and max_entries=",
    ),
    # -- swallowing the guard, code outside hooks ---------------------------------------------------
    (
        "bare_except_swallows_the_timeout",
        hook("try:\n    pass\nexcept:  # <-\n    pass"),
        "bare except would swallow",
    ),
    (
        "except_base_exception",
        hook("try:\n    pass\nexcept BaseException:  # <-\n    pass"),
        "'except BaseException' would swallow",
    ),
    (
        "except_tuple_naming_base_exception",
        hook("try:\n    pass\nexcept (ValueError, BaseException):  # <-\n    pass"),
        "'except (ValueError, BaseException)' would swallow",
    ),
    (
        "except_nested_tuple_naming_base_exception",
        hook("try:\n    pass\nexcept (ValueError, (KeyError, BaseException)):  # <-\n    pass"),
        "'except (ValueError, (KeyError, BaseException))' would swallow",
    ),
    (
        "del_method_runs_at_garbage_collection",
        hook("", extra="def __del__(self):  # <-\n    pass\n"),
        "method __del__ is not allowed",
    ),
    (
        "metaclass_keyword",
        module("", "pass").replace("class P(PlacementOps):", "class P(PlacementOps, metaclass=type):  # <-"),
        "metaclasses and class keywords are not allowed",
    ),
    (
        "decorator_runs_code_at_load",
        hook("", extra="@np.vectorize  # <-\ndef f(self):\n    return 1\n"),
        "decorator 'np.vectorize' is not allowed",
    ),
    # -- shape of the file --------------------------------------------------------------------------
    (
        "no_ops_class",
        "from gpuslice.programs.api import PlacementOps  # <-\n\n\ndef score():\n    return 1\n",
        "defines no ops class",
    ),
    (
        "two_ops_classes",
        module("", "pass") + "\n\nclass Q(PlacementOps):  # <-\n    pass\n",
        "second ops class",
    ),
    (
        "memory_policy_without_kind",
        "from gpuslice.programs.api import MemoryOps\n\n\nclass M(MemoryOps):  # <-\n    name = 'm'\n",
        "must say which half it implements",
    ),
    ("syntax_error", HEAD + "\ndef f(:  # <-\n", "syntax error"),
]


def marked_line(source: str) -> int:
    lines = [i for i, text in enumerate(source.splitlines(), start=1) if "# <-" in text]
    assert len(lines) == 1, f"case must mark exactly one line:\n{source}"
    return lines[0]


@pytest.mark.parametrize(("source", "problem"), [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_verifier_rejects_trick_at_its_line_with_a_sentence_naming_it(source: str, problem: str) -> None:
    report = check_source(source, "bad.py")
    line = marked_line(source)
    assert not report.ok
    at_line = [v for v in report.violations if v.line == line]
    assert any(problem in v.message for v in at_line), (
        f"expected {problem!r} at line {line}; got:\n" + "\n".join(map(str, report.violations))
    )
    assert all(str(v).startswith(f"bad.py:{v.line}: ") for v in report.violations)


def test_catalogue_covers_at_least_25_distinct_tricks() -> None:
    assert len({name for name, _, _ in CATALOGUE}) == len(CATALOGUE) >= 25


def test_a_file_larger_than_the_limit_is_rejected_at_line_1() -> None:
    source = module("") + "#" * MAX_SOURCE_BYTES
    report = check_source(source, "big.py")
    assert [v.line for v in report.violations] == [1]
    assert "larger than" in report.violations[0].message


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_verifier_accepts_the_examples(path: Path) -> None:
    report = check_file(path)
    assert report.ok, "\n".join(map(str, report.violations))
    assert report.family in FAMILIES
    assert report.class_name


@pytest.mark.parametrize(("family", "name"), EXPORTABLE, ids=lambda x: x)
def test_verifier_accepts_every_exportable_builtin_as_a_file_of_its_family(family: str, name: str) -> None:
    report = check_source(export_source(name, family), f"{name}.py")
    assert report.ok, "\n".join(map(str, report.violations))
    assert report.family == family and report.class_name


def test_report_names_family_class_and_maps() -> None:
    report = check_file(ROOT / "examples/policies/refault_protect.py")
    assert (report.family, report.class_name) == ("eviction", "RefaultProtect")
    assert str(report.maps["activations"]) == "Map(key=int, value=int, max_entries=65536)"
    assert report.summary().endswith("(activations: Map(key=int, value=int, max_entries=65536))")


def test_every_family_is_recognised() -> None:
    families = {check_source(export_source(n, f), f"{n}.py").family for f, n in EXPORTABLE}
    assert families == set(FAMILIES)


def test_attribute_of_a_hook_argument_named_like_a_method_is_not_recursion() -> None:
    # job.spec.priority is data, not a call of the policy's own priority(): no false recursion
    report = check_source(export_source("priority-fair"), "priority_fair.py")
    assert report.ok
