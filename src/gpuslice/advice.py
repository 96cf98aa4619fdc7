"""The one rule for a policy's advice, in every family: the mechanism asks, checks, and falls back.

```text
answer = hook(...)              # the policy's advice
    raised                  -> default(), fallback Fallback.EXCEPTION
    check(answer) False     -> default(), fallback Fallback.INVALID
    check(answer) a code    -> default() (or repair(answer)), fallback that code
    otherwise               -> answer,    fallback None
```

A check says why it refuses by returning a ``Fallback`` code (the placer's ``NAN``, ``WRONG_SHAPE``,
``DOES_NOT_FIT``); ``repair`` turns a refused answer into a usable one where that keeps more of the
policy's advice than the default would (NaN scores ranked below every real score). The codes are the one
vocabulary of fallbacks and of the runtime guard's faults (``programs/guard.py``); each is a string (its
value), so the counts keyed by them read the same in results, metrics and JSON.

Nothing a policy returns or raises reaches the caller as an exception: a wrong policy costs quality,
never correctness (sched_ext's rule: the core ignores an impossible choice, uses its own, and counts it).
Each family counts the fallback where its metrics live (the placer's ``fallbacks[(hook, reason)]``, the
queue's ``fallbacks[hook]``, a MIG plan's ``fallbacks[reason]``, a GPU-set choice's ``fallback`` text).
Used by the placement (``scheduler/placer.py``), queue (``policies/queue/base.py``), GPU-set
(``policies/gpuset/base.py``) and MIG placement (``policies/mig_placement.py``) mechanisms.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["EXCEPTION", "INVALID", "Advice", "Fallback", "ask"]

T = TypeVar("T")


class Fallback(enum.StrEnum):
    """Why the mechanism did not follow a policy's answer (the value is the label counted)."""

    EXCEPTION = "exception"  # the hook raised
    INVALID = "invalid"  # the hook returned something the family's check refuses
    NAN = "nan"  # scores with NaN in them
    WRONG_SHAPE = "wrong shape"  # an array of the wrong shape
    NOT_GPU_INDICES = "not GPU indices"
    GPU_NOT_USABLE = "GPU not usable"  # a GPU the home does not let the request use
    TOPOLOGY_NEED_NOT_MET = "topology need not met"
    DOES_NOT_FIT = "does not fit"  # the ledger refuses the GPUs it chose (``Ledger.check``)
    # The runtime guard's faults (``programs/guard.py``): the hook ran too long, ran out of memory, was
    # still running from an abandoned call, or its worker process died.
    TIMEOUT = "timeout"
    OVERRUN = "overrun"
    MEMORY = "memory"
    BUSY = "busy"
    CRASH = "crash"
    RESTARTING = "restarting"  # no worker process yet after a kill: counted, not a step towards detaching


EXCEPTION = Fallback.EXCEPTION
INVALID = Fallback.INVALID


@dataclass(frozen=True, slots=True)
class Advice(Generic[T]):
    """What the mechanism goes on with: the policy's answer, or the default's and why."""

    value: T
    fallback: Fallback | None = None  # None: the policy's own answer
    error: Exception | None = None  # what the hook raised, for messages

    @property
    def followed(self) -> bool:
        return self.fallback is None


def ask(
    hook: Callable[[], T],
    check: Callable[[T], bool | Fallback],
    default: Callable[[], T],
    repair: Callable[[T], T] | None = None,
) -> Advice[T]:
    """Call ``hook``; keep its answer if ``check`` accepts it, else use ``default()`` and say why.

    ``check`` returns True to accept, False (``INVALID``) or a ``Fallback`` code to refuse; raising
    counts as refusing (a malformed answer can break the check itself). ``repair(answer)``, when given,
    replaces the default for an answer refused with a code."""
    try:
        answer = hook()
    except Exception as err:  # a crashing policy must not take the mechanism down
        return Advice(default(), EXCEPTION, err)
    try:
        verdict = check(answer)
    except Exception:
        verdict = False
    if isinstance(verdict, Fallback):
        return Advice(repair(answer) if repair is not None else default(), verdict)
    if isinstance(verdict, str):  # only a code names a reason: any other text refuses plainly
        verdict = False
    return Advice(answer) if verdict else Advice(default(), INVALID)
