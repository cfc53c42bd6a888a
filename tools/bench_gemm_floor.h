/* The GEMM floor of the fused-linear distillation loss (docs/MATH.md section 6): the time of
 * its four GEMMs at full size, fp32 on fp32 operands, through each GEMM provider kdloss loads. */
#ifndef KB_GEMM_FLOOR_H
#define KB_GEMM_FLOOR_H

#include <stdint.h>

#include "kdloss.h"

enum { KB_GEMM_ZS = 0, KB_GEMM_ZT, KB_GEMM_DXS, KB_GEMM_DWS, KB_GEMM_COUNT };

/* "student logits", "teacher logits", "dXs", "dWs" */
const char *kb_gemm_name(int which);

/*
 * A GEMM-floor timer running in a child process (fork + exec of this same program with the
 * hidden command `__gemm-floor`, so the child starts with fresh OpenMP and BLAS thread pools
 * whatever the parent has run). It builds its own fp32 operands xs (bt x hs), ws (v x hs),
 * xt (bt x ht), wt (v x ht) with the benchmark's value ranges; each round times, once each,
 *   zs = xs ws^T (bt x v), zt = xt wt^T (bt x v), dxs = zs ws (bt x hs), dws = zs^T xs (v x hs)
 * through kdloss_gemm_f32 with the provider the parent names. Rounds run when the parent asks,
 * so the benchmark can alternate them with its own timed calls (both then see the same load);
 * the child's buffers (two full bt x v fp32 matrices) never count in the parent's peak RSS, and
 * it waits blocked on a pipe, using no CPU, between rounds.
 */
typedef struct kb_floor {
    int pid; /* the child, 0 when not running */
    int to_child, from_child;
} kb_floor;

/* Starts the child and waits until its buffers are ready. Returns 0, or -1 after printing why. */
int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v);
/* One timed round with `provider`: ns[i] = time of GEMM i. Returns 0; 1 when the provider
 * failed or cannot load in the child; -1 after printing why when the child stopped answering. */
int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, double ns[KB_GEMM_COUNT]);
/* Ends the child. */
void kb_floor_stop(kb_floor *f);
/* The child's side: `kdloss __gemm-floor IN_FD OUT_FD BT HS HT V`. Returns an exit status. */
int kb_floor_child_main(int argc, char **argv);

#endif
