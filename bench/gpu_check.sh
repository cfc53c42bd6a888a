#!/usr/bin/env bash
# One-shot GPU check of the CUDA backend, for a machine with an NVIDIA GPU (written for an H200,
# whose image has nvcc, CMake, python3 + torch, and may lack the CPU build's OpenBLAS):
#   1. build with -DKDLOSS_CUDA=ON -DKDLOSS_CUDA_ARCHS=90; if CMake cannot configure the full
#      library there (CPU dependencies missing), build the CUDA backend alone with nvcc (the test
#      then compares against its own float64 reference only: the CPU functions are not linked)
#   2. run the CUDA test (its top-k expectations, those of the divergence family on logits
#      and the vocabulary-parallel entries', 2 and 3 ranks as threads on this one GPU plus
#      the NCCL adapter with one rank, counted apart: "topk", "dlogits" and "vp" in the
#      summary); then its quick subset under compute-sanitizer memcheck and racecheck when
#      the tool is there and time allows
#   3. time kdloss with bench/gpu_check/gpu_bench.cu (KL full, fused-linear JSD at the seed shape
#      at three memory budgets, the four bare GEMMs; the sparse top-k teacher at issue 10's shape
#      BT 2048, H 1024, V 32768, K 64, fp32: fused forward-KL bucket against its three bare
#      GEMMs, renorm_both sparse against dense, the logits entry; kdloss_cuda_distill_logits on
#      2048 x 32768 fp32 logits, forward KL and JSD), and, when python3 has torch,
#      eager torch and Liger-Kernel on the same workloads (Liger from wheels in .whl/ if carried)
#   4. print one table; the log and a JSON summary go to $OUT (or bench/out/gpu_check): at most
#      five files (gpu_check.log, gpu_check.json, test_cuda.log, sanitizer.log, build.log on a
#      build failure), since the device tool brings back at most 8
# Every step has a time limit so the whole script ends within 8 minutes.
# Exit code: 0 when the build, the test and the kdloss benchmark all succeeded.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-$ROOT/bench/out/gpu_check}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d) # step logs; the ones worth keeping are copied to $OUTDIR at the end
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
export PATH=/usr/local/cuda/bin:$PATH
START=$(date +%s)
TOTAL=470 # seconds for everything, a little under 8 minutes
JOBS=$(nproc)
left() { echo $((TOTAL - ($(date +%s) - START))); }
# limit STEP_MAX: the step's own limit, capped by what is left of the total
limit() { local l; l=$(left); [ "$l" -lt 1 ] && l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
step() { echo; echo "== [$(($(date +%s) - START)) s] $*"; }

status_build=fail status_test=skipped status_memcheck=skipped status_racecheck=skipped
status_bench=skipped status_torch=skipped status_topk=skipped status_vp=skipped
status_dlogits=skipped

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
nvcc --version | tail -1

# ---- 1. build --------------------------------------------------------------------------------
step "build"
LIBDIR="" TEST=""
if timeout "$(limit 200)" bash -c "cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release \
      -DKDLOSS_CUDA=ON -DKDLOSS_CUDA_ARCHS=90 >'$WORK/cmake.log' 2>&1 &&
    cmake --build build-cuda -j$JOBS --target kdloss test_cuda >'$WORK/build.log' 2>&1"; then
  LIBDIR=$ROOT/build-cuda TEST=$ROOT/build-cuda/test_cuda status_build=cmake
  echo "CMake build ok"
else
  echo "CMake build failed; last lines:"
  tail -n 8 "$WORK/cmake.log" "$WORK/build.log" 2>/dev/null
  echo "building the CUDA backend alone with nvcc (no CPU kernels: no oneDNN needed)"
  B=$ROOT/build-cuda-only
  rm -rf "$B" && mkdir -p "$B/obj"
  NV="nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -Werror=all-warnings -Xcompiler=-fPIC,-fvisibility=hidden -Iinclude -Isrc -Isrc/common"
  if timeout "$(limit 200)" bash -c "
      set -e
      ls src/cuda/*.cu | xargs -P $JOBS -I{} sh -c '$NV -c {} -o $B/obj/\$(basename {} .cu)_cu.o'
      # src/common (shared checks, names, defaults) and the fused loss's plan (its defaults and
      # minimum budgets are public functions the test calls): no GEMM provider, no OpenMP
      for c in src/cuda/*.c src/common/*.c src/cpu/fld_plan.c; do
        gcc -std=c11 -O2 -fPIC -fvisibility=hidden -Wall -Wextra -Wno-unused-parameter -Werror \
            -Iinclude -Isrc -Isrc/common -Isrc/cpu -c \$c -o $B/obj/\$(basename \$c .c)_c.o
      done
      nvcc -shared -cudart shared -o $B/libkdloss.so $B/obj/*.o -lcublas -lcublasLt
      gcc -std=c11 -O2 -Iinclude -Itests/support -Isrc/common tests/cuda/test_cuda_*.c \
          tests/support/*.c \
          -o $B/test_cuda -L$B -lkdloss -L/usr/local/cuda/lib64 \
          -lcudart -lm -pthread -Wl,-rpath,$B -Wl,-rpath,/usr/local/cuda/lib64
    " >"$WORK/build_nvcc.log" 2>&1; then
    LIBDIR=$B TEST=$B/test_cuda status_build=nvcc-only
    echo "nvcc build ok"
  else
    echo "nvcc build FAILED:"
    tail -n 30 "$WORK/build_nvcc.log"
  fi
fi

# ---- 2. test ---------------------------------------------------------------------------------
if [ -n "$TEST" ]; then
  step "CUDA test"
  if timeout "$(limit 90)" "$TEST" >"$WORK/test_cuda.log" 2>&1; then status_test=pass; else status_test="FAIL($?)"; fi
  grep -E "^(seed|CPU functions|FAIL|skipped|top-k|vp|test_cuda|[0-9]+ passed)" "$WORK/test_cuda.log" | head -60
  # the top-k kernels' own verdict: their expectations ran (a tag "topk" / "fltopk") and none failed
  n_tk=$(grep -cE "^FAIL (.*: )?(fl)?topk " "$WORK/test_cuda.log")
  if grep -qE "^(top-k: )?skipped" "$WORK/test_cuda.log"; then status_topk=skipped
  elif [ "$n_tk" -gt 0 ]; then status_topk="FAIL($n_tk)"
  elif [ "$status_test" = pass ] || grep -qE "^[0-9]+ passed" "$WORK/test_cuda.log"; then status_topk=pass
  else status_topk="unknown(test cut short)"; fi
  echo "top-k expectations: $status_topk"
  # the vocabulary-parallel entries' verdict: their line printed ("vp: ...") and no "vp" FAIL
  n_vp=$(grep -cE "^FAIL (.*: )?vp " "$WORK/test_cuda.log")
  if ! grep -qE "^vp: " "$WORK/test_cuda.log"; then status_vp="not-run"
  elif [ "$n_vp" -gt 0 ]; then status_vp="FAIL($n_vp)"
  elif [ "$status_test" = pass ] || grep -qE "^[0-9]+ passed" "$WORK/test_cuda.log"; then status_vp=pass
  else status_vp="unknown(test cut short)"; fi
  echo "vocabulary-parallel expectations: $status_vp"
  # the same for kdloss_cuda_distill_logits (tag "dlogits")
  n_dl=$(grep -cE "^FAIL (.*: )?dlogits " "$WORK/test_cuda.log")
  if [ "$n_dl" -gt 0 ]; then status_dlogits="FAIL($n_dl)"
  elif [ "$status_test" = pass ] || grep -qE "^[0-9]+ passed" "$WORK/test_cuda.log"; then status_dlogits=pass
  else status_dlogits="unknown(test cut short)"; fi
  echo "distill_logits expectations: $status_dlogits"
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      if [ "$(left)" -lt 200 ]; then echo "no time left for $tool"; break; fi
      step "compute-sanitizer --tool $tool (quick test subset)"
      if KDLOSS_TEST_QUICK=1 timeout "$(limit 75)" compute-sanitizer --tool $tool --error-exitcode 3 \
          "$TEST" >"$WORK/sanitizer_$tool.log" 2>&1; then r=pass; else r="FAIL($?)"; fi
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|passed, " "$WORK/sanitizer_$tool.log" | head -12
      [ "$tool" = memcheck ] && status_memcheck=$r || status_racecheck=$r
    done
  fi
fi

# ---- 3. timings ------------------------------------------------------------------------------
if [ -n "$LIBDIR" ]; then
  step "kdloss timings"
  if nvcc -std=c++17 -O2 -arch=sm_90 -Iinclude bench/gpu_check/gpu_bench.cu -o "$LIBDIR/gpu_bench" \
      -L"$LIBDIR" -lkdloss -lcublas -Xlinker -rpath="$LIBDIR" >"$WORK/bench_build.log" 2>&1; then
    if timeout "$(limit 90)" "$LIBDIR/gpu_bench" "$WORK/kdloss_bench.json"; then status_bench=pass
    else status_bench="FAIL($?)"; fi
  else
    status_bench="build-fail"
    tail -n 20 "$WORK/bench_build.log"
  fi
fi

if command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  if [ "$(left)" -gt 60 ]; then
    step "eager torch and Liger-Kernel timings"
    if ls .whl/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    if PYTHONUNBUFFERED=1 timeout "$(limit 150)" python3 bench/gpu_check/torch_bench.py \
        "$WORK/peer_bench.json"; then status_torch=pass; else status_torch="FAIL($?)"; fi
  else
    echo "no time left for the torch/Liger timings"
  fi
else
  echo "python3 with CUDA torch not found: peer timings skipped"
fi

# ---- 4. summary ------------------------------------------------------------------------------
step "summary"
cat >"$WORK/status.json" <<EOF
{"build": "$status_build", "test": "$status_test", "topk": "$status_topk", "vp": "$status_vp",
 "dlogits": "$status_dlogits",
 "memcheck": "$status_memcheck", "racecheck": "$status_racecheck", "bench": "$status_bench",
 "peers": "$status_torch",
 "seconds": $(($(date +%s) - START))}
EOF
if command -v python3 >/dev/null; then
  python3 - "$WORK" "$OUTDIR" <<'PY'
import json, os, sys
d, outdir = sys.argv[1], sys.argv[2]
rows = []
for f in ("kdloss_bench.json", "peer_bench.json"):
    p = os.path.join(d, f)
    if os.path.exists(p):
        try:
            rows += json.load(open(p)).get("results", [])
        except Exception as e:  # a run cut short leaves a partial file
            print(f"{f}: unreadable ({e})")
status = json.load(open(os.path.join(d, "status.json")))
summary = {"status": status, "results": rows}
json.dump(summary, open(os.path.join(outdir, "gpu_check.json"), "w"), indent=1)
print(f"{'workload':46s} {'median ms':>10s} {'p20':>9s} {'p80':>9s} {'peak MB':>9s}")
for r in rows:
    if "ms" in r:
        print(f"{r['name'][:46]:46s} {r['ms']:10.3f} {r['p20']:9.3f} {r['p80']:9.3f} {r['mem_mb']:9.0f}")
    else:
        print(f"{r['name'][:46]:46s} {r.get('error', '?')[:60]}")
print("status: " + ", ".join(f"{k} {v}" for k, v in status.items()))
PY
else
  cat "$WORK/status.json"
  cp "$WORK/status.json" "$OUTDIR/gpu_check.json"
fi
# keep: the test log, the sanitizer logs (one file, each cut at 4 MB), the build log on failure
[ -f "$WORK/test_cuda.log" ] && head -c 8000000 "$WORK/test_cuda.log" >"$OUTDIR/test_cuda.log"
for f in "$WORK"/sanitizer_*.log; do
  [ -f "$f" ] && { echo "==== $(basename "$f")"; head -c 4000000 "$f"; }
done >"$OUTDIR/sanitizer.log"
[ -s "$OUTDIR/sanitizer.log" ] || rm -f "$OUTDIR/sanitizer.log"
if [ "$status_build" = fail ]; then
  cat "$WORK"/cmake.log "$WORK"/build.log "$WORK"/build_nvcc.log 2>/dev/null | tail -c 4000000 >"$OUTDIR/build.log"
fi
rm -rf "$WORK"
[ "$status_build" != fail ] && [ "$status_test" = pass ] && [ "$status_bench" = pass ]
