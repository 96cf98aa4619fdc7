"""Columnar free capacity (MIG instances included) with validated reserve/release, and the
fragmentation measure over it."""

from gpuslice.ledger.fit import FITS, code_number, code_of, fit_codes
from gpuslice.ledger.fragmentation import node_fragmentation
from gpuslice.ledger.ledger import Ledger, LedgerView
from gpuslice.ledger.mig import MigHold, mig_request
from gpuslice.ledger.placement import Placement, Refusal, RefusalCode

__all__ = [
    "FITS",
    "Ledger",
    "LedgerView",
    "MigHold",
    "Placement",
    "Refusal",
    "RefusalCode",
    "code_number",
    "code_of",
    "fit_codes",
    "mig_request",
    "node_fragmentation",
]
