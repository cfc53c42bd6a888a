#!/usr/bin/env bash
# The wheel (`make wheel`, scripts/wheel.sh) installs with pip alone and carries its oneDNN:
#  1. a fresh virtual environment (no torch), pip install of the wheel from the file (no network,
#     no compiler used): kdloss loads, computes a product through its GEMM layer, and
#     /proc/self/maps shows oneDNN from the wheel's kdloss.libs/, never the system's libdnnl;
#  2. no libgomp in the wheel, and in a process that imports torch first exactly one libgomp is
#     mapped (torch's), shared by torch, kdloss and kdloss's oneDNN.
set -euo pipefail
cd "$(dirname "$0")/../.."
whl=$(ls dist/kdloss-*manylinux*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "test_wheel: no dist/kdloss-*manylinux*.whl (make wheel)"; exit 1; }
echo "test_wheel: $whl"
if unzip -l "$whl" | grep -q 'libgomp'; then echo "FAIL: the wheel carries a libgomp"; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-index --no-deps "$whl"
check='
import ctypes, kdloss
from kdloss import _lib
a = (ctypes.c_float * 6)(1, 2, 3, 4, 5, 6); b = (ctypes.c_float * 6)(1, 0, 0, 1, 1, 1)
c = (ctypes.c_float * 4)()
f = _lib.fn("kdloss_gemm_f32")
f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int] + [ctypes.c_int64] * 3 + \
    [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
     ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
st = f(0, 0, 1, 2, 2, 3, 1.0, a, 3, b, 3, 0.0, c, 2)  # C = A B^T, A 2x3, B 2x3
assert st == 0 and list(c) == [1, 1 + 2 + 3, 4, 4 + 5 + 6], (st, list(c))
maps = open("/proc/self/maps").read()
dnnl = sorted({l.split()[-1] for l in maps.splitlines() if "libdnnl" in l})
gomp = sorted({l.split()[-1] for l in maps.splitlines() if "libgomp" in l})
print("  library:", _lib.library_path()); print("  oneDNN:", dnnl); print("  libgomp:", gomp)
assert dnnl and all("kdloss.libs/libdnnl-" in p for p in dnnl), dnnl
assert len(gomp) == 1, gomp
'
(cd "$tmp" && "$tmp/venv/bin/python" -c "$check")
# with torch loaded first: one libgomp in the process (torch/lib/libgomp.so.1)
venv=$(bash scripts/deps.sh py | tail -n 1)
mkdir -p "$tmp/unpacked" && (cd "$tmp/unpacked" && unzip -q "$OLDPWD/$whl")
(cd "$tmp" && PYTHONPATH="$tmp/unpacked" "$venv/bin/python" -c "import torch
$check")
echo "test_wheel: passed"
