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

Layout: ``driver.py`` walks the file once and hands each node to its rules; each rule is one function in
``imports``, ``declarations``, ``classes``, ``statements``, ``expressions``, ``names``, ``calls`` or
``recursion``; ``allowlists`` holds what a policy may name, ``context`` what the rules know about the file.

What is left to run time, honestly: Python cannot be fully analysed, so the loader also runs the file
with a restricted ``__builtins__`` and an allow-list importer (defence in depth), the guard times every
hook and interrupts one that overruns, and Python's recursion limit turns recursion the call graph cannot
see (a method reached through another object that happens to be ``self``) into an exception the guard
counts.
"""

from gpuslice.programs.verify.allowlists import (
    ALLOWED_IMPORTS,
    API_MODULE,
    FAMILIES,
    MAX_SOURCE_BYTES,
    SAFE_BUILTINS,
)
from gpuslice.programs.verify.driver import check_file, check_source
from gpuslice.programs.verify.report import CheckReport, Violation

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
