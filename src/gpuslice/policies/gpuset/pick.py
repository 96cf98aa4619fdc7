"""THE choice of k GPUs inside one machine, whoever asks: the placer (sim, serve, the extender), the
device plugin's GetPreferredAllocation and ``gpuslice topo pick``.

```text
pick_gpu_set(topology, free, k)                       # no constraint: the GPU-set policy's advice,
                                                      #   validated (exact search by default)
pick_gpu_set(topology, free, k, need=NVLINK, must={2}) # constrained: every k-set of the free GPUs that
                                                      #   holds ``must`` and meets ``need``, ranked the
                                                      #   way ``Exact`` ranks (cost, then leftovers)
```

Without a topology (a node whose wiring is unknown) the lowest free GPUs are taken, ``must`` first; a
topology need cannot be guaranteed there, so such a request gets None.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import combinations

from gpuslice.hardware.topology import Topology
from gpuslice.policies.gpuset.base import GpuSetOps, choose_gpu_set
from gpuslice.policies.gpuset.exact import Exact
from gpuslice.workload.job import TopologyNeed

__all__ = ["meets_need", "pick_gpu_set"]

_EXACT = Exact()  # stateless apart from its leftover cache, keyed by (topology, free mask)


def meets_need(topology: Topology | None, gpus: Sequence[int], need: TopologyNeed) -> bool:
    """NVLINK: every pair joined by NVLink (direct or NVSwitch); PCIE_SWITCH: every pair PIX or NVLink."""
    if need is TopologyNeed.ANY or len(gpus) < 2:
        return True
    if topology is None:
        return False
    for i, j in combinations(gpus, 2):
        if topology.nvlinks[i, j] > 0:
            continue
        if need is TopologyNeed.PCIE_SWITCH and topology.pcie[i, j] == 1:  # code 1 = PIX
            continue
        return False
    return True


def pick_gpu_set(
    topology: Topology | None,
    free: Collection[int],
    k: int,
    *,
    need: TopologyNeed = TopologyNeed.ANY,
    must: Collection[int] = (),
    policy: GpuSetOps | None = None,
) -> tuple[int, ...] | None:
    """k of the ``free`` GPUs (ascending), holding every GPU in ``must`` and meeting ``need``; None when
    no such set exists. ``policy`` advises only when there is no constraint (a GPU-set policy cannot take
    one); its bad advice falls back to the lowest free GPUs inside ``choose_gpu_set``."""
    free_sorted = sorted({int(g) for g in free})
    fixed = sorted({int(g) for g in must})
    if k < 1 or len(free_sorted) < k or len(fixed) > k or not set(fixed) <= set(free_sorted):
        return None
    rest = [g for g in free_sorted if g not in fixed]
    if topology is None or free_sorted[-1] >= topology.n_gpus:
        if need is not TopologyNeed.ANY and k > 1:
            return None
        return tuple(sorted(fixed + rest[: k - len(fixed)]))
    if need is TopologyNeed.ANY and not fixed:
        return choose_gpu_set(policy or _EXACT, topology, free_sorted, k).gpus
    sets = (tuple(sorted(fixed + list(c))) for c in combinations(rest, k - len(fixed)))
    valid = [s for s in sets if meets_need(topology, s, need)]
    if not valid:
        return None

    def rank(s: tuple[int, ...]) -> tuple[object, ...]:
        left = tuple(g for g in free_sorted if g not in s)
        return (Exact.cost(topology, s), -_EXACT.leftover_value(topology, left), s)

    return min(valid, key=rank)
