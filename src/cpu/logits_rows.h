/* The dense-teacher row kernel of kdloss_distill_logits on vectors (AVX2, AVX-512; the scalar
 * path runs the fused loss's row phases, fld_row_phases.h). */
#ifndef KDLOSS_LOGITS_ROWS_H
#define KDLOSS_LOGITS_ROWS_H

/* Per row, on fp32 logits held in cache between passes (docs/MATH.md section 7):
 *   1-2. one read of each row: per tile of KD_FLD_TILE columns its max, its exps at that max
 *      (stored: es, et) and their sum; then the row maxima ms, mt, the sums Ss, St and a scale
 *      per tile, so that es times its tile's scale is exp((zs - ms) / T) / Ss;
 *   3. X = (zs - ms) / T - log Ss, Y = (zt - mt) / T - log St, Q and P from es and et, the
 *      divergence's terms and g = dD/dX (div_elem.h's KDE_PQ form: P and Q are not exp'd
 *      again), g stored over et, and sum g;
 *   4. dz = gs (g - Q sum g) (forward KL: passes 3 and 4 in one, its sum g being -1).
 * When asked (ent), the student's entropy -sum Q X is one more sum in pass 3 (forward KL: in
 * its fused last pass), from the X and Q the divergence already has (docs/MATH.md section 12).
 * Two exps an element where the log-prob form of the same passes takes four (forward KL) to
 * five (JSD). Sums run in fp32 over tiles of KD_FLD_TILE columns, then in double, so their
 * order depends on V alone. Logits narrower than fp32 are widened by pass 1 into scratch rows
 * (the rest reads those); a narrower gradient is written in its dtype.
 * A thread runs its rows as a pipeline of steps: pass 3 of one row, then its pass 4 and pass 1
 * of the next row tile by tile (column by column on AVX-512, and on AVX2 at T = 1), so that the
 * gradient's writes and the next rows' reads share the memory system; a row's result does not
 * depend on its neighbours. T = 1 has its own instantiation without the multiplies by 1/T (the
 * same bits). */

#include <stdint.h>

#include "div_coef.h"
#include "isa.h"

typedef struct kd_lrow {
    const char *xs, *xt;  /* [v] the row's student and teacher logits as given */
    kdloss_dtype xdt, tdt; /* their dtypes (the gradient's is xdt) */
    int64_t xes, tes;     /* their bytes per column */
    const float *zs, *zt; /* [v] their fp32 view: xs, xt themselves when fp32, else scratch
                             rows (64-byte aligned) that pass 1 widens them into */
    float *es, *et;       /* [v] scratch each, 64-byte aligned: exps, then g over et */
    void *dz;             /* [v] out (dtype xdt), or NULL (no gradient); may be xs */
    int64_t v;
    kd_div_coef coef;     /* the divergence's element operation and constants */
    float inv_t;          /* 1 / T, rounded to fp32 */
    float gs;             /* grad_scale / (T n_valid) */
    int nt;               /* write dz with streaming stores (fp32 output, 64-byte aligned) */
    int64_t pf_off;       /* pass 1 prefetches this many columns ahead of its reads: into the
                             row itself, then into the next row */
    const char *next_s, *next_t; /* the next row's student and teacher, or NULL */
    double *tiles;        /* [4 ntiles] scratch: per tile of KD_FLD_TILE columns, the student's
                             max and scale, then the teacher's */
    int64_t ntiles;       /* ceil(v / KD_FLD_TILE) */
    int ent;              /* form the student's entropy in the last passes (docs/MATH.md 12) */
    double h;             /* set by the step that finishes the row when ent: H(Q) */
    float ms, mt;         /* set by pass 1: the row maxima of zs and zt */
    float lss, lst;       /* set by pass 1: log Ss, log St */
} kd_lrow;

/* One step of a thread's run of rows: the last passes of row d (returns its divergence; writes
 * d->dz when set) interleaved with pass 1 of row nx (fills its tiles and norms); either may be
 * NULL. One row alone is step(NULL, a) then step(a, NULL); a run of rows r0, r1, ... is
 * step(NULL, r0), step(r0, r1), ..., step(rn, NULL). d and nx use separate scratch.
 * One per ISA with a vector layer (isa.h; logits_rows_vec.c): the scalar path has none. */
#define KD_LOGITS_DECL(ID, name, layer, has, flags)                                             \
    KD_IF_VEC(layer, double kd_logits_step_##name(kd_lrow *d, kd_lrow *nx);)
KD_ISAS(KD_LOGITS_DECL)
#undef KD_LOGITS_DECL

#endif
