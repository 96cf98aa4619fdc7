"""The soft PyTorch cap, exercised with a fake ``torch`` package: applied when CUDA initialises,
never imports torch by itself, and keeps an existing sitecustomize and PYTHONPATH working."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from node_helpers import PY

from gpuslice.node.enforcement import softcap_dir
from gpuslice.units import GiB

# torch.cuda as far as the hook cares: _lazy_init, device_count, get_device_properties, and a
# set_per_process_memory_fraction that records its calls and, like torch's memory.py, calls the
# _lazy_init it imported (not the patched attribute).
FAKE_TORCH_CUDA = textwrap.dedent("""
    from types import SimpleNamespace
    calls = []
    initialised = []
    def _lazy_init():
        initialised.append(True)
    _original_lazy_init = _lazy_init
    def device_count():
        return 2
    def get_device_properties(device):
        _lazy_init()
        return SimpleNamespace(total_memory=80 * 1024**3)
    def set_per_process_memory_fraction(fraction, device=None):
        _original_lazy_init()
        calls.append([fraction, device])
""")


@pytest.fixture
def fake_torch(tmp_path) -> Path:
    root = tmp_path / "site"
    (root / "torch" / "cuda").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("from torch import cuda\n")
    (root / "torch" / "cuda" / "__init__.py").write_text(FAKE_TORCH_CUDA)
    return root


def run_job(code: str, pythonpath: list[Path], **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUSLICE_SOFT_CAP")}
    full.update(env, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    return subprocess.run([PY, "-c", code], env=full, capture_output=True, text=True, timeout=30, check=True)


def test_the_cap_is_set_on_every_device_when_torch_initialises_cuda(tmp_path, fake_torch):
    code = (
        "import json, sys, torch\n"
        "assert torch.cuda.calls == []\n"  # importing torch sets nothing: CUDA is not up yet
        "torch.cuda._lazy_init()\n"  # what PyTorch's C++ side calls on first CUDA use
        "torch.cuda._lazy_init()\n"
        "print(json.dumps(torch.cuda.calls))\n"
    )
    result = run_job(
        code,
        [softcap_dir(tmp_path), fake_torch],
        GPUSLICE_SOFT_CAP="1",
        GPUSLICE_GPU_MEMORY_BYTES=str(20 * GiB),
    )
    assert json.loads(result.stdout) == [[0.25, 0], [0.25, 1]]  # 20 of 80 GiB, once per device
    assert result.stderr == ""


def test_a_job_that_never_uses_torch_does_not_import_it(tmp_path, fake_torch):
    code = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.startswith('torch'))))"
    result = run_job(
        code, [softcap_dir(tmp_path), fake_torch], GPUSLICE_SOFT_CAP="1", GPUSLICE_GPU_MEMORY_BYTES=str(GiB)
    )
    assert json.loads(result.stdout) == []


def test_an_existing_sitecustomize_and_pythonpath_keep_working(tmp_path, fake_torch):
    site = tmp_path / "their-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIR_SITE_RAN = True\n")
    (site / "their_module.py").write_text("VALUE = 7\n")
    code = (
        "import builtins, their_module, torch; torch.cuda._lazy_init(); "
        "print(builtins.THEIR_SITE_RAN, their_module.VALUE, len(torch.cuda.calls))"
    )
    result = run_job(
        code,
        [softcap_dir(tmp_path), site, fake_torch],
        GPUSLICE_SOFT_CAP="1",
        GPUSLICE_GPU_MEMORY_BYTES=str(GiB),
    )
    assert result.stdout.split() == ["True", "7", "2"]


def test_without_the_switch_or_the_limit_nothing_is_patched(tmp_path, fake_torch):
    code = "import torch; torch.cuda._lazy_init(); print(len(torch.cuda.calls))"
    off = run_job(code, [softcap_dir(tmp_path), fake_torch], GPUSLICE_GPU_MEMORY_BYTES=str(GiB))
    no_limit = run_job(code, [softcap_dir(tmp_path), fake_torch], GPUSLICE_SOFT_CAP="1")
    assert off.stdout.strip() == no_limit.stdout.strip() == "0"


def test_a_cap_that_cannot_be_set_warns_and_the_job_goes_on(tmp_path, fake_torch):
    cuda = fake_torch / "torch" / "cuda" / "__init__.py"
    cuda.write_text(FAKE_TORCH_CUDA + "def device_count():\n    raise RuntimeError('no driver')\n")
    code = "import torch; torch.cuda._lazy_init(); print('still running')"
    result = run_job(
        code, [softcap_dir(tmp_path), fake_torch], GPUSLICE_SOFT_CAP="1", GPUSLICE_GPU_MEMORY_BYTES=str(GiB)
    )
    assert result.stdout.strip() == "still running"
    assert "could not set the PyTorch memory fraction" in result.stderr


def test_the_sitecustomize_file_is_rewritten_only_when_stale(tmp_path):
    target = softcap_dir(tmp_path) / "sitecustomize.py"
    target.write_text("# stale\n")
    assert softcap_dir(tmp_path) / "sitecustomize.py" == target
    assert "set_per_process_memory_fraction" in target.read_text()
