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
    """The wheel carries a native library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution,
      options={"build": {"build_base": "build-py"}})
