"""``gpuslice serve``: the store, the daemon loop, token auth and the REST API (serve-design.md)."""

__all__: list[str] = []
