#!/usr/bin/env bash
# Python binding tests: gets the venv (scripts/deps.sh py creates it with torch when missing),
# installs kdloss into it (building libkdloss.so through CMake), runs pytest tests/python.
# Exits non-zero on any failure. Extra arguments go to pytest (e.g. -k jsd, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh c  # compiler, CMake, OpenBLAS: pip install . builds the C library
venv=$(bash scripts/deps.sh py | tail -n 1)
py="$venv/bin/python"
# When the venv's setuptools can build the wheel itself (>= 61 for pyproject metadata, and
# bdist_wheel: built in from 70.1, else the `wheel` package), build without an isolated env (no
# download, incremental CMake). A fresh Debian 12 venv has setuptools 66 and no `wheel`: there pip
# builds in an isolated env with a current setuptools from PyPI.
iso=
if "$py" - >/dev/null 2>&1 <<'EOF'
import setuptools
assert int(setuptools.__version__.split(".")[0]) >= 61
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel
EOF
then
    iso=--no-build-isolation
fi
"$py" -m pip install -q $iso --no-deps . >/dev/null
# Run from tests/python so `import kdloss` resolves to the installed package, not ./python.
cd tests/python
exec "$py" -m pytest -q -p no:cacheprovider "$@" .
