#!/usr/bin/env bash
# The main benchmark job: `make bench` or `bash bench/run_main.sh BUILD_DIR [--check]`.
# Runs `kdloss bench` for kl_div, jsd and distill (each divergence) at the reference shape (BT
# 16384, V 4096, fp32, full), distill_logits (each divergence, BT 4096, V 32768), distill_jsd
# (JSD in bf16, then each other divergence in fp32) and topk_distill when the tool lists them,
# then bench/peers.sh when present and executable (fp32, then the fused loss in bf16), writing
# JSON records to bench/out/. Ends with one combined table, the targets (MET / NOT MET) and
# every step that was skipped, measured at a smaller point, or stopped by its time limit.
#
# Time: the job has a budget (KDLOSS_BENCH_BUDGET_S, default 1320 s = 22 min, so that `make
# bench` with its build ends within 25 min on a 2-core machine). Every step runs under its own
# time limit (`timeout`, which stops the step's whole process group: the GEMM-floor child, the
# peers' memory children); the kdloss steps share the budget up to the last
# KDLOSS_BENCH_PEERS_S seconds (default 540), which the peers get: a step that would start with
# less time than it needs is skipped and named. The peers get a deadline of their own
# (peers.py --deadline) and skip, or measure smaller, the points they cannot finish (a bf16 peer
# on a CPU without bf16 arithmetic, found by a timed probe; Liger's Triton kernels without a
# GPU), printing a SKIP or SMALLER line that the summary repeats.
#
# Exits 1 if any benchmark failed to run or was stopped by its time limit, else 0: a target NOT
# MET is a measurement, reported, not a failure of the job. With --check (`make bench-check`)
# it exits 3 when all ran but some target was NOT MET. `--self-test` checks the time guard
# itself (a step past its limit is stopped with its children, one past the budget is skipped,
# both named) in about 15 s, without a build (ctest: test_bench_guard).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"

# ---- the time guard --------------------------------------------------------------------------

budget=${KDLOSS_BENCH_BUDGET_S:-1320}
peers_s=${KDLOSS_BENCH_PEERS_S:-540}
grace=10 # seconds between a step's TERM and its KILL
t_start=$(date +%s)
deadline=$((t_start + budget))
kd_deadline=$((deadline - peers_s)) # the kdloss steps end here; the peers get the rest
failed=()
timedout=()
skipped=()
logs=()
cur_pidf=""

# Ctrl-C or TERM: stop the running step's process group too (timeout runs it in a group of its
# own, which the terminal's signals do not reach).
on_signal() {
    if [ -n "$cur_pidf" ] && [ -s "$cur_pidf" ]; then kill -TERM "$(cat "$cur_pidf")" 2>/dev/null; fi
    echo "run_main.sh: interrupted" >&2
    exit 130
}
trap on_signal INT TERM

# run NAME LIMIT_S [--until EPOCH] CMD...: runs a step with its output shown and kept, for at
# most LIMIT_S seconds and never past EPOCH (default: the kdloss steps' end). A step that would
# get less than min(LIMIT_S, 30) s is skipped; one stopped by its limit is named TIMED OUT.
run() {
    local name=$1 limit=$2
    shift 2
    local until=$kd_deadline
    if [ "${1:-}" = --until ]; then
        until=$2
        shift 2
    fi
    local left=$((until - $(date +%s))) need=$((limit < 30 ? limit : 30))
    if [ "$left" -lt "$need" ]; then
        echo
        echo "== $name: SKIPPED (${left} s left before its deadline, it needs ${need} s)"
        skipped+=("$name: not started, ${left} s left before its deadline, it needs ${need} s (job budget ${budget} s: KDLOSS_BENCH_BUDGET_S)")
        return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    local log="$logdir/$name.log"
    cur_pidf="$logdir/.$name.pid"
    : >"$cur_pidf"
    echo
    echo "== $name (time limit ${limit} s): $*"
    # the inner subshell writes its pid and becomes `timeout`, so that on_signal can reach it;
    # KDLOSS_BENCH_DEADLINE, an eighth of the limit (at least 20 s) before it: the fused
    # kernels time fewer rounds rather than be stopped (their SMALLER line)
    local t0 soft
    t0=$(date +%s)
    soft=$((t0 + limit - (limit / 8 > 20 ? limit / 8 : 20)))
    { (echo "$BASHPID" >"$cur_pidf"
       KDLOSS_BENCH_DEADLINE=$soft exec timeout -k "$grace" "$limit" "$@") 2>&1
      echo "$?" >"$cur_pidf.rc"; } | tee "$log" &
    wait $!
    local rc
    rc=$(cat "$cur_pidf.rc" 2>/dev/null || echo 1)
    rm -f "$cur_pidf" "$cur_pidf.rc"
    cur_pidf=""
    logs+=("$log")
    # 124: timeout's TERM; 137: its KILL after the grace, unless the step was killed sooner (OOM)
    if [ "$rc" -eq 124 ] || { [ "$rc" -eq 137 ] && [ $(($(date +%s) - t0)) -ge "$limit" ]; }; then
        echo "!! $name TIMED OUT: stopped after its ${limit} s limit"
        timedout+=("$name (limit ${limit} s)")
    elif [ "$rc" -ne 0 ]; then
        echo "!! $name failed (exit $rc)"
        failed+=("$name")
    fi
}

# has KERNEL: `kdloss bench --list` shows it.
has() { timeout 60 "$kd" bench --list | awk '{print $1}' | grep -qx "$1"; }

# ---- the job ---------------------------------------------------------------------------------

main_steps() {
    for k in kl_div jsd; do
        run "$k" 180 "$kd" bench "$k" --mode full --bt 16384 --vocab 4096 --dtype fp32 \
            --json "$out/$k-full-$stamp.json"
    done

    # The divergence family on log-probs (kdloss_distill), one run per divergence, same shape.
    if has distill; then
        for d in $("$kd" divergences); do
            run "distill-$d" 180 "$kd" bench distill --divergence "$d" --mode full --bt 16384 \
                --vocab 4096 --dtype fp32 --json "$out/distill-$d-full-$stamp.json"
        done
    fi

    # The same on logits (kdloss_distill_logits, what DistillLoss calls) at an LLM-like shape, BT
    # 4096, V 32768: TARGET 0.6 of the streaming bandwidth for the KL class in fp32, the others
    # (and forward KL on bf16 logits) reported.
    if has distill_logits; then
        for d in $("$kd" divergences); do
            run "distill_logits-$d" 180 "$kd" bench distill_logits --divergence "$d" --mode full \
                --bt 4096 --vocab 32768 --dtype fp32 --reps 7 \
                --json "$out/distill_logits-$d-full-$stamp.json"
        done
        # bf16 logits (what a bf16 model hands the loss): half the bytes, reported without a target
        run "distill_logits-forward_kl-bf16" 180 "$kd" bench distill_logits --divergence forward_kl \
            --mode full --bt 4096 --vocab 32768 --dtype bf16 --reps 7 \
            --json "$out/distill_logits-forward_kl-bf16-full-$stamp.json"
    fi

    if has distill_jsd; then
        run distill_jsd 420 "$kd" bench distill_jsd --mode full --json "$out/distill_jsd-full-$stamp.json"
        # The other divergences fused with the LM heads (target: <= 1.10x the floor, the row pass
        # hidden in GEMM time), fp32, 3 calls each against the oneDNN floor: about 25 s a
        # divergence on the Xeon, about a minute on a Zen 3.
        for d in $("$kd" divergences | grep -vx jsd); do
            run "distill_jsd-$d" 240 "$kd" bench distill_jsd --divergence "$d" --mode full --dtype fp32 \
                --reps 3 --floor-providers onednn --json "$out/distill_jsd-$d-full-$stamp.json"
        done
    else
        echo
        echo "== distill_jsd: not in 'kdloss bench --list', skipped"
    fi

    # The sparse top-k teacher (docs/MATH.md section 8): bucket, renorm_both and renorm_teacher side by side
    # (forward KL, BT 2048, H 1024, V 32768, K 64, fp32) with the three-GEMM floor, TARGETs bucket
    # <= 1.10x the floor and renorm_both <= 0.10x bucket; then one bucket call at BT 8192 in a
    # fresh process (no floor), TARGET its peak RSS below 1.5 GiB. Under two minutes together (1
    # min 43 s at load ~300 on the 2-core Xeon, BENCHMARKS.md).
    if has topk_distill; then
        run topk_distill 420 "$kd" bench topk_distill --tail all --mode full \
            --json "$out/topk_distill-full-$stamp.json"
        run topk_distill-rss 180 "$kd" bench topk_distill --bt 8192 --reps 1 --warmup 0 \
            --floor-providers none --rss-target 1536 --json "$out/topk_distill-rss-full-$stamp.json"
    else
        echo
        echo "== topk_distill: not in 'kdloss bench --list', skipped"
    fi

    if [ -x "$here/peers.sh" ]; then
        # fp32 until the last third of the peers' time, then the fused loss in bf16 (the seed's
        # dtype): kdloss, Liger, torch's four bf16 GEMMs and eager torch at BT 2048
        # (smaller where torch's bf16 is slow here: peers.py's probe), own records and plots in
        # out/bf16. Each gets a soft deadline (peers.py stops starting points) and a hard limit
        # 60 s later.
        local now left fp32_end
        now=$(date +%s)
        left=$((deadline - now))
        fp32_end=$((now + left * 2 / 3))
        run peers $((fp32_end - now + 60)) --until $((fp32_end + 60)) \
            "$here/peers.sh" "$build" "$out" --deadline "$fp32_end"
        now=$(date +%s)
        run peers-bf16 $((deadline - now + 60)) --until $((deadline + 60)) \
            "$here/peers.sh" "$build" "$out/bf16" --workloads distill_jsd_loss \
            --distill-bt 2048 --dtype bf16 --distill-all-modes-max-bt 0 --deadline "$deadline"
    else
        echo
        echo "== peers: bench/peers.sh absent or not executable, skipped"
    fi
}

# The self-test's job: a step that outlives its 2 s limit (with a grandchild that must go too),
# one that passes, and one the 6 s budget no longer holds.
self_test_steps() {
    run st-pass 5 bash -c 'echo "TARGET self-test pass: MET"'
    run st-sleeper 2 bash -c "sleep 60 & echo \$! > '$logdir/grandchild.pid'; sleep 60"
    run st-skip 3 --until $(($(date +%s) - 1)) true
    run st-late 60 true # needs 30 s: the 6 s budget no longer holds them
}

# ---- the summary -----------------------------------------------------------------------------

summary() {
    # Combined table: the header once, then from every log the non-blank lines that follow a
    # line starting with "kernel " (the row format of kdloss bench; peers.sh prints the same).
    echo
    echo "== combined results ($stamp)"
    local hdr
    hdr=$(grep -h -m1 '^kernel ' "${logs[@]}" /dev/null 2>/dev/null | head -1)
    [ -n "$hdr" ] && echo "$hdr"
    for log in "${logs[@]}"; do
        awk '/^kernel /{t=1; next} t && NF == 0 {t=0} t {print}' "$log"
    done

    # Targets: every TARGET line the benchmarks printed, then a count. Never "passed" while one
    # is NOT MET.
    echo
    echo "== targets"
    grep -h '^TARGET ' "${logs[@]}" /dev/null 2>/dev/null | sed 's/^TARGET /  /'
    local met notmet reduced
    met=$(grep -h '^TARGET ' "${logs[@]}" /dev/null 2>/dev/null | grep -c ': MET$')
    notmet=$(grep -h '^TARGET ' "${logs[@]}" /dev/null 2>/dev/null | grep -c ': NOT MET$')

    # Everything not measured as asked: steps skipped or stopped here, points the peers skipped
    # or measured smaller (their SKIP / SMALLER lines).
    echo
    echo "== skipped, smaller or stopped (job budget ${budget} s, took $(($(date +%s) - t_start)) s)"
    local s
    for s in "${skipped[@]+"${skipped[@]}"}"; do echo "  SKIP $s"; done
    for s in "${timedout[@]+"${timedout[@]}"}"; do echo "  TIMED OUT $s"; done
    grep -h -E '^(SKIP|SMALLER) ' "${logs[@]}" /dev/null 2>/dev/null | sed 's/^/  /'
    reduced=$((${#skipped[@]} + ${#timedout[@]} +
        $(grep -h -E '^(SKIP|SMALLER) ' "${logs[@]}" /dev/null 2>/dev/null | wc -l)))
    [ "$reduced" -eq 0 ] && echo "  none: every step ran in full"
    local tail="targets: $met met, $notmet NOT MET; $reduced skipped, smaller or stopped (listed above)"
    if [ ${#failed[@]} -gt 0 ] || [ ${#timedout[@]} -gt 0 ]; then
        local what=()
        [ ${#failed[@]} -gt 0 ] && what+=("${failed[*]}")
        [ ${#timedout[@]} -gt 0 ] && what+=("timed out: ${timedout[*]}")
        local IFS=";"
        echo "FAILED to run: ${what[*]}; $tail"
        return 1
    fi
    if [ "$notmet" -gt 0 ]; then
        echo "all benchmarks ran; $tail"
        [ "$check" -eq 1 ] && return 3
        return 0
    fi
    echo "all benchmarks ran; targets: all $met met; $reduced skipped, smaller or stopped"
}

# The self-test: runs the job's machinery on self_test_steps and checks what it did.
self_test() {
    local tmp outp rc t0 el bad=0
    tmp=$(mktemp -d)
    t0=$(date +%s)
    outp=$(KDLOSS_BENCH_BUDGET_S=6 KDLOSS_BENCH_PEERS_S=0 KDLOSS_BENCH_OUT="$tmp" \
        bash "$self" --self-test-job 2>&1)
    rc=$?
    el=$(($(date +%s) - t0))
    fail() { echo "run_main.sh --self-test: FAIL: $*"; bad=1; }
    [ "$rc" -eq 1 ] || fail "exit status $rc, want 1 (a step timed out)"
    [ "$el" -le $((2 + grace + 8)) ] || fail "took ${el} s: the 2 s step was not stopped in time"
    grep -q '^  TIMED OUT st-sleeper (limit 2 s)$' <<<"$outp" || fail "the stopped step is not named"
    grep -q '^  SKIP st-skip: not started' <<<"$outp" || fail "the step past its deadline is not named"
    grep -q '^  SKIP st-late: not started, [0-9]* s left before its deadline, it needs 30 s (job budget 6 s' <<<"$outp" ||
        fail "the step past the job's budget was not skipped and named"
    grep -q '^  self-test pass: MET$' <<<"$outp" || fail "the passing step's TARGET line is missing"
    local gc
    gc=$(cat "$tmp"/logs-*/grandchild.pid 2>/dev/null)
    # alive: exists and is not a zombie (a container's init may leave those unreaped)
    if [ -z "$gc" ]; then fail "the sleeper's grandchild never started"
    elif [ -e "/proc/$gc" ] && ! grep -q ') Z ' "/proc/$gc/stat" 2>/dev/null; then
        fail "the sleeper's grandchild $gc outlived the time limit"
        kill "$gc"
    fi
    rm -rf "$tmp"
    # peers.py's deadline and bf16-probe arithmetic (no torch needed)
    if command -v python3 >/dev/null 2>&1; then
        python3 "$here/peers.py" --self-test || fail "peers.py --self-test"
    fi
    if [ "$bad" -ne 0 ]; then
        echo "--- the job's output:"
        echo "$outp"
        return 1
    fi
    echo "run_main.sh --self-test: passed (stopped at its limit with its children, skips named; ${el} s)"
}

# ---- entry -------------------------------------------------------------------------------------

mode=job
check=0
case "${1:-}" in
--self-test) self_test; exit $? ;;
--self-test-job) mode=self ;;
esac
build=${1:-build}
[ "${2:-}" = --check ] && check=1
out=${KDLOSS_BENCH_OUT:-$here/out}
kd="$build/kdloss"
if [ "$mode" = job ] && [ ! -x "$kd" ]; then
    echo "run_main.sh: $kd not found or not executable (build first: make build)" >&2
    exit 2
fi
mkdir -p "$out"
stamp=$(date -u +%Y%m%d-%H%M%S)
logdir="$out/logs-$stamp"
mkdir -p "$logdir"

if [ "$mode" = self ]; then
    self_test_steps
    summary
    exit $?
fi

echo "== kdloss main benchmark job, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), time budget ${budget} s (peers: the last ${peers_s} s)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) online CPUs, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
echo "environment as found: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}, KDLOSS_CPU_ISA=${KDLOSS_CPU_ISA:-unset}, ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}, KDLOSS_BENCH_BF16_SLOW=${KDLOSS_BENCH_BF16_SLOW:-unset}"
echo "records: $out   logs: $logdir"
timeout 120 "$kd" info | sed 's/^/  /'
main_steps
summary
exit $?
