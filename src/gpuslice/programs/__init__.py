"""Policies as programs: verify a policy file, load it, run it under a guard, swap it while running.

``api`` is what a policy file imports; ``verify`` (a package: a driver and one function per rule) checks
a file without running it; ``loader`` runs a verified file in a restricted namespace; ``maps`` holds the
bounded typed state a policy declares; ``guard`` (and ``guard_memory`` for the memory families) times
and validates every hook call and detaches a faulty policy; ``slot`` holds the active policy of one
family in a running system and swaps it atomically; ``export`` writes a built-in policy as a file.
``policy_process`` (the server's side) and ``policy_worker`` (the worker's) run a placement or queue
file in a worker process with a memory limit, killed past its budget; ``guard_isolated`` puts the guard
in front of it. See
docs/policy-authors-guide.md.
"""

__all__: list[str] = []  # the modules are the API: api (for policy files), verify, loader, guard, export
