"""Fixed codes for free-text reasons, so metrics get a small, stable ``reason`` label.

The scheduler and the daemon explain themselves in sentences ("needs 40 GiB on one GPU; largest free is
22 GiB on GPU 3"); a label must not carry numbers or job ids (each distinct value is a new time series).
The tables map the sentences' fixed parts to codes, first match wins; tests/observe/test_reasons.py
drives the real scheduler into each situation and checks its sentence gets the code meant for it.
"""

from __future__ import annotations

__all__ = ["FAULT_KINDS", "NOT_TRIED", "failure_code", "fault_kind", "pending_code"]

NOT_TRIED = "not_tried"  # submitted since the last scheduling pass: not a failure yet

# (code, any of these fragments) in order; the first code whose fragment is in the reason wins.
_PENDING: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unhealthy_gpu", ("is unhealthy",)),
    (NOT_TRIED, ("waiting for the next scheduling pass",)),
    ("quota", ("at its quota",)),
    ("preempting", ("preempting lower-priority", "waiting for preempted")),
    ("behind_queue_head", ("waiting behind",)),
    ("no_mig_slot", ("needs MIG",)),
    ("topology", ("hold no such set",)),
    ("insufficient_memory", ("largest free is",)),
    ("insufficient_compute", ("compute on one GPU",)),
    ("insufficient_gpus", ("free", "held whole")),
)

# Why a job ended FAILED (daemon.py's reasons).
_FAILED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lost", ("lost",)),
    ("launch", ("could not launch",)),
    ("max_runtime", ("max runtime",)),
    ("memory_enforcement", ("exceeding its GPU memory slice",)),
    ("exit_code", ("failed with",)),
)

FAULT_KINDS = ("xid", "ecc", "nvml", "manual")


def _first(text: str, table: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    for code, fragments in table:
        if any(f in text for f in fragments):
            return code
    return "other"


def pending_code(reason: str) -> str:
    """The code of a pending job's reason: insufficient_memory, quota, unhealthy_gpu, … or other."""
    return _first(reason, _PENDING)


def failure_code(reason: str) -> str:
    """The code of a FAILED job's reason: exit_code, lost, launch, max_runtime, memory_enforcement."""
    return _first(reason, _FAILED)


def fault_kind(reason: str, manual: bool) -> str:
    """xid | ecc | nvml | manual: what marked a GPU unhealthy (manual marks keep their own kind, even
    when their text names an XID, so injected faults never pass for real ones)."""
    if manual:
        return "manual"
    if reason.startswith("XID"):
        return "xid"
    if "ECC" in reason:
        return "ecc"
    return "nvml"
