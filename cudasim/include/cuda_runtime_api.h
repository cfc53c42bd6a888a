/* cuda_runtime_api.h of the CUDA simulator (cudasim/): the host API of the CUDA runtime that
 * kdloss and its tests use, served on the CPU by cudasim/src/sim.cpp. C and C++. Names, values
 * and documented behaviour follow the CUDA runtime's; only what kdloss calls is here. */
#ifndef KD_SIM_CUDA_RUNTIME_API_H
#define KD_SIM_CUDA_RUNTIME_API_H

#include <stddef.h>
#include <stdint.h>

#include "kd_sim.h"

#define KD_SIM_CUDA 1 /* this is the simulator, not the toolkit */
#define CUDART_VERSION 12000

#ifdef __cplusplus
extern "C" {
#endif

/* The values are CUDA's (driver_types.h), so a status printed by a test means the same. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
} cudaFuncAttribute;

#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1

typedef struct kd_sim_stream *cudaStream_t;

typedef struct dim3 {
    unsigned int x, y, z;
#ifdef __cplusplus
    dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
#endif
} dim3;

typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;      /* 48 KiB: the default limit of a launch */
    size_t sharedMemPerBlockOptin; /* 227 KiB: what cudaFuncSetAttribute can raise it to */
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int major;
    int minor;
} cudaDeviceProp;

KD_SIM_API cudaError_t cudaGetDeviceCount(int *count);
KD_SIM_API cudaError_t cudaGetDevice(int *device);
KD_SIM_API cudaError_t cudaSetDevice(int device);
KD_SIM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
KD_SIM_API cudaError_t cudaDeviceSynchronize(void);
KD_SIM_API cudaError_t cudaGetLastError(void);
KD_SIM_API cudaError_t cudaPeekAtLastError(void);
KD_SIM_API const char *cudaGetErrorString(cudaError_t e);
KD_SIM_API const char *cudaGetErrorName(cudaError_t e);

KD_SIM_API cudaError_t cudaMalloc(void **p, size_t bytes);
KD_SIM_API cudaError_t cudaFree(void *p);
KD_SIM_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
KD_SIM_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                       cudaMemcpyKind kind, cudaStream_t st);
KD_SIM_API cudaError_t cudaMemset(void *p, int value, size_t bytes);
KD_SIM_API cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st);

KD_SIM_API cudaError_t cudaStreamCreate(cudaStream_t *st);
KD_SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags);
KD_SIM_API cudaError_t cudaStreamDestroy(cudaStream_t st);
KD_SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t st);

/* The kernel is named by its address (as CUDA's C++ overload does). */
KD_SIM_API cudaError_t kd_sim_func_set_attribute(const void *func, cudaFuncAttribute attr,
                                                 int value);
#ifndef __cplusplus
#define cudaFuncSetAttribute(f, a, v) kd_sim_func_set_attribute((const void *)(f), (a), (v))
#endif

#ifdef __cplusplus
}
template <class F>
static inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return kd_sim_func_set_attribute((const void *)func, attr, value);
}
#endif

#endif
