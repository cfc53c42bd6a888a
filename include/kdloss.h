/*
 * kdloss: fused loss kernels for knowledge distillation.
 *
 * The whole public API of the library is in this header. Everything is C11, prefixed `kdloss_`.
 *
 * Conventions (read once, they hold for every function):
 *  - The STUDENT comes first and the TEACHER second (PyTorch KLDivLoss order: input, target).
 *  - Rows are tokens (BT of them), columns are the vocabulary (V). Every matrix is row-major and
 *    carries its own leading dimension `ld` (elements between the starts of consecutive rows),
 *    so padded or sliced tensors need no copy. `ld = 0` means contiguous (ld = number of columns).
 *  - All sizes and indices are int64_t: BT x V above 2^31 elements works.
 *  - Every function returns a kdloss_status. On any error nothing is written to any output
 *    (the exceptions, all named where they apply: a communicator or CUDA failure after work
 *    began, and the OpenBLAS provider, which cannot report its own failures).
 *  - Every pointer must be aligned to its element size (2 for bf16/fp16, 4 for fp32/int32,
 *    8 for int64; float outputs 4): a misaligned one is rejected with KDLOSS_ERR_MISALIGNED.
 *    Every scale factor a kernel uses (grad_scale times the reduction or weight factors, 1/T,
 *    eps) must be representable as a finite fp32, else KDLOSS_ERR_INVALID_PARAM.
 *    The library never exits, aborts or prints; kdloss_status_string() gives a message per code.
 *  - Losses are returned in fp32 and accumulated in fp32 vectors over short tiles, then in double.
 *    Gradients are written in the dtype of the tensor they belong to.
 *  - Results are bitwise identical from run to run and do not depend on the number of threads
 *    (for the fused-linear losses: with the default GEMM provider, see kdloss_gemm_provider).
 *  - CPU functions use OpenMP over rows (OMP_NUM_THREADS controls the thread count).
 *  - Non-finite inputs (the NaN policy; docs/MATH.md 10). -inf is a valid log-prob or logit
 *    (probability 0). A NaN in any value a kept row reads (a student or teacher log-prob, logit,
 *    target, hidden state or weight entering that row's logits, a used slot's teacher log-prob),
 *    a +inf logit (softmax undefined) or a +inf log-prob is propagated, never absorbed: that
 *    row's loss (row_loss, row_soft) is NaN, so every scalar loss is NaN, and EVERY element of
 *    that row's gradient is NaN (dxs's row too; dws / dbs then hold NaN in every element, on
 *    every path, the sparse RENORM_BOTH one included). The other rows are computed as if it were
 *    clean. Exceptions, all where the value is not read: ignored rows (loss 0, gradient 0);
 *    unused top-k slots; under RENORM_BOTH the student's logits outside S and the weight rows and
 *    bias entries that form only them (without a cross-entropy gradient dxs is formed from S
 *    alone on every path: a NaN weight row outside every row's S changes nothing); a top-k row
 *    with no used slot (0); kdloss_kl_div called for the gradient alone (no loss outputs: the
 *    input is not read, the gradient -t is NaN where t is). A gradient factor of 0 (grad_scale
 *    0; for the fused losses, both parts' factors 0) writes zeros in every element, also where
 *    the unscaled gradient is infinite or NaN; a loss part whose weight is 0 and whose outputs
 *    are not asked for is not computed (what only it reads is not read). The check costs one
 *    test a row (a scaled sum of the row's inputs, or its normalizer) and no pass of its own.
 *    The CUDA entry points follow the same policy (docs/MATH.md 10).
 */
#ifndef KDLOSS_H
#define KDLOSS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(KDLOSS_BUILD_SHARED)
#define KDLOSS_API __declspec(dllexport)
#elif defined(__GNUC__)
#define KDLOSS_API __attribute__((visibility("default")))
#else
#define KDLOSS_API
#endif

#define KDLOSS_VERSION_MAJOR 0
#define KDLOSS_VERSION_MINOR 1
#define KDLOSS_VERSION_PATCH 0

/* "0.1.0" */
KDLOSS_API const char *kdloss_version(void);

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef enum kdloss_status {
    KDLOSS_OK = 0,
    KDLOSS_ERR_NULL_POINTER = -1,      /* a required pointer (params, input, output) is NULL */
    KDLOSS_ERR_INVALID_SIZE = -2,      /* a size is zero or negative, or sizes overflow int64 bytes */
    KDLOSS_ERR_INVALID_DTYPE = -3,     /* unknown dtype, or a dtype not allowed for that operand */
    KDLOSS_ERR_INVALID_REDUCTION = -4, /* unknown reduction */
    KDLOSS_ERR_INVALID_PARAM = -5,     /* a parameter is out of range (beta, eps, temperature, ...) */
    KDLOSS_ERR_INVALID_STRIDE = -6,    /* a leading dimension is negative or below the row length */
    KDLOSS_ERR_ALIASING = -7,          /* an output overlaps an input or another output */
    KDLOSS_ERR_LABEL_OUT_OF_RANGE = -8,/* a label is neither ignore_index nor in [0, V) */
    KDLOSS_ERR_SHAPE_MISMATCH = -9,    /* operands disagree (e.g. bias given without its weight) */
    KDLOSS_ERR_NO_OUTPUT = -10,        /* every output pointer is NULL: nothing to compute */
    KDLOSS_ERR_OUT_OF_MEMORY = -11,    /* the library could not allocate its working space */
    KDLOSS_ERR_WORKSPACE_TOO_SMALL = -12, /* caller's workspace is smaller than *_workspace_size() */
    KDLOSS_ERR_UNSUPPORTED = -13,      /* not available in this build or on this machine */
    KDLOSS_ERR_BLAS = -14,             /* the BLAS library reported a failure */
    KDLOSS_ERR_CUDA = -15,             /* a CUDA runtime, cuBLAS or cuBLASLt call failed */
    KDLOSS_ERR_INTERNAL = -16,         /* a bug in kdloss: please report it */
    KDLOSS_ERR_BUDGET_TOO_SMALL = -17, /* memory_budget cannot hold a one-row chunk: the minimum is
                                          what kdloss_fljsd_min_budget() returns */
    KDLOSS_ERR_MISALIGNED = -18,       /* a pointer is not aligned to its element size */
    KDLOSS_ERR_INVALID_ID = -19,       /* a sparse teacher's token id is neither -1 nor in [0, V),
                                          or repeats among one row's used slots */
    KDLOSS_ERR_COMM = -20,             /* the communicator's all-reduce reported a failure */
    KDLOSS_ERR_PEER = -21              /* another rank rejected its arguments (vocabulary-parallel
                                          calls; that rank returned the reason) */
} kdloss_status;

/* A static, human-readable message for a status code ("invalid size: ..."). Never NULL. */
KDLOSS_API const char *kdloss_status_string(kdloss_status status);
/* After a kdloss call on this thread returned an error status: which argument, and where the
 * check can tell, which row and value failed ("labels[17] = 40000 is neither ignore_index (-100)
 * nor in [0, 32768)", "teacher_weight: dtype fp16, expected fp32 or bf16 like teacher_input
 * (fp32)"); "" when the check has nothing to add to kdloss_status_string. Thread-local, valid
 * until the thread's next kdloss call; unspecified after a call that succeeded. Argument checks
 * of the CPU entry points and of the parameters shared with CUDA set it. Every entry point that
 * returns a status clears it first, so after an error it is that call's own detail or "", never
 * an earlier call's (tests/test_error_detail.c sweeps them all). */
KDLOSS_API const char *kdloss_error_detail(void);
/* The layout of public struct `type` ("kdloss_cmat", ...) as this build compiled it, for
 * bindings that mirror the structs: index 0 gives *field NULL and *size = sizeof the struct;
 * index i >= 1 its i-th field in declaration order (name, offset, size).
 * KDLOSS_ERR_INVALID_PARAM past the last field or for an unknown type. */
KDLOSS_API kdloss_status kdloss_abi_layout(const char *type, int index, const char **field,
                                           size_t *offset, size_t *size);

/* ------------------------------------------------------------------------------------------ */
/* Data types and matrix views                                                                 */
/* ------------------------------------------------------------------------------------------ */

typedef enum kdloss_dtype {
    KDLOSS_F32 = 0,  /* IEEE binary32 */
    KDLOSS_BF16 = 1, /* bfloat16 (upper half of a binary32) */
    KDLOSS_F16 = 2,  /* IEEE binary16 */
    KDLOSS_I32 = 3,  /* labels only */
    KDLOSS_I64 = 4,  /* labels only */
    KDLOSS_F64 = 5   /* IEEE binary64: the communicator's statistics only (kdloss_comm) */
} kdloss_dtype;

/* Size in bytes of one element of `dtype`, 0 for an unknown dtype. */
KDLOSS_API size_t kdloss_dtype_size(kdloss_dtype dtype);
/* "fp32", "bf16", "fp16", "int32", "int64", "fp64"; "unknown" for another value. */
KDLOSS_API const char *kdloss_dtype_name(kdloss_dtype dtype);

/* A read-only row-major matrix: element (r, c) is at data + (r * ld + c) * dtype_size.
 * Its row and column counts come from the function it is passed to. ld = 0 means contiguous. */
typedef struct kdloss_cmat {
    const void *data;
    kdloss_dtype dtype;
    int64_t ld;
} kdloss_cmat;

/* A writable row-major matrix, same layout rules as kdloss_cmat. data = NULL means "not wanted". */
typedef struct kdloss_mat {
    void *data;
    kdloss_dtype dtype;
    int64_t ld;
} kdloss_mat;

/* A vector of BT labels (token ids), KDLOSS_I64 or KDLOSS_I32. data = NULL means "no labels". */
typedef struct kdloss_labels {
    const void *data;
    kdloss_dtype dtype;
} kdloss_labels;

typedef enum kdloss_reduction {
    KDLOSS_REDUCTION_NONE = 0,     /* elementwise BT x V loss */
    KDLOSS_REDUCTION_SUM = 1,      /* sum over all elements */
    KDLOSS_REDUCTION_MEAN = 2,     /* sum / (BT * V) : the torch module's default */
    KDLOSS_REDUCTION_BATCHMEAN = 3 /* sum / BT : the mathematically correct KL per token */
} kdloss_reduction;

/* ------------------------------------------------------------------------------------------ */
/* CPU code paths                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* The CPU kernels exist as one generic source compiled per instruction set. The best path the
 * CPU supports is chosen on first use; the environment variable KDLOSS_CPU_ISA=scalar|avx2|avx512
 * forces one (an unsupported or unknown value falls back to automatic choice). */
typedef enum kdloss_cpu_isa {
    KDLOSS_ISA_AUTO = 0,
    KDLOSS_ISA_SCALAR = 1, /* portable C, libm */
    KDLOSS_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C, 8-lane exp/log (src/cpu/vmath.h) */
    KDLOSS_ISA_AVX512 = 3, /* AVX-512 F/BW/VL/DQ, 16-lane exp/log (src/cpu/vmath.h) */
    KDLOSS_ISA_COUNT       /* one past the last: the paths are [KDLOSS_ISA_SCALAR, COUNT), each
                              with a kdloss_cpu_isa_name, so a caller can list them */
} kdloss_cpu_isa;

/* 1 if this CPU (and this build) can run `isa`, else 0. KDLOSS_ISA_AUTO and SCALAR: always 1. */
KDLOSS_API int kdloss_cpu_isa_supported(kdloss_cpu_isa isa);
/* Force a path for every later call in the process (AUTO = best supported). Not thread-safe
 * against calls running at the same time. Returns KDLOSS_ERR_UNSUPPORTED if the CPU cannot run it. */
KDLOSS_API kdloss_status kdloss_cpu_set_isa(kdloss_cpu_isa isa);
/* The path the next call will use (never AUTO). */
KDLOSS_API kdloss_cpu_isa kdloss_cpu_get_isa(void);
/* "scalar", "avx2", "avx512", "auto"; "unknown" otherwise. */
KDLOSS_API const char *kdloss_cpu_isa_name(kdloss_cpu_isa isa);

/* ------------------------------------------------------------------------------------------ */
/* The GEMM layer                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Every CPU GEMM of kdloss (the fused-linear losses' logits and gradients) goes through one
 * layer with several providers. The default (AUTO) is oneDNN, whose JIT kernels are chosen from
 * the CPU's feature flags (so a CPU newer than the library still gets its AVX-512 or AVX2
 * kernel) and which reports failures as statuses. OpenBLAS is loaded on demand (dlopen of
 * libopenblas.so.0) for comparison; it is never picked automatically, because Debian 12's
 * OpenBLAS 0.3.21 runs generic SSE3 kernels on CPUs it does not know (BENCHMARKS.md has the
 * measurements). The environment variable KDLOSS_GEMM=openblas forces OpenBLAS. A build without
 * oneDNN (CMake -DKDLOSS_GEMM=builtin, or oneDNN not found) runs the same tiles on kdloss's own
 * packed GEMM instead (KDLOSS_GEMM_BUILTIN: as accurate, thread-count independent, slower).
 *
 * Determinism: with oneDNN, kdloss splits every product C = op(A) op(B) into a grid of tiles
 * of C that depends on the shape and on the number of processors the process may run on, never
 * on the thread count, and computes each tile over its whole K with one single-threaded call.
 * So every element of C is the same sequence of floating-point operations whatever
 * OMP_NUM_THREADS or torch.set_num_threads() say. OpenBLAS partitions by its own thread count. */
typedef enum kdloss_gemm_provider {
    KDLOSS_GEMM_AUTO = 0,
    KDLOSS_GEMM_ONEDNN = 1,  /* dnnl_sgemm, tiled by kdloss (the default)                        */
    KDLOSS_GEMM_OPENBLAS = 2, /* cblas_sgemm of libopenblas.so.0, one threaded call per product  */
    KDLOSS_GEMM_BUILTIN = 3  /* kdloss's own packed GEMM on the same tiles (the default of a build
                                without oneDNN, CMake -DKDLOSS_GEMM=builtin; such a build has no
                                ONEDNN provider)                                                 */
} kdloss_gemm_provider;

typedef struct kdloss_gemm_info {
    kdloss_gemm_provider provider; /* never AUTO                                                 */
    char name[16];                 /* "onednn", "openblas", "builtin"                            */
    char version[32];              /* the provider's own version string, e.g. "2.6.3"            */
    char kernel[64];               /* the kernel family it runs here: oneDNN's effective ISA
                                      ("avx512_core_bf16", ...), OpenBLAS's core ("SkylakeX")    */
    int generic;                   /* 1 if that kernel is a generic one on a CPU that has AVX2 or
                                      AVX-512 (a provider that does not know this CPU)           */
    int thread_independent;        /* 1 if results do not depend on the thread count            */
    int bf16_native;               /* 1 if bf16 x bf16 products run natively (fp32 accumulate)
                                      rather than widened to fp32 first (kdloss_gemm_set_bf16;
                                      with the provider in use)                                  */
} kdloss_gemm_info;

/* Whether `provider` can be loaded here, and what it runs. AUTO describes the provider in use.
 * KDLOSS_ERR_UNSUPPORTED if it cannot be loaded (info untouched). */
KDLOSS_API kdloss_status kdloss_gemm_query(kdloss_gemm_provider provider, kdloss_gemm_info *info);
/* Use `provider` for every later call in the process (AUTO = the default choice). Not
 * thread-safe against calls running at the same time. KDLOSS_ERR_UNSUPPORTED if it cannot load. */
KDLOSS_API kdloss_status kdloss_gemm_set_provider(kdloss_gemm_provider provider);

/* bf16 x bf16 products (the fused losses' GEMMs when the student's, or the teacher's, hidden
 * states and LM head are bf16): widened to fp32 and multiplied by sgemm, or multiplied natively
 * with fp32 accumulation (oneDNN's bf16 gemm). Both are exact products summed in fp32; they differ in
 * speed and summation order. AUTO decides by measurement, once per process, on first need:
 * native bf16 against widen + sgemm on one thread on a chunk-sized product (256 x 1024 x 1024,
 * a few ms), native chosen when at least 1.15x faster (kdloss_gemm_bf16_query tells the rates).
 * So native runs where oneDNN's bf16 kernels beat sgemm and not where they do not, nor where
 * oneDNN has none (AVX2 only); BENCHMARKS.md has what each machine measured. The choice does not depend on the thread count; a process
 * whose timing lands near the margin could choose differently from another, so force a mode for
 * bitwise reproducibility across processes and machines. Process-wide, not thread-safe against
 * running calls (the AUTO measurement itself is); KDLOSS_ERR_UNSUPPORTED if NATIVE cannot run on
 * this CPU (oneDNN has no bf16 gemm for it).
 * Out of memory: widened, native and fp32 products all keep the library's guarantee that a
 * refused allocation ends in KDLOSS_ERR_OUT_OF_MEMORY with nothing written, or in success: a
 * native tile whose gemm cannot allocate its packing buffers (it then returns before writing C)
 * is redone by kdloss's allocation-free GEMM on widened operand blocks, from scratch reserved
 * before the call writes anything (tests/fault/test_fault_inject.c, strict on both). */
typedef enum kdloss_bf16_gemm {
    KDLOSS_BF16_GEMM_AUTO = 0,
    KDLOSS_BF16_GEMM_WIDEN = 1,
    KDLOSS_BF16_GEMM_NATIVE = 2
} kdloss_bf16_gemm;
KDLOSS_API kdloss_status kdloss_gemm_set_bf16(kdloss_bf16_gemm mode);

/* The backward GEMMs of the fused-linear losses with a bf16 student (dXs = dZ Ws, dWs = dZ^T Xs)
 * when the logits GEMMs run natively (above): AUTO rounds dZ to bf16 (nearest even, relative
 * error <= 2^-8 an element; the bounds on dXs and dWs: docs/MATH.md section 4, "bf16 operands")
 * and multiplies natively, as torch's bf16 autograd, Liger-Kernel and kdloss's CUDA backend do;
 * EXACT keeps dZ in fp32 and multiplies fp32 on widened Ws / Xs (exact products, fp32 sums:
 * slower where native is faster, within the fp32 tolerances). Where the logits are widened,
 * both are EXACT's computation (the same bits). dbs is always summed from the fp32 dZ. CPU only
 * (the CUDA backend always rounds dZ to bf16). Process-wide, not thread-safe against running
 * calls. KDLOSS_ERR_INVALID_PARAM for another value. */
typedef enum kdloss_bf16_grad {
    KDLOSS_BF16_GRAD_AUTO = 0,
    KDLOSS_BF16_GRAD_EXACT = 1
} kdloss_bf16_grad;
KDLOSS_API kdloss_status kdloss_gemm_set_bf16_grad(kdloss_bf16_grad mode);

typedef struct kdloss_bf16_gemm_info {
    kdloss_bf16_gemm mode; /* as kdloss_gemm_set_bf16 set it (AUTO by default)                   */
    kdloss_bf16_grad grad; /* as kdloss_gemm_set_bf16_grad set it                                */
    int native;            /* 1 if bf16 x bf16 logits products run natively now (mode, or AUTO)  */
    int grad_native;       /* 1 if the backward GEMMs run natively from bf16 dZ now              */
    int auto_native;       /* AUTO's measured choice                                             */
    int available;         /* 1 if oneDNN's bf16 gemm runs on this CPU                           */
    int reference;         /* 1 if that is only a reference implementation (never chosen; 0 now) */
    int measurements;      /* times this process measured: 1 after the first query (cached)     */
    double native_gflops;  /* measured bf16 x bf16 -> fp32 gemm, one thread; 0 if not available   */
    double widen_gflops;   /* measured fp32 sgemm of the same product on widened operands         */
    double margin;         /* native chosen when native_gflops >= margin * widen_gflops (1.15)    */
    int64_t m, n, k;       /* the timed product: C (m x n) = A (m x k) B^T (B stored n x k)       */
    char kernel[64];       /* oneDNN's bf16 gemm kernel ("gemm:jit:avx512_core_bf16", ...),      
                              "none" if it has none                                               */
} kdloss_bf16_gemm_info;

/* The bf16 GEMM choice and the measurement behind it; runs the measurement (both rates, a few ms)
 * the first time, which later calls and the AUTO choice reuse. */
KDLOSS_API kdloss_status kdloss_gemm_bf16_query(kdloss_bf16_gemm_info *info);

/* The layer itself, exposed for benchmarks and floors: row-major fp32
 *   C (m x n, ldc) = alpha op(A) op(B) + beta C,  op(A) m x k, op(B) k x n,
 * trans_a / trans_b 0 or 1 (A stored k x m when transposed, B stored n x k). provider AUTO is the
 * one the losses use. beta = 0 ignores C's contents (NaN included). C overlapping A or B is
 * KDLOSS_ERR_ALIASING (nothing written). With oneDNN, the memory a tile needs beyond what oneDNN
 * can get is reserved before C is written (KDLOSS_ERR_OUT_OF_MEMORY, C untouched, if even that
 * fails); KDLOSS_ERR_BLAS or a failing OpenBLAS may leave C partly written. */
KDLOSS_API kdloss_status kdloss_gemm_f32(kdloss_gemm_provider provider, int trans_a, int trans_b,
                                         int64_t m, int64_t n, int64_t k, float alpha,
                                         const float *a, int64_t lda, const float *b, int64_t ldb,
                                         float beta, float *c, int64_t ldc);
/* The same with bf16 operands (raw bits) and an fp32 C, multiplied natively (bf16 x bf16
 * products, fp32 accumulation), alpha 1, beta 0 or 1 (else KDLOSS_ERR_INVALID_PARAM): what the
 * fused losses run when their bf16 GEMMs are native (kdloss_gemm_set_bf16), exposed for
 * benchmarks and floors. AUTO / ONEDNN: oneDNN's bf16 gemm on kdloss's thread-count independent
 * tile grid; OPENBLAS: cblas_sbgemm of libopenblas.so.0. KDLOSS_ERR_UNSUPPORTED where the
 * provider has no bf16 GEMM for this CPU (oneDNN needs AVX-512; OpenBLAS only when built with
 * bf16 support, which Debian 12's is not). Native bf16 dot products (AVX512_BF16's, and AMX's)
 * read a subnormal bf16 operand (below 2^-126 in magnitude) as 0; the widened path, and the
 * allocation-free fallback a tile takes when memory runs out, multiply it exactly. */
KDLOSS_API kdloss_status kdloss_gemm_bf16(kdloss_gemm_provider provider, int trans_a, int trans_b,
                                          int64_t m, int64_t n, int64_t k, const uint16_t *a,
                                          int64_t lda, const uint16_t *b, int64_t ldb, float beta,
                                          float *c, int64_t ldc);

/* ------------------------------------------------------------------------------------------ */
/* KL divergence: PyTorch KLDivLoss semantics                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct kdloss_kl_params {
    kdloss_reduction reduction; /* default KDLOSS_REDUCTION_MEAN (torch's default)            */
    int log_target;             /* 0: target holds probabilities; 1: target holds log-probs    */
    double eps;                 /* clamp inside log(max(t, eps)), >= 0 and at most FLT_MAX (it
                                   is used as an fp32); default 1e-10                            */
    double grad_scale;          /* upstream gradient (dL_outer/dloss), folded into the gradient;
                                   default 1. |grad_scale| must be at most FLT_MAX.              */
} kdloss_kl_params;

KDLOSS_API void kdloss_kl_params_default(kdloss_kl_params *params);

/*
 * KL(target || input), elementwise per PyTorch KLDivLoss:
 *   log_target = 0: l = t * (log(max(t, eps)) - y), and 0 where t == 0
 *   log_target = 1: l = exp(t) * (t - y),           and 0 where t == -inf
 * Shapes: input y (BT x V) student log-probs, any float dtype; target t (BT x V), any float dtype.
 * Outputs (each optional, at least one required):
 *   loss      [1] fp32: the reduced loss; must be NULL when reduction is NONE.
 *   row_loss  [BT] fp32: per-row sum of l (no reduction scale).
 *   elem_loss (BT x V) fp32, reduction NONE only: l itself.
 *   grad      (BT x V) in the input's dtype: dloss/dy = -t (or -exp(t)) times the reduction scale
 *             (1, 1/(BT*V), 1/BT; 1 for NONE) times grad_scale. It is produced in the same pass
 *             as the loss. grad.data may equal input.data (same ld): the gradient then overwrites
 *             the input in place. Any other overlap between outputs and inputs is an error.
 */
KDLOSS_API kdloss_status kdloss_kl_div(const kdloss_kl_params *params, int64_t bt, int64_t v,
                                       kdloss_cmat input, kdloss_cmat target, float *loss,
                                       float *row_loss, kdloss_mat elem_loss, kdloss_mat grad);

/* ------------------------------------------------------------------------------------------ */
/* The divergence family (docs/MATH.md section 7)                                              */
/* ------------------------------------------------------------------------------------------ */

/* Per row over the vocabulary, P = teacher distribution, Q = student distribution:
 *   FORWARD_KL       KL(P || Q)
 *   REVERSE_KL       KL(Q || P)
 *   JSD              beta KL(P || M) + (1-beta) KL(Q || M), M = beta P + (1-beta) Q
 *                    (beta = 0 is forward KL, beta = 1 reverse KL)
 *   SKEW_FORWARD_KL  KL(P || alpha P + (1-alpha) Q)   (alpha = 0: forward KL; 1: zero)
 *   SKEW_REVERSE_KL  KL(Q || alpha Q + (1-alpha) P)   (alpha = 0: reverse KL; 1: zero)
 *   TVD              1/2 sum |P - Q|                  (subgradient 0 where P = Q)
 * Mixtures are formed in log space; terms whose weight is 0 contribute 0 (0 log 0 = 0), so
 * finite log-probs, however far below exp's range, give finite losses and gradients. */
typedef enum kdloss_divergence {
    KDLOSS_DIV_FORWARD_KL = 0,
    KDLOSS_DIV_REVERSE_KL = 1,
    KDLOSS_DIV_JSD = 2,
    KDLOSS_DIV_SKEW_FORWARD_KL = 3,
    KDLOSS_DIV_SKEW_REVERSE_KL = 4,
    KDLOSS_DIV_TVD = 5,
    KDLOSS_DIV_COUNT /* the number of divergences (not one): loop to it, name each with
                        kdloss_divergence_name */
} kdloss_divergence;

/* A divergence and its parameters; every distillation function takes one. Both beta and alpha
 * are checked (in [0, 1], not NaN: KDLOSS_ERR_INVALID_PARAM) whichever divergence is chosen. */
typedef struct kdloss_div_params {
    kdloss_divergence divergence; /* default KDLOSS_DIV_FORWARD_KL                              */
    double beta;                  /* JSD mixture weight of P, default 0.5                        */
    double alpha;                 /* skew KL mixture weight, default 0.1                         */
} kdloss_div_params;

KDLOSS_API void kdloss_div_params_default(kdloss_div_params *params);
/* "forward_kl", "reverse_kl", "jsd", "skew_forward_kl", "skew_reverse_kl", "tvd"; "unknown". */
KDLOSS_API const char *kdloss_divergence_name(kdloss_divergence divergence);
/* The divergence named `name` (the strings above); KDLOSS_ERR_INVALID_PARAM if none is. */
KDLOSS_API kdloss_status kdloss_divergence_from_name(const char *name,
                                                     kdloss_divergence *divergence);

typedef struct kdloss_distill_params {
    kdloss_div_params div; /* default forward KL                                            */
    int64_t ignore_index;  /* rows whose label equals it are skipped; default -100           */
    double grad_scale;     /* upstream gradient, folded in; default 1; |grad_scale| <= FLT_MAX */
} kdloss_distill_params;

KDLOSS_API void kdloss_distill_params_default(kdloss_distill_params *params);

/*
 * A divergence of the family on log-probs, one pass that writes the gradient while it sums:
 * X = student log-probs (Q = exp X), Y = teacher log-probs (P = exp Y), per row D(P, Q).
 * Shapes: student (BT x V) any float dtype; teacher (BT x V) any float dtype;
 *         labels [BT] optional (I64 or I32): rows whose label == ignore_index count nowhere,
 *         every other label must be in [0, V).
 * Outputs (each optional, at least one required):
 *   loss     [1] fp32: sum of row divergences / n_valid (non-ignored rows; BT without labels),
 *            0 when every row is ignored.
 *   row_loss [BT] fp32: each row's divergence (0 for ignored rows), not divided by n_valid.
 *   grad     (BT x V) in the student's dtype: dloss/dX * grad_scale, each X element treated as a
 *            free variable (the caller applies the softmax's chain rule; for logits z with
 *            X = log_softmax(z / T): dz = (g - softmax(z / T) sum(g)) / T). Zero on ignored
 *            rows. grad.data may equal student.data (same ld, in place).
 * The element gradients are in docs/MATH.md section 7.
 */
KDLOSS_API kdloss_status kdloss_distill(const kdloss_distill_params *params, int64_t bt, int64_t v,
                                        kdloss_cmat student, kdloss_cmat teacher,
                                        kdloss_labels labels, float *loss, float *row_loss,
                                        kdloss_mat grad);

/* Per-row weights and the student's entropy (docs/MATH.md section 12), taken by the losses on
 * logits and the fused losses (every backend, the vocabulary-parallel calls included; the CUDA
 * backend's differences are under "CUDA backend" below):
 *   row_weights  [BT] fp32, optional input (NULL: every row weighs 1). Each weight must be finite
 *                and >= 0 (KDLOSS_ERR_INVALID_PARAM, nothing written; on CUDA, where the values
 *                are device memory, through the status word as labels are). A row of weight 0 is
 *                ignored as a row whose label is ignore_index is (it counts nowhere: not in
 *                n_valid, 0 in every row output, zero gradient). A row of weight w > 0 contributes
 *                w times its divergence (and cross-entropy) to the sums and w times its gradients;
 *                n_valid counts the rows kept (label not ignore_index, weight > 0), so weights of
 *                0 and 1 are a mask. Another normalizer (the sum of the weights, TRL's
 *                num_items_in_batch) is the caller's: scale by grad_scale, or take the row outputs.
 *                The row outputs (row_loss, row_soft, row_hard) stay unweighted.
 *   row_entropy  [BT] fp32, optional output (NULL: not wanted): the student's entropy
 *                H(Q) = -sum_v Q_v log Q_v in nats of Q = softmax(zs / T) at the call's temperature
 *                (after the logit map), from the same pass as the loss; 0 on ignored rows. It is
 *                for logging: no gradient flows from it. On the losses on logits it is a member
 *                of the params struct (an output, so that the functions' signatures stay); on the
 *                fused losses a member of kdloss_fused_linear_distill_out. Asking for it on the
 *                fused top-k loss runs the full-vocabulary path (as row_lse does). A fused call
 *                asking for nothing else (no loss part weighted or asked for) still forms the
 *                student's logits and their tempered sums for it, not the teacher's.
 * Both are checked as the other operands are: aligned to 4 bytes (KDLOSS_ERR_MISALIGNED), neither
 * may overlap another operand or output (KDLOSS_ERR_ALIASING). The defaults (NULL, NULL) are the
 * behaviour without these members (the same bits on the CPU). */

typedef struct kdloss_distill_logits_params {
    kdloss_div_params div; /* default forward KL                                            */
    double temperature;    /* T > 0, a normal finite fp32 (FLT_MIN <= T <= FLT_MAX, the rule
                              of every loss on logits), with 1/T and grad_scale / T finite
                              fp32; default 1                                                  */
    int64_t ignore_index;  /* rows whose label equals it are skipped; default -100           */
    double grad_scale;     /* upstream gradient, folded in; default 1; |grad_scale| <= FLT_MAX */
    const float *row_weights; /* [BT] per-row weights (see above); default NULL: all 1         */
    float *row_entropy;       /* [BT] output: the student's entropy (see above); default NULL   */
} kdloss_distill_logits_params;

KDLOSS_API void kdloss_distill_logits_params_default(kdloss_distill_logits_params *params);

/*
 * kdloss_distill on LOGITS, one pass: per row, Q = softmax(zs / T), P = softmax(zt / T) and
 * D(P, Q) for the chosen divergence, with the whole chain rule through the tempered softmax in
 * the same call (the fused-linear loss's row pass on the caller's logits; docs/MATH.md 4, 7).
 * Shapes: student_logits (BT x V) any float dtype; teacher_logits (BT x V) any float dtype;
 *         labels [BT] optional (I64 or I32), checked as kdloss_distill's.
 * Outputs (each optional, at least one required; params->row_entropy counts as one):
 *   loss     [1] fp32: sum of row divergences / max(1, n_valid) (n_valid = non-ignored rows; BT
 *            without labels; with row_weights, the sum of w times the divergences over the kept
 *            rows, n_valid the kept rows); 0 when every row is ignored. Other reductions (sum,
 *            per row) are the caller's, from row_loss.
 *   row_loss [BT] fp32: each row's divergence (0 for ignored rows), not divided by n_valid,
 *            unweighted.
 *   grad     (BT x V) in the student's dtype: d loss / d student_logits * grad_scale
 *            = grad_scale w / (T max(1, n_valid)) (g - Q sum(g)), g = dD/dlog Q per element,
 *            w the row's weight (1 without row_weights; the factor grad_scale w / (T n_valid)
 *            is formed in fp32: a weight that takes it past FLT_MAX makes that row non-finite).
 *            Zero on ignored rows. grad.data may equal student_logits.data (same ld, in place).
 * Errors: kdloss_distill's, and INVALID_PARAM for a temperature that is not > 0 and a finite
 * fp32 (T = 1e39 is refused), or whose 1/T or gradient factor grad_scale / T is not a finite
 * fp32, or a row weight that is not finite and >= 0 (checked after the labels, the detail
 * naming row_weights[i]); MISALIGNED for row_weights or row_entropy off a 4-byte boundary;
 * ALIASING for row_weights overlapping an output, or row_entropy overlapping an input or an
 * output; OUT_OF_MEMORY (row buffers). Every check runs before anything is written.
 * Logits of any size: a row spanning more than FLT_MAX (max - min > FLT_MAX, e.g. 3e38 and
 * -3e38) is served in a careful form (log-probs formed in double, rounded to fp32 once); only a
 * tempered log-prob beyond fp32's range ((max - z) / T > FLT_MAX, possible for T < 2) rounds to
 * -inf, as any fp32 would. The fused losses do the same for such logits from their GEMMs.
 */
KDLOSS_API kdloss_status kdloss_distill_logits(const kdloss_distill_logits_params *params,
                                               int64_t bt, int64_t v, kdloss_cmat student_logits,
                                               kdloss_cmat teacher_logits, kdloss_labels labels,
                                               float *loss, float *row_loss, kdloss_mat grad);

/* ------------------------------------------------------------------------------------------ */
/* Generalized Jensen-Shannon divergence JSD(beta)                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct kdloss_jsd_params {
    double beta;          /* in [0, 1]; 0 = forward KL(P||Q), 1 = reverse KL(Q||P); default 0.5 */
    int64_t ignore_index; /* rows whose label equals it are skipped; default -100                 */
    double grad_scale;    /* upstream gradient, folded in; default 1; |grad_scale| <= FLT_MAX     */
} kdloss_jsd_params;

KDLOSS_API void kdloss_jsd_params_default(kdloss_jsd_params *params);

/*
 * kdloss_distill with divergence JSD(beta) (a thin wrapper, kept for compatibility).
 * Per row, with X = student log-probs (Q = exp X) and Y = teacher log-probs (P = exp Y):
 *   M = beta P + (1-beta) Q,  JSD = beta KL(P||M) + (1-beta) KL(Q||M)
 *   beta = 0: KL(P||Q) = sum P (Y - X);  beta = 1: KL(Q||P) = sum Q (X - Y)
 * log M is formed in log space, so rows far below exp's range (log-probs of -1e4) stay finite.
 * Shapes: student (BT x V) any float dtype; teacher (BT x V) any float dtype;
 *         labels [BT] optional (I64 or I32): rows whose label == ignore_index count nowhere,
 *         every other label must be in [0, V).
 * Outputs (each optional, at least one required):
 *   loss     [1] fp32: sum of row JSDs / n_valid (n_valid = non-ignored rows; BT without labels);
 *            0 when every row is ignored.
 *   row_loss [BT] fp32: each row's JSD (0 for ignored rows), not divided by n_valid.
 *   grad     (BT x V) in the student's dtype: dloss/dX * grad_scale, treating log-probs as free:
 *            (1-beta) Q (X - log M); beta = 0: -P; beta = 1: Q (X - Y + 1). Zero on ignored rows.
 *            grad.data may equal student.data (same ld, in place).
 */
KDLOSS_API kdloss_status kdloss_jsd(const kdloss_jsd_params *params, int64_t bt, int64_t v,
                                    kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                                    float *loss, float *row_loss, kdloss_mat grad);

/* ------------------------------------------------------------------------------------------ */
/* Fused-linear distillation loss (student and teacher hidden states in, never full logits)   */
/* ------------------------------------------------------------------------------------------ */

typedef struct kdloss_fljsd_params {
    double beta;             /* JSD beta in [0, 1]; default 0.5                                   */
    double temperature;      /* divides both logit sets for the soft loss, > 0 and a normal
                                finite fp32 (FLT_MIN <= T <= FLT_MAX) with 1/T a finite fp32;
                                default 1 (no T^2)                                              */
    double weight_hard_loss; /* >= 0; default 0.5. 0 skips all cross-entropy work                 */
    double weight_soft_loss; /* >= 0; default 0.5                                                 */
    int64_t ignore_index;    /* default -100                                                      */
    int64_t chunk_size;      /* rows per chunk; 0 = automatic from shapes and memory_budget       */
    size_t memory_budget;    /* bytes of working space the chunk may use; 0 = 256 MiB on the CPU
                                and, in the dense kdloss_cuda_* fused losses, 1/32 of the device's
                                memory between 256 MiB and 2 GiB (the device of the context; the
                                workspace queries use the current device); the one-row minimum
                                when the shapes need more. A non-zero budget below
                                kdloss_fljsd_min_budget() is KDLOSS_ERR_BUDGET_TOO_SMALL          */
    double grad_scale;       /* upstream gradient, folded into every gradient; default 1. The
                                factors grad_scale * w_soft / T and grad_scale * w_hard must be
                                finite in fp32 (KDLOSS_ERR_INVALID_PARAM otherwise)               */
} kdloss_fljsd_params;

KDLOSS_API void kdloss_fljsd_params_default(kdloss_fljsd_params *params);

/* Outputs of the fused-linear loss; any pointer may be NULL (not wanted), at least one not NULL.
 * If dxs, dws and dbs are all NULL the call is forward-only and does no gradient work. */
typedef struct kdloss_fljsd_out {
    float *loss;      /* [1] w_hard * hard + w_soft * soft                                       */
    float *soft_loss; /* [1] soft (JSD) part, already divided by n_valid, before its weight      */
    float *hard_loss; /* [1] hard (CE) part, already divided by n_valid, before its weight       */
    kdloss_mat dxs;   /* (BT x Hs), dtype of xs                                                  */
    kdloss_mat dws;   /* (V x Hs), dtype of ws; accumulated in fp32 across chunks, cast once     */
    void *dbs;        /* [V], dtype of ws; requires a student bias                               */
} kdloss_fljsd_out;

/*
 * Chunked fused-linear JSD distillation loss (docs/MATH.md section 4); a thin wrapper over
 * kdloss_fused_linear_distill (below) with divergence JSD(beta) and no T^2 factor:
 *   zs = xs ws^T + bs, zt = xt wt^T + bt (fp32, straight from the GEMM accumulator)
 *   hard = sum over valid rows of CE(zs, label);  soft = sum of JSD(beta)(log_softmax(zs/T), log_softmax(zt/T))
 *   loss = (w_hard * hard + w_soft * soft) / max(1, n_valid)
 * Shapes: xs (BT x Hs), ws (V x Hs), bs [V] optional (dtype of ws), xt (BT x Ht), wt (V x Ht),
 *   bt [V] optional (dtype of wt), labels [BT] required (I64 or I32). xs/ws share a dtype (F32 or
 *   BF16), xt/wt share a dtype (F32 or BF16).
 * Working space: O(chunk x V) floats plus an fp32 (V x Hs) dW accumulator when ws is not fp32;
 *   kdloss_fljsd_workspace_size() tells the exact bytes. workspace = NULL lets the library
 *   allocate and free it itself (one malloc; KDLOSS_ERR_OUT_OF_MEMORY, nothing written, when it
 *   fails). kdloss_fljsd_min_budget() tells the smallest memory_budget these shapes accept (the
 *   fixed buffers plus a one-row chunk; the dWs accumulator is not counted against the budget).
 * Memory: besides that workspace, a thread's first call reserves the GEMM layer's fallback
 *   scratch (at most 2.2 MB, kept for the thread's life) before anything is written. oneDNN
 *   allocates its packing buffers inside each GEMM; when it cannot, kdloss redoes that tile with
 *   its own allocation-free GEMM in that scratch (the same accuracy, not bitwise the same), so a
 *   warm call's only failure mode under memory pressure is KDLOSS_ERR_OUT_OF_MEMORY with nothing
 *   written. The first call of a process also starts the OpenMP threads and oneDNN's JIT kernels,
 *   whose allocation failures abort the process inside those runtimes; kdloss cannot catch them
 *   (tests/README.md, test_fault_inject, has the figures: a warm-up call at start-up avoids them).
 *   Native bf16 products (where measured faster, or forced) and the OpenBLAS provider are not
 *   covered.
 */
KDLOSS_API kdloss_status kdloss_fljsd_workspace_size(const kdloss_fljsd_params *params, int64_t bt,
                                                     int64_t hs, int64_t ht, int64_t v,
                                                     kdloss_dtype student_dtype,
                                                     int want_grad, size_t *bytes);

KDLOSS_API kdloss_status kdloss_fljsd_min_budget(const kdloss_fljsd_params *params, int64_t bt,
                                                 int64_t hs, int64_t ht, int64_t v,
                                                 kdloss_dtype student_dtype, int want_grad,
                                                 size_t *bytes);

KDLOSS_API kdloss_status kdloss_fused_linear_jsd(const kdloss_fljsd_params *params, int64_t bt,
                                                 int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs,
                                                 kdloss_cmat ws, const void *bs, kdloss_cmat xt,
                                                 kdloss_cmat wt, const void *bt_bias,
                                                 kdloss_labels labels, kdloss_fljsd_out *out,
                                                 void *workspace, size_t workspace_bytes);

/* The fused-linear loss with any divergence of the family: the same computation as
 * kdloss_fused_linear_jsd (which is this function with divergence JSD, t2_scale 0), plus:
 *   t2_scale     1 multiplies the soft part (loss, soft_loss, its gradient) by T^2 (Hinton's
 *                convention, keeps soft gradients' size independent of T); 0: no factor.
 *   row outputs  per token, from the same pass (each [BT] fp32, NULL = not wanted): row_soft the
 *                row's divergence of the tempered distributions (no weight, no T^2), row_hard the
 *                row's cross-entropy of the untempered logits, row_lse the student's untempered
 *                log-sum-exp log sum_v exp(zs_v). 0 on ignored rows.
 *   loss = (w_hard * hard_sum + w_soft * soft_sum * (t2_scale ? T^2 : 1)) / max(1, n_valid)
 * The factor grad_scale * w_soft * (t2_scale ? T : 1/T) must be a finite fp32. With t2_scale, T
 * must be <= 100 (KDLOSS_ERR_INVALID_PARAM above): the divergence of the tempered distributions
 * shrinks as 1/T^2 while the fp32 log-probs it is formed from carry a rounding of ~1e-7 each, so
 * T^2 times it stays within ~1e-4 of the float64 value at T 100 (V 4096 and 32768, tests/
 * test_t2_scale.c) but not at T 1e3 and beyond. Without t2_scale any T is accepted; the
 * soft part then carries an absolute error of ~1e-7 (a relative one growing as T^2). */
/* A model's map from its LM head's output u = x W^T + b to its logits, applied inside the fused
 * losses before the temperature, as the model's own forward applies it (Cohere's logit_scale,
 * Gemma 2's final_logit_softcapping; docs/MATH.md section 4):
 *   z = softcap tanh(scale u / softcap)   (softcap > 0)
 *   z = scale u                           (softcap = 0: no cap)
 * The gradients flow through it: dz/du = scale (1 - (z / softcap)^2), or scale.
 * A zeroed map is the identity (scale 0 is read as 1), so code that filled a params struct
 * field by field before these members existed keeps its meaning. */
typedef struct kdloss_logit_map {
    double scale;   /* > 0 and a finite fp32, or 0 (read as 1); default 1                     */
    double softcap; /* 0 (none), or > 0 and a normal finite fp32 (>= FLT_MIN: a subnormal
                       cap has too few bits for the gradient factor 1 - (z/cap)^2 at
                       saturation) with 1/softcap finite; default 0                           */
} kdloss_logit_map;

typedef struct kdloss_fused_linear_distill_params {
    kdloss_div_params div;   /* default JSD, beta 0.5, alpha 0.1                                  */
    double temperature;      /* as kdloss_fljsd_params; default 1                                 */
    double weight_hard_loss; /* >= 0; default 0.5                                                 */
    double weight_soft_loss; /* >= 0; default 0.5                                                 */
    int t2_scale;            /* 0 or 1; default 0                                                 */
    int64_t ignore_index;    /* default -100                                                      */
    int64_t chunk_size;      /* as kdloss_fljsd_params; default 0 (automatic)                     */
    size_t memory_budget;    /* as kdloss_fljsd_params; default 0 (automatic, per backend)        */
    double grad_scale;       /* default 1                                                         */
    kdloss_logit_map student_map; /* the student head's logit map; default the identity        */
    kdloss_logit_map teacher_map; /* the teacher head's logit map; default the identity        */
    const float *row_weights;     /* [BT] per-row weights (see kdloss_distill_logits_params);
                                     default NULL: every row weighs 1                           */
} kdloss_fused_linear_distill_params;

KDLOSS_API void kdloss_fused_linear_distill_params_default(kdloss_fused_linear_distill_params *p);

typedef struct kdloss_fused_linear_distill_out {
    float *loss;      /* [1] the combined loss above                                             */
    float *soft_loss; /* [1] soft_sum * (t2_scale ? T^2 : 1) / max(1, n_valid), before w_soft    */
    float *hard_loss; /* [1] hard_sum / max(1, n_valid), before w_hard                           */
    kdloss_mat dxs;   /* (BT x Hs), dtype of xs                                                  */
    kdloss_mat dws;   /* (V x Hs), dtype of ws                                                   */
    void *dbs;        /* [V], dtype of ws; requires a student bias                               */
    float *row_soft;  /* [BT] per-row divergence                                                 */
    float *row_hard;  /* [BT] per-row cross-entropy                                              */
    float *row_lse;   /* [BT] per-row student log-sum-exp (untempered)                           */
    float *row_entropy; /* [BT] the student's entropy H(softmax(zs / T)), no gradient (see
                           kdloss_distill_logits_params)                                        */
} kdloss_fused_linear_distill_out;

KDLOSS_API kdloss_status kdloss_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes);

KDLOSS_API kdloss_status kdloss_fused_linear_distill_min_budget(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes);

KDLOSS_API kdloss_status kdloss_fused_linear_distill(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt, kdloss_cmat wt,
    const void *bt_bias, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes);

/* Several teachers in one call (docs/MATH.md section 13): row r of the batch is distilled from
 * teacher index[r]'s head, all heads over the same vocabulary and the same hidden size Ht (xt's
 * row r holds the hidden state that row's teacher produced). The loss, its parts, the row outputs
 * and the gradients are those of kdloss_fused_linear_distill with row r's teacher logits
 * zt_r = xt_r wt[index[r]]^T + bias[index[r]]: equal to separate single-teacher calls on each
 * teacher's rows, combined with the n_valid of the whole batch.
 *   n      the number of heads, >= 1
 *   wt     [n] the heads, each (V x Ht), all of xt's dtype; each checked as wt is
 *   bias   [n] optional ([V], dtype of the heads; an entry may be NULL), or NULL: no biases
 *   index  [BT] int32 in HOST memory (on every backend: it decides which rows share a teacher
 *          GEMM), each in [0, n) (KDLOSS_ERR_INVALID_ID otherwise, ignored rows included);
 *          must not overlap an output (KDLOSS_ERR_ALIASING)
 * Every argument is checked before anything is written, each head as the single-teacher call
 * checks wt. The teacher GEMM runs once per run of rows with the same index inside a chunk, so
 * rows grouped by teacher (one teacher per sequence, as multi-teacher data is) cost what one
 * teacher costs; alternating teachers row by row cost one small GEMM a row. The heads are widened
 * to fp32 panel by panel (never whole). The workspace is
 * kdloss_fused_linear_distill_workspace_size()'s for the same params and shapes. */
typedef struct kdloss_teacher_heads {
    int64_t n;
    const kdloss_cmat *wt;
    const void *const *bias;
    const int32_t *index;
} kdloss_teacher_heads;

KDLOSS_API kdloss_status kdloss_fused_linear_distill_multi(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt,
    const kdloss_teacher_heads *teachers, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Sparse top-k teacher (docs/MATH.md section 8)                                               */
/* ------------------------------------------------------------------------------------------ */

/* Offline distillation stores, per token, the teacher's K most likely token ids and their
 * log-probabilities. These functions compare that sparse teacher with the student's full
 * distribution Q = softmax(zs / T) over V tokens. The teacher's log-probs must be normalized over
 * the FULL vocabulary at the distillation temperature (log_softmax(teacher_logits / T), then
 * gathered); kdloss never re-tempers them.
 *
 * Per row, S = the row's used ids (slots with id != -1, in slot order), P_k = exp(lp_k):
 *   BUCKET          K+1 bins: the used ids and one tail bin. Teacher tail = 1 - sum_S P_k, formed
 *                   as -expm1(logsumexp(lp_S)) in double and floored at 2^-126 (so that
 *                   reverse-type divergences stay finite when the teacher's top-k mass rounds to
 *                   1; the floor moves a forward-type loss by < 1e-35). Student tail = sum of Q
 *                   over the ids NOT in S, summed directly in log space (never 1 - sum, so it is
 *                   exact, and > 0 whenever some id is outside S). When S holds all V ids there is
 *                   no tail bin (then this equals kdloss_distill on the dense distributions).
 *                   Every divergence of the family applies to the two (|S|+1)-bin distributions.
 *   RENORM_BOTH     both distributions renormalized over S (log-softmax over the used slots);
 *                   every divergence applies. It depends on the student only through the |S|
 *                   selected logits, so the fused loss computes them from the |S| gathered weight
 *                   rows, O(BT K H) instead of O(BT V H), when no cross-entropy or row_lse is wanted
 *                   and the student has no logit map (with one, the full-vocabulary path runs).
 *   RENORM_TEACHER  the teacher renormalized over S against the student's full-vocabulary
 *                   log-probs at S: sum_S P'_k (log P'_k - log Q_k) (the axolotl / DistillKit
 *                   convention; not a divergence between two distributions, and >= -log sum_S Q).
 *                   FORWARD_KL only: any other divergence is KDLOSS_ERR_INVALID_PARAM.
 * A row with no used slot contributes 0 (loss and gradient) and still counts as a kept row. */
typedef enum kdloss_topk_tail {
    KDLOSS_TAIL_BUCKET = 0,
    KDLOSS_TAIL_RENORM_BOTH = 1,
    KDLOSS_TAIL_RENORM_TEACHER = 2
} kdloss_topk_tail;

/* "bucket", "renorm_both", "renorm_teacher"; "unknown" otherwise. */
KDLOSS_API const char *kdloss_topk_tail_name(kdloss_topk_tail tail);
/* The tail mode named `name`; KDLOSS_ERR_INVALID_PARAM if none is. */
KDLOSS_API kdloss_status kdloss_topk_tail_from_name(const char *name, kdloss_topk_tail *tail);

/* A sparse teacher for BT rows: K slots per row.
 *   ids       (BT x K) KDLOSS_I32 or KDLOSS_I64: token ids in [0, V), -1 = unused slot. Every
 *             row is checked, ignored rows too: any other value, or an id used twice in one row,
 *             is KDLOSS_ERR_INVALID_ID (nothing written).
 *   logprobs  (BT x K) F32, BF16 or F16: the teacher's log-probs at those ids (finite or -inf;
 *             the value in an unused slot is never read). */
typedef struct kdloss_topk_teacher {
    int64_t k;
    kdloss_cmat ids;
    kdloss_cmat logprobs;
} kdloss_topk_teacher;

typedef struct kdloss_topk_distill_params {
    kdloss_div_params div; /* default forward KL                                             */
    kdloss_topk_tail tail; /* default KDLOSS_TAIL_BUCKET                                      */
    double temperature;    /* divides the student logits; > 0 and a normal finite fp32 with
                              1/T a finite fp32 (as every loss on logits); default 1           */
    int64_t ignore_index;  /* rows whose label equals it are skipped; default -100            */
    double grad_scale;     /* upstream gradient, folded in; default 1; grad_scale / T must be a
                              finite fp32                                                      */
    const float *row_weights; /* [BT] per-row weights (see kdloss_distill_logits_params)      */
    float *row_entropy;       /* [BT] output: the student's entropy over all V; default NULL   */
} kdloss_topk_distill_params;

KDLOSS_API void kdloss_topk_distill_params_default(kdloss_topk_distill_params *params);

/*
 * The sparse-teacher loss on the student's LOGITS, one pass per row (the fused loss's row pass):
 * Q = softmax(zs / T) over V, the teacher as above, per row D in the chosen tail mode.
 * Shapes: student_logits (BT x V) any float dtype; teacher: BT rows of K slots; labels [BT]
 *         optional (I64 or I32), checked as kdloss_distill's.
 * Outputs (each optional, at least one required; params->row_entropy counts as one):
 *   loss     [1] fp32: sum of row losses / max(1, n_valid) (n_valid: non-ignored rows; BT without
 *            labels; row_weights as kdloss_distill_logits').
 *   row_loss [BT] fp32: each row's loss (0 for ignored rows), not divided by n_valid.
 *   grad     (BT x V) in the student's dtype: d loss / d student_logits * grad_scale, the chain
 *            rule through the tempered softmax included (docs/MATH.md 8). Zero on ignored rows.
 *            grad.data may equal student_logits.data (same ld, in place).
 * Errors: kdloss_distill_logits's (row_weights and row_entropy included), INVALID_ID (ids),
 * INVALID_SIZE (K < 1), INVALID_PARAM (unknown tail; RENORM_TEACHER with another divergence),
 * OUT_OF_MEMORY (row buffers). Every check runs before anything is written.
 */
KDLOSS_API kdloss_status kdloss_topk_distill_logits(const kdloss_topk_distill_params *params,
                                                    int64_t bt, int64_t v,
                                                    kdloss_cmat student_logits,
                                                    kdloss_topk_teacher teacher,
                                                    kdloss_labels labels, float *loss,
                                                    float *row_loss, kdloss_mat grad);

/* The fused-linear loss against a sparse teacher: the student's logits zs = xs ws^T + bs are
 * formed chunk by chunk as in kdloss_fused_linear_distill; no teacher GEMM exists.
 *   loss = (w_hard * CE_sum + w_soft * soft_sum * (t2_scale ? T^2 : 1)) / max(1, n_valid)
 * with CE on the untempered logits and the soft part in the chosen tail mode, over rows whose
 * label is not ignore_index. labels.data = NULL keeps every row; weight_hard_loss must then be 0
 * and hard_loss / row_hard not asked for (KDLOSS_ERR_INVALID_PARAM). Outputs as
 * kdloss_fused_linear_distill's (row_soft: the row's soft loss; row_lse: the untempered
 * log-sum-exp). RENORM_BOTH without any cross-entropy or row_lse output runs the sparse path:
 * K gathered weight rows per token, no BT x V logits (workspace O(chunk K + V Hs) at most). */
typedef struct kdloss_fused_linear_topk_distill_params {
    kdloss_div_params div;   /* default forward KL                                             */
    kdloss_topk_tail tail;   /* default KDLOSS_TAIL_BUCKET                                      */
    double temperature;      /* as kdloss_fused_linear_distill_params; default 1               */
    double weight_hard_loss; /* >= 0; default 0                                                */
    double weight_soft_loss; /* >= 0; default 1                                                */
    int t2_scale;            /* 0 or 1; default 0; 1 requires T <= 100 (as the dense loss)     */
    int64_t ignore_index;    /* default -100                                                   */
    int64_t chunk_size;      /* rows per chunk; 0 = automatic; default 0                        */
    size_t memory_budget;    /* default 0: 256 MiB (the CUDA top-k path too: it does not take
                                the dense losses' device-sized default)                        */
    double grad_scale;       /* default 1                                                      */
    kdloss_logit_map student_map; /* as kdloss_fused_linear_distill_params; the identity by
                                     default. The teacher's log-probs are given, already mapped */
    const float *row_weights;     /* [BT] per-row weights (see kdloss_distill_logits_params)  */
} kdloss_fused_linear_topk_distill_params;

KDLOSS_API void kdloss_fused_linear_topk_distill_params_default(
    kdloss_fused_linear_topk_distill_params *params);

/* Workspace bytes for these shapes (K slots per row); want_grad as kdloss_fljsd_workspace_size.
 * The plan depends on whether labels are given only through the params' weights, so this is
 * the size for any call with these params and shapes. */
KDLOSS_API kdloss_status kdloss_fused_linear_topk_distill_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes);

/* The smallest memory_budget these shapes accept (as kdloss_fljsd_min_budget). */
KDLOSS_API kdloss_status kdloss_fused_linear_topk_distill_min_budget(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes);

/* Shapes: xs (BT x Hs), ws (V x Hs), bs [V] optional (dtype of ws), teacher (BT rows of K),
 * labels [BT] optional. xs/ws F32 or BF16 (the same). */
KDLOSS_API kdloss_status kdloss_fused_linear_topk_distill(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_topk_teacher teacher,
    kdloss_labels labels, kdloss_fused_linear_distill_out *out, void *workspace,
    size_t workspace_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Vocabulary-parallel fused losses (docs/MATH.md section 9)                                   */
/* ------------------------------------------------------------------------------------------ */

/* When the LM head is split by vocabulary rows across ranks (tensor parallelism), each rank
 * computes its block of the logits, and the loss needs a few per-token statistics of every
 * block. kdloss does not bring a transport: the caller passes its own collective library (MPI,
 * NCCL, torch.distributed) as one all-reduce callback. include/kdloss_mpi.h is a ready MPI
 * adapter; the PyTorch modules take a process_group. */
typedef enum kdloss_comm_op { KDLOSS_COMM_SUM = 0, KDLOSS_COMM_MAX = 1 } kdloss_comm_op;

typedef struct kdloss_comm {
    int rank; /* this rank, 0 .. size-1                                                        */
    int size; /* ranks sharing the LM head                                                      */
    /* All-reduce in place of n elements of `dtype` (KDLOSS_F32 or KDLOSS_F64) with `op` over
     * every rank. Every rank makes the same calls in the same order, with the same n and dtype.
     * Returns 0 on success; anything else ends the call with KDLOSS_ERR_COMM. */
    int (*allreduce)(void *ctx, void *buf, int64_t n, kdloss_dtype dtype, kdloss_comm_op op);
    void *ctx; /* passed back to allreduce                                                      */
} kdloss_comm;

/* This rank's block of the vocabulary: rows [v_begin, v_begin + v) of the LM head (v is the
 * function's argument). Blocks are contiguous in rank order and cover [0, v_total); their sizes
 * may differ. */
typedef struct kdloss_vocab_shard {
    const kdloss_comm *comm;
    int64_t v_total;
    int64_t v_begin;
} kdloss_vocab_shard;

/*
 * kdloss_fused_linear_distill with the student's and teacher's LM heads (and biases) split by
 * vocabulary: ws, bs, wt, bt_bias are this rank's blocks (v rows), xs, xt, labels replicated,
 * labels global ids in [0, v_total). Every rank gets the same loss, soft_loss, hard_loss and
 * row outputs, the full dxs (summed over ranks), and dws / dbs for its own block; the results
 * equal a single-process call on the whole head up to summation order.
 * Collectives, batched per chunk of rows, never per row: before anything is written, the
 * agreement: a MAX over 2 size + 12 doubles (every rank's block; whether its own checks passed;
 * its chunk size; BT, Hs, Ht (or K) and two fingerprints, of the setup and of the parameters, each
 * as x and -x), then a MAX over 3 doubles (each rank's verdict and the chunk it read). Then per
 * chunk an all-reduce MAX of 2 doubles a row (row maxima), a SUM of 4 (sums of exps, the label's
 * logit), a SUM of 2 (the divergence's terms and sum of its gradient), and a SUM of the chunk's
 * Hs fp32 dxs values a row: 64 bytes + 4 Hs a token (docs/MATH.md section 9). With row_entropy
 * asked for, the SUM of 4 is a SUM of 5: the 5th double of a row is the rank's sum of
 * -e^u u, u = (zs - max zs) / T, over its columns (the entropy's own sum, from the exps of the
 * first; docs/MATH.md section 12.1): 72 bytes + 4 Hs a token. Without it the protocol is the one
 * above. row_weights are replicated (every rank passes the same BT values) and add nothing to
 * the per-chunk collectives.
 * Every rank makes the agreement's two calls whatever its arguments, and what they return decides
 * every later call, so all ranks make the same calls or all return:
 *  - a rank whose own arguments are bad (or whose workspace or GEMM scratch cannot be allocated)
 *    returns that status and the others KDLOSS_ERR_PEER;
 *  - ranks that disagree on BT, Hs, Ht / K, v_total or the tiling of [0, v_total) by the blocks,
 *    the dtypes of xs and of the teacher's operands, which biases and labels are given, whether
 *    the soft part, the hard part, any gradient and dxs are computed (from the weights and the
 *    outputs asked for), whether row_entropy is asked for (it sizes the SUM above), whether
 *    row_weights are given and their values (bitwise, in row order), or n_valid (the rows kept:
 *    labels and row weights must be replicated): every rank KDLOSS_ERR_SHAPE_MISMATCH;
 *  - ranks that disagree on divergence, beta, alpha, temperature, the weights, t2_scale,
 *    ignore_index, grad_scale or the top-k tail: every rank KDLOSS_ERR_INVALID_PARAM (chunk_size
 *    and memory_budget may differ: the smallest chunk is used);
 *  - values read back that an honest MAX cannot give (a chunk outside [1, this rank's plan], not
 *    an integer or NaN; a flag other than 0 or 1; this rank's own entries changed; ranks that read
 *    different verdicts or chunks): KDLOSS_ERR_COMM on every rank.
 * Nothing is written anywhere in all these cases. A NULL shard, comm or callback
 * (KDLOSS_ERR_NULL_POINTER), a rank outside [0, size) (KDLOSS_ERR_INVALID_PARAM), or, above 64
 * ranks, an agreement buffer that cannot be allocated (KDLOSS_ERR_OUT_OF_MEMORY), returns at once:
 * that rank cannot take part, and the other ranks would then wait in the first collective. A
 * callback that fails ends the call on that rank at once (KDLOSS_ERR_COMM): a communicator must
 * fail a collective on every rank (MPI and NCCL do), or the others wait. KDLOSS_ERR_COMM (or a
 * GEMM failure) after the first chunk may leave outputs partly written. The workspace is
 * *_workspace_size() with this rank's v.
 */
KDLOSS_API kdloss_status kdloss_fused_linear_distill_vp(
    const kdloss_fused_linear_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes);

/* The sparse top-k teacher, vocabulary-parallel: the teacher's ids are global (replicated); each
 * rank handles the ids in its block, and every tail mode works. Per chunk: a MAX of 2 doubles a
 * row, a SUM of 4 + K (the rest's sums of exps, the label's logit, the K selected logits, each
 * from the rank that holds it), and the dxs SUM: 48 + 8 K + 4 Hs bytes a token. With row_entropy
 * asked for, a SUM of 5 + K: the last double of a row (after the K logits) is the rank's sum of
 * -e^u u, u = (zs - mr) / T, over its columns outside the teacher's ids (docs/MATH.md section
 * 12.1): 56 + 8 K + 4 Hs bytes a token. renorm_both runs the full-vocabulary path here (the sparse
 * path is single-process). */
KDLOSS_API kdloss_status kdloss_fused_linear_topk_distill_vp(
    const kdloss_fused_linear_topk_distill_params *params, const kdloss_vocab_shard *shard,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes);

/* ------------------------------------------------------------------------------------------ */
/* CUDA backend (declared always; returns KDLOSS_ERR_UNSUPPORTED when built without CUDA)     */
/* ------------------------------------------------------------------------------------------ */

/* Owns the cuBLAS/cuBLASLt handles for one device (and 64 KiB of device memory for the
 * vocabulary-parallel calls' agreement). Create once per device, reuse for every call. */
typedef struct kdloss_cuda_context kdloss_cuda_context;

KDLOSS_API int kdloss_cuda_available(void); /* 1 if built with CUDA and a device is visible */
KDLOSS_API kdloss_status kdloss_cuda_context_create(int device, kdloss_cuda_context **ctx);
KDLOSS_API void kdloss_cuda_context_destroy(kdloss_cuda_context *ctx);

/* Same semantics and argument rules as the CPU functions; all pointers are device pointers,
 * `stream` is a cudaStream_t (NULL = legacy default stream). The scalar outputs are written on the
 * device: no host synchronization happens inside. Workspace is caller-provided device memory of
 * at least *_workspace_size() bytes (these functions never allocate); it must be 16-byte aligned
 * (KDLOSS_ERR_INVALID_PARAM otherwise; cudaMalloc gives 256) and must not overlap any operand.
 * Every argument is checked on the host before the first launch, with the CPU's codes; a
 * KDLOSS_ERR_CUDA or _OUT_OF_MEMORY returned after launches began may leave outputs partly written.
 * A context serves one host thread at a time (its cuBLAS handle takes the call's stream).
 *
 * Labels on the GPU: their values are device memory, so an out-of-range label cannot be rejected
 * before anything is written without a host synchronization. Instead the call returns KDLOSS_OK,
 * and the device writes a status word: the first 4 bytes of the workspace hold, once the stream
 * has reached the end of the call, an int32 kdloss_status: KDLOSS_OK, or
 * KDLOSS_ERR_LABEL_OUT_OF_RANGE when some label is neither ignore_index nor in [0, V). In that
 * case every scalar loss output is NaN, the offending rows have NaN row_loss and zero gradient,
 * and the other rows are computed as if those rows were ignored. Read the word with
 * cudaMemcpyAsync + a stream synchronization when you need it (it stays valid until the workspace
 * is reused). Calls without labels write KDLOSS_OK there too.
 *
 * Per-row weights and the entropy (row_weights, row_entropy; docs/MATH.md section 12):
 * kdloss_cuda_distill_logits, kdloss_cuda_topk_distill_logits, kdloss_cuda_fused_linear_distill
 * and kdloss_cuda_fused_linear_topk_distill take both, with the CPU's semantics (a dense fused
 * call asking for row_entropy runs its row pass without the sm_90 single-read form; a top-k one
 * runs the full-vocabulary path, as on the CPU). The weights are device memory, so their values
 * are checked on the device, as labels are: a weight that is not finite and >= 0 makes the
 * status word KDLOSS_ERR_INVALID_PARAM, every scalar loss NaN, that row's row outputs
 * (row_entropy included) NaN and its gradient zero, the other rows computed as if it were
 * ignored. With several faults the word holds the code of the CPU function's first failing
 * check: on the losses on logits labels, then weights, then (top-k) ids; on the fused top-k
 * loss ids, then labels, then weights.
 * The two _vp forms take row_weights and read them to the host before the agreement (a copy on
 * `stream` and its synchronization, so a call with weights synchronizes twice): there they are
 * checked as the CPU checks them (KDLOSS_ERR_INVALID_PARAM naming the row, this rank's fault in
 * the agreement, nothing written) and their values join the agreement's fingerprint (ranks
 * whose weights differ: KDLOSS_ERR_SHAPE_MISMATCH). They take row_entropy too (one more double
 * a row in phase 2's SUM, as the protocol below says; their workspace holds it whether or not it
 * is asked for, so the size queries do not depend on the outputs). */
KDLOSS_API kdloss_status kdloss_cuda_kl_div_workspace_size(int64_t bt, int64_t v, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_kl_div(kdloss_cuda_context *ctx, void *stream,
                                            const kdloss_kl_params *params, int64_t bt, int64_t v,
                                            kdloss_cmat input, kdloss_cmat target, float *loss,
                                            float *row_loss, kdloss_mat elem_loss, kdloss_mat grad,
                                            void *workspace, size_t workspace_bytes);
KDLOSS_API kdloss_status kdloss_cuda_jsd_workspace_size(int64_t bt, int64_t v, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_jsd(kdloss_cuda_context *ctx, void *stream,
                                         const kdloss_jsd_params *params, int64_t bt, int64_t v,
                                         kdloss_cmat student, kdloss_cmat teacher,
                                         kdloss_labels labels, float *loss, float *row_loss,
                                         kdloss_mat grad, void *workspace, size_t workspace_bytes);
KDLOSS_API kdloss_status kdloss_cuda_fljsd_workspace_size(const kdloss_fljsd_params *params,
                                                          int64_t bt, int64_t hs, int64_t ht,
                                                          int64_t v, kdloss_dtype student_dtype,
                                                          int want_grad, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_jsd(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fljsd_params *params, int64_t bt,
    int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fljsd_out *out, void *workspace, size_t workspace_bytes);

/* The divergence family on the GPU: the same semantics as kdloss_distill and
 * kdloss_fused_linear_distill (kdloss_cuda_jsd and kdloss_cuda_fused_linear_jsd are wrappers),
 * the same element definitions (src/common/div_elem.h). */
KDLOSS_API kdloss_status kdloss_cuda_distill_workspace_size(int64_t bt, int64_t v, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_distill(kdloss_cuda_context *ctx, void *stream,
                                             const kdloss_distill_params *params, int64_t bt,
                                             int64_t v, kdloss_cmat student, kdloss_cmat teacher,
                                             kdloss_labels labels, float *loss, float *row_loss,
                                             kdloss_mat grad, void *workspace,
                                             size_t workspace_bytes);
/* kdloss_distill_logits on the GPU: the same semantics, checks and codes (labels' values through
 * the status word, as above), the same element definitions. One block per row, three passes over
 * the row's logits (log-sum-exps; divergence and sum(g); gradient), no copy of the row: any V
 * (rows of 256k logits included), any row count. grad.data may equal student_logits.data (same
 * ld, in place). */
KDLOSS_API kdloss_status kdloss_cuda_distill_logits_workspace_size(int64_t bt, int64_t v,
                                                                   size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_distill_logits(
    kdloss_cuda_context *ctx, void *stream, const kdloss_distill_logits_params *params,
    int64_t bt, int64_t v, kdloss_cmat student_logits, kdloss_cmat teacher_logits,
    kdloss_labels labels, float *loss, float *row_loss, kdloss_mat grad, void *workspace,
    size_t workspace_bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_distill_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes);
/* kdloss_fused_linear_distill_multi on the GPU: the same semantics and checks (every head as wt
 * is checked, then the heads' own), kdloss_cuda_fused_linear_distill's conventions. The heads
 * (teachers->wt[j].data) and their biases are device memory; teachers->index is HOST memory, as
 * on the CPU (it decides which rows share a teacher GEMM, so it is read before the first launch:
 * an index outside [0, n) is KDLOSS_ERR_INVALID_ID with nothing written). Per chunk, one teacher
 * GEMM per run of rows with the same index, then that run's bias and the teacher's logit map in
 * one pass over its logits. The workspace: kdloss_cuda_fused_linear_distill_workspace_size()'s.
 * With several faults the status can differ from the CPU function's: the CPU plans the call and
 * checks the aliasing and the workspace with each head, before the next head and the heads' own
 * checks (n, index); this function does so once every head and the heads' own checks passed. A
 * call with a fault of the plan, the aliasing or the workspace and also one in a later head or
 * the heads' own arguments gets the former's code on the CPU, the latter's here. */
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_distill_multi(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_cmat xt, const kdloss_teacher_heads *teachers, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes);

/* The sparse top-k teacher on the GPU: the same semantics as kdloss_topk_distill_logits and
 * kdloss_fused_linear_topk_distill, from the same row definitions (src/common/topk_row.h). The
 * teacher's ids are device memory: like labels, an invalid id (or a repeated one) is reported
 * through the workspace's status word (KDLOSS_ERR_INVALID_ID; scalar losses NaN, the row's loss
 * NaN and its gradient zero, ignored rows' ids checked too) instead of before the first launch;
 * the other rows are computed as if that row were ignored. With invalid ids and an out-of-range
 * label both present the word holds the CPU function's code for that call (the fused loss:
 * KDLOSS_ERR_INVALID_ID; the logits loss: KDLOSS_ERR_LABEL_OUT_OF_RANGE). The fused loss's
 * sparse renorm_both path needs BT K < 2^31 (above, the full-vocabulary path runs: same results).
 * The workspace size query of the fused loss covers both paths. */
KDLOSS_API kdloss_status kdloss_cuda_topk_distill_logits_workspace_size(int64_t bt, int64_t v,
                                                                       int64_t k, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_topk_distill_logits(
    kdloss_cuda_context *ctx, void *stream, const kdloss_topk_distill_params *params, int64_t bt,
    int64_t v, kdloss_cmat student_logits, kdloss_topk_teacher teacher, kdloss_labels labels,
    float *loss, float *row_loss, kdloss_mat grad, void *workspace, size_t workspace_bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_topk_distill_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_topk_distill(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws, const void *bs,
    kdloss_topk_teacher teacher, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes);

/* The vocabulary-parallel fused losses on the GPU: the contract of kdloss_fused_linear_distill_vp
 * and kdloss_fused_linear_topk_distill_vp (shards, replicated inputs with global ids, the same
 * collectives in the same order and sizes, the agreement before anything is written, its error
 * codes) with the CUDA conventions above (ctx, stream, device pointers, the caller's workspace of
 * *_vp_workspace_size() bytes for this rank's v, labels and ids checked on the device against
 * v_total and reported through the status word).
 * The communicator: every allreduce gets a DEVICE pointer (F64 statistics, F32 dxs), and must
 * reduce it in stream order on `stream`: the kernels that produced the buffer are queued before
 * the callback, the ones that read the result after it, without a host synchronization in
 * between (include/kdloss_nccl.h enqueues ncclAllReduce on the stream it was given, which must be
 * this call's). A callback may also synchronize the stream and reduce on the host (slower).
 * The agreement is a host decision: its buffer (in memory the context owns) is copied to the
 * device, reduced by the callback, copied back, and the stream synchronized: one host
 * synchronization a call, before the first kernel. A workspace that is NULL, misaligned, too small
 * or overlapping is this rank's own fault there (its code, KDLOSS_ERR_PEER on the others, nothing
 * written), like any other argument. A NULL ctx (KDLOSS_ERR_NULL_POINTER), a
 * communicator of more than 4096 ranks (KDLOSS_ERR_UNSUPPORTED), or a CUDA failure on the way to
 * the agreement (KDLOSS_ERR_CUDA) returns at once, like a NULL comm: that rank cannot take part,
 * and the others wait in the agreement. Never run on a GPU yet (docs/MATH.md section 9). */
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_distill_vp_workspace_size(
    const kdloss_fused_linear_distill_params *params, int64_t bt, int64_t hs, int64_t ht,
    int64_t v, kdloss_dtype student_dtype, int want_grad, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t ht, int64_t v,
    kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_cmat xt, kdloss_cmat wt,
    const void *bt_bias, kdloss_labels labels, kdloss_fused_linear_distill_out *out,
    void *workspace, size_t workspace_bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    int64_t k, kdloss_dtype student_dtype, int want_grad, size_t *bytes);
KDLOSS_API kdloss_status kdloss_cuda_fused_linear_topk_distill_vp(
    kdloss_cuda_context *ctx, void *stream, const kdloss_fused_linear_topk_distill_params *params,
    const kdloss_vocab_shard *shard, int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs,
    kdloss_cmat ws, const void *bs, kdloss_topk_teacher teacher, kdloss_labels labels,
    kdloss_fused_linear_distill_out *out, void *workspace, size_t workspace_bytes);

#ifdef __cplusplus
}
#endif

#endif /* KDLOSS_H */
