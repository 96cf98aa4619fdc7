"""The mechanism that turns policy advice into validated reservations."""

from gpuslice.scheduler.placer import Placer, Unplaced

__all__ = ["Placer", "Unplaced"]
