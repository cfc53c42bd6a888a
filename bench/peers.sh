#!/usr/bin/env bash
# Peer comparison on this CPU (eager torch, Liger-Kernel, kdloss): gets the venv with liger-kernel
# (scripts/deps.sh py peers), installs kdloss into it, runs bench/peers.py with OPENBLAS_CORETYPE
# and OPENBLAS_L2_SIZE unset (they make OpenBLAS ~2x slower here). Arguments go to peers.py
# (--quick for a short run, --help for the rest). Records and plots land in bench/out/.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/deps.sh py peers | tail -n 1)
py="$venv/bin/python"
iso=--no-build-isolation
"$py" -c "import setuptools" >/dev/null 2>&1 || iso=
"$py" -m pip install -q $iso --no-deps . >/dev/null
exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$py" bench/peers.py "$@"
