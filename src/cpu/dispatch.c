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

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c". */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static int cpu_has(kdloss_cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    switch (isa) {
    case KDLOSS_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               has_f16c();
    case KDLOSS_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma") && has_f16c();
    default: return isa == KDLOSS_ISA_SCALAR || isa == KDLOSS_ISA_AUTO;
    }
#else
    return isa == KDLOSS_ISA_SCALAR || isa == KDLOSS_ISA_AUTO;
#endif
}

static kdloss_cpu_isa best_isa(void) {
    if (cpu_has(KDLOSS_ISA_AVX512)) return KDLOSS_ISA_AVX512;
    if (cpu_has(KDLOSS_ISA_AVX2)) return KDLOSS_ISA_AVX2;
    return KDLOSS_ISA_SCALAR;
}

int kdloss_cpu_isa_supported(kdloss_cpu_isa isa) {
    if (isa < KDLOSS_ISA_AUTO || isa > KDLOSS_ISA_AVX512) return 0;
    return cpu_has(isa);
}

kdloss_cpu_isa kd_cpu_isa(void) {
    int isa = g_isa;
    if (isa) return (kdloss_cpu_isa)isa;
    kdloss_cpu_isa chosen = best_isa();
    const char *env = getenv("KDLOSS_CPU_ISA");
    if (env) {
        kdloss_cpu_isa want = KDLOSS_ISA_AUTO;
        if (!strcmp(env, "scalar")) want = KDLOSS_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = KDLOSS_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = KDLOSS_ISA_AVX512;
        if (want != KDLOSS_ISA_AUTO && cpu_has(want)) chosen = want;
    }
    g_isa = (int)chosen;
    return chosen;
}

kdloss_status kdloss_cpu_set_isa(kdloss_cpu_isa isa) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (isa < KDLOSS_ISA_AUTO || isa > KDLOSS_ISA_AVX512) return KDLOSS_ERR_INVALID_PARAM;
    if (!cpu_has(isa)) return KDLOSS_ERR_UNSUPPORTED;
    g_isa = isa == KDLOSS_ISA_AUTO ? (int)best_isa() : (int)isa;
    return KDLOSS_OK;
}

kdloss_cpu_isa kdloss_cpu_get_isa(void) { return kd_cpu_isa(); }

static const kd_kernel_table KD_KERNELS_SCALAR = {
    kd_kl_row_scalar,        kd_div_row_scalar,     kd_fld_rows_scalar,
    kd_fld_rows_phase_scalar, kd_topk_sparse_rows_scalar, kd_topk_sparse_scatter_scalar,
    NULL,                    kd_gemm_fb_scalar,
};
static const kd_kernel_table KD_KERNELS_AVX2 = {
    kd_kl_row_avx2,        kd_div_row_avx2,     kd_fld_rows_avx2,
    kd_fld_rows_phase_avx2, kd_topk_sparse_rows_avx2, kd_topk_sparse_scatter_avx2,
    kd_logits_step_avx2,   kd_gemm_fb_avx2,
};
static const kd_kernel_table KD_KERNELS_AVX512 = {
    kd_kl_row_avx512,        kd_div_row_avx512,     kd_fld_rows_avx512,
    kd_fld_rows_phase_avx512, kd_topk_sparse_rows_avx512, kd_topk_sparse_scatter_avx512,
    kd_logits_step_avx512,   kd_gemm_fb_avx512,
};

const kd_kernel_table *kd_cpu_kernels(void) {
    switch (kd_cpu_isa()) {
    case KDLOSS_ISA_AVX512: return &KD_KERNELS_AVX512;
    case KDLOSS_ISA_AVX2: return &KD_KERNELS_AVX2;
    default: return &KD_KERNELS_SCALAR;
    }
}

const char *kdloss_cpu_isa_name(kdloss_cpu_isa isa) {
    switch (isa) {
    case KDLOSS_ISA_AUTO: return "auto";
    case KDLOSS_ISA_SCALAR: return "scalar";
    case KDLOSS_ISA_AVX2: return "avx2";
    case KDLOSS_ISA_AVX512: return "avx512";
    }
    return "unknown";
}
