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

/* ---- the trace: what a GPU model counts (cudasim/README.md, "The trace") ------------------- */
enum {
    KD_SIM_OP_KERNEL, /* a kernel launch: bytes its threads read / wrote in device memory */
    KD_SIM_OP_GEMM,   /* a cuBLAS / cuBLASLt GEMM: flops = 2 m n k, operand bytes */
    KD_SIM_OP_MEMSET, /* cudaMemset(Async): bytes written */
    KD_SIM_OP_COPY,   /* cudaMemcpy(Async) touching device memory: bytes read and written */
    KD_SIM_OP_SYNC,   /* a host synchronization: cudaStreamSynchronize, cudaDeviceSynchronize,
                         a synchronous cudaMemcpy */
    KD_SIM_OP_ALLOC,  /* cudaMalloc: bytes_written holds the size */
    KD_SIM_OP_COLLECTIVE /* an NCCL collective: bytes read and written on this rank */
};
typedef struct kd_sim_op {
    int kind;
    const char *name;  /* the kernel's registry name, the GEMM's API, the runtime call */
    double blocks;     /* kernel: blocks in the grid */
    double blocks_run; /* kernel: blocks executed (fewer under block sampling) */
    int threads;       /* kernel: threads a block */
    double bytes_read, bytes_written; /* kernel: scaled to the whole grid under sampling */
    double flops;                     /* GEMM: 2 m n k */
    long long m, n, k;                /* GEMM */
    int elem_bytes;                   /* GEMM: bytes of an element of A (4 fp32, 2 bf16 / fp16) */
} kd_sim_op;
/* Clears the trace and starts recording every operation, on every host thread. */
KD_SIM_API void kd_sim_trace_begin(void);
/* Stops recording; returns the number of operations recorded. */
KD_SIM_API long kd_sim_trace_end(void);
/* Operation i of the trace (0 <= i < count); 0 when out of range. */
KD_SIM_API int kd_sim_trace_get(long i, kd_sim_op *op);
/* Model mode. k > 0: a launch of more than k blocks runs k of them, evenly spread, and its byte
 * counts are scaled to the grid. on: GEMMs are counted, not computed (D gets finite values).
 * Either one silences the checkers and skips initcheck's shadow for allocations made after it:
 * results are not meaningful, only the counts. */
KD_SIM_API void kd_sim_set_sample_blocks(long k);
KD_SIM_API void kd_sim_set_gemm_count_only(int on);
/* The device memory cudaGetDeviceProperties reports (totalGlobalMem; 0: the default 16 GiB), so a
 * GPU model sees the plan a given GPU gets. Allocation is not limited by it. */
KD_SIM_API void kd_sim_set_device_memory(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
