"""Create and destroy the MIG instances that ``--sharing mig`` jobs run in, with ``nvidia-smi mig``.

```text
acquire(assignment)   the instance (gpu, profile, start) exists (NVML)  -> its MIG-… UUID, nothing run
                      it does not                                        -> the planner's CreateInstance
                                                                           commands (nvidia-smi mig -i G
                                                                           -cgi ID:START -C), then its UUID
claim(job, uuid)      the job launched in it: it is now in use
release(job)          the job ended; an instance gpuslice created and no job uses -> the planner's
                      DestroyInstance commands (-dci -ci CI -gi GI, then -dgi -gi GI)
```

Rules: gpuslice destroys only instances it created itself (recorded, with their GI/CI ids parsed from
``nvidia-smi``'s "Successfully created … instance ID N" lines, in ``state_dir/mig/instances.json``, so a
restarted server still knows them); an instance an administrator created is used as found and left
alone. An instance is destroyed as soon as its last job ends; when that fails (a process still holds
it), it stays recorded as idle and is destroyed again before the next create on its GPU and when the
server stops with no jobs running. Every command runs with a timeout; a failure raises
``MigCommandFailed`` naming the command, its exit status and its output, and ``MigPermissionDenied``
(creating and destroying MIG instances needs root) says how to proceed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuslice.errors import UserError
from gpuslice.hardware.machine import Machine
from gpuslice.hardware.mig import MigInstance, mig_gpu
from gpuslice.node.discovery import MigInstanceMissing, find_mig_device_uuid
from gpuslice.scheduler.mig_planner import CreateInstance, DestroyInstance

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "MigCommandFailed",
    "MigManager",
    "MigPermissionDenied",
    "OwnedInstance",
    "run_mig_command",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 60.0  # a create takes about a second; a busy driver can take much longer
# nvidia-smi exits 4 for NVML_ERROR_NO_PERMISSION ("Insufficient Permissions").
_NO_PERMISSION_EXIT = 4
_NO_PERMISSION_TEXT = re.compile(r"insufficient permissions|permission denied|not permitted", re.I)
_CREATED_GI = re.compile(r"created GPU instance ID\s+(\d+)", re.I)
_CREATED_CI = re.compile(r"created compute instance ID\s+(\d+)", re.I)


class MigCommandFailed(UserError):
    """An ``nvidia-smi mig`` command failed, could not start, or timed out."""

    def __init__(self, message: str, command: str, returncode: int | None, output: str) -> None:
        super().__init__(message)
        self.command = command
        self.returncode = returncode
        self.output = output

    @property
    def details(self) -> dict[str, Any]:
        """For an event's data: the command, its exit status and what it printed."""
        return {"command": self.command, "returncode": self.returncode, "output": self.output}


class MigPermissionDenied(MigCommandFailed):
    """The command needs root (or CAP_SYS_ADMIN with the MIG capability devices); gpuslice has neither."""


def run_mig_command(command: str, *, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> str:
    """Run one planner command (``nvidia-smi mig …``); its stdout, or MigCommandFailed saying why not."""
    argv = shlex.split(command)
    program = shutil.which(argv[0])
    if program is None:
        raise MigCommandFailed(
            f"`{command}` cannot run: {argv[0]} is not on PATH (it ships with the NVIDIA driver)",
            command, None, "",
        )  # fmt: skip
    try:
        done = subprocess.run(
            [program, *argv[1:]], capture_output=True, text=True, timeout=timeout_seconds, check=False
        )
    except subprocess.TimeoutExpired:
        raise MigCommandFailed(
            f"`{command}` did not finish within {timeout_seconds:g} s", command, None, ""
        ) from None
    except OSError as err:
        raise MigCommandFailed(f"`{command}` cannot run: {err}", command, None, "") from None
    output = (done.stderr.strip() + "\n" + done.stdout.strip()).strip()  # nvidia-smi errors go to stdout
    if done.returncode == 0:
        return done.stdout
    said = output or "no output"
    if done.returncode == _NO_PERMISSION_EXIT or _NO_PERMISSION_TEXT.search(output):
        raise MigPermissionDenied(
            f"`{command}` was refused (exit {done.returncode}: {said}): creating and destroying MIG "
            f"instances needs root; run gpuslice serve as root, or create the instance beforehand with "
            f"`sudo {command}`",
            command, done.returncode, output,
        )  # fmt: skip
    raise MigCommandFailed(f"`{command}` failed (exit {done.returncode}): {said}", command, done.returncode,
                           output)  # fmt: skip


@dataclass
class OwnedInstance:
    """A MIG instance gpuslice created: where it is, its GI/CI ids, and the jobs in it."""

    gpu: int
    profile: str
    start: int
    gi_id: int
    ci_ids: list[int]
    uuid: str = ""
    jobs: list[str] = field(default_factory=list)

    def destroy_commands(self, machine: Machine) -> tuple[str, ...]:
        """The planner's DestroyInstance commands; only the ``-dgi`` one once the CIs are gone."""
        profile = mig_gpu(machine.gpus[self.gpu].mig_model).profile(self.profile)
        instance = MigInstance(profile, self.start, self.gi_id, tuple(self.ci_ids))
        commands = DestroyInstance(self.gpu, instance).commands
        return commands if self.ci_ids else commands[1:]


class MigManager:
    """The MIG instances of one server's jobs on a real machine (see the module docstring for the rules).

    ``nvml`` is a pynvml-like module for tests; ``timeout_seconds`` bounds every command."""

    def __init__(self, machine: Machine, state_dir: Path, *, nvml: Any | None = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:  # fmt: skip
        self.machine = machine
        self.path = Path(state_dir) / "mig" / "instances.json"
        self.nvml = nvml
        self.timeout_seconds = timeout_seconds
        self.owned: list[OwnedInstance] = self._load()

    # -- the record ------------------------------------------------------------------------------------

    def _load(self) -> list[OwnedInstance]:
        if not self.path.exists():
            return []
        return [OwnedInstance(**row) for row in json.loads(self.path.read_text(encoding="utf-8"))]

    def reload(self) -> None:
        """Read the record again: another process (the DRA driver's other instance in a roll) may have
        written it; the caller holds the lock they share."""
        self.owned = self._load()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".instances.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([asdict(o) for o in self.owned], indent=1), encoding="utf-8")
        os.replace(tmp, self.path)

    def _run(self, command: str) -> str:
        log.info("running %s", command)
        return run_mig_command(command, timeout_seconds=self.timeout_seconds)

    # -- lifecycle -------------------------------------------------------------------------------------

    def acquire(self, gpu: int, profile_name: str, start: int) -> str:
        """The UUID of the instance (gpu, profile, start), created first when it does not exist."""
        try:
            return find_mig_device_uuid(gpu, profile_name, start, nvml=self.nvml)
        except MigInstanceMissing:
            pass
        profile = mig_gpu(self.machine.gpus[gpu].mig_model).profile(profile_name)
        wanted = profile.mask_at(start)
        for idle in [o for o in self.owned if o.gpu == gpu and not o.jobs]:
            idle_profile = mig_gpu(self.machine.gpus[gpu].mig_model).profile(idle.profile)
            if idle_profile.mask_at(idle.start) & wanted:  # a leftover in the way: retry its destroy
                self._destroy(idle)
        (command,) = CreateInstance(gpu, MigInstance(profile, start)).commands
        stdout = self._run(command)
        gi = _CREATED_GI.search(stdout)
        if gi is None:
            raise MigCommandFailed(
                f"`{command}` succeeded but printed no GPU instance ID, so gpuslice could not destroy it "
                f"later; destroy it by hand (nvidia-smi mig -i {gpu} -lgi lists it)",
                command, 0, stdout.strip(),
            )  # fmt: skip
        ci_ids = [int(c) for c in _CREATED_CI.findall(stdout)] or [0]  # -C makes CI 0
        owned = OwnedInstance(gpu, profile.name, start, int(gi.group(1)), ci_ids)
        self.owned.append(owned)
        self._save()
        try:
            owned.uuid = find_mig_device_uuid(gpu, profile.name, start, nvml=self.nvml)
        except Exception:
            self._destroy(owned, quiet=True)
            raise
        self._save()
        return owned.uuid

    def claim(self, job_id: str, uuid: str) -> None:
        """``job_id`` runs in the instance ``uuid`` (no-op for an instance gpuslice did not create)."""
        for o in self.owned:
            if o.uuid == uuid and job_id not in o.jobs:
                o.jobs.append(job_id)
                self._save()

    def release(self, job_id: str) -> None:
        """``job_id`` ended: destroy the instances it was the last job in (failures are logged, kept)."""
        for o in [o for o in self.owned if job_id in o.jobs]:
            o.jobs.remove(job_id)
            self._save()
            if not o.jobs:
                self._destroy(o, quiet=True)

    def destroy_idle(self) -> None:
        """Destroy every recorded instance no job uses (a server stop, or leftovers from a crash)."""
        for o in [o for o in self.owned if not o.jobs]:
            self._destroy(o, quiet=True)

    def _destroy(self, owned: OwnedInstance, *, quiet: bool = False) -> None:
        try:
            for command in owned.destroy_commands(self.machine):
                self._run(command)
                if " -dci " in command:  # CIs gone: a retry runs only the -dgi
                    owned.ci_ids = []
                    self._save()
        except MigCommandFailed as err:
            if not quiet:
                raise
            log.warning("MIG instance %s@%s on GPU %s kept (destroyed again later): %s",
                        owned.profile, owned.start, owned.gpu, err)  # fmt: skip
            return
        self.owned.remove(owned)
        self._save()
