"""Policies as programs: verify a policy file, load it, run it under a guard, swap it while running.

``api`` is what a policy file imports; ``verify`` (a package: a driver and one function per rule) checks
a file without running it; ``loader`` runs a verified file in a restricted namespace; ``maps`` holds the
bounded typed state a policy declares; ``guard`` (and ``guard_memory`` for the memory families) times
and validates every hook call and detaches a faulty policy; ``slot`` holds the active policy of one
family in a running system and swaps it atomically; ``export`` writes a built-in policy as a file. See
docs/policy-authors-guide.md.
"""

__all__: list[str] = []  # the modules are the API: api (for policy files), verify, loader, guard, export
