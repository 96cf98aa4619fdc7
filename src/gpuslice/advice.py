"""The one rule for a policy's advice, in every family: the mechanism asks, checks, and falls back.

```text
answer = hook(...)              # the policy's advice
    raised                  -> default(), fallback "exception"
    check(answer) False     -> default(), fallback "invalid"
    check(answer) "reason"  -> default() (or repair(answer)), fallback "reason"
    otherwise               -> answer,    fallback None
```

A check says why it refuses by returning the reason as a string (the placer counts ``"nan"``, ``"wrong
shape"``, a ledger refusal's text); ``repair`` turns a refused answer into a usable one where that keeps
more of the policy's advice than the default would (NaN scores ranked below every real score).

Nothing a policy returns or raises reaches the caller as an exception: a wrong policy costs quality,
never correctness (sched_ext's rule: the core ignores an impossible choice, uses its own, and counts it).
Each family counts the fallback where its metrics live (the placer's ``fallbacks[(hook, reason)]``, the
queue's ``fallbacks[hook]``, a MIG plan's ``fallbacks[reason]``, a GPU-set choice's ``fallback`` text).
Used by the placement (``scheduler/placer.py``), queue (``policies/queue/base.py``), GPU-set
(``policies/gpuset/base.py``) and MIG placement (``policies/mig_placement.py``) mechanisms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["EXCEPTION", "INVALID", "Advice", "ask"]

T = TypeVar("T")

EXCEPTION = "exception"  # the hook raised
INVALID = "invalid"  # the hook returned something the family's check refuses


@dataclass(frozen=True, slots=True)
class Advice(Generic[T]):
    """What the mechanism goes on with: the policy's answer, or the default's and why."""

    value: T
    fallback: str | None = None  # None: the policy's own answer; else EXCEPTION or INVALID
    error: Exception | None = None  # what the hook raised, for messages

    @property
    def followed(self) -> bool:
        return self.fallback is None


def ask(
    hook: Callable[[], T],
    check: Callable[[T], bool | str],
    default: Callable[[], T],
    repair: Callable[[T], T] | None = None,
) -> Advice[T]:
    """Call ``hook``; keep its answer if ``check`` accepts it, else use ``default()`` and say why.

    ``check`` returns True to accept, False (``INVALID``) or a reason string to refuse; raising counts
    as refusing (a malformed answer can break the check itself). ``repair(answer)``, when given, replaces
    the default for an answer refused with a reason."""
    try:
        answer = hook()
    except Exception as err:  # a crashing policy must not take the mechanism down
        return Advice(default(), EXCEPTION, err)
    try:
        verdict = check(answer)
    except Exception:
        verdict = False
    if isinstance(verdict, str):
        return Advice(repair(answer) if repair is not None else default(), verdict or INVALID)
    return Advice(answer) if verdict else Advice(default(), INVALID)
