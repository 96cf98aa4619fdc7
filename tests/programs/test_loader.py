"""The loader verifies first, runs files with restricted builtins, and gives each instance its own maps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuslice.errors import UnknownPolicy
from gpuslice.policies import PolicyContext, placement_policy
from gpuslice.policies.queue import queue_policy
from gpuslice.programs import loader
from gpuslice.programs.loader import (
    RESTRICTED_BUILTINS,
    PolicyFamilyMismatch,
    PolicyInitError,
    PolicyRejected,
    is_policy_path,
    load_file,
    load_source,
    resolve,
)
from gpuslice.programs.maps import Map, MapError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples/policies"


def test_loaded_policy_knows_family_name_hash_and_maps() -> None:
    loaded = load_file(EXAMPLES / "refault_protect.py")
    assert (loaded.family, loaded.name, loaded.ops_class.__name__) == (
        "eviction",
        "refault-protect",
        "RefaultProtect",
    )
    assert len(loaded.sha256) == 64 and loaded.path.endswith("refault_protect.py")
    assert str(loaded.map_specs["activations"]) == "Map(key=int, value=int, max_entries=65536)"


def test_rejected_file_lists_every_violation_as_file_line_message() -> None:
    source = "import os\nfrom gpuslice.programs.api import QueueOps\n\n\nclass Q(QueueOps):\n    pass\n"
    with pytest.raises(PolicyRejected) as err:
        load_source(source, "q.py")
    assert "q.py:1: import of 'os' is not allowed" in str(err.value)
    assert [v.line for v in err.value.violations] == [1]


def test_restricted_namespace_has_no_open_exec_or_free_import() -> None:
    assert not {"open", "exec", "eval", "compile", "globals", "type", "print"} & set(RESTRICTED_BUILTINS)
    # defence in depth: unverified code run the loader's way finds none of them
    code = compile("open('/etc/passwd')", "x.py", "exec")
    with pytest.raises(PolicyInitError, match="NameError"):
        loader._execute(code, "x.py")
    code = compile("import os", "x.py", "exec")
    with pytest.raises(PolicyInitError, match="import of 'os' is not allowed"):
        loader._execute(code, "x.py")
    code = compile("from dataclasses import make_dataclass", "x.py", "exec")
    with pytest.raises(PolicyInitError, match="may not be imported"):
        loader._execute(code, "x.py")


def test_each_instance_gets_its_own_maps_unless_maps_are_handed_in() -> None:
    loaded = load_file(EXAMPLES / "refault_protect.py")
    a, b = loaded.instantiate(), loaded.instantiate()
    a.activations.update(7, 1)
    assert 7 not in b.activations
    carried = loaded.new_maps()
    carried["activations"].update(9, 3)
    c = loaded.instantiate(maps=carried)
    assert c.activations is carried["activations"] and c.activations.get(9) == 3


def test_module_level_maps_are_per_instance_too() -> None:
    source = (
        "from gpuslice.programs.api import Map, QueueOps\n\n"
        "SEEN = Map(key=str, value=int, max_entries=4)\n\n\n"
        "class Q(QueueOps):\n    def on_started(self, view, job):\n        SEEN.update(job.job_id, 1)\n\n"
        "    def count(self):\n        return len(SEEN)\n"
    )
    loaded = load_source(source, "q.py")
    first, second = loaded.new_maps(), loaded.new_maps()
    a, b = loaded.instantiate(maps=first), loaded.instantiate(maps=second)
    first["SEEN"].update("j1", 1)
    assert (a.count(), b.count()) == (1, 0)


def test_handed_in_map_must_match_the_declared_spec() -> None:
    loaded = load_file(EXAMPLES / "refault_protect.py")
    with pytest.raises(MapError, match="declares"):
        loaded.instantiate(maps={"activations": Map(key=int, value=float, max_entries=65536)})
    with pytest.raises(MapError, match="no map"):
        loaded.instantiate(maps={"other": Map(key=int, value=int, max_entries=1)})


def test_a_policy_whose_init_fails_reports_it_as_a_user_error(builtin_files: Path) -> None:
    loaded = load_file(builtin_files / "fgd.py")
    with pytest.raises(PolicyInitError, match="FGD needs a target workload"):
        loaded.instantiate(object(), PolicyContext(rng=np.random.default_rng(0), target=None))


def test_dataclass_helpers_work_inside_the_restricted_namespace() -> None:
    source = (
        "from dataclasses import dataclass\nfrom typing import Any\n\n"
        "from gpuslice.programs.api import QueueOps\n\n\n"
        "@dataclass(frozen=True)\nclass Key:\n    level: int\n\n    def __lt__(self, other):\n"
        "        return self.level < other.level\n\n\n"
        "class Q(QueueOps):\n    def order_key(self, view, job) -> tuple[Any, ...]:\n"
        "        return (-Key(int(job.spec.priority)).level,)\n"
    )
    loaded = load_source(source, "q.py")
    assert loaded.family == "queue" and loaded.instantiate() is not None


def test_names_go_to_the_registry_and_paths_to_the_loader() -> None:
    assert resolve("fifo", "queue", queue_policy).name == "fifo"
    assert resolve("bestfit", "placement", placement_policy).name == "bestfit"
    with pytest.raises(UnknownPolicy):
        resolve("nope", "placement", placement_policy)
    assert is_policy_path("x.py") and is_policy_path("dir/policy") and not is_policy_path("fgd-exact")


def test_a_file_of_another_family_is_refused() -> None:
    with pytest.raises(PolicyFamilyMismatch, match="is a queue policy; a placement policy is needed"):
        resolve(str(EXAMPLES / "small_first.py"), "placement", placement_policy)


def test_a_missing_file_is_a_clear_error() -> None:
    with pytest.raises(loader.UserError, match="does not exist"):
        resolve("nowhere/policy.py", "queue", queue_policy)


def test_numpy_code_may_import_its_own_submodules_from_inside_a_policy(builtin_files: Path) -> None:
    # ndarray.min imports numpy._core._methods lazily, through the calling frame's (restricted)
    # __import__; a fresh interpreter makes the policy's call the first one
    script = (
        "import numpy as np\n"
        "from gpuslice.programs.loader import load_file\n"
        f"ops = load_file({str(builtin_files / 'bestfit.py')!r}).instantiate(None, None)\n"
        "print(ops.normalize(None, None, np.array([1.0, 3.0])).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[0.0, 100.0]"
    with pytest.raises(ImportError):
        loader._allow_list_import("os.path")
    with pytest.raises(ImportError):
        loader._allow_list_import("gpuslice.programs.loader")
