"""Placement policies: one per file, one registry. Unknown names list the known ones."""

from __future__ import annotations

from gpuslice.errors import UnknownPolicy
from gpuslice.ledger.ledger import LedgerView
from gpuslice.policies.base import PlacementOps, PolicyContext, TieBreak
from gpuslice.policies.bestfit import BestFit
from gpuslice.policies.clustering import Clustering
from gpuslice.policies.dotprod import DotProd
from gpuslice.policies.fgd import FGD, FGDExact
from gpuslice.policies.fgd_scarcity import ScarcityFGD
from gpuslice.policies.hami import HamiBinpack, HamiSpread
from gpuslice.policies.packing import Packing
from gpuslice.policies.random import RandomFit

__all__ = [
    "DEFAULT_PLACEMENT",
    "FGD_PAPER_POLICIES",
    "PLACEMENT",
    "PlacementOps",
    "PolicyContext",
    "TieBreak",
    "make_policy",
    "placement_policy",
]

# What serve and the Kubernetes extender place with unless told otherwise: FGD needs a target workload
# that a fresh server or cluster may not have yet; best fit needs nothing.
DEFAULT_PLACEMENT = "bestfit"

PLACEMENT: dict[str, type[PlacementOps]] = {
    p.name: p
    for p in (
        RandomFit,
        DotProd,
        Clustering,
        Packing,
        BestFit,
        FGD,
        FGDExact,
        ScarcityFGD,
        HamiBinpack,
        HamiSpread,
    )
}

# The six policies of the FGD paper, in its order, with the artifact's directory names.
FGD_PAPER_POLICIES: dict[str, str] = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def placement_policy(name: str) -> type[PlacementOps]:
    """The policy class registered as ``name``; UnknownPolicy lists the known names otherwise."""
    try:
        return PLACEMENT[name]
    except KeyError:
        raise UnknownPolicy(
            f"{name!r} is not a placement policy; known: {', '.join(sorted(PLACEMENT))}"
        ) from None


def make_policy(name: str, view: LedgerView, context: PolicyContext) -> PlacementOps:
    return placement_policy(name)(view, context)
