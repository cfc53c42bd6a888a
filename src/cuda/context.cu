/* CUDA availability, the backend's argument-check rules (kd_cuda_rules) and the per-device
 * context (cuBLAS and cuBLASLt handles). Handles are created once here and reused by every call,
 * never global. Errors become status codes. */
#include <stdlib.h>

#include "vp_cuda.h" /* first: it includes kd_cuda.cuh after div_math.h (tk_rows.cuh says why) */
#include "kd_cuda.cuh"

const kd_rules kd_cuda_rules = {
    0,  /* host_memory: the values of labels, ids and weights are the kernels' to check */
    16, /* ws_align: the workspace is required, its regions read with 16-byte loads */
};

int kdloss_cuda_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* no driver or no device: not an error of the caller's later CUDA calls */
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* device: index as cudaSetDevice takes it. *ctx is set to NULL on any failure. */
kdloss_status kdloss_cuda_context_create(int device, kdloss_cuda_context **ctx) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    *ctx = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return KDLOSS_ERR_UNSUPPORTED;
    }
    if (device < 0 || device >= n) return KDLOSS_ERR_INVALID_PARAM;

    kdloss_cuda_context *c = (kdloss_cuda_context *)calloc(1, sizeof *c);
    if (!c) return KDLOSS_ERR_OUT_OF_MEMORY;
    c->device = device;

    kd_dev_guard g;
    kdloss_status s = kd_dev_enter(c, &g);
    if (s != KDLOSS_OK) {
        free(c);
        return s;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) s = kd_cuda_status(e);
    if (s == KDLOSS_OK) {
        c->sm_count = prop.multiProcessorCount;
        c->cc_major = prop.major;
        c->total_mem = prop.totalGlobalMem;
        s = kd_blas_status(cublasCreate(&c->blas));
    }
    if (s == KDLOSS_OK) {
        s = kd_blas_status(cublasLtCreate(&c->lt));
        if (s != KDLOSS_OK) {
            cublasDestroy(c->blas);
            c->blas = NULL;
        }
    }
    if (s == KDLOSS_OK) { /* the vocabulary-parallel agreement's buffer: calls never allocate */
        s = kd_cuda_status(cudaMalloc((void **)&c->vp_agree, KD_VP_AGREE_BYTES));
        if (s != KDLOSS_OK) {
            cublasLtDestroy(c->lt);
            cublasDestroy(c->blas);
        }
    }
    kd_dev_leave(&g);
    if (s != KDLOSS_OK) {
        free(c);
        return s;
    }
    *ctx = c;
    return KDLOSS_OK;
}

/* NULL is a no-op. Work still queued with the handles must be finished by the caller. */
void kdloss_cuda_context_destroy(kdloss_cuda_context *ctx) {
    if (!ctx) return;
    kd_dev_guard g;
    int entered = kd_dev_enter(ctx, &g) == KDLOSS_OK;
    if (ctx->vp_agree) (void)cudaFree(ctx->vp_agree);
    if (ctx->lt) cublasLtDestroy(ctx->lt);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (entered) kd_dev_leave(&g);
    free(ctx);
}

static size_t kd_cuda_budget_for(size_t total_mem) {
    const size_t lo = (size_t)256 << 20, hi = (size_t)2 << 30, b = total_mem / 32;
    return b < lo ? lo : b > hi ? hi : b;
}

/* Cached per device on a GPU (a properties query costs more than a small call); the simulator
 * asks every time, since a GPU model changes its simulated memory between runs. */
size_t kd_cuda_default_budget(int device) {
    static size_t cache[64];
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return kd_cuda_budget_for(0);
    }
#if !defined(KD_SIM_CUDA_RUNTIME_H)
    if (device < 64 && __atomic_load_n(&cache[device], __ATOMIC_RELAXED))
        return __atomic_load_n(&cache[device], __ATOMIC_RELAXED);
#endif
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return kd_cuda_budget_for(0);
    }
    const size_t b = kd_cuda_budget_for(prop.totalGlobalMem);
    if (device < 64) __atomic_store_n(&cache[device], b, __ATOMIC_RELAXED);
    return b;
}
