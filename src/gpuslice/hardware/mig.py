"""MIG geometry: per-GPU profile tables and the 8-slot occupancy bitmask that decides what still fits.

What: the GPU-instance (GI) profiles of A100-40GB, A100-80GB, H100 SXM5 80GB, H100 PCIe 80GB, H100 NVL
94GB and H200-141GB (name, the ``nvidia-smi mig -lgip`` ID, the NVML selector constant, memory, compute
and memory slices, allowed starts, SMs), a ``MigLayout`` (which instances sit where on one GPU) and
smallest-profile selection for a memory request.

Why a bitmask: a GI occupies ``size`` consecutive memory slices from an aligned ``start``; GIs may not
overlap. On these GPUs the placement table (``nvidia-smi mig -lgipp``) makes an 8-bit memory-slice mask
capture every GI conflict, including the 7 SM slices: bit ``s`` is set when memory slice ``s`` is taken.
The one extra rule is a per-profile instance cap, which only bites for the ``+me`` profile (one
media-extension instance per GPU).

Sources (docs/references.md, "MIG tables"): memory and SM counts are the figures ``nvidia-smi mig -lgip``
prints, in GiB with two decimals, stored as MiB (GiB × 1024), from published ``-lgip`` output of each
GPU. A100-40GB keeps NVML's ``memorySizeMB``
(NVIDIA/go-nvml's mock tables). ``gpuslice.hardware.mig_nvml.compare_with_table`` prints any difference
between a table and a real GPU. MIG GPUs whose complete ``-lgip`` output was not found (A30, GH200,
B200) have no table rather than a guessed one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpuslice.errors import InvalidSize, UnknownName, UserError
from gpuslice.units import MiB, format_size, looks_like_size, parse_size

__all__ = [
    "COMPUTE_SLICES",
    "MEMORY_SLICES",
    "MIG_GPUS",
    "InvalidMigLayout",
    "MigGpu",
    "MigInstance",
    "MigLayout",
    "MigProfile",
    "MigRequestTooLarge",
    "UnknownMigGpu",
    "UnknownMigProfile",
    "compute_slices_by_name",
    "format_mask",
    "mig_gpu",
    "parse_layout",
    "resolve_request",
    "slot_mask",
    "smallest_profiles",
]

MEMORY_SLICES = 8  # NVIDIA MIG user guide, "Concepts": 8 memory slices
COMPUTE_SLICES = 7  # and 7 SM (GPC) slices per MIG-capable GPU
FULL_MASK = (1 << MEMORY_SLICES) - 1


def compute_slices_by_name(profile: str) -> int:
    """A GPU instance profile's compute slices from its name alone: NVIDIA names every one
    ``<compute slices>g.<memory>gb`` (``3g.40gb`` → 3, ``1g.10gb+me`` → 1; MIG user guide, "Supported MIG
    Profiles"). For a profile whose GPU's table is not known yet; a name not of that form counts all 7."""
    head = profile.split("g", 1)[0]
    slices = int(head) if head.isdigit() else COMPUTE_SLICES
    return slices if 1 <= slices <= COMPUTE_SLICES else COMPUTE_SLICES


class UnknownMigGpu(UnknownName):
    """A GPU name has no MIG profile table."""


class UnknownMigProfile(UnknownName):
    """A profile name or ID is not in the GPU's MIG table."""


class MigRequestTooLarge(UserError):
    """A memory request is larger than the GPU's largest MIG profile."""


class InvalidMigLayout(UserError):
    """A layout string names an impossible instance (bad start, overlap, malformed entry)."""


def slot_mask(start: int, size: int) -> int:
    """Bits ``start … start+size-1`` set: the memory slices a GI at ``start`` occupies."""
    return ((1 << size) - 1) << start


def format_mask(mask: int) -> str:
    """Slot 0 first, '#' taken and '.' free: ``0b11110000`` → '....####'."""
    return "".join("#" if mask >> s & 1 else "." for s in range(MEMORY_SLICES))


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model.

    ``profile_id`` is the ID ``nvidia-smi mig -lgip`` prints and ``-cgi`` takes, equal to
    ``nvmlGpuInstanceProfileInfo_t.id``; ``nvml_constant`` is the ``NVML_GPU_INSTANCE_PROFILE_*`` selector
    passed to ``nvmlDeviceGetGpuInstanceProfileInfo`` (NVML's ``nvml.h``; the two numberings differ).
    """

    name: str  # "<SM slices>g.<memory GB>gb[+me]"
    profile_id: int
    nvml_constant: int
    memory_bytes: int  # as NVML reports it (memorySizeMB × MiB), not the name's nominal GB
    compute_slices: int  # of 7
    memory_slices: int  # of 8; equals the placement size
    starts: tuple[int, ...]  # allowed placement starts, as ``nvidia-smi mig -lgipp`` prints
    max_count: int  # instances per GPU
    sm_count: int

    def mask_at(self, start: int) -> int:
        """Memory slices this profile occupies when started at ``start``."""
        return slot_mask(start, self.memory_slices)

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A MIG-capable GPU model: its key (``a100-80gb``), a description and its profiles, smallest first."""

    key: str
    description: str
    profiles: tuple[MigProfile, ...]

    @property
    def name(self) -> str:
        """The GPU as output shows it, spelled as the GPU model catalogue does: ``A100-80GB``."""
        return self.key.upper().replace("PCIE", "PCIe")

    def named(self, name: str) -> MigProfile | None:
        """The profile whose name is exactly ``name`` ("1g.10gb"), None if this table has none: how a
        request that names its profile (``Request.mig_profile``) is matched, everywhere alike."""
        return next((p for p in self.profiles if p.name == name), None)

    def profile(self, name_or_id: str | int) -> MigProfile:
        """The profile called ``name_or_id`` ("3g.40gb", "MIG 3g.40gb", 9 or "9"); UnknownMigProfile else."""
        text = str(name_or_id).strip().lower().removeprefix("mig ").strip()
        for p in self.profiles:
            if text in (p.name, str(p.profile_id)):
                return p
        known = ", ".join(f"{p.name} ({p.profile_id})" for p in self.profiles)
        raise UnknownMigProfile(f"{name_or_id!r} is not a MIG profile of {self.key}; known: {known}")


# Profile shapes shared by these GPUs: IDs from ``nvidia-smi mig -lgip``, constants from ``nvml.h``, starts
# and counts from ``-lgipp`` (NVIDIA MIG user guide, "Supported MIG Profiles"; docs/references.md):
# (suffix-less SM slices, nvidia-smi ID, NVML constant, compute slices, memory slices, starts, max count)
_SHAPES: dict[str, tuple[int, int, int, int, tuple[int, ...], int]] = {
    "1g": (19, 0x0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),  # NVML_GPU_INSTANCE_PROFILE_1_SLICE
    "1g+me": (20, 0x7, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),  # 1_SLICE_REV1: media extensions, one per GPU
    "1g.2x": (15, 0x9, 1, 2, (0, 2, 4, 6), 4),  # 1_SLICE_REV2: 1 SM slice, twice the memory
    "2g": (14, 0x1, 2, 2, (0, 2, 4), 3),  # 2_SLICE
    "3g": (9, 0x2, 3, 4, (0, 4), 2),  # 3_SLICE: 4 memory slices, 3 SM slices (MIG user guide)
    "4g": (5, 0x3, 4, 4, (0,), 1),  # 4_SLICE
    "7g": (0, 0x4, 7, 8, (0,), 1),  # 7_SLICE
}


def _gpu(key: str, description: str, rows: Iterable[tuple[str, str, int, int]]) -> MigGpu:
    """rows: (shape key, profile name, memory MiB, SMs)."""
    profiles = []
    for shape, name, memory_mib, sms in rows:
        pid, const, compute, memory, starts, count = _SHAPES[shape]
        profiles.append(
            MigProfile(
                name=name,
                profile_id=pid,
                nvml_constant=const,
                memory_bytes=memory_mib * MiB,
                compute_slices=compute,
                memory_slices=memory,
                starts=starts,
                max_count=count,
                sm_count=sms,
            )
        )
    return MigGpu(key=key, description=description, profiles=tuple(profiles))


# A100-40GB: MiB from NVIDIA/go-nvml mock a100.go (memorySizeMB), 14 SMs per slice.
_A100_40 = _gpu(
    "a100-40gb",
    "NVIDIA A100 SXM4/PCIe 40GB",
    [
        ("1g", "1g.5gb", 4864, 14),
        ("1g+me", "1g.5gb+me", 4864, 14),
        ("1g.2x", "1g.10gb", 9856, 14),
        ("2g", "2g.10gb", 9856, 28),
        ("3g", "3g.20gb", 19968, 42),
        ("4g", "4g.20gb", 19968, 56),
        ("7g", "7g.40gb", 40192, 98),
    ],
)
# A100-80GB: same shapes as the 40 GB card. Memory: `nvidia-smi mig -lgip` on an A100 80GB with a current
# driver (9.50 / 19.50 / 39.25 / 79.00 GiB; docs/references.md, "MIG tables").
_A100_80 = _gpu(
    "a100-80gb",
    "NVIDIA A100 SXM4/PCIe 80GB",
    [
        ("1g", "1g.10gb", 9728, 14),
        ("1g+me", "1g.10gb+me", 9728, 14),
        ("1g.2x", "1g.20gb", 19968, 14),
        ("2g", "2g.20gb", 19968, 28),
        ("3g", "3g.40gb", 40192, 42),
        ("4g", "4g.40gb", 40192, 56),
        ("7g", "7g.80gb", 80896, 98),
    ],
)
# H100 SXM5 80GB: a published `-lgip` of an H100 80GB HBM3 (9.75 / 19.62 / 39.50 / 79.25 GiB).
# SMs per slice are not uniform on GH100 (1g 16, doubled-memory 1g 26, 3g 60, 7g 132).
_H100_80 = _gpu(
    "h100-80gb",
    "NVIDIA H100 SXM5 80GB",
    [
        ("1g", "1g.10gb", 9984, 16),
        ("1g+me", "1g.10gb+me", 9984, 16),
        ("1g.2x", "1g.20gb", 20096, 26),
        ("2g", "2g.20gb", 20096, 32),
        ("3g", "3g.40gb", 40448, 60),
        ("4g", "4g.40gb", 40448, 64),
        ("7g", "7g.80gb", 81152, 132),
    ],
)
# H100 PCIe 80GB: the same memory, fewer SMs (114 in all; 14 / 14 / 14 / 30 / 46 / 62 / 114), from a
# published `-lgip` of an H100 PCIe on driver 570.169 (docs/references.md).
_H100_PCIE_80 = _gpu(
    "h100-pcie-80gb",
    "NVIDIA H100 PCIe 80GB",
    [
        ("1g", "1g.10gb", 9984, 14),
        ("1g+me", "1g.10gb+me", 9984, 14),
        ("1g.2x", "1g.20gb", 20096, 14),
        ("2g", "2g.20gb", 20096, 30),
        ("3g", "3g.40gb", 40448, 46),
        ("4g", "4g.40gb", 40448, 62),
        ("7g", "7g.80gb", 81152, 114),
    ],
)
# H100 NVL 94GB: `-lgip` rows posted in NVIDIA/gpu-operator pull request 900 (1g 10.75 GiB, 1g.24gb and
# 2g.24gb 21.62, 3g 46.38) and a published `-lgip`/`-lgipp` of an H100 94GB on driver 560 (4g 46.38,
# 7g 93.12; SMs as on the H100 SXM5; the same placements).
_H100_NVL = _gpu(
    "h100-nvl-94gb",
    "NVIDIA H100 NVL 94GB",
    [
        ("1g", "1g.12gb", 11008, 16),
        ("1g+me", "1g.12gb+me", 11008, 16),
        ("1g.2x", "1g.24gb", 22144, 26),
        ("2g", "2g.24gb", 22144, 32),
        ("3g", "3g.47gb", 47488, 60),
        ("4g", "4g.47gb", 47488, 64),
        ("7g", "7g.94gb", 95360, 132),
    ],
)
# H200 141GB: `-lgip` of an H200 posted to NVIDIA/mig-parted#120 (16.00 / 32.25 / 69.50 /
# 139.75 GiB; SMs as on the H100 SXM5). IDs and placements are H100's (same GH100 slice layout).
_H200 = _gpu(
    "h200-141gb",
    "NVIDIA H200 SXM5/NVL 141GB",
    [
        ("1g", "1g.18gb", 16384, 16),
        ("1g+me", "1g.18gb+me", 16384, 16),
        ("1g.2x", "1g.35gb", 33024, 26),
        ("2g", "2g.35gb", 33024, 32),
        ("3g", "3g.71gb", 71168, 60),
        ("4g", "4g.71gb", 71168, 64),
        ("7g", "7g.141gb", 143104, 132),
    ],
)

MIG_GPUS: dict[str, MigGpu] = {
    g.key: g for g in (_A100_40, _A100_80, _H100_80, _H100_PCIE_80, _H100_NVL, _H200)
}
# Other spellings people use: the GpuModel catalogue's names and nvidia-smi's product names.
_ALIASES = {
    "a100": "a100-40gb",
    "h100": "h100-80gb",
    "h100-sxm-80gb": "h100-80gb",
    "h100-pcie": "h100-pcie-80gb",
    "h100-nvl": "h100-nvl-94gb",
    "h200": "h200-141gb",
    "h200-141": "h200-141gb",
}


def mig_gpu(name: str) -> MigGpu:
    """The MIG table of ``name`` (``a100-80gb``, ``A100-80GB``, ``H200``); UnknownMigGpu lists the keys."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key in MIG_GPUS:
        return MIG_GPUS[key]
    raise UnknownMigGpu(f"{name!r} has no MIG profile table; known: {', '.join(MIG_GPUS)}")


def smallest_profiles(gpu: MigGpu, memory_bytes: int) -> tuple[MigProfile, ...]:
    """Profiles with at least ``memory_bytes``, best first: least memory, then fewest compute slices.

    HAMi's rule (Project-HAMi/HAMi ``pkg/device/nvidia/device.go``, dynamic MIG: "the smallest profile whose
    memory ≥ the request; ties go to fewer slices"), kept as an ordered list so a planner can fall back to the
    next size when the smallest cannot be placed. ``+me`` profiles are left out: media engines are asked for
    by name.
    """
    if memory_bytes <= 0:
        raise MigRequestTooLarge(f"a MIG memory request must be positive, got {memory_bytes} bytes")
    fitting = [p for p in gpu.profiles if p.memory_bytes >= memory_bytes and not p.media_extensions]
    if not fitting:
        largest = max(gpu.profiles, key=lambda p: p.memory_bytes)
        raise MigRequestTooLarge(
            f"{format_size(memory_bytes)} does not fit any MIG profile of {gpu.key}: the largest, "
            f"{largest.name}, has {format_size(largest.memory_bytes)}; use a whole GPU instead"
        )
    return tuple(sorted(fitting, key=lambda p: (p.memory_bytes, p.compute_slices, p.memory_slices)))


def resolve_request(gpu: MigGpu, text: str) -> tuple[MigProfile, ...]:
    """A request as written ("3g.40gb", "9", "12GiB") → the profiles that satisfy it, best first."""
    try:
        return (gpu.profile(text),)
    except UnknownMigProfile as err:
        if text.strip().isdigit():  # a bare number is a profile ID, never a size in bytes
            raise UnknownMigProfile(f"{err}; a memory size needs a unit, e.g. 12GiB") from None
        try:
            size = parse_size(text.strip())
        except InvalidSize as bad:
            if looks_like_size(text):  # "0GiB", "-5GiB", "1.5.2GiB": meant as a size, so say what is wrong
                raise bad from None
            raise UnknownMigProfile(f"{err}; or give a memory size such as 12GiB") from None
    return smallest_profiles(gpu, size)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance: its profile and start; ``gi_id``/``ci_ids`` when read from a node.

    ``idle`` marks an instance no workload uses: a planner may reuse or destroy it.
    """

    profile: MigProfile
    start: int
    gi_id: int | None = None
    ci_ids: tuple[int, ...] = (0,)
    idle: bool = False

    @property
    def mask(self) -> int:
        return self.profile.mask_at(self.start)

    def __str__(self) -> str:
        gi = "" if self.gi_id is None else f"/{self.gi_id}"
        return f"{self.profile.name}@{self.start}{gi}{':idle' if self.idle else ''}"


@dataclass(frozen=True, slots=True)
class MigLayout:
    """The GPU instances on one GPU. Immutable: ``with_instance``/``without`` return new layouts."""

    gpu: MigGpu
    instances: tuple[MigInstance, ...] = ()

    @property
    def mask(self) -> int:
        """Occupied memory slices, bit s = slice s."""
        m = 0
        for inst in self.instances:
            m |= inst.mask
        return m

    def count(self, profile: MigProfile) -> int:
        return sum(1 for i in self.instances if i.profile == profile)

    def can_place(self, profile: MigProfile, start: int) -> bool:
        """Is ``start`` allowed for ``profile`` (``-lgipp``), its slices free and its cap not reached?"""
        return (
            start in profile.starts
            and not self.mask & profile.mask_at(start)
            and self.count(profile) < profile.max_count
        )

    def has_start(self, profile_name: str) -> bool:
        """Whether this GPU's table has a profile called exactly ``profile_name`` with a free start now."""
        wanted = self.gpu.named(profile_name)
        return wanted is not None and bool(self.placements(wanted))

    def placements(self, profile: MigProfile) -> tuple[int, ...]:
        """Every start where ``profile`` fits now, lowest first."""
        return tuple(s for s in profile.starts if self.can_place(profile, s))

    def with_instance(self, instance: MigInstance) -> MigLayout:
        if not self.can_place(instance.profile, instance.start):
            raise InvalidMigLayout(
                f"{instance.profile.name} cannot start at slot {instance.start} on {self.gpu.key}: "
                f"allowed starts {list(instance.profile.starts)}, occupied slots {format_mask(self.mask)}"
            )
        return replace(self, instances=(*self.instances, instance))

    def without(self, instance: MigInstance) -> MigLayout:
        if instance not in self.instances:
            raise InvalidMigLayout(f"{instance} is not in the layout")
        rest = list(self.instances)
        rest.remove(instance)
        return replace(self, instances=tuple(rest))


def parse_layout(gpu: MigGpu, text: str) -> MigLayout:
    """``"4g.40gb@0/1, 1g.10gb@6/13:idle"`` → a layout. Entry: PROFILE@START[/GI_ID][:idle].

    The GI id (``nvidia-smi mig -lgi``'s "GI ID") is needed for an idle instance, because a planner may
    destroy it and ``-dgi`` takes that id. Entries are validated against the placement table and each
    other; nothing is returned half-built.
    """
    layout = MigLayout(gpu)
    for raw in (e.strip() for e in text.split(",")):
        if not raw:
            continue
        body, _, flag = raw.partition(":")
        if flag not in ("", "idle"):
            raise InvalidMigLayout(f"layout entry {raw!r}: only ':idle' may follow the start")
        name, at, where = body.partition("@")
        start_text, _, gi_text = where.partition("/")
        if not at or not start_text.strip().isdigit() or (gi_text and not gi_text.strip().isdigit()):
            raise InvalidMigLayout(
                f"layout entry {raw!r}: write PROFILE@START[/GI_ID][:idle], "
                "e.g. 3g.40gb@4/2 or 1g.10gb@6/13:idle"
            )
        gi_id = int(gi_text) if gi_text else None
        if flag and gi_id is None:
            raise InvalidMigLayout(
                f"idle instance {raw!r} needs its GPU-instance id (nvidia-smi mig -lgi, 'GI ID'), "
                f"e.g. {name.strip()}@{start_text.strip()}/7:idle, so that it can be destroyed"
            )
        profile = gpu.profile(name)
        layout = layout.with_instance(
            MigInstance(profile=profile, start=int(start_text), gi_id=gi_id, idle=bool(flag))
        )
    return layout
