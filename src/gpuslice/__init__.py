"""gpuslice: open GPU sharing and scheduling."""

__version__ = "0.1.0"
