"""Why a job waits: the one refusal record (``ledger.placement.Refusal``: a code and its amounts) plus the
sentence shown to people.

The code is chosen where the decision is made (the scheduler knows whether it ran out of GPU memory or hit
a quota) and travels typed to the metrics, whose ``reason`` label (``RefusalCode.label``) must be small
and stable; the sentence carries sizes and job ids for people. Nothing turns a sentence back into a code,
so rewording a message never changes a metric or an alert.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuslice.ledger.placement import Refusal, RefusalCode

__all__ = ["PendingReason"]


@dataclass(frozen=True, slots=True)
class PendingReason:
    """``refusal``: the code and amounts on serve's one machine (node 0); ``text``: the sentence."""

    refusal: Refusal
    text: str

    @classmethod
    def of(cls, code: RefusalCode, text: str) -> PendingReason:
        """A reason whose code names no amounts (a quota's, a queue head's: the sentence has them)."""
        return cls(Refusal(code, 0), text)

    @property
    def code(self) -> RefusalCode:
        return self.refusal.code

    def __str__(self) -> str:
        return self.text

    def then(self, more: str) -> PendingReason:
        """The same record with ``more`` appended to the sentence."""
        return PendingReason(self.refusal, f"{self.text}; {more}")

    def recoded(self, code: RefusalCode) -> PendingReason:
        """The same sentence and amounts under another code (a cause found above the one that wrote it)."""
        return PendingReason(dataclasses.replace(self.refusal, code=code), self.text)
