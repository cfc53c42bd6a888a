#include "dispatch.h"
#include "check.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* fork(): libgomp's thread pool does not survive it (the child has only the forking thread,
 * while the pool's record says its workers wait at their barrier), so in the child of a process
 * that ran any OpenMP parallel region (kdloss's, or another library's on the same runtime) the
 * next region with more than one thread waits forever. The child handler makes the child's
 * OpenMP serial (nthreads-var 1): kdloss calls there run on one thread and finish (README,
 * "Threads"). Registered when the library is loaded, so a fork before any kdloss call is
 * covered; pthread_atfork failing (ENOMEM) leaves things as they were. */
static void kd_fork_child(void) { omp_set_num_threads(1); }

__attribute__((constructor)) static void kd_fork_register(void) {
    (void)pthread_atfork(NULL, NULL, kd_fork_child);
}

/* 0 = not decided yet; otherwise a kdloss_cpu_isa. Reads and writes are single aligned ints. */
static volatile int g_isa = 0;

/* The registry's rows are KDLOSS_ISA_SCALAR, ... in enum order, and are all of them. */
enum { KD_ISA_POS0 = 0,
#define KD_ISA_POS(ID, name, layer, has, flags) KD_ISA_POS_##ID,
       KD_ISAS(KD_ISA_POS)
#undef KD_ISA_POS
       KD_ISA_ROWS_END };
#define KD_ISA_ORDER(ID, name, layer, has, flags)                                               \
    _Static_assert((int)KD_ISA_POS_##ID == (int)KDLOSS_ISA_##ID,                               \
                   "KD_ISAS row " #name " out of enum order");
KD_ISAS(KD_ISA_ORDER)
#undef KD_ISA_ORDER
_Static_assert((int)KD_ISA_ROWS_END == (int)KDLOSS_ISA_COUNT,
               "KD_ISAS and kdloss_cpu_isa disagree in count");

/* The registry's `has` tests (the vector rows' flags are x86's: kdloss builds for x86-64). */
static int kd_has_always(void) { return 1; }
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
static int kd_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}
static int kd_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && has_f16c();
}
#endif

static int cpu_has(kdloss_cpu_isa isa) {
    switch (isa) {
    case KDLOSS_ISA_AUTO: return 1;
#define KD_ISA_HAS(ID, name, layer, has, flags)                                                 \
    case KDLOSS_ISA_##ID: return has();
        KD_ISAS(KD_ISA_HAS)
#undef KD_ISA_HAS
    default: return 0;
    }
}

/* The last row the CPU has (rows are in the order of preference, isa.h). */
static kdloss_cpu_isa best_isa(void) {
    int best = KDLOSS_ISA_SCALAR;
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++)
        if (cpu_has((kdloss_cpu_isa)i)) best = i;
    return (kdloss_cpu_isa)best;
}

int kdloss_cpu_isa_supported(kdloss_cpu_isa isa) {
    if (isa < KDLOSS_ISA_AUTO || isa >= KDLOSS_ISA_COUNT) return 0;
    return cpu_has(isa);
}

kdloss_cpu_isa kd_cpu_isa(void) {
    int isa = g_isa;
    if (isa) return (kdloss_cpu_isa)isa;
    kdloss_cpu_isa chosen = best_isa();
    const char *env = getenv("KDLOSS_CPU_ISA");
    if (env) /* a name of the registry the CPU has; anything else: the automatic choice */
        for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++)
            if (!strcmp(env, kdloss_cpu_isa_name((kdloss_cpu_isa)i)) && cpu_has((kdloss_cpu_isa)i))
                chosen = (kdloss_cpu_isa)i;
    g_isa = (int)chosen;
    return chosen;
}

kdloss_status kdloss_cpu_set_isa(kdloss_cpu_isa isa) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (isa < KDLOSS_ISA_AUTO || isa >= KDLOSS_ISA_COUNT) return KDLOSS_ERR_INVALID_PARAM;
    if (!cpu_has(isa)) return KDLOSS_ERR_UNSUPPORTED;
    g_isa = isa == KDLOSS_ISA_AUTO ? (int)best_isa() : (int)isa;
    return KDLOSS_OK;
}

kdloss_cpu_isa kdloss_cpu_get_isa(void) { return kd_cpu_isa(); }

/* The kernel tables (BLIS's bli_cntx_init_<arch>): each ISA's starts from the scalar one, the
 * reference kernels, and overrides what it has: with a vector layer, the entry points of the
 * *_vec.c sources compiled for it (logits_step has no scalar form: NULL, the scalar rows). The
 * later designated initializer wins (C11 6.7.9), which is the point here, so GCC's and clang's
 * warning about overridden initializers is off for these lines. */
#define KD_SCALAR_SLOTS                                                                         \
    .kl_row = kd_kl_row_scalar, .div_row = kd_div_row_scalar, .fld_rows = kd_fld_rows_scalar,   \
    .fld_phase = kd_fld_rows_phase_scalar, .sparse_rows = kd_topk_sparse_rows_scalar,           \
    .sparse_scatter = kd_topk_sparse_scatter_scalar, .logits_step = NULL,                      \
    .gemm_fb = kd_gemm_fb_scalar,
#define KD_VEC_SLOTS(n)                                                                         \
    .kl_row = kd_kl_row_##n, .div_row = kd_div_row_##n, .fld_rows = kd_fld_rows_##n,            \
    .fld_phase = kd_fld_rows_phase_##n, .sparse_rows = kd_topk_sparse_rows_##n,                 \
    .sparse_scatter = kd_topk_sparse_scatter_##n, .logits_step = kd_logits_step_##n,           \
    .gemm_fb = kd_gemm_fb_##n,
#define KD_TABLE(ID, name, layer, has, flags)                                                   \
    [KDLOSS_ISA_##ID] = {KD_SCALAR_SLOTS KD_IF_VEC(layer, KD_VEC_SLOTS(name))},
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const kd_kernel_table KD_TABLES[KDLOSS_ISA_COUNT] = {KD_ISAS(KD_TABLE)};
#pragma GCC diagnostic pop
#undef KD_TABLE

const kd_kernel_table *kd_cpu_kernels(void) { return &KD_TABLES[kd_cpu_isa()]; }

const char *kdloss_cpu_isa_name(kdloss_cpu_isa isa) {
    switch (isa) {
    case KDLOSS_ISA_AUTO: return "auto";
#define KD_ISA_NAME_CASE(ID, name, layer, has, flags)                                           \
    case KDLOSS_ISA_##ID: return #name;
        KD_ISAS(KD_ISA_NAME_CASE)
#undef KD_ISA_NAME_CASE
    default: return "unknown";
    }
}
