"""Builds libkdloss.so with the project's CMake and ships it inside the `kdloss` package.

`pip install .` (or `pip wheel .`) runs build_py below, which:
  1. configures CMake into build-py/cmake (kept between builds, so a rebuild is incremental),
     Release, warnings not fatal (-DKDLOSS_WERROR=OFF: a user's newer compiler must not break
     the install); extra arguments come from $KDLOSS_CMAKE_ARGS (e.g. "-DKDLOSS_CUDA=ON");
  2. builds only the `kdloss` shared-library target ($KDLOSS_BUILD_JOBS jobs, default: all cores);
  3. copies build-py/cmake/libkdloss.so into the package next to _lib.py.
Everything else is declared in pyproject.toml.
"""

import os
import shlex
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = os.path.join(ROOT, "build-py", "cmake")
        cmake_args = ["-DCMAKE_BUILD_TYPE=Release", "-DKDLOSS_WERROR=OFF"]
        cmake_args += shlex.split(os.environ.get("KDLOSS_CMAKE_ARGS", ""))
        jobs = os.environ.get("KDLOSS_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir] + cmake_args,
                              stdout=subprocess.DEVNULL)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "kdloss", "-j", jobs])
        dest = os.path.join(self.build_lib, "kdloss")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.join(build_dir, "libkdloss.so"), os.path.join(dest, "libkdloss.so"))


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
