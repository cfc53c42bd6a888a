#!/usr/bin/env bash
# Peer comparison on this CPU (eager torch, Liger-Kernel, kdloss through its PyTorch modules).
#   bench/peers.sh [BUILD_DIR [OUT_DIR]] [peers.py options]     (--quick, --help, ...)
# Gets the venv with liger-kernel (scripts/deps.sh py peers) and runs bench/peers.py in the
# environment as it is (OPENBLAS_* included: users won't change them). With BUILD_DIR (as
# bench/run_main.sh passes it) holding libkdloss.so, the kdloss modules are this checkout's
# python/ package loading that library (PYTHONPATH, KDLOSS_LIBRARY), so the peers measure the
# same build as `kdloss bench` and nothing is built or installed here; without it, kdloss is
# pip-installed into the venv (which builds the C library). OUT_DIR: where records and plots go
# (default bench/out). Exit status: non-zero if a torch or kdloss run, or Liger's CPU-capable
# chunked loss, failed (Liger's Triton modules cannot run without a GPU: skipped and named).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
    if [ -f "$1/libkdloss.so" ]; then export KDLOSS_LIBRARY=$(cd "$1" && pwd)/libkdloss.so; fi
    shift
    if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then args+=(--out "$1"); shift; fi
fi
venv=$(bash scripts/deps.sh py peers | tail -n 1)
py="$venv/bin/python"
if [ -n "${KDLOSS_LIBRARY:-}" ]; then
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
else
    bash scripts/deps.sh c  # compiler, CMake, OpenBLAS: pip install . builds the C library
    iso=--no-build-isolation
    "$py" -c "import setuptools" >/dev/null 2>&1 || iso=
    "$py" -m pip install -q $iso --no-deps . >/dev/null
fi
exec "$py" bench/peers.py "${args[@]}" "$@"
