"""Builds libkdloss.so with the project's CMake and ships it inside the `kdloss` package.

`pip install .` (or `pip wheel .`) runs build_py below, which:
  1. configures CMake into build-py/cmake (kept between builds, so a rebuild is incremental),
     Release, warnings not fatal (-DKDLOSS_WERROR=OFF: a user's newer compiler must not break
     the install); extra arguments come from $KDLOSS_CMAKE_ARGS (e.g. "-DKDLOSS_CUDA=ON");
  2. builds the `kdloss` shared-library target ($KDLOSS_BUILD_JOBS jobs, default: all cores) and,
     where nvcc is found (PATH, $CUDACXX or /usr/local/cuda/bin/nvcc) and $KDLOSS_CUDA is not 0,
     the CUDA backend `kdloss_cuda` too (-DKDLOSS_CUDA=ON: machine code for every architecture
     family that nvcc supports from sm_80 up, PTX of the newest; cmake/cuda_archs.cmake);
     $KDLOSS_CUDA=1 makes a missing nvcc an error;
  3. copies build-py/cmake/libkdloss.so (and libkdloss_cuda.so with kdloss_cuda_build.json) into
     the package next to _lib.py, which loads the CUDA one only where torch sees a device.
Everything else is declared in pyproject.toml.
"""

import os
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_nvcc():
    """nvcc's path when the CUDA backend is to be built, else None ($KDLOSS_CUDA: auto, 0, 1)."""
    want = os.environ.get("KDLOSS_CUDA", "auto").lower()
    if want in ("0", "off", "no"):
        return None
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc and os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        nvcc = "/usr/local/cuda/bin/nvcc"
    if want in ("1", "on", "yes") and not nvcc:
        raise RuntimeError("KDLOSS_CUDA=1 but no nvcc found (PATH, CUDACXX, /usr/local/cuda)")
    return nvcc


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = os.path.join(ROOT, "build-py", "cmake")
        user_args = shlex.split(os.environ.get("KDLOSS_CMAKE_ARGS", ""))
        nvcc = None if any(a.startswith("-DKDLOSS_CUDA") for a in user_args) else find_nvcc()
        cmake_args = ["-DCMAKE_BUILD_TYPE=Release", "-DKDLOSS_WERROR=OFF",
                      "-DKDLOSS_CUDA=" + ("ON" if nvcc else "OFF")]
        if nvcc:
            cmake_args.append("-DCMAKE_CUDA_COMPILER=" + nvcc)
        cmake_args += user_args
        jobs = os.environ.get("KDLOSS_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir] + cmake_args,
                              stdout=subprocess.DEVNULL)
        cuda = nvcc is not None or "-DKDLOSS_CUDA=ON" in user_args
        targets = ["kdloss"] + (["kdloss_cuda"] if cuda else [])
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target"] + targets)
        dest = os.path.join(self.build_lib, "kdloss")
        os.makedirs(dest, exist_ok=True)
        files = ["libkdloss.so"] + (["libkdloss_cuda.so", "kdloss_cuda_build.json"] if cuda else [])
        for name in ["libkdloss_cuda.so", "kdloss_cuda_build.json"]:
            if os.path.exists(os.path.join(dest, name)) and name not in files:
                os.remove(os.path.join(dest, name))  # a CPU-only rebuild of the same tree
        for name in files:
            shutil.copy2(os.path.join(build_dir, name), os.path.join(dest, name))


class BinaryDistribution(Distribution):
    """The wheel carries a native library: it is not pure Python."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithCMake}
try:  # setuptools >= 70.1 has bdist_wheel; older ones take it from the `wheel` package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """Tag py3-none-<platform>: libkdloss.so is loaded with ctypes, so the wheel works with
        any Python 3 on this platform (it is not a CPython extension tied to one ABI)."""

        def get_tag(self):
            return ("py3", "none") + tuple(super().get_tag()[2:])

    cmdclass["bdist_wheel"] = PlatformWheel

setup(cmdclass=cmdclass, distclass=BinaryDistribution,
      options={"build": {"build_base": "build-py"}})
