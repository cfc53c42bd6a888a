/* The GEMM layer's allocation-free fallback (gemm.c): a packed, cache-blocked fp32 product that
 * takes every byte it needs from a scratch the caller hands it, so it cannot fail. gemm.c runs it
 * on a tile whose oneDNN call ran out of memory (dnnl_sgemm allocates its packing buffers inside
 * every call, and returns dnnl_out_of_memory with C untouched when that fails), from the scratch
 * kd_gemm_prepare reserved before the loss call wrote anything. */
#ifndef KD_GEMM_FB_H
#define KD_GEMM_FB_H

/* One source per instruction set (gemm_fb_vec.c, and gemm_fb_scalar.c), like the row kernels.
 * Blocking (Goto / BLIS): for each block of KD_FB_MC rows of op(A) and each block of KD_FB_KC of
 * the inner dimension, the A block is packed into MR-row panels; for each block of KD_FB_NC
 * columns of op(B) the B block is packed into NR-column panels; an MR x NR register tile of C is
 * accumulated over the K block by fused multiply-adds in k order and then stored as
 * C = alpha * acc + beta * C (the first K block) or C = alpha * acc + C (the later ones). Blocks
 * have balanced sizes, the K blocks depending on k only, so every element of C gets the same
 * sequence of roundings wherever it lies in a tile: the result depends neither on the thread
 * count nor on the tile grid. It is not bitwise the same as oneDNN's result (another summation
 * order), only as accurate. */

#include <stddef.h>
#include <stdint.h>

#include "gemm.h"
#include "isa.h"

/* rows of op(A) per packed block: a multiple of every MR (12, 6 and 4) */
#define KD_FB_MC 1020
/* the inner-dimension block: an MR-row panel of it (12 KiB at MR 12) stays in L1 */
#define KD_FB_KC 256
/* columns of op(B) per packed block: a multiple of every NR (32, 16 and 8); 1 MiB, in L2 */
#define KD_FB_NC 1024

/* Floats of scratch an m x n x k product needs (the scratch 64-byte aligned); monotone in each
 * dimension, so the largest shape of a set bounds every smaller one. */
static inline size_t kd_gemm_fb_floats(int64_t m, int64_t n, int64_t k) {
    size_t mc = (size_t)(m < KD_FB_MC ? m : KD_FB_MC), nc = (size_t)(n < KD_FB_NC ? n : KD_FB_NC);
    size_t kc = (size_t)(k < KD_FB_KC ? k : KD_FB_KC);
    /* panels round up to MR / NR (< 32), and packing may store 16 floats past the last one */
    size_t a = ((mc + 32) * kc + 32 + 15) / 16 * 16;
    return a + (nc + 32) * kc + 32;
}

/* C = alpha op(A) op(B) + beta C for g (m, n, k > 0) with the scratch above; beta = 0 never
 * reads C. One per ISA of the registry (isa.h); dispatch.c tables them (kd_cpu_kernels). */
#define KD_GEMM_FB_DECL(ID, name, layer, has, flags)                                            \
    void kd_gemm_fb_##name(const kd_gemm *g, float *scratch);
KD_ISAS(KD_GEMM_FB_DECL)
#undef KD_GEMM_FB_DECL

#endif
