/* Host stand-in for the few CUDA runtime calls tests/cuda/test_cuda.c makes (see emu_shim.c):
 * "device" memory is host memory, copies are memcpy, streams are no-ops. Only for the
 * test_cuda_emu build, which puts this directory first on the include path. */
#ifndef KDLOSS_EMU_CUDA_RUNTIME_API_H
#define KDLOSS_EMU_CUDA_RUNTIME_API_H
#include <stdlib.h>
#include <string.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
enum { cudaStreamNonBlocking = 1 };

static inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = malloc(n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int kind) {
    (void)kind;
    memcpy(d, s, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int kind,
                                          cudaStream_t st) {
    (void)st;
    return cudaMemcpy(d, s, n, kind);
}
static inline cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int flags) {
    (void)flags;
    *s = NULL;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return cudaSuccess; }
static inline const char *cudaGetErrorString(cudaError_t e) { (void)e; return "emulated CUDA error"; }

#endif
