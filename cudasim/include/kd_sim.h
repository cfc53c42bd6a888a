/* kd_sim.h: the CUDA simulator's own API (cudasim/, the KDLOSS_CUDA_SIM build). Tests use it to
 * read the checkers' verdict and to steer the stand-ins; nothing of kdloss calls it.
 * C and C++. */
#ifndef KD_SIM_H
#define KD_SIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KD_SIM_API __attribute__((visibility("default")))

/* Checker reports so far (memcheck, racecheck, synccheck, initcheck, launch, blas, nccl). Each
 * report was printed to stderr when it was made, naming kernel, block and thread. */
KD_SIM_API long kd_sim_report_count(void);
/* Reports of one checker ("memcheck", "racecheck", "synccheck", "initcheck", ...). */
KD_SIM_API long kd_sim_report_count_of(const char *checker);
/* Prints "cuda-sim: K of N kernels executed, C checker reports" and the launch sites not
 * reached; returns the number of checker reports. */
KD_SIM_API long kd_sim_summary(void);
/* The kernels and launch sites of a set of sources, written by cudasim/tools/kd_sim_scan.c
 * into a generated file that registers them at load time: the simulator counts what ran
 * against them (kd_sim_summary) and takes each kernel's __launch_bounds__ from them. */
typedef struct kd_sim_kernel_info {
    const char *name; /* identifier, without template arguments */
    const char *file; /* base name of the source */
    int line;
    int launch_bounds; /* __launch_bounds__'s first argument, 0 if none */
} kd_sim_kernel_info;
typedef struct kd_sim_site_info {
    const char *file; /* base name */
    int line;         /* what __LINE__ gives at the KD_LAUNCH */
    const char *kernel;
} kd_sim_site_info;
KD_SIM_API void kd_sim_register(const kd_sim_kernel_info *k, int nk, const kd_sim_site_info *s,
                                int ns);
/* Kernels registered / executed at least once; launch sites registered / reached. */
KD_SIM_API void kd_sim_coverage(int *kernels, int *kernels_run, int *sites, int *sites_run);

/* Makes cublasLtMatmulAlgoGetHeuristic return no algorithm (on != 0), so the cuBLAS fallback
 * of src/cuda/gemm.cu runs. Also set by the environment variable KD_SIM_NO_LT_HEURISTIC=1. */
KD_SIM_API void kd_sim_set_no_lt_heuristic(int on);
/* Counts of GEMMs served by cuBLASLt and by cublasGemmEx since the start. */
KD_SIM_API void kd_sim_gemm_counts(long *lt, long *gemm_ex);

#ifdef __cplusplus
}
#endif
#endif
