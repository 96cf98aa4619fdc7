"""NodePrepareResources / NodeUnprepareResources of one node: a claim's allocation -> a CDI spec.

```text
prepare(claim ns/name/uid)
  checkpoint has uid            -> the devices prepared before (idempotent; no API read)
  read the ResourceClaim        -> uid must match; status.allocation must name our devices in our pool
  our results -> one slice      -> container_slice(...): the env, mounts and device nodes Allocate gives
  write <cdi_dir>/gpuslice.io-claim_<uid>.json (0600, atomic), then the checkpoint (0600, atomic)
unprepare(uid)                  -> remove the spec and the checkpoint entry; unknown uid: done already
```

The checkpoint is read entry by entry at start (``entry_problem``): an entry that is not what
``prepare`` writes is logged and dropped, and its claim is prepared afresh when the kubelet asks again.
A claim's own lock covers its API read; the node-wide lock covers only local work (MIG instances, files).

The kubelet API passes no pod and no share: the CDI device name carries the claim UID, the device
and, for a share, its shareID (``<uid>-<device>[-<shareID>]``), so two shares of one GPU are two CDI
devices. Claim-wide edits (environment, mounts, control devices) sit at the spec's top level, applied
once whichever of its devices a container gets; each device adds its own /dev/nvidia<minor>.

A shared GPU's slice is the allocation's consumed capacity (``memory``, ``cores``): the smallest over
the claim's GPUs when there are several; the request policy's default (all of it, step-aligned) is the
whole GPU.

A MIG device's instance is created on Prepare when it does not exist, by the ``MigManager`` that
``gpuslice serve --sharing mig`` uses (``nvidia-smi mig -cgi … -C``, recorded in
``<state_dir>/mig/instances.json``), and destroyed on Unprepare when gpuslice created it and no other
prepared claim uses it; an instance an administrator made is used as found and left alone. A simulated
node (no NVIDIA driver) has no manager: its MIG UUIDs are made up, as everywhere else.

On a simulated node the device nodes are stand-ins (``stand_in_device_node``, the device plugin's):
each CDI device node names its host file in ``hostPath``, since the runtime refuses a missing one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from gpuslice.errors import InvalidRequest, UserError
from gpuslice.hardware.machine import Machine
from gpuslice.k8s import quantity
from gpuslice.k8s.container_slice import CONTROL_DEVICES, ContainerSlice, container_slice
from gpuslice.k8s.device_plugin.devices import stand_in_device_node
from gpuslice.k8s.dra.classes import CONFIG_API_VERSION, CONFIG_KIND
from gpuslice.k8s.dra.slices import (
    DRIVER,
    consumed_share,
    gpu_device_name,
    memory_default_mib,
    parse_mig_device_name,
)
from gpuslice.k8s.shim_mounts import slice_folder
from gpuslice.k8s.uninstall import clear_state_folder
from gpuslice.node.discovery import is_simulated
from gpuslice.node.enforcement import SharingMode
from gpuslice.node.mig_manager import MigManager
from gpuslice.scheduler.node_decisions import MigAssignment
from gpuslice.units import MiB

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "ClaimRef",
    "ClaimSource",
    "PrepareRefused",
    "PreparedDevice",
    "Preparer",
    "cdi_spec_path",
]

log = logging.getLogger(__name__)

CDI_VERSION = "0.6.0"
CDI_KIND = "gpuslice.io/claim"  # vendor/class of the CDI devices this driver writes


class PrepareRefused(UserError):
    """A claim cannot be prepared on this node; the kubelet reports the message on the pod."""


class ClaimSource(Protocol):
    """Reads ResourceClaims (the API server in production, a dict in tests)."""

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim object as the API returns it (JSON); raise if it cannot be read."""
        ...


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources returns it."""

    request: str
    pool: str
    device: str
    cdi_id: str
    share_id: str = ""


# A checkpoint entry, as ``prepare`` writes it: these keys, each a string, and ``devices`` a non-empty
# list of PreparedDevice fields (``share_id`` may be left out).
_ENTRY_KEYS = frozenset({"namespace", "name", "cdi_spec", "devices"})
_DEVICE_KEYS = frozenset(f.name for f in fields(PreparedDevice))
_DEVICE_OPTIONAL = frozenset({"share_id"})


def entry_problem(entry: Any) -> str:
    """What is wrong with one checkpoint entry ('' if nothing): a hand edit, a newer or older writer,
    or a bug must cost that one claim a fresh prepare, never wedge it (a KeyError on every prepare and
    unprepare, retried by the kubelet forever)."""
    if not isinstance(entry, dict):
        return f"not an object but {type(entry).__name__}"
    keys = set(entry)
    if keys != _ENTRY_KEYS:
        return f"fields {sorted(keys)}, not {sorted(_ENTRY_KEYS)}"
    for key in ("namespace", "name", "cdi_spec"):
        if not isinstance(entry[key], str):
            return f"{key} is not a string"
    devices = entry["devices"]
    if not isinstance(devices, list) or not devices:
        return "devices is not a non-empty list"
    for i, device in enumerate(devices):
        if not isinstance(device, dict):
            return f"devices[{i}] is not an object"
        keys = set(device)
        if not _DEVICE_KEYS - _DEVICE_OPTIONAL <= keys <= _DEVICE_KEYS:
            return f"devices[{i}] has fields {sorted(keys)}, not {sorted(_DEVICE_KEYS)}"
        if not all(isinstance(v, str) for v in device.values()):
            return f"devices[{i}] has a field that is not a string"
    return ""


_CDI_SPEC_PREFIX = "gpuslice.io-claim_"  # every spec this driver writes, and only those, starts so


def cdi_spec_path(cdi_dir: Path, uid: str) -> Path:
    return cdi_dir / f"{_CDI_SPEC_PREFIX}{uid}.json"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class Preparer:
    """Prepares and unprepares this node's claims; thread-safe (the gRPC server runs several workers).

    ``healthy(gpu)`` says whether a GPU may be handed out now; ``minors`` maps GPU index to
    /dev/nvidia<minor>. The checkpoint (``<state_dir>/dra-checkpoint.json``) survives restarts.
    ``mig`` creates and destroys MIG instances (default: a ``MigManager`` on a real machine, none on a
    simulated one); ``nvml`` is a pynvml-like module for tests."""

    def __init__(
        self,
        machine: Machine,
        node_name: str,
        claims: ClaimSource,
        *,
        cdi_dir: Path,
        state_dir: Path,
        sharing: SharingMode | str = SharingMode.SOFT,
        minors: Sequence[int] | None = None,
        healthy: Callable[[int], bool] = lambda gpu: True,
        mig: MigManager | None = None,
        nvml: Any | None = None,
    ) -> None:
        self.machine = machine
        self.node_name = node_name
        self.claims = claims
        self.cdi_dir = Path(cdi_dir)
        self.state_dir = Path(state_dir)
        self.sharing = sharing
        self.minors = tuple(minors) if minors is not None else tuple(g.index for g in machine.gpus)
        self.healthy = healthy
        self.simulated = is_simulated(machine)
        self.nvml = nvml
        if mig is None and not self.simulated:
            mig = MigManager(machine, self.state_dir, nvml=nvml)
        self.mig = mig
        self.checkpoint_path = self.state_dir / "dra-checkpoint.json"
        self.lock_path = self.state_dir / "dra-checkpoint.lock"
        # Two levels: a claim's own lock is held across its API read, so a slow read holds up only
        # that claim (a second prepare of it waits and then answers from the checkpoint); the node's
        # ``_lock`` guards the devices, the MIG instances, the files and the checkpoint, and is never
        # held across an API call. ``_node()`` takes it and the lock file's flock: in a roll with surge
        # the other pod's driver prepares on the same node, from the same checkpoint.
        self._lock = threading.Lock()
        self._claim_locks: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._prepared: dict[str, dict[str, Any]] = self._load()

    # -- checkpoint ----------------------------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.checkpoint_path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            # A torn or foreign file: start empty rather than refuse every claim; the specs it named
            # stay on disk until their claims are unprepared by UID below.
            log.error("DRA checkpoint %s unreadable (%s); starting with none", self.checkpoint_path, err)
            return {}
        claims = data.get("claims") if isinstance(data, dict) else None
        if not isinstance(claims, dict):
            log.error("DRA checkpoint %s has no claims object; starting with none", self.checkpoint_path)
            return {}
        kept = {}
        for uid, entry in claims.items():
            problem = entry_problem(entry)
            if problem:
                log.error(
                    "DRA checkpoint %s: claim %s dropped (%s); it is prepared afresh when the kubelet "
                    "asks again", self.checkpoint_path, uid, problem,
                )  # fmt: skip
                continue
            kept[uid] = entry
        return kept

    def _save(self) -> None:
        _atomic_write(self.checkpoint_path, json.dumps({"version": 1, "claims": self._prepared}, indent=1))

    @contextlib.contextmanager
    def _node(self) -> Iterator[None]:
        """The node's lock: this process's threads and, by an flock on ``lock_path``, the driver's other
        instance (the old and the new pod of a roll are both registered, and the kubelet may call
        either). Inside it the checkpoint and the MIG record are read afresh: the other may have
        written them."""
        with self._lock:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._prepared = self._load()
                if self.mig is not None:
                    self.mig.reload()
                yield
            finally:
                os.close(fd)  # the flock goes with it

    def prepared(self) -> dict[str, list[PreparedDevice]]:
        """Claim UID -> its prepared devices (from the checkpoint)."""
        with self._node():
            return {uid: [PreparedDevice(**d) for d in e["devices"]] for uid, e in self._prepared.items()}

    def prepared_claims(self) -> list[tuple[str, str, str, str]]:
        """(UID, namespace, name, CDI spec path) of every prepared claim (the node's metrics read them)."""
        with self._node():
            return [(uid, e["namespace"], e["name"], e["cdi_spec"]) for uid, e in self._prepared.items()]

    def forget(self) -> list[str]:
        """gpuslice is leaving the node (``k8s.uninstall``): unless a claim is still prepared, destroy
        the idle MIG instances gpuslice made, remove every CDI spec of this driver (a crash's leftovers
        too), the checkpoint and the state files. What was kept, in words (for the log)."""
        with self._node():
            if self._prepared:
                names = [f"{e['namespace']}/{e['name']}" for e in self._prepared.values()]
                return [
                    f"{len(names)} claim(s) still prepared here ({', '.join(names[:5])}): their CDI specs, "
                    f"the checkpoint and {self.state_dir} stay"
                ]
            own = [self.checkpoint_path.name, self.lock_path.name]
            if self.mig is not None:
                self.mig.destroy_idle()
                if not self.mig.owned:  # an instance that could not be destroyed keeps its record
                    own.append(self.mig.path.parent.name)
            for spec in self.cdi_dir.glob(f"{_CDI_SPEC_PREFIX}*.json"):
                spec.unlink(missing_ok=True)
            return clear_state_folder(self.state_dir, own)

    # -- prepare / unprepare -------------------------------------------------------------------------

    def _claim_lock(self, uid: str) -> Any:
        """The lock of one claim, shared by every prepare and unprepare of it that runs now."""
        with self._lock:
            lock = self._claim_locks.get(uid)
            if lock is None:
                lock = self._claim_locks[uid] = threading.Lock()
            return lock

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        """The claim's devices, its CDI spec written; PrepareRefused says why not (nothing is written)."""
        with self._claim_lock(ref.uid):
            with self._node():
                done = self._prepared.get(ref.uid)
            if done is not None:
                return [PreparedDevice(**d) for d in done["devices"]]
            try:
                claim = self.claims.get_claim(ref.namespace, ref.name)
            except Exception as err:
                raise PrepareRefused(f"cannot read ResourceClaim {ref.namespace}/{ref.name}: {err}") from None
            uid = (claim.get("metadata") or {}).get("uid")
            if uid != ref.uid:
                raise PrepareRefused(
                    f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid}: it was deleted "
                    "and created again; the pod must be recreated"
                )
            with self._node():
                return self._prepare_read(ref, claim)

    def _prepare_read(self, ref: ClaimRef, claim: Mapping[str, Any]) -> list[PreparedDevice]:
        """Under both locks, the claim read: plan its devices, write its spec and the checkpoint."""
        done = self._prepared.get(ref.uid)
        if done is not None:  # the driver's other instance prepared it meanwhile
            return [PreparedDevice(**d) for d in done["devices"]]
        path = cdi_spec_path(self.cdi_dir, ref.uid)
        try:
            devices, spec = self._plan(ref, claim)
            _atomic_write(path, json.dumps(spec, indent=1))
            self._prepared[ref.uid] = {
                "namespace": ref.namespace,
                "name": ref.name,
                "cdi_spec": str(path),
                "devices": [asdict(d) for d in devices],
            }
            self._save()
        except BaseException:
            self._prepared.pop(ref.uid, None)
            path.unlink(missing_ok=True)
            if self.mig is not None:
                self.mig.release(ref.uid)  # an instance created for this claim goes again
            raise
        log.info("prepared claim %s/%s: %s", ref.namespace, ref.name, ", ".join(d.cdi_id for d in devices))
        return devices

    def unprepare(self, uid: str) -> None:
        """Undo ``prepare``: its CDI spec and checkpoint entry go. A UID never prepared is a success."""
        with self._claim_lock(uid), self._node():
            entry = self._prepared.get(uid)
            Path(entry["cdi_spec"] if entry else cdi_spec_path(self.cdi_dir, uid)).unlink(missing_ok=True)
            if entry is None:
                return
            del self._prepared[uid]
            self._save()
            if self.mig is not None:
                self.mig.release(uid)  # destroys the instance gpuslice made for it, if no claim else uses it
            log.info("unprepared claim %s/%s", entry["namespace"], entry["name"])

    # -- the allocation ------------------------------------------------------------------------------

    def _plan(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[list[PreparedDevice], dict[str, Any]]:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareRefused(f"{where} is not allocated")
        results = [
            r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == DRIVER
        ]
        if not results:
            raise PrepareRefused(f"{where} has no device of driver {DRIVER}")
        self._check_requests(where, claim)
        exclusive = self._exclusive_requests(allocation)
        gpus: list[int] = []
        memory: list[int] = []
        cores: list[int] = []
        migs: list[MigAssignment] = []
        for r in results:
            device = str(r.get("device", ""))
            if r.get("pool") != self.node_name:
                raise PrepareRefused(
                    f"{where}: device {device} is in pool {r.get('pool')}, not {self.node_name}"
                )
            mig = parse_mig_device_name(self.machine, device)
            if mig is not None:
                migs.append(MigAssignment(mig.gpu, mig.profile.name, mig.start))
                gpu = mig.gpu
            else:
                gpu = self._shared_gpu(where, device)
                full = memory_default_mib(self.machine.gpus[gpu].memory_bytes)
                mib, pct = consumed_share(r.get("consumedCapacity") or {}, full)
                if r.get("request") in exclusive and (mib < full or pct < 100):
                    raise PrepareRefused(
                        f"{where}: request {r.get('request')} is for a whole GPU but consumes {mib} MiB and "
                        f"{pct} cores of {device}; use the gpu.gpuslice.io class for a share"
                    )
                memory.append(0 if mib >= full else mib)  # 0: all of it (the default is step-aligned)
                cores.append(pct)
            if not self.healthy(gpu):
                raise PrepareRefused(f"{where}: GPU {self.machine.gpus[gpu].uuid} ({device}) is unhealthy")
            gpus.append(gpu)
        if migs and (len(migs) > 1 or memory):
            raise PrepareRefused(
                f"{where}: a claim gets one MIG instance or GPUs, not {len(results)} devices mixed"
            )
        if migs and self.mig is not None:
            mig = migs[0]
            try:
                created = self.mig.acquire(mig.gpu, mig.profile, mig.start)
            except UserError as err:
                raise PrepareRefused(f"{where}: MIG {mig.profile} at slot {mig.start}: {err}") from None
            self.mig.claim(ref.uid, created)
        setup = container_slice(
            self.machine,
            sharing=self.sharing,
            state_dir=self.state_dir,
            minors=self.minors,
            namespace=ref.namespace,
            holder=slice_folder(claim=ref.name),
            gpus=gpus,
            memory_bytes=min((m for m in memory if m), default=0) * MiB,
            compute_percent=min(cores, default=100),
            mig=migs[0] if migs else None,
            nvml=self.nvml,
        )
        prepared = []
        spec_devices = []
        for r, gpu in zip(results, gpus, strict=True):
            share = str(r.get("shareID") or "")
            name = f"{ref.uid}-{r['device']}" + (f"-{share}" if share else "")
            prepared.append(
                PreparedDevice(
                    str(r["request"]), self.node_name, str(r["device"]), f"{CDI_KIND}={name}", share
                )
            )
            node = self._device_node(f"/dev/nvidia{self.minors[gpu]}")
            spec_devices.append({"name": name, "containerEdits": {"deviceNodes": [node]}})
        return prepared, self._spec(spec_devices, setup, self._device_node)

    def _device_node(self, path: str) -> dict[str, str]:
        """A CDI device node; on a simulated node with the stand-in host file it is made from."""
        if not self.simulated:
            return {"path": path}
        try:
            return {"path": path, "hostPath": stand_in_device_node(self.state_dir / "dev", path)}
        except OSError as err:
            raise PrepareRefused(f"no stand-in for {path} on this simulated node: {err}") from None

    @staticmethod
    def _check_requests(where: str, claim: Mapping[str, Any]) -> None:
        """Refuse what the API server stores but no one meant: kube-scheduler rounds a negative capacity
        request up to the policy's minimum and allocates it, so the pod would run with a slice its owner
        never asked for. The kubelet shows this refusal on the pod."""
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            for sub in [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]:
                for key, value in ((sub.get("capacity") or {}).get("requests") or {}).items():
                    try:
                        amount = quantity.parse(value, key)
                    except InvalidRequest:
                        amount = -1
                    if amount <= 0:
                        raise PrepareRefused(
                            f"{where}: request {request.get('name')} asks for {value} {key}; capacity "
                            "requests must be positive (e.g. memory: 10Gi, cores: 30)"
                        )

    def _shared_gpu(self, where: str, device: str) -> int:
        for g in self.machine.gpus:
            if gpu_device_name(g.index) == device and not g.mig_enabled:
                return g.index
        raise PrepareRefused(f"{where}: device {device} is not a device of node {self.node_name}")

    @staticmethod
    def _exclusive_requests(allocation: Mapping[str, Any]) -> set[str]:
        """Requests whose class configuration says ``exclusive`` (the whole-GPU class)."""
        found: set[str] = set()
        every = {str(r.get("request")) for r in (allocation.get("devices") or {}).get("results") or []}
        for entry in (allocation.get("devices") or {}).get("config") or []:
            opaque = entry.get("opaque") or {}
            params = opaque.get("parameters") or {}
            if (
                opaque.get("driver") == DRIVER
                and params.get("apiVersion") == CONFIG_API_VERSION
                and params.get("kind") == CONFIG_KIND
                and params.get("exclusive") is True
            ):
                found |= set(entry.get("requests") or every)
        return found

    @staticmethod
    def _spec(
        devices: list[dict[str, Any]], setup: ContainerSlice, device_node: Callable[[str], dict[str, str]]
    ) -> dict[str, Any]:
        nodes = [device_node(p) for p in CONTROL_DEVICES if p in setup.device_nodes]
        mounts = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "bind"],
            }
            for m in setup.mounts
        ]
        edits: dict[str, Any] = {
            "env": [f"{k}={v}" for k, v in sorted(setup.env.items())],
            "deviceNodes": nodes,
        }
        if mounts:
            edits["mounts"] = mounts
        return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices, "containerEdits": edits}
