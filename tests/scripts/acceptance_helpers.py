"""Fakes for the GPU acceptance script's tests: a fake ``nvidia-smi`` program, a fake ``pynvml`` and
canned unified-memory worker output.

Importing this module puts ``scripts/`` on sys.path, so the tests import ``gpu_acceptance`` as the
script does.

The fake nvidia-smi prints files from a folder: ``gpus.csv`` for ``--query-gpu``, ``apps.csv`` for
``--query-compute-apps`` and ``topo.txt`` for ``topo -m``; any other arguments exit 6, as nvidia-smi
does for a bad option. The recorded outputs (fixtures/) are in nvidia-smi's formats, with the values
of a published DGX H100 (H100 80GB HBM3, 81559 MiB; see fixtures/README.md).
"""

from __future__ import annotations

import stat
import sys
import textwrap
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "hardware"))  # the topology tests' fake pynvml

FIXTURES = Path(__file__).parent / "fixtures"
TOPO_FIXTURES = ROOT / "tests" / "hardware" / "fixtures"
MIB = 1 << 20

FAKE_SMI = textwrap.dedent(
    """\
    #!{python}
    import sys
    from pathlib import Path
    folder = Path({folder!r})
    args = sys.argv[1:]
    FORMAT = "--format=csv,noheader,nounits"
    if args[:1] == ["topo"] and args[1:] == ["-m"]:
        name = "topo.txt"
    elif args and args[0].startswith("--query-gpu=") and args[1:] == [FORMAT]:
        name = "gpus.csv"
    elif args and args[0].startswith("--query-compute-apps=") and args[1:] == [FORMAT]:
        name = "apps.csv"
    else:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", file=sys.stderr)
        sys.exit(6)
    sys.stdout.write((folder / name).read_text() if (folder / name).exists() else "")
    """
)


def make_fake_smi(folder: Path, *, gpus: str, topo: str, apps: str = "") -> Path:
    """A fake nvidia-smi in ``folder``/bin printing the given texts; returns the program's path."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "gpus.csv").write_text(gpus)
    (folder / "topo.txt").write_text(topo)
    (folder / "apps.csv").write_text(apps)
    program = folder / "bin" / "nvidia-smi"
    program.write_text(FAKE_SMI.format(python=sys.executable, folder=str(folder)))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def dgx_h100_smi_at(tmp_path: Path) -> Path:
    """nvidia-smi of a DGX H100: eight H100 80GB HBM3 on NVSwitch."""
    return make_fake_smi(
        tmp_path / "smi",
        gpus=(FIXTURES / "smi_dgx_h100_gpus.csv").read_text(),
        topo=(TOPO_FIXTURES / "dgx_h100.txt").read_text(),
    )


def dgx_h100_nvml(**changes) -> types.ModuleType:
    """A fake pynvml for the same DGX H100: the topology tests' fake (links, PCIe paths) plus the names,
    memory, MIG mode and telemetry nvidia-smi prints in fixtures/smi_dgx_h100_gpus.csv. ``changes``
    overrides a GPU field for every GPU (e.g. ``uuid_suffix="x"``)."""
    from test_topology_nvml import fake_pynvml

    from gpuslice.hardware.topology_profiles import profile

    m = fake_pynvml(profile("dgx-h100"))
    rows = [line.split(", ") for line in (FIXTURES / "smi_dgx_h100_gpus.csv").read_text().splitlines()]
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    m.NVML_VOLATILE_ECC = 0
    m.nvmlDeviceGetName = lambda h: rows[h][2].encode()
    m.nvmlDeviceGetUUID = lambda h: rows[h][1] + changes.get("uuid_suffix", "")
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=int(rows[h][3]) * MIB + 123,
        used=int(rows[h][4]) * MIB + changes.get("extra_used", 0),
        free=(int(rows[h][3]) - int(rows[h][4])) * MIB,
    )
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=int(rows[h][5]), memory=0)
    m.nvmlDeviceGetTemperature = lambda h, sensor: int(rows[h][6])
    m.nvmlDeviceGetPowerUsage = lambda h: int(float(rows[h][7]) * 1000)
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0

    def no_mig_profiles(h, profile):
        raise m.NVMLError("Not Supported")

    m.nvmlDeviceGetGpuInstanceProfileInfo = no_mig_profiles
    return m


def canned_worker_output(plan: dict, *, drop: tuple[str, ...] = ()) -> str:
    """What um_worker.py prints for ``plan``, with invented figures (tests only: no GPU measured these).
    The figures are chosen to be self-consistent: 25 GB/s host-to-device, 40 µs per serial fault,
    1 ns per resident access, and sweep times from those. ``drop`` leaves out records of those kinds."""
    import json

    link, fault_s, access_s = 25e9, 40e-6, 1e-9
    bench = plan["bench_bytes"]
    lines = [
        "CuPy warning: a line that is not JSON is kept as a note",
        {
            "kind": "env",
            "gpu": "Canned GPU (not a measurement)",
            "free_bytes": 8 << 30,
            "total_bytes": 8 << 30,
        },
        {"kind": "faults", "pages": plan["fault_pages"], "seconds": plan["fault_pages"] * fault_s},
        {"kind": "bandwidth", "direction": "h2d", "method": "fault", "bytes": bench, "seconds": bench / 12e9},
        {"kind": "bandwidth", "direction": "d2h", "method": "fault", "bytes": bench, "seconds": bench / 6e9},
        {
            "kind": "bandwidth",
            "direction": "h2d",
            "method": "prefetch",
            "bytes": bench,
            "seconds": bench / link,
        },
        {
            "kind": "bandwidth",
            "direction": "d2h",
            "method": "prefetch",
            "bytes": bench,
            "seconds": bench / 22e9,
        },
        {
            "kind": "advise",
            "variant": "none",
            "bytes": bench,
            "seconds": bench / 12e9,
            "second_touch_seconds": 1e-4,
        },
        {
            "kind": "advise",
            "variant": "prefetch",
            "bytes": bench,
            "seconds": bench / 24e9,
            "second_touch_seconds": 1e-4,
        },
    ]
    first = max((s for s in plan["sweeps"] if s["pattern"] == "cyclic"), key=lambda s: s["tile"])
    lines.append(
        {
            "kind": "resident",
            "accesses": first["streams"] * first["tile"],
            "seconds": first["streams"] * first["tile"] * access_s,
        }
    )
    for s in plan["sweeps"]:
        nbytes = s["streams"] * s["tile"] * 4096
        cold = nbytes / link + nbytes / (2 << 20) * fault_s / 8
        warm = s["streams"] * s["tile"] * access_s
        passes = [cold + warm] + [warm * (1 + 3 * max(0.0, s["ratio"] - 1))] * (len(s["passes"]) - 1)
        lines.append(
            {
                "kind": "sweep",
                "pattern": s["pattern"],
                "ratio": s["ratio"],
                "tile": s["tile"],
                "streams": s["streams"],
                "buffer_bytes": nbytes,
                "capacity_bytes": plan["capacity_bytes"],
                "pass_seconds": passes,
            }
        )
    return (
        "\n".join(
            line if isinstance(line, str) else json.dumps(line)
            for line in lines
            if isinstance(line, str) or line["kind"] not in drop
        )
        + "\n"
    )
