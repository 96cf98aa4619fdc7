"""MigManager over a fake ``nvidia-smi`` (first on PATH) and a fake pynvml that sees what it created.

``FakeSmi`` writes an executable ``nvidia-smi`` into tmp_path: it records each argv in ``calls.jsonl``,
keeps the MIG devices it created in ``state.json`` (which the fake NVML reads, so the UUID lookup finds
them), prints what the real one prints on success, and fails a command on request (``refuse``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from node_helpers import fake_pynvml

from gpuslice.node.discovery import discover
from gpuslice.node.mig_manager import MigCommandFailed, MigManager, MigPermissionDenied, run_mig_command
from gpuslice.units import GiB

NO_ROOT = "Unable to create a GPU instance on GPU 0 using profile 9: Insufficient Permissions"
_SCRIPT = """#!{python}
import json, sys, time
state_path, log_path = {state!r}, {log!r}
args = sys.argv[1:]
with open(log_path, "a") as log:
    log.write(json.dumps(args) + "\\n")
with open(state_path) as f:
    state = json.load(f)
refuse = state.get("refuse")
if refuse and refuse["match"] in " ".join(args):
    time.sleep(refuse.get("sleep", 0))
    print(refuse["message"], file=sys.stderr if refuse.get("stderr") else sys.stdout)
    sys.exit(refuse["exit"])
gpu = int(args[args.index("-i") + 1])
if "-cgi" in args:
    profile_id, start = map(int, args[args.index("-cgi") + 1].split(":"))
    gi = state["next_gi"]
    state["next_gi"] += 1
    state["devices"].append([f"MIG-fake-{{gpu}}-{{gi}}", profile_id, start, gi, gpu])
    print(f"Successfully created GPU instance ID  {{gi}} on GPU  {{gpu}} using profile MIG x (ID  9)")
    print(f"Successfully created compute instance ID  0 on GPU  {{gpu}} GPU instance ID  {{gi}} using MIG x")
elif "-dgi" in args:
    gi = int(args[args.index("-gi") + 1])
    state["devices"] = [d for d in state["devices"] if not (d[3] == gi and d[4] == gpu)]
    print(f"Successfully destroyed GPU instance ID  {{gi}} from GPU  {{gpu}}")
else:
    print("Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  1")
with open(state_path, "w") as f:
    json.dump(state, f)
"""


class FakeSmi:
    """A fake nvidia-smi in ``directory``; put ``directory`` first on PATH to use it."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.state_path = directory / "state.json"
        self.log_path = directory / "calls.jsonl"
        self.state_path.write_text(json.dumps({"devices": [], "next_gi": 1}))
        program = directory / "nvidia-smi"
        program.write_text(
            _SCRIPT.format(python=sys.executable, state=str(self.state_path), log=str(self.log_path))
        )
        program.chmod(0o755)

    def _state(self) -> dict[str, Any]:
        return json.loads(self.state_path.read_text())

    def refuse(
        self, match: str, exit_code: int, message: str, *, stderr: bool = False, sleep: float = 0
    ) -> None:
        """Commands containing ``match`` print ``message`` and exit ``exit_code``; ``allow`` undoes it."""
        state = self._state()
        state["refuse"] = {"match": match, "exit": exit_code, "message": message, "stderr": stderr,
                           "sleep": sleep}  # fmt: skip
        self.state_path.write_text(json.dumps(state))

    def allow(self) -> None:
        state = self._state()
        state.pop("refuse", None)
        self.state_path.write_text(json.dumps(state))

    def add_device(self, gpu: int, uuid: str, profile_id: int, start: int) -> None:
        """An instance that exists without gpuslice (an administrator made it)."""
        state = self._state()
        state["devices"].append([uuid, profile_id, start, 99, gpu])
        self.state_path.write_text(json.dumps(state))

    def devices(self, gpu: int) -> list[tuple[str, int, int]]:
        return [(u, p, s) for u, p, s, _gi, g in self._state()["devices"] if g == gpu]

    def calls(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return ["nvidia-smi " + " ".join(json.loads(line)) for line in self.log_path.read_text().splitlines()]


class _LiveGpu(dict):
    """A fake-NVML GPU whose MIG devices are whatever the fake nvidia-smi has created so far."""

    def __init__(self, smi: FakeSmi, index: int, **fields: Any) -> None:
        super().__init__(mig_devices=[], **fields)
        self.smi, self.index = smi, index

    def __getitem__(self, key: str) -> Any:
        return self.smi.devices(self.index) if key == "mig_devices" else super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key == "mig_devices" else super().get(key, default)


def a100_nvml(smi: FakeSmi, n: int = 2) -> Any:
    """n A100-80GB GPUs in MIG mode, their MIG devices read from ``smi``."""
    return fake_pynvml(
        [
            _LiveGpu(smi, i, name="NVIDIA A100-SXM4-80GB", total=80 * GiB, uuid=f"GPU-a{i}", mig=1)
            for i in range(n)
        ]
    )


@pytest.fixture
def smi(tmp_path, monkeypatch) -> FakeSmi:
    fake = FakeSmi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.directory}:{__import__('os').environ['PATH']}")
    return fake


@pytest.fixture
def manager(tmp_path, smi) -> MigManager:
    nvml = a100_nvml(smi)
    return MigManager(discover(nvml=nvml), tmp_path / "state", nvml=nvml, timeout_seconds=5)


def test_a_missing_instance_is_created_with_the_planner_command_and_destroyed_after_its_job(manager, smi):
    uuid = manager.acquire(1, "3g.40gb", 4)
    assert smi.calls() == ["nvidia-smi mig -i 1 -cgi 9:4 -C"]
    assert uuid == "MIG-fake-1-1" and smi.devices(1) == [(uuid, 9, 4)]
    manager.claim("job-1", uuid)
    assert MigManager(manager.machine, manager.path.parents[1]).owned[0].jobs == ["job-1"]  # on disk
    manager.release("job-1")
    assert smi.calls()[1:] == ["nvidia-smi mig -i 1 -dci -ci 0 -gi 1", "nvidia-smi mig -i 1 -dgi -gi 1"]
    assert smi.devices(1) == [] and manager.owned == []


def test_an_instance_that_already_exists_is_used_as_found_and_never_destroyed(manager, smi):
    smi.add_device(0, "MIG-admin", 19, 6)  # 1g.10gb at slot 6
    assert manager.acquire(0, "1g.10gb", 6) == "MIG-admin"
    manager.claim("job-1", "MIG-admin")
    manager.release("job-1")
    manager.destroy_idle()
    assert smi.calls() == [] and smi.devices(0) == [("MIG-admin", 19, 6)]


def test_without_root_the_error_says_so_and_names_the_command(manager, smi):
    smi.refuse("-cgi", 4, NO_ROOT)
    with pytest.raises(MigPermissionDenied) as caught:
        manager.acquire(0, "3g.40gb", 0)
    text = str(caught.value)
    assert "needs root" in text and "nvidia-smi mig -i 0 -cgi 9:0 -C" in text and "Insufficient" in text
    assert caught.value.details["returncode"] == 4
    assert manager.owned == [] and not manager.path.exists()


def test_a_failed_command_names_the_command_and_its_stderr(manager, smi):
    smi.refuse("-cgi", 2, "Failed to create GPU instance: Insufficient Resources", stderr=True)
    with pytest.raises(MigCommandFailed, match=r"`nvidia-smi mig -i 0 -cgi 9:4 -C` failed \(exit 2\): "
                       r"Failed to create GPU instance: Insufficient Resources"):  # fmt: skip
        manager.acquire(0, "3g.40gb", 4)


def test_a_destroy_that_fails_keeps_the_instance_and_retries_before_the_next_create(manager, smi, tmp_path):
    uuid = manager.acquire(0, "3g.40gb", 0)
    manager.claim("job-1", uuid)
    smi.refuse("-dgi", 19, "Failed to destroy GPU instance ID 1 from GPU 0: In use by another client")
    manager.release("job-1")  # logged, not raised: a job's end never crashes the daemon
    assert smi.devices(0) == [(uuid, 9, 0)]
    restarted = MigManager(manager.machine, tmp_path / "state", nvml=manager.nvml)
    assert [(o.gi_id, o.ci_ids, o.jobs) for o in restarted.owned] == [(1, [], [])]  # CIs already gone
    smi.allow()
    restarted.acquire(0, "4g.40gb", 0)  # overlaps the leftover: it goes first, by -dgi only
    assert smi.calls()[-2:] == ["nvidia-smi mig -i 0 -dgi -gi 1", "nvidia-smi mig -i 0 -cgi 5:0 -C"]
    assert [(o.profile, o.gi_id) for o in restarted.owned] == [("4g.40gb", 2)]


def test_nvidia_smi_missing_or_hanging_is_a_clear_error(smi, monkeypatch, tmp_path):
    smi.refuse("-lgi", 0, "", sleep=5)
    with pytest.raises(MigCommandFailed, match=r"did not finish within 0.3 s"):
        run_mig_command("nvidia-smi mig -i 0 -lgi", timeout_seconds=0.3)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(MigCommandFailed, match="nvidia-smi is not on PATH"):
        run_mig_command("nvidia-smi mig -i 0 -cgi 9:0 -C")
