#!/usr/bin/env bash
# Python binding tests: gets the venv (scripts/deps.sh py creates it with torch when missing),
# installs kdloss into it (building libkdloss.so through CMake), runs pytest tests/python.
# Exits non-zero on any failure. Extra arguments go to pytest (e.g. -k jsd, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh c  # compiler, CMake, OpenBLAS: pip install . builds the C library
venv=$(bash scripts/deps.sh py | tail -n 1)
py="$venv/bin/python"
# setuptools is in the venv already: build without an isolated env (no download, incremental CMake).
iso=--no-build-isolation
"$py" -c "import setuptools" >/dev/null 2>&1 || iso=
"$py" -m pip install -q $iso --no-deps . >/dev/null
# Run from tests/python so `import kdloss` resolves to the installed package, not ./python.
cd tests/python
exec "$py" -m pytest -q -p no:cacheprovider "$@" .
