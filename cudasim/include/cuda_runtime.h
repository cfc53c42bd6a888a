/* cuda_runtime.h of the CUDA simulator (cudasim/): what a .cu file of kdloss needs to compile
 * with the host C++ compiler and run on the CPU. The kernels' bodies are compiled unchanged:
 *  - __global__ / __device__ functions are plain functions; a launch goes through KD_LAUNCH
 *    (src/cuda/kd_cuda.cuh), which calls kd_sim_launcher below;
 *  - threadIdx / blockIdx / blockDim / gridDim are the running simulated thread's (every thread
 *    of a block is a fiber, cudasim/src/sim.cpp);
 *  - __shared__ variables are static thread_local: one block runs on one OS thread at a time, so
 *    the fibers of a block share them and blocks running on other OS threads do not;
 *  - __syncthreads, warp shuffles and votes, and atomics are calls into the simulator, which
 *    schedules the fibers, checks them (synccheck) and records the accesses (racecheck).
 * Device math is the host's libm (glibc): expf, logf, log1pf, exp, log, log1p are correctly
 * rounded or within 1 ulp there, inside CUDA's documented bounds (expf 2 ulp, logf 1 ulp, log1pf
 * 1 ulp, double functions 1-2 ulp), so a result may differ from a GPU's in the last bit. */
#ifndef KD_SIM_CUDA_RUNTIME_H
#define KD_SIM_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __restrict__ __restrict

/* ---- vector types (CUDA's alignment: 16 bytes for the 4-wide ones) ------------------------ */
struct uint3 {
    unsigned int x, y, z;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

/* ---- the running simulated thread --------------------------------------------------------- */
struct kd_sim_thread {
    uint3 tid;  /* threadIdx */
    uint3 bid;  /* blockIdx */
    dim3 bdim;  /* blockDim */
    dim3 gdim;  /* gridDim */
};
extern "C" KD_SIM_API const kd_sim_thread *kd_sim_self(void);
#define threadIdx (kd_sim_self()->tid)
#define blockIdx (kd_sim_self()->bid)
#define blockDim (kd_sim_self()->bdim)
#define gridDim (kd_sim_self()->gdim)
static constexpr int warpSize = 32;

/* ---- synchronization: every call is a scheduling point of the simulator ------------------- */
enum { KD_SIM_SHFL_DOWN, KD_SIM_SHFL_UP, KD_SIM_SHFL_XOR, KD_SIM_SHFL_IDX,
       KD_SIM_VOTE_ANY, KD_SIM_VOTE_ALL, KD_SIM_VOTE_BALLOT };
extern "C" KD_SIM_API void kd_sim_syncthreads(const char *file, int line);
extern "C" KD_SIM_API uint64_t kd_sim_warp_op(int op, unsigned mask, uint64_t value, int arg,
                                              int width, const char *file, int line);
extern "C" KD_SIM_API void *kd_sim_dyn_smem(void);
#define __syncthreads() kd_sim_syncthreads(__FILE__, __LINE__)
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

template <class T>
static inline T kd_sim_shfl(int op, unsigned mask, T v, int arg, int width, const char *file,
                            int line) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    uint64_t bits = 0;
    __builtin_memcpy(&bits, &v, sizeof v);
    bits = kd_sim_warp_op(op, mask, bits, arg, width, file, line);
    T r;
    __builtin_memcpy(&r, &bits, sizeof r);
    return r;
}
#define __shfl_down_sync(mask, v, d, ...) \
    kd_sim_shfl(KD_SIM_SHFL_DOWN, (mask), (v), (int)(d), kd_sim_width(__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, d, ...) \
    kd_sim_shfl(KD_SIM_SHFL_UP, (mask), (v), (int)(d), kd_sim_width(__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, m, ...) \
    kd_sim_shfl(KD_SIM_SHFL_XOR, (mask), (v), (int)(m), kd_sim_width(__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __shfl_sync(mask, v, l, ...) \
    kd_sim_shfl(KD_SIM_SHFL_IDX, (mask), (v), (int)(l), kd_sim_width(__VA_ARGS__ + 0), __FILE__, __LINE__)
#define __any_sync(mask, p) \
    ((int)kd_sim_warp_op(KD_SIM_VOTE_ANY, (mask), (p) ? 1u : 0u, 0, 32, __FILE__, __LINE__))
#define __all_sync(mask, p) \
    ((int)kd_sim_warp_op(KD_SIM_VOTE_ALL, (mask), (p) ? 1u : 0u, 0, 32, __FILE__, __LINE__))
#define __ballot_sync(mask, p) \
    ((unsigned)kd_sim_warp_op(KD_SIM_VOTE_BALLOT, (mask), (p) ? 1u : 0u, 0, 32, __FILE__, __LINE__))
/* the optional width argument of the shuffles: absent (0) means the whole warp */
static inline int kd_sim_width(int w) { return w == 0 ? 32 : w; }

/* ---- atomics: the compiler's atomic builtins, which the racecheck build's instrumentation
 * reports to the simulator as atomic accesses ------------------------------------------------ */
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline unsigned int atomicAdd(unsigned int *p, unsigned int v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned int atomicOr(unsigned int *p, unsigned int v) {
    return __atomic_fetch_or(p, v, __ATOMIC_RELAXED);
}
static inline unsigned int atomicAnd(unsigned int *p, unsigned int v) {
    return __atomic_fetch_and(p, v, __ATOMIC_RELAXED);
}
static inline unsigned int atomicMax(unsigned int *p, unsigned int v) {
    unsigned int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v &&
           !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

/* ---- bit casts ------------------------------------------------------------------------------ */
template <class To, class From>
static inline To kd_sim_bitcast(From f) {
    static_assert(sizeof(To) == sizeof(From), "same size");
    To t;
    __builtin_memcpy(&t, &f, sizeof t);
    return t;
}
static inline float __int_as_float(int i) { return kd_sim_bitcast<float>(i); }
static inline float __uint_as_float(unsigned int u) { return kd_sim_bitcast<float>(u); }
static inline int __float_as_int(float f) { return kd_sim_bitcast<int>(f); }
static inline unsigned int __float_as_uint(float f) { return kd_sim_bitcast<unsigned int>(f); }
static inline double __longlong_as_double(long long i) { return kd_sim_bitcast<double>(i); }
static inline long long __double_as_longlong(double d) { return kd_sim_bitcast<long long>(d); }
/* The fast intrinsics: CUDA computes them with fewer bits (__expf 2 + 1.16|x| ulp); glibc
 * declares __expf and __logf itself as its accurate expf and logf, and __fdividef is a plain
 * division here, so a kernel relying on them is checked against a tighter result than a GPU's. */
static inline float __fdividef(float a, float b) { return a / b; }

/* ---- launches: KD_LAUNCH(grid, block, smem, stream, kernel)(args...) ------------------------ */
struct kd_sim_launch_cfg {
    const void *fn;       /* the kernel's address */
    const char *expr;     /* the kernel as written at the launch site */
    const char *file;
    int line;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    unsigned cluster; /* blocks per thread-block cluster along x (KD_LAUNCH_CLUSTER); 1: none */
};
/* Runs the launch (checks the configuration, then every block): thunk(fn, args) is what each
 * simulated thread runs. Sets the calling thread's last error as CUDA does. */
extern "C" KD_SIM_API void kd_sim_launch(const kd_sim_launch_cfg *cfg,
                                         void (*thunk)(const void *fn, const void *args),
                                         const void *args, size_t args_size);

template <class... P>
struct kd_sim_launch_obj {
    kd_sim_launch_cfg cfg;
    template <class... A>
    void operator()(A &&...a) const {
        static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
        /* the parameters as the kernel takes them, converted once, as CUDA copies them */
        const std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
        kd_sim_launch(&cfg, &thunk, &args, sizeof args);
    }
    static void thunk(const void *fn, const void *args) {
        /* each thread gets its own copy of the parameters, on its own stack */
        std::tuple<typename std::decay<P>::type...> mine =
            *(const std::tuple<typename std::decay<P>::type...> *)args;
        std::apply((void (*)(P...))fn, mine);
    }
};

template <class... P>
static inline kd_sim_launch_obj<P...> kd_sim_launcher(void (*fn)(P...), const char *expr,
                                                       const char *file, int line, dim3 grid,
                                                       dim3 block, size_t smem,
                                                       cudaStream_t stream) {
    return kd_sim_launch_obj<P...>{{(const void *)fn, expr, file, line, grid, block, smem, stream, 1}};
}

/* A launch in thread-block clusters of `cluster` blocks along x (cudaLaunchKernelEx with
 * cudaLaunchAttributeClusterDimension on a GPU): the blocks of a cluster run at once, each on an
 * OS thread of its own, so cluster.sync() and distributed shared memory work
 * (cooperative_groups.h). */
template <class... P>
static inline kd_sim_launch_obj<P...> kd_sim_launcher_cluster(void (*fn)(P...), const char *expr,
                                                               const char *file, int line,
                                                               dim3 grid, dim3 block, size_t smem,
                                                               cudaStream_t stream,
                                                               unsigned cluster) {
    return kd_sim_launch_obj<P...>{
        {(const void *)fn, expr, file, line, grid, block, smem, stream, cluster}};
}

/* ---- thread-block clusters (cooperative_groups.h's cluster_group) -------------------------- */
extern "C" KD_SIM_API void kd_sim_cluster_sync(const char *file, int line);
extern "C" KD_SIM_API unsigned kd_sim_cluster_rank(void);
extern "C" KD_SIM_API unsigned kd_sim_cluster_size(void);
extern "C" KD_SIM_API void *kd_sim_map_shared_rank(const void *p, unsigned rank);

#endif /* __cplusplus */
#endif
