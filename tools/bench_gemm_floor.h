/* The GEMM floor of the fused-linear distillation loss (docs/MATH.md section 6): the time of
 * its four GEMMs at full size in the same BLAS the library uses, fp32 sgemm on fp32 copies. */
#ifndef KB_GEMM_FLOOR_H
#define KB_GEMM_FLOOR_H

#include <stdint.h>

#include "kdloss.h"

enum { KB_GEMM_ZS = 0, KB_GEMM_ZT, KB_GEMM_DXS, KB_GEMM_DWS, KB_GEMM_COUNT };

/* "student logits", "teacher logits", "dXs", "dWs" */
const char *kb_gemm_name(int which);

/*
 * A GEMM-floor timer running in a forked child process, for xs (bt x hs), ws (v x hs),
 * xt (bt x ht), wt (v x ht) of dtype dt (F32 or BF16). Each round times, once each,
 *   zs = xs ws^T (bt x v), zt = xt wt^T (bt x v), dxs = zs ws (bt x hs), dws = zs^T xs (v x hs)
 * in fp32 sgemm on fp32 copies. Rounds run when the parent asks, so the benchmark can
 * alternate them with its own timed calls: on a shared machine both then see the same load.
 * Being another process, the child's buffers (two full bt x v fp32 matrices and the fp32 copies
 * of bf16 inputs) never count in the benchmark's peak RSS. The child uses no OpenMP (a forked
 * child must not touch the parent's OpenMP thread pool) and waits blocked on a pipe, using no
 * CPU, between rounds.
 */
typedef struct kb_floor {
    int pid;              /* the child, 0 when not running */
    int to_child, from_child;
} kb_floor;

/* Forks the child, which builds its buffers and runs one untimed round (none when a round is
 * over a TFLOP). Returns 0, or -1 after printing why (fork failure, the child out of memory). */
int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_dtype dt,
                   const void *xs, const void *ws, const void *xt, const void *wt);
/* One timed round: ns[i] = time of GEMM i. Returns 0, or -1 after printing why. */
int kb_floor_round(kb_floor *f, double ns[KB_GEMM_COUNT]);
/* Ends the child. */
void kb_floor_stop(kb_floor *f);

#endif
