"""Load a verified policy file: check it, run it in a restricted namespace, find its one ops class.

```text
load_file(path) -> check_source (programs/verify; rejected -> PolicyRejected listing "file:line: message")
                -> compile once -> exec in {__builtins__: SAFE_BUILTINS only, imports through the allow-list}
                -> LoadedPolicy(family, name, sha256, ops_class, map_specs)
LoadedPolicy.instantiate(*args, maps=...) -> exec again in a fresh namespace, bind the maps, build the ops
```

Every instance gets its own namespace, so its module- and class-level ``Map`` declarations are its own;
``maps=`` hands in existing maps instead (a hot swap carries maps over, ``slot.py``). The restricted
namespace is defence in depth behind the verifier: a name the verifier let through by mistake still
finds no ``open``, ``exec`` or ``__import__`` of an unlisted module at run time.

``resolve(name_or_path, family, registry)`` is how every place that takes a built-in policy name also
takes a file: a name goes to the registry, a path (ends in ``.py`` or contains a path separator) is
loaded, its family checked, and wrapped in the runtime guard (``guard.py``).
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

from gpuslice.errors import UserError
from gpuslice.inputs import file_kind, read_text
from gpuslice.programs.maps import Map, MapError, MapSpec
from gpuslice.programs.verify import (
    ALLOWED_IMPORTS,
    SAFE_BUILTINS,
    Violation,
    check_source,
)

__all__ = [
    "LoadedPolicy",
    "PolicyFamilyMismatch",
    "PolicyInitError",
    "PolicyRejected",
    "is_policy_path",
    "load_file",
    "load_source",
    "memory_ops",
    "resolve",
]


class PolicyRejected(UserError):
    """The verifier rejected a policy file; ``violations`` says where and why."""

    http_status = 422  # the file arrived and was read, but its content is refused (RFC 9110, 15.5.21)

    def __init__(self, filename: str, violations: list[Violation]) -> None:
        self.filename = filename
        self.violations = violations
        lines = "\n".join(str(v) for v in violations)
        super().__init__(f"policy {filename} rejected ({len(violations)} violation(s)):\n{lines}")


class PolicyFamilyMismatch(UserError):
    """A policy file of one family was given where another family is expected."""


class PolicyInitError(UserError):
    """A verified policy failed while its module or its ops class was being set up."""


_LIBRARY_ROOTS = frozenset({"math", "numpy", "collections", "heapq"})  # libraries whose internals may import


def _allow_list_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> Any:
    """The restricted namespace's ``__import__``: the verifier's allow-list, enforced again at run time.

    C code called from a policy imports through it too (CPython looks ``__import__`` up in the calling
    frame's builtins): numpy's ``ndarray.min`` lazily imports ``numpy._core._methods``. So submodules of
    an allowed library are allowed here; policy source cannot name them (the verifier checks imports)."""
    root = name.partition(".")[0]
    library = name in ALLOWED_IMPORTS or (root in _LIBRARY_ROOTS and level == 0)
    if level != 0 or not library:
        raise ImportError(f"import of {name!r} is not allowed in a policy")
    allowed = ALLOWED_IMPORTS.get(name)
    for item in fromlist or ():
        if allowed is not None and item not in allowed:
            raise ImportError(f"{item!r} may not be imported from {name}")
    if fromlist:
        return importlib.import_module(name)
    return builtins.__import__(name, None, None, (), 0)


RESTRICTED_BUILTINS: Mapping[str, Any] = {
    **{name: getattr(builtins, name) for name in sorted(SAFE_BUILTINS)},
    "__build_class__": builtins.__build_class__,  # what a class statement calls
    "__import__": _allow_list_import,  # what an import statement calls
}


@dataclass(frozen=True)
class LoadedPolicy:
    """A verified, executable policy file. ``ops_class`` is the class from the first execution (for
    inspection); each ``instantiate`` runs the module afresh so instances never share state."""

    family: str
    name: str
    path: str
    source: str
    sha256: str
    ops_class: type
    map_specs: dict[str, MapSpec]
    code: CodeType = field(repr=False, compare=False)

    def new_maps(self) -> dict[str, Map]:
        """Fresh, empty maps for every declared map."""
        return {name: Map.from_spec(spec) for name, spec in self.map_specs.items()}

    def instantiate(self, *args: Any, maps: Mapping[str, Map] | None = None, **kwargs: Any) -> Any:
        """A new ops instance built with ``args``; ``maps`` (name -> Map) replaces the declared maps of
        the same name, which must have the same spec. PolicyInitError if the module or ``__init__`` fails."""
        given = dict(maps or {})
        for name, live in given.items():
            if name not in self.map_specs:
                raise MapError(f"policy {self.name} declares no map {name!r}")
            if live.spec() != self.map_specs[name]:
                raise MapError(
                    f"map {name!r} is {live.spec()}, policy {self.name} declares {self.map_specs[name]}"
                )
        namespace = _execute(self.code, self.path)
        cls = namespace[self.ops_class.__name__]
        for name in self.map_specs:
            live = given[name] if name in given else Map.from_spec(self.map_specs[name])
            if isinstance(namespace.get(name), Map):
                namespace[name] = live  # a module-level map: the hooks read it as a global
            else:
                setattr(cls, name, live)  # a class-level map
        try:
            return cls(*args, **kwargs)
        except Exception as err:  # the policy's own __init__: reported to the user, nothing is attached
            raise PolicyInitError(
                f"policy {self.name} ({self.path}) failed in __init__: {type(err).__name__}: {err}"
            ) from err


def _execute(code: CodeType, path: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {
        "__builtins__": dict(RESTRICTED_BUILTINS),
        "__name__": f"gpuslice_policy:{path}",
    }
    try:
        exec(code, namespace)  # verified source, restricted builtins: see the module docstring
    except Exception as err:
        raise PolicyInitError(f"policy {path} failed while loading: {type(err).__name__}: {err}") from err
    return namespace


def load_source(source: str, filename: str) -> LoadedPolicy:
    """Verify ``source`` and load it; PolicyRejected lists every violation, nothing is run before."""
    report = check_source(source, filename)
    return _load(report, source, filename)


def load_file(path: str | Path) -> LoadedPolicy:
    """Verify and load the policy file at ``path``."""
    return load_source(read_text(path, "policy file"), str(path))  # read once: what is checked is run


def _load(report: Any, source: str, filename: str) -> LoadedPolicy:
    if not report.ok:
        raise PolicyRejected(filename, report.violations)
    code = compile(source, filename, "exec", dont_inherit=True)
    namespace = _execute(code, filename)
    cls = namespace[report.class_name]
    own_name = vars(cls).get("name")
    return LoadedPolicy(
        family=report.family,
        name=own_name if isinstance(own_name, str) else cls.__name__,
        path=filename,
        source=source,
        sha256=hashlib.sha256(source.encode("utf-8")).hexdigest(),
        ops_class=cls,
        map_specs=dict(report.maps),
        code=code,
    )


def is_policy_path(text: str) -> bool:
    """Whether a ``--policy``-style value names a file rather than a built-in policy."""
    return text.endswith(".py") or "/" in text or "\\" in text


def load_for_family(path: str | Path, family: str | tuple[str, ...]) -> LoadedPolicy:
    """``load_file`` that also checks the policy's family; PolicyFamilyMismatch says what was expected."""
    loaded = load_file(path)
    families = (family,) if isinstance(family, str) else family
    if loaded.family not in families:
        raise PolicyFamilyMismatch(
            f"{path} is a {loaded.family} policy; a {' or '.join(families)} policy is needed here"
        )
    return loaded


def resolve(
    name_or_path: str,
    family: str,
    registry: Callable[[str], Any],
    guard_config: Any = None,
    on_event: Callable[[str], None] | None = None,
) -> Callable[..., Any]:
    """A factory for the policy ``name_or_path``: the registry's class for a name, or for a file a
    function that builds the file's ops guarded (defaults: the family's base ops decide on a fault).

    The factory takes what the family's classes take: placement ``(view, context)``, queue and memory
    ``()``. ``registry`` is the family's lookup, e.g. ``PLACEMENT.lookup`` (every family's
    ``registry.Registry`` raises UnknownPolicy listing the known names)."""
    if not is_policy_path(name_or_path):
        return registry(name_or_path)
    return _file_factory(name_or_path, family, guard_config, on_event)


def _file_factory(
    path: str, family: str, guard_config: Any, on_event: Callable[[str], None] | None
) -> Callable[..., Any]:
    if file_kind(path) == "missing":  # a folder or FIFO is named as such by read_text
        raise UserError(f"policy file {path} does not exist")
    loaded = load_for_family(path, family)
    from gpuslice.programs.guard import guarded_factory  # guard imports this module

    return guarded_factory(loaded, config=guard_config, on_event=on_event)


def memory_ops(
    evict: str | None = None,
    prefetch: str | None = None,
    guard_config: Any = None,
    on_event: Callable[[str], None] | None = None,
) -> Any:
    """``memory.make_ops`` where either half may also be a policy file (``memsim --evict FILE``): names go to
    the memory registries (UnknownMemoryPolicy lists them), files are loaded for their family and guarded
    with the driver as the default (also for a half not named)."""
    from gpuslice.memory.hooks import Composed
    from gpuslice.memory.policies import DEFAULT_EVICTION, DEFAULT_PREFETCH, make_ops

    evict = evict or DEFAULT_EVICTION
    prefetch = prefetch or DEFAULT_PREFETCH

    evict_file = prefetch_file = None
    if is_policy_path(evict):
        evict_file = _file_factory(evict, "eviction", guard_config, on_event)()
    if is_policy_path(prefetch):
        prefetch_file = _file_factory(prefetch, "prefetch", guard_config, on_event)()
    named = make_ops(
        DEFAULT_EVICTION if evict_file else evict, DEFAULT_PREFETCH if prefetch_file else prefetch
    )
    return Composed(evict_file or named.evict, prefetch_file or named.prefetch)
