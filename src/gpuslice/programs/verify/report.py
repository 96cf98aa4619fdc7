"""The verifier's answer for one file: every violation (file, line, one sentence) and what it found."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuslice.programs.maps import MapSpec

__all__ = ["CheckReport", "Violation"]


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
