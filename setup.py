"""setuptools hook: build the native shim (native/shim/) into the package with the machine's C compiler.

Everything else about the package is in pyproject.toml. ``pip install .`` compiles
``gpuslice/shim/lib/libgpuslice-shim.so`` and the fake driver (``lib/fake/libcuda.so.1``,
``libnvidia-ml.so.1``, used only on ``--simulate`` machines) into the wheel; an editable install
compiles them into ``src/gpuslice/shim/lib/``. No CUDA SDK is needed.
"""

import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SOURCES = ROOT / "native" / "shim"


def _builder():
    # gpuslice itself cannot be imported here (its dependencies are not installed yet): load the one
    # standard-library-only module by path.
    spec = importlib.util.spec_from_file_location("_gpuslice_shim_build", ROOT / "src/gpuslice/shim/build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = ROOT / "src" / "gpuslice" / "shim" / "lib"
        else:
            target = Path(self.build_lib) / "gpuslice" / "shim" / "lib"
        builder = _builder()
        builder.build_shim(SOURCES, target)
        builder.build_fake_driver(SOURCES, target / "fake")


class NativeDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithShim}, distclass=NativeDistribution)
