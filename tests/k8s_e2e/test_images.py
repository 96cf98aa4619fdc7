"""The images ``scripts/build-image`` builds (or finds in its cache), imported into a private containerd with
``ctr images import`` and run with ``ctr run``, as a node runs them: gpuslice's CLI and the native shim
work inside, no compiler or pip is left in the image, and the kube-scheduler image runs the e2e's build.

Cold (no cached archive) the gpuslice image takes minutes and needs Debian's mirror and PyPI; from the
cache (``$GPUSLICE_E2E_CACHE/images``) these tests take seconds.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from controlplane import ControlPlane, binaries_dir
from images import built_component_images

from node import Node

# a cold build of the gpuslice image takes minutes (benchmarks/RESULTS.md, "Container images")
pytestmark = [pytest.mark.k8s_e2e, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
GPUSLICE_IMAGE = "docker.io/library/gpuslice:0.1.0"  # what the manifests' gpuslice:0.1.0 means
COMPILERS = {"usr/bin/gcc", "usr/bin/cc", "usr/bin/c99", "usr/bin/x86_64-linux-gnu-gcc"}


@pytest.fixture(scope="module")
def images() -> dict[str, Path]:
    """{image name: archive} from scripts/build-image (both images)."""
    return built_component_images(binaries_dir())


@pytest.fixture(scope="module")
def runtime(images: dict[str, Path]) -> Iterator[Node]:
    """A containerd of its own (the e2e node's, without a kubelet) with both images imported."""
    plane = ControlPlane(binaries_dir() or Path())  # never started: only its folder and process list
    node = Node(plane, "images", images)
    try:
        node.start_runtime()
        yield node
    finally:
        node.stop()
        plane.stop()


def _manifest_and_config(archive: Path) -> tuple[dict, dict, str]:
    """The image's manifest, its config and its name, read from the OCI layout archive."""
    with tarfile.open(archive) as tar:
        blob = lambda digest: json.load(tar.extractfile(f"blobs/sha256/{digest.partition(':')[2]}"))  # noqa: E731
        (entry,) = json.load(tar.extractfile("index.json"))["manifests"]
        manifest = blob(entry["digest"])
        return manifest, blob(manifest["config"]["digest"]), entry["annotations"]["io.containerd.image.name"]


def _rootfs_paths(archive: Path) -> set[str]:
    """Every path in the image's root file system (its one layer)."""
    manifest, _config, _name = _manifest_and_config(archive)
    (layer,) = manifest["layers"]
    with tarfile.open(archive) as outer:
        inner = outer.extractfile(f"blobs/sha256/{layer['digest'].partition(':')[2]}")
        with tarfile.open(fileobj=inner, mode="r|") as rootfs:
            return {member.name.removeprefix("./") for member in rootfs}


def test_the_images_are_named_as_the_manifests_use_them(images: dict[str, Path], runtime: Node) -> None:
    listed = runtime.ctr("images", "ls", "-q").stdout.split()
    scheduler = next(name for name in images if "kube-scheduler" in name)
    assert GPUSLICE_IMAGE in listed and scheduler in listed
    assert scheduler.startswith("registry.k8s.io/kube-scheduler:v1.")
    _manifest, config, name = _manifest_and_config(images[GPUSLICE_IMAGE])
    assert name == GPUSLICE_IMAGE
    assert config["config"]["Entrypoint"] == ["gpuslice"]


def test_gpuslice_runs_inside_the_image(runtime: Node) -> None:
    version = runtime.run_image(GPUSLICE_IMAGE, "gpuslice", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, "gpuslice 0.1.0"), version.stderr
    helped = runtime.run_image(GPUSLICE_IMAGE, "gpuslice", "k8s", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("extender", "webhook", "device-plugin", "dra-driver", "dra-allocator"):
        assert command in helped.stdout


def test_every_gpuslice_module_imports_inside_the_image(runtime: Node) -> None:
    """Each compiled dependency finds the system libraries its wheel expects (libstdc++, OpenMP)."""
    probe = (
        "import importlib, pkgutil, gpuslice\n"
        "for m in pkgutil.walk_packages(gpuslice.__path__, 'gpuslice.'):\n"
        "    importlib.import_module(m.name)\n"
        "import numba, numpy, scipy.optimize, sklearn.ensemble, matplotlib.pyplot, grpc, uvloop, orjson\n"
        "print('ok')"
    )
    done = runtime.run_image(GPUSLICE_IMAGE, "python3", "-W", "ignore", "-c", probe)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr[-3000:]


def test_the_shim_is_installed_and_no_compiler_or_pip_is(images: dict[str, Path], runtime: Node) -> None:
    probe = (
        "import shutil; from gpuslice.shim import library_path; "
        "print(library_path().is_file(), shutil.which('gcc'), shutil.which('cc'), shutil.which('pip'))"
    )
    done = runtime.run_image(GPUSLICE_IMAGE, "python3", "-c", probe)
    assert (done.returncode, done.stdout.split()) == (0, ["True", "None", "None", "None"]), done.stderr
    paths = _rootfs_paths(images[GPUSLICE_IMAGE])
    assert "opt/gpuslice/bin/gpuslice" in paths
    assert not paths & COMPILERS
    assert not [p for p in paths if "/site-packages/pip/" in p or p.startswith("usr/lib/gcc")]


def test_the_scheduler_image_runs_the_e2e_build(images: dict[str, Path], runtime: Node) -> None:
    scheduler = next(name for name in images if "kube-scheduler" in name)
    done = runtime.run_image(scheduler, "kube-scheduler", "--version")
    version = scheduler.rpartition(":")[2]
    assert (done.returncode, done.stdout.strip()) == (0, f"Kubernetes {version}"), done.stderr
