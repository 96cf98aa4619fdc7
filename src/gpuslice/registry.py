"""One registry shape for every policy family: a read-only mapping from a policy's name to its class.

```python
PLACEMENT = Registry("placement", (BestFit, Clustering, ...))
PLACEMENT["fgd"]           # -> the class FGD
PLACEMENT.lookup("fdg")    # UnknownPolicy: 'fdg' is not a placement policy; known: bestfit, clustering, ...
```

Every family (placement, GPU set, MIG placement, queue, memory eviction and prefetch) registers its
classes here, so a lookup always returns a class (the caller builds the instance it needs) and an unknown
name always raises the same error listing the known names, in the order the family registered them.
Adding a policy means one new file and one entry in its family's tuple.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from gpuslice.errors import UnknownPolicy

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, type[T]], Generic[T]):
    """Policy classes of one family by their ``name`` attribute; unknown names raise ``error``.

    ``family`` is the phrase used in the message ("placement", "GPU-set", "eviction"); ``error`` is
    UnknownPolicy or a subclass of it (the memory families raise UnknownMemoryPolicy)."""

    def __init__(
        self, family: str, classes: Iterable[type[T]], error: type[UnknownPolicy] = UnknownPolicy
    ) -> None:
        self.family = family
        self.error = error
        self._classes: dict[str, type[T]] = {}
        for cls in classes:
            name = getattr(cls, "name", None)
            if not isinstance(name, str) or not name:
                raise TypeError(f"{cls.__name__} has no policy name")
            if name in self._classes:
                raise TypeError(f"two {family} policies are called {name!r}")
            self._classes[name] = cls

    def lookup(self, name: str) -> type[T]:
        """The class registered as ``name``; ``error`` lists the known names otherwise."""
        try:
            return self._classes[name]
        except KeyError:
            known = ", ".join(self._classes)
            raise self.error(f"{name!r} is not a {self.family} policy; known: {known}") from None

    def __getitem__(self, name: str) -> type[T]:
        return self.lookup(name)

    def get(self, name: str, default: type[T] | None = None) -> type[T] | None:  # type: ignore[override]
        return self._classes.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {list(self._classes)})"
