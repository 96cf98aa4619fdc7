"""The container images of the end-to-end node, built here: no registry, no docker.

Each image is written as an OCI image layout archive (``oci-layout``, ``index.json``, ``blobs/sha256/…``:
one uncompressed layer, its config and manifest), which ``ctr -n k8s.io images import`` reads; the name
is carried by the ``io.containerd.image.name`` annotation of the index entry. ``oci_image`` writes one
from a prebuilt layer (``scripts/build-image`` gives it a whole Debian root file system).

* ``PAUSE_IMAGE``: the pod sandbox, one static binary (``pause.c`` here) that waits for SIGTERM.
* ``TOOLS_IMAGE``: what the test pods run: busybox (Debian's busybox-static) for the shell and its
  applets, the CUDA driver client of the shim tests (``tests/shim/c/driver_client.c``) and the glibc
  files that it and the native shim load, copied from this machine as ``ldd`` lists them. The CUDA
  driver itself (the fake ``libcuda.so.1``) is not in the image: the device plugin mounts it, as the
  NVIDIA container toolkit mounts the real one on a GPU node.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PAUSE_IMAGE", "TOOLS_IMAGE", "build_images", "built_component_images", "oci_archive", "oci_image"]

PAUSE_IMAGE = "gpuslice.local/pause:e2e"
TOOLS_IMAGE = "gpuslice.local/e2e-tools:1"
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: one static binary
APPLETS = ("sh", "cat", "env", "ls", "sleep", "grep", "echo", "test", "true", "wc", "head", "readlink")
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def _layer(files: Mapping[str, bytes | Path], links: Mapping[str, str]) -> bytes:
    """One uncompressed layer: ``files`` (image path -> bytes or a host file, mode 0755) and ``links``
    (image path -> symlink target), their folders, owned by root, time 0 (the same bytes every build)."""
    out = io.BytesIO()
    folders: set[str] = set()
    for path in [*files, *links]:
        parts = path.strip("/").split("/")[:-1]
        folders.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, content in sorted(files.items()):
            data = content.read_bytes() if isinstance(content, Path) else content
            info = tarfile.TarInfo(path.strip("/"))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path.strip("/"))
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return out.getvalue()


def oci_archive(
    out: Path,
    name: str,
    files: Mapping[str, bytes | Path],
    *,
    entrypoint: list[str],
    links: Mapping[str, str] | None = None,
) -> Path:
    """Write the image ``name`` (one layer of ``files`` and ``links``) as an OCI layout tar at ``out``."""
    return oci_image(out, name, _layer(files, links or {}), entrypoint=entrypoint)


def oci_image(
    out: Path,
    name: str,
    layer: bytes | Path,
    *,
    entrypoint: list[str],
    path: str = "/usr/local/bin:/usr/bin:/bin",
) -> Path:
    """Write the image ``name`` with one prebuilt layer (an uncompressed tar, in memory or a file such
    as a whole root file system) as an OCI layout tar at ``out``; ``path`` is the image's PATH."""
    blobs: dict[str, bytes | Path] = {}

    def blob(data: bytes | Path) -> dict[str, object]:
        if isinstance(data, Path):
            with data.open("rb") as stream:
                digest = "sha256:" + hashlib.file_digest(stream, "sha256").hexdigest()
            size = data.stat().st_size
        else:
            digest, size = "sha256:" + hashlib.sha256(data).hexdigest(), len(data)
        blobs[digest] = data
        return {"digest": digest, "size": size}

    layer_ref = blob(layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": [f"PATH={path}"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_ref["digest"]]},  # uncompressed: digest = diff_id
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(_json(config))},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_ref}],
    }
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **blob(_json(manifest)),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                },
            }
        ],
    }
    entries: dict[str, bytes | Path] = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json(index),
    }
    entries.update({f"blobs/sha256/{d.partition(':')[2]}": data for d, data in blobs.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        for member, data in entries.items():
            info = tarfile.TarInfo(member)
            info.mode = 0o644
            if isinstance(data, Path):
                info.size = data.stat().st_size
                with data.open("rb") as stream:
                    tar.addfile(info, stream)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _compile(cc: list[str], out: Path, *args: str) -> Path:
    done = subprocess.run([*cc, "-o", str(out), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"compiling {out.name} failed:\n{done.stderr}")
    return out


def _shared_libraries(binary: Path, library_path: Path) -> dict[str, Path]:
    """The loader and libraries ``binary`` needs, by the path the loader finds them at (``ldd``), less
    the CUDA driver libraries (mounted into the container, not part of the image)."""
    done = subprocess.run(
        ["ldd", str(binary)],
        capture_output=True,
        text=True,
        check=True,
        env={"LD_LIBRARY_PATH": str(library_path)},
    )
    found: dict[str, Path] = {}
    for line in done.stdout.splitlines():
        match = _LDD_PATH.search(line)
        if match is None or "libcuda" in line or "libnvidia-ml" in line:
            continue
        found[match.group(1)] = Path(match.group(1)).resolve()
    return found


def build_images(work: Path) -> dict[str, Path]:
    """Build both images into ``work``: {image name: archive}. Needs a C compiler with static glibc
    (libc6-dev) and /bin/busybox (busybox-static)."""
    from gpuslice.shim import library_path
    from gpuslice.shim.build import build_fake_driver, compiler

    if not BUSYBOX.is_file():
        raise RuntimeError(f"{BUSYBOX} is missing: apt-get install busybox-static")
    work.mkdir(parents=True, exist_ok=True)
    cc = compiler()
    pause = _compile(cc, work / "pause", "-static", "-O2", str(HERE / "pause.c"))
    fake = work / "fake"
    build_fake_driver(REPO / "native" / "shim", fake)
    source = REPO / "tests" / "shim" / "c" / "driver_client.c"
    client = _compile(
        cc, work / "driver_client", "-std=gnu11", "-O1", str(source),
        f"-L{fake}", "-l:libcuda.so.1", "-l:libnvidia-ml.so.1", "-ldl", "-lpthread",
    )  # fmt: skip
    files: dict[str, bytes | Path] = {"/bin/busybox": BUSYBOX, "/usr/local/bin/driver_client": client}
    for binary in (client, library_path()):
        files.update(_shared_libraries(binary, fake))
    archives = {
        PAUSE_IMAGE: oci_archive(work / "pause.tar", PAUSE_IMAGE, {"/pause": pause}, entrypoint=["/pause"]),
        TOOLS_IMAGE: oci_archive(
            work / "tools.tar",
            TOOLS_IMAGE,
            files,
            entrypoint=[],
            links={f"/bin/{applet}": "busybox" for applet in APPLETS},
        ),
    }
    shutil.rmtree(fake, ignore_errors=True)
    return archives


def built_component_images(k8s_bin: Path | None) -> dict[str, Path]:
    """{image name: archive} of gpuslice's and kube-scheduler's images from ``scripts/build-image``
    (built, or found in its cache; kube-scheduler from ``k8s_bin``). AssertionError with the script's
    last words if it fails."""
    import os
    import subprocess

    done = subprocess.run(
        [str(REPO / "scripts" / "build-image"), "gpuslice", "kube-scheduler"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={**os.environ, "GPUSLICE_K8S_BIN": str(k8s_bin or "")},
    )
    if done.returncode != 0:
        raise AssertionError(f"scripts/build-image exited {done.returncode}:\n{done.stderr[-4000:]}")
    return {name: Path(archive) for name, archive in (line.split() for line in done.stdout.splitlines())}
