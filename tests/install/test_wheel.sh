#!/usr/bin/env bash
# The wheel (`make wheel`, scripts/wheel.sh) installs with pip alone and carries its oneDNN:
#  1. a fresh virtual environment (no torch), pip install of the wheel from the file (no network,
#     no compiler used): kdloss loads, computes a product through its GEMM layer, and
#     /proc/self/maps shows oneDNN from the wheel's kdloss.libs/, never the system's libdnnl;
#  2. no libgomp in the wheel, and in a process that imports torch first exactly one libgomp is
#     mapped (torch's), shared by torch, kdloss and kdloss's oneDNN;
#  3. where nvcc exists, the CUDA backend kdloss/libkdloss_cuda.so is in the wheel: machine code
#     for sm_80 and sm_90 and PTX (cuobjdump --list-elf / --list-ptx; cuobjdump from PyPI's
#     nvidia-cuda-cuobjdump when the toolkit has none), its CUDA runtime, cuBLAS and cuBLASLt
#     needed by soname and not grafted; in the fresh venv (no torch, no driver)
#     kdloss.cuda_info() says available False with its reason and the library is not loaded;
#  4. with torch: the CPU Python tests of the package (a quick subset of tests/python, on the
#     installed wheel) pass, and cuda_info() gives torch's reason (no device here);
#  5. the wheel is under PyPI's default limit of 100 MiB (its size is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
whl=$(ls dist/kdloss-*manylinux*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "test_wheel: no dist/kdloss-*manylinux*.whl (make wheel)"; exit 1; }
echo "test_wheel: $whl"
# grep -c, not -q: -q exits at the first match and pipefail would see unzip's SIGPIPE
if unzip -Z1 "$whl" | grep -c 'libgomp' >/dev/null; then echo "FAIL: the wheel carries a libgomp"; exit 1; fi
size=$(stat -c %s "$whl")
echo "test_wheel: $(( (size + 524288) / 1048576 )) MiB ($size bytes)"
[ "$size" -lt $((100 * 1048576)) ] || { echo "FAIL: the wheel is over 100 MiB"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-index --no-deps "$whl"
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc" ] && [ "${KDLOSS_CUDA:-auto}" != 0 ]; then
    unzip -Z1 "$whl" | grep -c "^kdloss/libkdloss_cuda.so$" >/dev/null || { echo "FAIL: nvcc here, no libkdloss_cuda.so in the wheel"; exit 1; }
    mkdir -p "$tmp/cu" && (cd "$tmp/cu" && unzip -q "$OLDPWD/$whl" 'kdloss/libkdloss_cuda.so' 'kdloss/kdloss_cuda_build.json')
    so=$tmp/cu/kdloss/libkdloss_cuda.so
    cuobjdump=$(command -v cuobjdump || ls "$(dirname "$nvcc")/cuobjdump" 2>/dev/null || true)
    if [ -z "$cuobjdump" ]; then # the toolkit here has none: PyPI's, into a venv of its own
        python3 -m venv "$tmp/cuobj" && "$tmp/cuobj/bin/pip" install -q nvidia-cuda-cuobjdump
        cuobjdump=$(find "$tmp/cuobj" -type f -name cuobjdump | head -n 1)
    fi
    [ -x "$cuobjdump" ] || { echo "FAIL: no cuobjdump to list the CUDA library's code"; exit 1; }
    elf=$("$cuobjdump" --list-elf "$so" | sed -n 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/p' | sort -u | tr '\n' ' ')
    ptx=$("$cuobjdump" --list-ptx "$so" | sed -n 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/p' | sort -u | tr '\n' ' ')
    echo "  libkdloss_cuda.so: $(( $(stat -c %s "$so") / 1048576 )) MiB; SASS: $elf; PTX: $ptx"
    echo "  $(cat "$tmp/cu/kdloss/kdloss_cuda_build.json")"
    for a in sm_80 sm_90; do
        case " $elf" in *" $a "*) ;; *) echo "FAIL: no $a machine code"; exit 1 ;; esac
    done
    [ -n "$ptx" ] || { echo "FAIL: no PTX in libkdloss_cuda.so"; exit 1; }
    needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
    echo "  NEEDED: $needed"
    for n in libcudart.so. libcublas.so. libcublasLt.so.; do
        case " $needed" in *" $n"[0-9]*) ;; *) echo "FAIL: $n* is not a soname dependency"; exit 1 ;; esac
    done
    if unzip -Z1 "$whl" | grep -E 'kdloss\.libs/lib(cudart|cublas|nccl)'; then
        echo "FAIL: a CUDA library was grafted into the wheel"; exit 1
    fi
    (cd "$tmp" && "$tmp/venv/bin/python" -c '
import kdloss
info = kdloss.cuda_info()
print("  cuda_info (no torch):", info)
assert info["available"] is False and "torch is not installed" in info["reason"], info
assert info["library"] is None, info  # not even looked for: nothing to use it through
assert "libkdloss_cuda" not in open("/proc/self/maps").read()
')
fi
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
# the CPU Python tests of the package on the installed wheel (torch from the project's venv)
(cd tests/python && PYTHONPATH="$tmp/unpacked" "$venv/bin/python" -c "import kdloss, sys
assert kdloss.__file__.startswith('$tmp/unpacked'), kdloss.__file__
info = kdloss.cuda_info(); print('  cuda_info (torch):', info['available'], '-', info['reason'])" &&
  PYTHONPATH="$tmp/unpacked" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    test_package.py test_abi.py test_kl_div.py test_jsd.py test_cuda_loader.py 2>&1 | tail -n 3)
echo "test_wheel: passed"
