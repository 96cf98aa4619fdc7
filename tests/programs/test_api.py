"""programs.api: what a policy file imports; placement and queue files never load the memory engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpuslice.memory import hooks
from gpuslice.programs import api

ROOT = Path(__file__).resolve().parents[2]


def test_every_name_in_all_resolves_and_memory_names_are_the_memory_engines_own() -> None:
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert api.MemoryOps is hooks.MemoryOps and api.HEAD == hooks.HEAD
    assert set(api.__all__) <= set(dir(api))


def test_an_openb_replay_of_a_placement_policy_file_does_not_import_the_memory_engine() -> None:
    code = (
        "import sys\n"
        "from gpuslice.programs.loader import load_file\n"
        "from gpuslice.sim.openb import replay\n"
        "from gpuslice.programs.guard import guard\n"
        f"load_file({str(ROOT / 'examples/policies/least_loaded.py')!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuslice.memory')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
