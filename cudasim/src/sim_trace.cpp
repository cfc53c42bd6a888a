/* The simulator's trace: what a GPU model needs from each operation a program queues, counted,
 * never typed in (cudasim/README.md, "The trace"). Each kernel launch records the bytes its
 * threads read and wrote in device memory (the racecheck build's instrumentation sees every
 * access: sim_hooks.cpp counts them per OS thread), each GEMM of the cuBLAS / cuBLASLt stand-in
 * its FLOPs and operand bytes, each memset / copy its bytes, and each host synchronization and
 * device allocation an entry of its own.
 *
 * Two switches make a seed-sized workload affordable on a CPU:
 *  - block sampling: a launch of more than k blocks runs k of them, spread evenly over the grid,
 *    and its byte counts are scaled by blocks / k (sound for kernels whose blocks do the same
 *    work: one row each, or a grid-stride loop);
 *  - GEMMs counted, not computed: the output gets finite, non-uniform values in O(m n) instead
 *    of the O(m n k) reference product.
 * While either is on the checkers are quiet: blocks that did not run leave memory unwritten, and
 * the checkers would report what a real run never does. */
#include <math.h>
#include <string.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "sim_exec.h"

static std::mutex g_tr_mu;
static std::vector<kd_sim_op> &g_ops = *new std::vector<kd_sim_op>;
static std::atomic<int> g_tracing{0};
static std::atomic<long> g_sample{0};
static std::atomic<int> g_count_only{0};

extern "C" {

int kd_sim_tracing(void) { return g_tracing.load(std::memory_order_relaxed); }
long kd_sim_sample_blocks(void) { return g_sample.load(std::memory_order_relaxed); }
int kd_sim_gemm_count_only(void) { return g_count_only.load(std::memory_order_relaxed); }
int kd_sim_model_mode(void) { return kd_sim_sample_blocks() > 0 || kd_sim_gemm_count_only(); }

void kd_sim_trace_add(const kd_sim_op *op) {
    if (!kd_sim_tracing()) return;
    std::lock_guard<std::mutex> lk(g_tr_mu);
    g_ops.push_back(*op);
}

void kd_sim_trace_simple(int kind, const char *name, double bytes_r, double bytes_w) {
    if (!kd_sim_tracing()) return;
    kd_sim_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    op.name = name;
    op.bytes_read = bytes_r;
    op.bytes_written = bytes_w;
    kd_sim_trace_add(&op);
}

KD_SIM_API void kd_sim_trace_begin(void) {
    std::lock_guard<std::mutex> lk(g_tr_mu);
    g_ops.clear();
    g_tracing.store(1);
}

KD_SIM_API long kd_sim_trace_end(void) {
    g_tracing.store(0);
    std::lock_guard<std::mutex> lk(g_tr_mu);
    return (long)g_ops.size();
}

KD_SIM_API int kd_sim_trace_get(long i, kd_sim_op *op) {
    std::lock_guard<std::mutex> lk(g_tr_mu);
    if (!op || i < 0 || (size_t)i >= g_ops.size()) return 0;
    *op = g_ops[(size_t)i];
    return 1;
}

KD_SIM_API void kd_sim_set_sample_blocks(long k) { g_sample.store(k > 0 ? k : 0); }
KD_SIM_API void kd_sim_set_gemm_count_only(int on) { g_count_only.store(on ? 1 : 0); }

} /* extern "C" */
