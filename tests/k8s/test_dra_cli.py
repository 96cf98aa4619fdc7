"""``gpuslice k8s dra-driver`` and ``dra-allocator`` at the command line: the objects they print, and one
error line with exit 2 for bad options (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from gpuslice.k8s.dra.classes import device_classes
from gpuslice.k8s.dra.identity import gpu_identities
from gpuslice.k8s.dra.slices import node_slices
from gpuslice.node.discovery import discover

GPUSLICE = str(Path(sys.executable).parent / "gpuslice")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUSLICE, "k8s", *args], capture_output=True, text=True, timeout=120)


def test_print_classes_writes_the_shipped_device_classes() -> None:
    done = run("dra-driver", "--print-classes")
    assert done.returncode == 0, done.stderr
    assert [d for d in yaml.safe_load_all(done.stdout) if d] == device_classes()


def test_print_slices_writes_the_nodes_pool() -> None:
    done = run("dra-driver", "--simulate", "dgx-a100:mig", "--node-name", "gpu-7", "--print-slices")
    assert done.returncode == 0, done.stderr
    machine = discover("dgx-a100:mig")
    expected = node_slices(machine, "gpu-7", generation=1, identities=gpu_identities(machine))
    assert [d for d in yaml.safe_load_all(done.stdout) if d] == expected


def test_bad_options_are_one_error_line_and_exit_2() -> None:
    for args, text in (
        (("dra-driver", "--sharing", "mps", "--print-slices"), "mps is not offered on Kubernetes"),
        (("dra-driver", "--sharing", "nope"), "pods get soft or shim sharing"),
        (("dra-driver", "--simulate", "no-such-box", "--print-slices"), "no-such-box"),
        (("dra-allocator", "--policy", "fdg"), "is not a placement policy; known:"),
    ):
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        out = done.stdout + done.stderr
        assert text in out and "Traceback" not in out, out
