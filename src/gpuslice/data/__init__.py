"""Data files shipped inside the package (the openb default trace; see openb/README.md)."""

__all__: list[str] = []
