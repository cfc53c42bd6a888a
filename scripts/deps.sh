#!/usr/bin/env bash
# Installs what kdloss needs when it is missing, so the README's two commands work on a fresh
# machine. `deps.sh c` : compiler, CMake, oneDNN, OpenBLAS, pkg-config, clang + libFuzzer (Debian).
#           `deps.sh py`: a virtual environment at $KDLOSS_VENV with torch, numpy, pytest, matplotlib
#                         and trl==1.16.0 (with transformers, accelerate, datasets: the TRL tests
#                         and examples; about 30 s and 480 MB, measured), and Liger-Kernel for the
#                         peer harness, from PyPI.
set -euo pipefail
what=${1:-c}

need_pkgs=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

if [ "$what" = c ]; then
    # libopenblas-dev: only for comparison (kdloss dlopens it as a second GEMM provider);
    # clang + libclang-rt-14-dev: the libFuzzer target; Open MPI: the vocabulary-parallel test.
    for p in build-essential cmake libdnnl-dev libopenblas-dev pkg-config clang libclang-rt-14-dev \
        libopenmpi-dev openmpi-bin; do
        have_pkg "$p" || need_pkgs+=("$p")
    done
    if [ ${#need_pkgs[@]} -gt 0 ]; then
        echo "deps: installing ${need_pkgs[*]}"
        SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
    fi
    exit 0
fi

if [ "$what" = py ]; then
    venv=${KDLOSS_VENV:-$HOME/.cache/kdloss/venv}
    if [ ! -x "$venv/bin/python" ]; then
        have_pkg python3-venv || python3 -m venv --help >/dev/null 2>&1 || {
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --upgrade pip
    fi
    if ! "$venv/bin/python" -c "import torch, numpy, pytest, matplotlib" >/dev/null 2>&1; then
        echo "deps: installing torch, numpy, pytest, matplotlib into $venv (several GB the first time)"
        "$venv/bin/pip" install -q torch numpy pytest matplotlib
    fi
    # TRL's trainers (tests/python/test_trl_distillation.py, examples/trl_*.py): pinned, as the
    # adapters follow its private _chunked_divergence_loss; pip through the venv's python (a
    # copied venv's bin/pip still points at the original's interpreter)
    if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('trl') == '1.16.0'" \
            >/dev/null 2>&1; then
        echo "deps: installing trl==1.16.0 (transformers, accelerate, datasets) into $venv"
        "$venv/bin/python" -m pip install -q trl==1.16.0 || echo "deps: trl could not be installed"
    fi
    if [ "${2:-}" = peers ] && ! "$venv/bin/python" -c "import liger_kernel" >/dev/null 2>&1; then
        echo "deps: installing liger-kernel into $venv"
        "$venv/bin/pip" install -q liger-kernel || echo "deps: liger-kernel could not be installed"
    fi
    echo "$venv"
    exit 0
fi
echo "deps.sh: unknown target '$what' (use c or py)" >&2
exit 2
