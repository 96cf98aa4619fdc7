"""Why a job ended FAILED, as a fixed code for the metrics' ``reason`` label.

The daemon picks the code where it ends the job (it knows whether the launch failed or the job broke
its memory slice) and writes the sentence for people beside it; a label must not carry numbers or job
ids, and rewording a sentence must not change a metric, so nothing is parsed back from the text. The
codes of a pending job are ``ledger.placement.RefusalCode``; the kinds of a GPU fault are
``hardware.faults.FaultKind``.
"""

from __future__ import annotations

import enum

__all__ = ["FailureCode"]


class FailureCode(enum.Enum):
    EXIT_CODE = "exit_code"  # the job exited non-zero or was killed by a signal of its own
    LOST = "lost"  # its process or supervisor vanished (a crash, a server that was down)
    LAUNCH = "launch"  # it could not be started
    MAX_RUNTIME = "max_runtime"  # stopped at its max runtime
    MEMORY_ENFORCEMENT = "memory_enforcement"  # killed for exceeding its GPU memory slice
