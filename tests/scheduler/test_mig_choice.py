"""The one MIG instance choice (``scheduler.mig_choice``) asked directly: candidates over existing
instances and over created ones, the start the policy gives or the lowest valid one, the fallbacks it
counts, and the per-node cache of the fullest GPU."""

from __future__ import annotations

from collections import Counter

import numpy as np

from gpuslice.hardware.mig import MigInstance, MigLayout, mig_gpu
from gpuslice.hardware.node import NodeSpec
from gpuslice.ledger import Ledger
from gpuslice.policies.mig_placement import MigPlacementOps
from gpuslice.scheduler.mig_choice import (
    FullestByNode,
    MigCandidate,
    choose_mig_instance,
    created_candidates,
    mig_candidate,
)
from gpuslice.units import GiB

A100 = mig_gpu("A100-80GB")
P1G, P2G, P3G = (A100.profile(n) for n in ("1g.10gb", "2g.20gb", "3g.40gb"))


class NoStart(MigPlacementOps):
    name = "no-start"

    def choose(self, layout, profile):
        return None


class Invalid(MigPlacementOps):
    name = "invalid"

    def choose(self, layout, profile):
        return 3  # no 2g.20gb may start at slice 3


def test_the_default_policy_start_is_kept_and_no_start_means_the_lowest_valid_one():
    empty = mig_candidate("g", MigLayout(A100), (P2G,))
    fallbacks: Counter[str] = Counter()
    chosen = choose_mig_instance([empty], fallbacks=fallbacks)
    assert chosen == (empty, MigInstance(P2G, 4)) and fallbacks == Counter()  # keep-largest: the last start
    ones = mig_candidate("g", MigLayout(A100), (P1G,))
    assert choose_mig_instance([ones], NoStart(), fallbacks) == (ones, MigInstance(P1G, 0))
    assert fallbacks == Counter()  # "no start" is an answer, not a fault


def test_an_invalid_start_falls_back_to_the_lowest_and_is_counted_each_time():
    empty = mig_candidate("g", MigLayout(A100), (P2G,))
    fallbacks: Counter[str] = Counter()
    assert choose_mig_instance([empty], Invalid(), fallbacks) == (empty, MigInstance(P2G, 0))
    assert fallbacks == Counter({"mig-placement: invalid": 1})
    choose_mig_instance([empty], Invalid(), fallbacks)
    assert fallbacks == Counter({"mig-placement: invalid": 2})


def test_where_instances_exist_only_a_free_existing_one_of_the_profile_may_be_chosen():
    held = MigLayout(A100, (MigInstance(P1G, 6),))
    existing = [MigInstance(P2G, 0), MigInstance(P1G, 6), MigInstance(P3G, 4)]
    candidate = mig_candidate("g", held, (P2G,), existing)
    assert candidate.starts(P2G) == (0,)  # keep-largest would create 2g.20gb@4 if it could
    assert candidate.layout.instances == (MigInstance(P1G, 6), MigInstance(P3G, 4))  # 3g.40gb@4 blocks
    assert choose_mig_instance([candidate]) == (candidate, MigInstance(P2G, 0))
    none_free = MigCandidate("g", MigLayout(A100), (P2G,), existing={})
    assert none_free.starts(P2G) == () and choose_mig_instance([none_free]) is None


def test_created_candidates_skip_gpus_not_in_mig_mode_and_tables_without_the_profile():
    node = NodeSpec("a", 8_000, 64 * GiB, 3, "A100-80GB", gpu_memory_bytes=80 * GiB)
    ledger = Ledger([node], mig={(0, 1): A100, (0, 2): mig_gpu("H200")})
    pairs = [(0, 0), (0, 1), (0, 2)]
    assert [c.key for c in created_candidates(ledger.view, pairs, "2g.20gb")] == [(0, 1)]
    assert [c.key for c in created_candidates(ledger.view, pairs, "1g.18gb")] == [(0, 2)]  # H200's


def test_the_fullest_cache_reads_each_node_once_per_version_and_marks_a_node_without_a_start():
    empty = mig_candidate("e", MigLayout(A100), (P3G,))
    full = mig_candidate("f", MigLayout(A100, (MigInstance(P3G, 0), MigInstance(P3G, 4))), (P3G,))
    asked: list[int] = []

    def candidates_of(node: int) -> list[MigCandidate]:
        asked.append(node)
        return [full] if node == 0 else [empty]

    cache = FullestByNode(2)
    rows, version = np.array([0, 1]), np.zeros(2, dtype=np.int64)
    held = cache.fullest("3g.40gb", rows, version, candidates_of)
    assert held.tolist() == [-1, 0] and FullestByNode.first(rows, held) == 1
    assert cache.fullest("3g.40gb", rows, version, candidates_of).tolist() == [-1, 0]
    assert asked == [0, 1]  # the second question read nothing
    version[1] += 1
    cache.fullest("3g.40gb", rows, version, candidates_of)
    assert asked == [0, 1, 1]
    assert FullestByNode.first(rows[:1], held[:1]) is None
