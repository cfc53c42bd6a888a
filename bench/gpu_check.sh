#!/usr/bin/env bash
# First contact with a GPU in one call (bench/gpu_check/NOTES.md gives the exact remote command,
# the files to carry and how they are made here). Written for the H200 machine's image: nvcc 13,
# CMake, cuBLAS/cuBLASLt, NCCL, compute-sanitizer, python3 with a CUDA torch and triton; no
# oneDNN, no network.
#
#   bash bench/gpu_check.sh            on the GPU machine (at most ~9 minutes, every step limited)
#   bash bench/gpu_check.sh --dry-run  here, without a GPU (make test runs it): every step up to
#                                      the first GPU call, in a device-like setting; exit 1 if any
#                                      of them would fail on the device
#
# Steps (device / dry run):
#   1. python: the carried wheels installed with pip --no-index --no-deps, kdloss from
#      dist/kdloss-*.whl, Liger-Kernel from .whl/liger_kernel-*.whl: on the device into a
#      --target folder on PYTHONPATH of the machine's python3; in the dry run into a fresh venv
#      (see "the dry run's python" below). Then `import kdloss, kdloss.torch, liger_kernel` and
#      kdloss.cuda_info(): available on the device; here False with torch's reason, and the
#      loader path of libkdloss_cuda.so run on the simulator-built backend
#      (tests/python/test_cuda_loader.py with KDLOSS_CUDA_LIB).
#   2. build: CMake, -DKDLOSS_CUDA=ON -DKDLOSS_GEMM=builtin (no oneDNN: none is linked, checked),
#      SASS for the device's architecture (nvidia-smi's compute capability; 90 in the dry run):
#      libkdloss_cuda.so, test_cuda, the kdloss command (`kdloss info` names the GEMM provider)
#      and gpu_bench (bench/gpu_check/gpu_bench.cu, nvcc against libkdloss_cuda.so).
#   3. test_cuda (the CUDA C test; in the dry run it runs its argument checks and skips the rest).
#   4. the Python losses on CUDA tensors against the CPU backend (bench/gpu_check/cuda_vs_cpu.py:
#      every loss, forward and backward, fp32 and bf16, ignored rows, top-k, a logit map,
#      torch.compile of one loss); in the dry run the same calls with both sides on the CPU.
#   5. timings: the C bench (gpu_bench, device only) and bench/gpu_check/torch_bench.py (kdloss
#      through Python with default arguments, eager torch, Liger; KL from log-probs on every side
#      and from logits on every side, the fused-linear JSD seed); in the dry run torch_bench.py
#      --dry-run (tiny shapes on the CPU).
#   6. compute-sanitizer memcheck and racecheck on test_cuda's quick subset, each when at least
#      100 s are left (device only).
#   7. one table; at most 8 files under $OUT (default bench/out/gpu_check, or
#      bench/out/gpu_check_dry): gpu_check.log, gpu_check.json, test_cuda.log, python.log,
#      sanitizer.log, and build.log when the build failed.
#
# The dry run's python: a fresh venv made here (python3 -m venv) whose site-packages gets the two
# wheels, plus one .pth line naming the site-packages of the project's torch venv
# (scripts/deps.sh py) after its own: torch, numpy, pytest and triton come from there (the GPU
# image has them installed; pip cannot install torch offline), kdloss and liger_kernel only from
# the wheels (checked: both import from the fresh venv).
#
# Exit code: 0 when every step that ran passed (device: the build, test_cuda, the Python check
# and the C bench at least).
set -uo pipefail
DRY=0
[ "${1:-}" = --dry-run ] && DRY=1
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ $DRY = 1 ]; then OUTDIR=${OUT:-$ROOT/bench/out/gpu_check_dry}; else OUTDIR=${OUT:-$ROOT/bench/out/gpu_check}; fi
mkdir -p "$OUTDIR"
WORK=$(mktemp -d) # step logs; the ones worth keeping are copied to $OUTDIR at the end
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
export PATH=/usr/local/cuda/bin:$PATH
START=$(date +%s)
# everything under 9 minutes on the device; the dry run on a 2-core machine gets 6x each limit
if [ $DRY = 1 ]; then TOTAL=${GPU_CHECK_SECONDS:-3600}; SLOW=6; else TOTAL=${GPU_CHECK_SECONDS:-530}; SLOW=1; fi
JOBS=$(nproc)
BUILD=$(realpath -m "${GPU_CHECK_BUILD:-$ROOT/build-gpu-check}")
left() { echo $((TOTAL - ($(date +%s) - START))); }
# limit STEP_MAX: the step's own limit, capped by what is left of the total
limit() { local l s=$(($1 * SLOW)); l=$(left); [ "$l" -lt 1 ] && l=1; [ "$s" -lt "$l" ] && echo "$s" || echo "$l"; }
step() { echo; echo "== [$(($(date +%s) - START)) s] $*"; }
declare -A ST # step -> status
FAILED=0
fail() { ST[$1]="FAIL${2:+($2)}"; FAILED=1; echo "FAIL: $1${3:+: $3}"; }

step "device"
if [ $DRY = 1 ]; then
  echo "dry run: no GPU call; architecture 90 assumed"
  ARCH=90
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader || true
  ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  [ -n "$ARCH" ] || ARCH=90
fi
nvcc --version | tail -1
echo "architecture sm_$ARCH, $JOBS cores"

# ---- 1. python: the carried wheels -----------------------------------------------------------
step "python: install the carried wheels (pip --no-index --no-deps)"
WHL=$(ls dist/kdloss-*manylinux*.whl 2>/dev/null | head -n 1)
LIGER=$(ls .whl/liger_kernel-*.whl 2>/dev/null | head -n 1)
[ -n "$WHL" ] || fail python "" "no dist/kdloss-*manylinux*.whl (make wheel; NOTES.md)"
[ -n "$LIGER" ] || echo "no .whl/liger_kernel-*.whl: Liger rows will say 'not installed' (NOTES.md)"
if [ $DRY = 1 ]; then
  base=$(bash scripts/deps.sh py | tail -n 1)
  python3 -m venv "$WORK/venv" || fail python venv
  PY=$WORK/venv/bin/python
  PIPT=()
else
  PY=python3
  SITE=$WORK/site
  PIPT=(--target "$SITE")
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
pip_install() {
  timeout "$(limit 120)" "$PY" -m pip install -q --no-index --no-deps --no-compile "${PIPT[@]}" "$@" \
    "$WHL" ${LIGER:+"$LIGER"} >>"$WORK/pip.log" 2>&1
}
# an image whose python is marked externally managed (PEP 668) may refuse even a --target install
if [ -n "$WHL" ] && { pip_install || { grep -q externally-managed "$WORK/pip.log" &&
    pip_install --break-system-packages; }; }; then
  ST[install]=pass
else
  cat "$WORK/pip.log" 2>/dev/null | tail -n 20
  fail install
fi
if [ $DRY = 1 ]; then # after the install: pip would take the torch venv's liger_kernel as installed
  own=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$base/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" >"$own/zz_torch_venv.pth"
fi
# From a folder without python/ or kdloss/: the imports are the installed ones.
check_imports='
import json, os, sys, kdloss, kdloss.torch
info = kdloss.cuda_info()
try:
    import liger_kernel
    liger = os.path.dirname(liger_kernel.__file__)
except ImportError as e:
    liger = "absent (%s)" % e
print(json.dumps({"kdloss": os.path.dirname(kdloss.__file__), "library": kdloss.library_path(),
                  "liger": liger, "cuda_info": info}))
'
if (cd "$WORK" && timeout "$(limit 60)" "$PY" -c "$check_imports") >"$WORK/imports.json" 2>"$WORK/imports.err"; then
  cat "$WORK/imports.json"
  "$PY" - "$WORK/imports.json" "$DRY" "${WORK}" "${LIGER:-}" <<'PY' || fail imports
import json, sys
r, dry, work, liger = json.load(open(sys.argv[1])), sys.argv[2] == "1", sys.argv[3], sys.argv[4]
info, ok = r["cuda_info"], True
if dry:  # no device here: not loaded, with torch's reason; both wheels from the fresh venv
    ok &= info["available"] is False and "no CUDA device" in info["reason"]
    ok &= r["kdloss"].startswith(work) and (not liger or r["liger"].startswith(work))
else:
    ok &= info["available"] is True
print("cuda_info:", info["reason"])
sys.exit(0 if ok else 1)
PY
  [ -z "${ST[imports]:-}" ] && ST[imports]=pass
else
  cat "$WORK/imports.err"
  fail imports
fi

if [ $DRY = 1 ]; then
  step "python: the loader of libkdloss_cuda.so on the simulator-built backend"
  SIM=$(realpath -m "${GPU_CHECK_SIM_BUILD:-$ROOT/build-sim}")
  if timeout "$(limit 150)" bash -c "cmake -S . -B '$SIM' -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA_SIM=ON >'$WORK/sim_cmake.log' 2>&1 &&
      cmake --build '$SIM' -j$JOBS --target kdloss_cuda >'$WORK/sim_build.log' 2>&1"; then
    if (cd tests/python && KDLOSS_TEST_CUDA_SIM_LIB=$SIM/libkdloss_cuda.so KDLOSS_TEST_REQUIRE_SIM=1 \
        timeout "$(limit 60)" "$PY" -m pytest -q -p no:cacheprovider test_cuda_loader.py) >"$WORK/loader.log" 2>&1; then
      ST[loader]=pass
    else
      fail loader
    fi
    tail -n 5 "$WORK/loader.log"
  else
    tail -n 20 "$WORK/sim_cmake.log" "$WORK/sim_build.log"
    fail loader build
  fi
fi

# ---- 2. build ----------------------------------------------------------------------------
step "build: CMake -DKDLOSS_CUDA=ON -DKDLOSS_GEMM=builtin, sm_$ARCH"
LIB=$BUILD/libkdloss_cuda.so
if timeout "$(limit 300)" bash -c "cmake -S . -B '$BUILD' -DCMAKE_BUILD_TYPE=Release -DKDLOSS_CUDA=ON \
      -DKDLOSS_GEMM=builtin -DKDLOSS_CUDA_ARCHS=$ARCH-real >'$WORK/cmake.log' 2>&1 &&
    cmake --build '$BUILD' -j$JOBS --target kdloss_cuda test_cuda kdloss_cli >'$WORK/build.log' 2>&1 &&
    nvcc -std=c++17 -O2 -arch=sm_$ARCH -Iinclude bench/gpu_check/gpu_bench.cu -o '$BUILD/gpu_bench' \
      -L'$BUILD' -lkdloss_cuda -lcublas -Xlinker -rpath='$BUILD' >>'$WORK/build.log' 2>&1"; then
  grep -E "kdloss (CPU GEMM|CUDA)" "$WORK/cmake.log"
  if readelf -d "$LIB" | grep -q dnnl || readelf -d "$BUILD/test_cuda" | grep -q dnnl; then
    fail build dnnl "a oneDNN library is linked"
  elif ! "$BUILD/kdloss" info | tee "$WORK/info.txt" | grep -q "^gemm        builtin .*in use"; then
    fail build provider "kdloss info does not name the builtin GEMM provider"
  else
    ST[build]=pass
    grep -E "^(gemm|cuda) " "$WORK/info.txt"
    readelf -d "$LIB" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/  NEEDED \1/p'
  fi
else
  tail -n 30 "$WORK/cmake.log" "$WORK/build.log" 2>/dev/null
  fail build
fi

# ---- 3. the CUDA C test --------------------------------------------------------------------
if [ "${ST[build]:-}" = pass ]; then
  step "test_cuda"
  if timeout "$(limit 120)" "$BUILD/test_cuda" >"$WORK/test_cuda.log" 2>&1; then ST[test_cuda]=pass
  else fail test_cuda $?; fi
  grep -E "^(seed|CPU functions|FAIL|skipped|top-k|vp|test_cuda|[0-9]+ passed)" "$WORK/test_cuda.log" | head -40
  if [ $DRY = 1 ] && ! grep -q "^skipped: no CUDA device" "$WORK/test_cuda.log"; then
    fail test_cuda "" "expected its no-device line here"
  fi
fi

# ---- 4. the Python losses on the device against the CPU backend -------------------------------
DEVICE=cuda
[ $DRY = 1 ] && DEVICE=cpu
step "python: every loss on $DEVICE against the CPU backend"
if (cd "$WORK" && PYTHONUNBUFFERED=1 timeout "$(limit 180)" "$PY" "$ROOT/bench/gpu_check/cuda_vs_cpu.py" \
    --device $DEVICE) >"$WORK/python.log" 2>&1; then ST[python]=pass; else fail python $?; fi
grep -E "^(ok|FAIL|[0-9]+ of)" "$WORK/python.log"

# ---- 5. timings ---------------------------------------------------------------------------
if [ $DRY = 0 ] && [ "${ST[build]:-}" = pass ]; then
  step "timings: the C bench (gpu_bench)"
  if timeout "$(limit 120)" "$BUILD/gpu_bench" "$WORK/kdloss_bench.json"; then ST[c_bench]=pass
  else fail c_bench $?; fi
fi
if [ "$(left)" -gt 30 ]; then
  dry_arg=()
  [ $DRY = 1 ] && dry_arg=(--dry-run)
  step "timings: kdloss through Python, eager torch, Liger (torch_bench.py ${dry_arg[*]:-})"
  if (cd "$WORK" && PYTHONUNBUFFERED=1 timeout "$(limit 180)" "$PY" "$ROOT/bench/gpu_check/torch_bench.py" \
      "$WORK/peer_bench.json" "${dry_arg[@]}"); then ST[py_bench]=pass; else fail py_bench $?; fi
else
  echo "no time left for the Python timings"
  ST[py_bench]=skipped
fi

# ---- 6. compute-sanitizer (after the timings: with what time is left) ---------------------
if [ $DRY = 0 ] && [ "${ST[build]:-}" = pass ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    if [ "$(left)" -lt 100 ]; then echo "no time left for $tool"; ST[$tool]=skipped; continue; fi
    step "compute-sanitizer --tool $tool (test_cuda, quick subset)"
    if KDLOSS_TEST_QUICK=1 timeout "$(limit 75)" compute-sanitizer --tool $tool --error-exitcode 3 \
        "$BUILD/test_cuda" >"$WORK/sanitizer_$tool.log" 2>&1; then ST[$tool]=pass; else fail $tool $?; fi
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|passed, " "$WORK/sanitizer_$tool.log" | head -12
  done
elif [ $DRY = 1 ]; then
  echo "compute-sanitizer: device only ($(command -v compute-sanitizer || echo 'not on this machine'))"
fi

# ---- 7. summary ---------------------------------------------------------------------------
step "summary"
status_json=$(for k in "${!ST[@]}"; do printf '"%s": "%s", ' "$k" "${ST[$k]}"; done)
echo "{${status_json} \"dry_run\": $DRY, \"seconds\": $(($(date +%s) - START))}" >"$WORK/status.json"
"$PY" - "$WORK" "$OUTDIR" <<'PY'
import json, os, sys
d, outdir = sys.argv[1], sys.argv[2]
rows = []
for f in ("kdloss_bench.json", "peer_bench.json"):
    p = os.path.join(d, f)
    if os.path.exists(p):
        try:
            side = "C" if f.startswith("kdloss") else "Python"
            rows += [dict(r, via=side) for r in json.load(open(p)).get("results", [])]
        except Exception as e:  # a run cut short leaves a partial file
            print(f"{f}: unreadable ({e})")
status = json.load(open(os.path.join(d, "status.json")))
json.dump({"status": status, "results": rows}, open(os.path.join(outdir, "gpu_check.json"), "w"),
          indent=1)
print(f"{'workload':58s} {'via':6s} {'median ms':>10s} {'p20':>9s} {'p80':>9s} {'peak MB':>9s}")
for r in rows:
    if "ms" in r:
        print(f"{r['name'][:58]:58s} {r['via']:6s} {r['ms']:10.3f} {r['p20']:9.3f} {r['p80']:9.3f}"
              f" {r['mem_mb']:9.0f}")
    else:
        print(f"{r['name'][:58]:58s} {r['via']:6s} {r.get('error', '?')[:60]}")
print("status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
PY
[ -f "$WORK/test_cuda.log" ] && head -c 8000000 "$WORK/test_cuda.log" >"$OUTDIR/test_cuda.log"
cat "$WORK/python.log" "$WORK/loader.log" 2>/dev/null | head -c 4000000 >"$OUTDIR/python.log"
for f in "$WORK"/sanitizer_*.log; do
  [ -f "$f" ] && { echo "==== $(basename "$f")"; head -c 4000000 "$f"; }
done >"$OUTDIR/sanitizer.log"
[ -s "$OUTDIR/sanitizer.log" ] || rm -f "$OUTDIR/sanitizer.log"
if [ "${ST[build]:-}" != pass ]; then
  cat "$WORK"/cmake.log "$WORK"/build.log "$WORK"/sim_*.log 2>/dev/null | tail -c 4000000 >"$OUTDIR/build.log"
fi
echo "gpu_check: $([ $FAILED = 0 ] && echo passed || echo FAILED) in $(($(date +%s) - START)) s$([ $DRY = 1 ] && echo ' (dry run)')"
exit $FAILED
