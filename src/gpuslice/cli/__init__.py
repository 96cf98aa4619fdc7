"""Command line: parse, wire, present. One command per module; ``main`` is the console script."""
