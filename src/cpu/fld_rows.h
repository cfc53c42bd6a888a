/* The row work of one chunk of the fused-linear distillation loss (docs/MATH.md section 4),
 * shared by the scalar, AVX2 and AVX-512 row kernels and the driver (fld.c).
 *
 * The driver has put the chunk's fp32 logits (straight from the GEMM, bias not yet added) in
 * zs and zt; one call does everything that needs whole rows, one row at a time, in a fixed
 * order of operations that does not depend on the thread count:
 *   1. add the bias, apply the heads' logit maps, and take the row max of zs and zt;
 *   2. sum-exp of zs/T and zt/T (and of zs itself for the cross-entropy when T != 1); with the
 *      entropy asked for, the sum of -e^u u beside that of e^u for zs/T (docs/MATH.md 12.1);
 *   3. the JSD element terms on X = log_softmax(zs/T), Y = log_softmax(zt/T), their sum, and
 *      the element gradients g = dJSD/dX (stored over zt) with sum(g); the row's entropy;
 *   4. dzs = gh (softmax(zs) - onehot(y)) + gs (g - softmax(zs/T) sum(g)), written over zs
 *      (times the softcap's factor 1 - (zs / cap)^2 per element when the student has one).
 * With a sparse teacher (topk set, zt unused) passes 2-4 run on the columns outside the teacher's
 * ids and kd_topk_row on the ids themselves (fld_row_phases.h).
 * Ignored rows (label ignore_index, or row weight 0) get zero loss terms and, when gradients
 * are wanted, a zero dzs row; a kept row's dzs is its weight times the unweighted one. */
#ifndef KDLOSS_FLD_ROWS_H
#define KDLOSS_FLD_ROWS_H

#include <stdint.h>

#include "div_coef.h"
#include "isa.h"
#include "kdloss.h"
#include "logit_map.h"

/* Row reductions run in fp32 vectors over tiles of this many columns, then in double: the
 * fp32 rounding error of a sum stays that of a 1024-term sum whatever V is. A multiple of 16,
 * so only the last tile of a row has a partial vector. */
#define KD_FLD_TILE 1024

/* A chunk with fewer elements than this runs its rows on the calling thread: waking an OpenMP
 * team (and, on a busy machine, waiting for it) costs more than the row work itself. */
#define KD_FLD_PAR_MIN (1 << 16)

typedef struct kd_fld_rows {
    int64_t n, v;          /* rows in this chunk, vocabulary size */
    int64_t row0;          /* batch index of the chunk's first row (to read labels) */
    float *zs;             /* (n x v), ld v: student logits in; dzs out when grad */
    float *zt;             /* (n x v), ld v: teacher logits in, g after; unused when !soft */
    const float *bias_s, *bias_t; /* [v] fp32 biases, or NULL */
    kdloss_labels labels;  /* checked: ignore_index or in [0, v); data NULL: every row kept
                              (then hard must be 0) */
    int64_t ignore_index;
    kd_div_coef coef;      /* the divergence's element operation and constants */
    kd_logit_map map_s, map_t; /* the heads' logit maps, applied in pass 1 (logit_map.h); the
                              student's scale is folded into gs and gh */
    float inv_t;           /* 1 / temperature */
    double inv_t64;        /* inv_t as a double (kd_topk_row's argument; exact, topk_row.h) */
    int soft;              /* compute the JSD terms (needs zt) */
    int hard;              /* compute the cross-entropy terms */
    int grad;              /* write dzs over zs */
    float gs;              /* soft gradient factor grad_scale * w_soft / (n_valid T); 0 = none */
    float gh;              /* hard gradient factor grad_scale * w_hard / n_valid; 0 = none */
    double *row_soft;      /* [n] out: each row's JSD (0 for ignored rows) */
    double *row_hard;      /* [n] out: each row's cross-entropy (0 for ignored rows) */
    float *row_lse;        /* [n] out or NULL: each row's student log-sum-exp (0 when ignored) */
    /* a sparse teacher instead of zt (docs/MATH.md section 8; fld_row_phases.h) */
    const kdloss_topk_teacher *topk; /* ids and log-probs with effective lds, or NULL (dense) */
    int tail;              /* KD_TAIL_* of topk_row.h */
    char *tk;              /* n x kd_topk_row_scratch(K) bytes of per-row scratch */
    /* the phases' statistics (fld_row_phases.h) and the vocabulary-parallel column offset */
    int64_t v_lo;          /* global id of local column 0 (0 unless vocabulary-parallel) */
    double *stat_max;        /* [2 n] */
    double *stat_sum;        /* [n_sum n] */
    double *stat_div;        /* [2 n] */
    int64_t n_sum;         /* kd_fld_n_sum(): 4, + K with a sparse teacher, + 1 with ent */
    /* per-row weights and the student's entropy (docs/MATH.md section 12) */
    const float *w;        /* [BT] row weights by batch index (row0 + i), or NULL: all 1. A
                              row of weight 0 is ignored; gs and gh scale by a kept row's w */
    int ent;               /* form the entropy: its sum joins stat_sum at kd_fld_ent_at() */
    float *row_ent;        /* [n] out or NULL: each row's entropy H(softmax(zs/T)) (0 ignored) */
} kd_fld_rows;

/* Where the entropy's sum sits in a row's stat_sum (after the K gathered logits). */
static inline int64_t kd_fld_ent_at(int64_t topk_k) { return 4 + topk_k; }

/* Doubles per row of the phases' statistics: stat_max 2, stat_sum kd_fld_n_sum(K) (+ 1, the
 * entropy's sum, when it is asked for), stat_div 2. The workspace always has room for the
 * entropy's double (8 bytes a row), so that its size does not depend on the outputs. */
static inline int64_t kd_fld_n_sum(int64_t topk_k) { return 4 + topk_k; }
static inline int64_t kd_fld_n_stats(int64_t topk_k) { return 5 + kd_fld_n_sum(topk_k); }

/* Per ISA of the registry (isa.h; fld_rows_scalar.c, fld_rows_vec.c):
 * kd_fld_rows_phase_<isa>: one phase (1..4, fld_row_phases.h) over every row of the chunk,
 * OpenMP over rows (the vocabulary-parallel driver reduces the statistics between phases);
 * kd_fld_rows_<isa>: the row work of one chunk, OpenMP over rows. Never calls BLAS. */
#define KD_FLD_ROWS_DECL(ID, name, layer, has, flags)                                           \
    void kd_fld_rows_phase_##name(const kd_fld_rows *a, int phase);                            \
    void kd_fld_rows_##name(const kd_fld_rows *a);
KD_ISAS(KD_FLD_ROWS_DECL)
#undef KD_FLD_ROWS_DECL

#endif /* KDLOSS_FLD_ROWS_H */
