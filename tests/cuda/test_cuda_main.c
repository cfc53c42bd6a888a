/* CUDA backend test (one program, test_cuda; tests/cuda/test_cuda_*.c): every CUDA path against
 * a float64 reference written in the test (the oracle), and against the library's own CPU
 * functions when they are linked (weak symbols: a build may lack the CPU kernels). Also: error
 * codes (the CPU's), "nothing written on error", the device status word for out-of-range labels
 * and invalid ids, in-place and strided / misaligned operands, and bitwise run-to-run
 * reproducibility. The divergence family runs the case grid of tests/support/cases.h, the one
 * the CPU tests (tests/test_distill.c, test_distill_logits.c, test_topk.c) run.
 *
 * Without a GPU, the argument checks still run (they return before any CUDA call, so any
 * pointer will do), then the binary prints "skipped: no CUDA device" and exits with the result
 * of those checks. KDLOSS_TEST_QUICK=1 runs a subset (sanitizer and cublasGemmEx runs); the
 * special cases always run. KDLOSS_TEST_ONLY=NAME runs one section (the names below; "nan": the
 * NaN policy and wide rows).
 *
 * Tolerances (|got - want| <= atol + rtol |want|, per element, or normwise for GEMM outputs):
 *  - an output rounded to dtype d carries up to one unit roundoff u(d) (2^-24, 2^-8, 2^-11)
 *    from that rounding, plus the fp32 arithmetic of the kernels (~1e-6 relative; expf/logf
 *    of CUDA and of glibc differ by an ulp or two): rtol = 2 u(d) + 1e-5;
 *  - cancellation (JSD terms where X ~ log M) makes relative error meaningless near zero:
 *    atol = 1e-5 x the largest |reference| in the tensor (1e-6 for KL, whose gradient is -t);
 *  - scalar losses are double sums of fp32 terms: rtol 1e-4, atol 1e-5 x the sum of |terms|;
 *  - fused-linear gradients go through GEMMs: normwise 1e-4 in fp32 (no TF32), and 1.5e-2 in
 *    bf16, where dzs itself is rounded to bf16 (2^-9) before the two backward GEMMs.
 *
 * The divergence family (kdloss_cuda_distill, kdloss_cuda_fused_linear_distill): against
 * ref_div_elem of tests/support/reference.h (the CPU tests' float64 reference, written from the
 * definitions); the same tolerances plus 64 u x (1 + the mixture weights' logs) x scale for the
 * cancellation at P = Q, except TVD's subgradient, whose sign may differ where P and Q agree to
 * fp32 rounding (those elements may move by Q). The fused cases also check t2_scale and the
 * per-row outputs row_soft, row_hard, row_lse (rtol 1e-4, or 1e-3 with bf16 operands).
 *
 * The vocabulary-parallel entry points (test_cuda_vp.c: 2 and 3 ranks as threads on one GPU,
 * with the test's own communicator) are compared with the single-process CUDA call instead, at
 * tests/mpi/test_vp.c's tolerances (losses 1e-6 relative, gradients 1e-5), and their all-reduce
 * sequence with the documented protocol; the NCCL adapter runs with one rank where CMake found
 * NCCL (KDLOSS_TEST_NCCL).
 *
 * The divergence family on logits (test_cuda_distill_logits.c) and the top-k teacher
 * (test_cuda_topk.c): the top-k logits loss's tolerances plus what S = sum g carries to element
 * j as Q_j dS: 64 u of its terms' magnitudes (the bound test_distill_logits holds the CPU to),
 * and for TVD Q_k of each element k where P and Q agree to fp32 rounding.
 *
 * The NaN policy and wide rows (docs/MATH.md section 10; test_cuda_nan.c,
 * test_cuda_nan_fused.c). */
#include <time.h>

#include "cuda_test.h"

kdloss_cuda_context *g_ctx;
cudaStream_t g_st;
int g_gpu;

/* The sections after the argument checks, in order. */
static const struct {
    const char *name;
    void (*run)(kt_rng *rng);
} SECTIONS[] = {
    {"kl", test_kl},
    {"jsd", test_jsd},
    {"fld_jsd", test_fl},
    {"distill", test_distill},
    {"dlogits", test_distill_logits},
    {"fldistill", test_fld},
    {"multi", test_multi},
    {"bigv", test_bigv},
    {"topk", test_topk_logits},
    {"fltopk", test_topk_fused},
    {"logit_map", test_logit_maps},
    {"vp", test_vp},
    {"nan", test_nan},
#ifdef KDLOSS_TEST_NCCL
    {"nccl", test_vp_nccl},
#endif
};

/* On the simulator every checker report is a failure of this test (kernel, block and thread
 * were printed when it was made); the summary says which kernels and sites ran, and which GEMM
 * path served: KD_SIM_NO_LT_HEURISTIC=1 (ctest test_cuda_gemmex) makes cuBLASLt offer no
 * algorithm, so every GEMM must have gone through gemm.cu's cublasGemmEx fallback. */
static void sim_summary(void) {
#ifdef KD_SIM_CUDA
    KT_CHECK(kd_sim_summary() == 0, "cuda-sim: no checker report");
    long lt = 0, ex = 0;
    const char *no_lt = getenv("KD_SIM_NO_LT_HEURISTIC");
    kd_sim_gemm_counts(&lt, &ex);
    printf("cuda-sim: %ld GEMMs through cuBLASLt, %ld through cublasGemmEx\n", lt, ex);
    if (no_lt && !strcmp(no_lt, "1")) KT_CHECK(lt == 0 && ex > 0, "cuda-sim: the fallback ran");
    else KT_CHECK(lt > 0, "cuda-sim: cuBLASLt ran");
#endif
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    g_gpu = kdloss_cuda_available();
    if (g_gpu) {
        kdloss_status s = kdloss_cuda_context_create(0, &g_ctx);
        if (s != KDLOSS_OK) {
            printf("FAIL: context create: %s\n", kdloss_status_string(s));
            return 1;
        }
        CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    }
    printf("CPU functions linked: kl %s, jsd %s, fld_jsd %s\n", kdloss_kl_div ? "yes" : "no",
           kdloss_jsd ? "yes" : "no", kdloss_fused_linear_jsd ? "yes" : "no");
    test_errors();
    if (!g_gpu) {
        printf("skipped: no CUDA device (argument checks ran)\n");
        return kt_finish("test_cuda");
    }
    const char *only = getenv("KDLOSS_TEST_ONLY");
    for (size_t i = 0; i < sizeof SECTIONS / sizeof SECTIONS[0]; i++) {
        if (only && *only && strcmp(only, SECTIONS[i].name)) continue;
        const int checks = kt_checks, fails = kt_failures;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        SECTIONS[i].run(&rng);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("section %s: %d checks, %d failures, %.1f s\n", SECTIONS[i].name,
               kt_checks - checks, kt_failures - fails,
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    }
    CK(cudaStreamDestroy(g_st));
    kdloss_cuda_context_destroy(g_ctx);
    sim_summary();
    return kt_finish("test_cuda");
}
