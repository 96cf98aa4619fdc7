"""What an estimate returns: named components in bytes per GPU, and the settings that produced them."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Component", "Estimate"]


@dataclass(frozen=True, slots=True)
class Component:
    """One part of a GPU's memory: ``key`` for JSON (``kv_cache``), ``label`` for people, bytes per GPU."""

    key: str
    label: str
    bytes_per_gpu: int
    note: str  # how it was computed, with the formula's source


@dataclass(frozen=True, slots=True)
class Estimate:
    """Per-GPU memory of one model in one mode over ``gpus`` GPUs; ``settings`` echo the inputs used."""

    model: str
    mode: str  # "inference" | "training"
    gpus: int
    components: tuple[Component, ...]
    settings: dict[str, object] = field(default_factory=dict)
    parameters: int = 0
    active_parameters: int = 0
    parameter_source: str = "given with --params"  # how ``parameters`` was counted

    @property
    def total_bytes_per_gpu(self) -> int:
        return sum(c.bytes_per_gpu for c in self.components)

    def component(self, key: str) -> Component:
        for c in self.components:
            if c.key == key:
                return c
        raise KeyError(key)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: every component in bytes per GPU plus ``total_bytes_per_gpu``."""
        return {
            "model": self.model,
            "mode": self.mode,
            "gpus": self.gpus,
            "parameters": self.parameters,
            "active_parameters": self.active_parameters,
            "parameter_source": self.parameter_source,
            "settings": dict(self.settings),
            "components": {c.key: c.bytes_per_gpu for c in self.components},
            "total_bytes_per_gpu": self.total_bytes_per_gpu,
        }
