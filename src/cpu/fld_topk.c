/* The fused top-k operation on the CPU (kdloss.h, kdloss_fused_linear_topk_distill; docs/MATH.md
 * section 8): its entry point, and its sparse renorm_both path (topk.h), which needs no GEMM and
 * no V-wide row: the rows' K selected logits by dot products, the slot gradients scattered into
 * dws and dbs in row order. Every other top-k call runs the chunked full-vocabulary loop of
 * fld.c with the top-k teacher form. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_rows.h"
#include "dispatch.h"
#include "fld.h"
#include "fld_phase.h"
#include "topk.h"

/* Whether a checked fused call can take the sparse path: renorm_both, and nothing that needs
 * the full logits (no cross-entropy weight or output, no row_lse, no row_entropy: the entropy is
 * over all V) and no student logit map (the sparse rows take the gathered logits as they are). */
static int sparse_eligible(const kd_fld_call *k) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    return k->topk.k > 0 && k->tail == KDLOSS_TAIL_RENORM_BOTH && !(k->p.weight_hard_loss > 0.0) &&
           !o->hard_loss && !o->row_hard && !o->row_lse && !o->row_entropy &&
           !kd_logit_map_make(k->p.student_map).on;
}

/* The sparse path's workspace, carved from `base` with the chunk of the full plan: every region
 * is at most its counterpart in the full plan (tk, xs32, xconv, rows, dbs, dws, bias), so the
 * full plan's bytes bound it. Returns the bytes used. */
static size_t sparse_layout(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                            kd_topk_sparse *a) {
    int sb = k->xs.dtype == KDLOSS_BF16;
    size_t c = (size_t)pl->chunk, hs = (size_t)k->hs, v = (size_t)k->v, end = 0;
    size_t sz[7] = {c * kd_topk_row_scratch(k->topk.k), sb ? c * hs * 4 : 0,
                    sb && k->out.dxs.data ? c * hs * 4 : 0, c * sizeof(double),
                    k->out.dbs ? v * 4 : 0, sb && k->out.dws.data ? v * hs * 4 : 0,
                    k->bs && sb ? v * 4 : 0};
    char *r[7];
    for (int i = 0; i < 7; i++) {
        r[i] = base ? base + end : NULL;
        end += (sz[i] + KD_FLD_ALIGN - 1) / KD_FLD_ALIGN * KD_FLD_ALIGN;
    }
    if (!base) return end + KD_FLD_ALIGN - 1;
    a->tk = r[0];
    a->x32 = sb ? (float *)r[1] : NULL;
    a->d32 = (float *)r[2];
    a->row_soft = (double *)r[3];
    a->dbs = k->out.dbs ? (float *)r[4] : NULL;
    a->dws = !k->out.dws.data ? NULL : sb ? (float *)r[5] : (float *)k->out.dws.data;
    a->ldd = sb ? k->hs : k->out.dws.ld;
    a->bs = kd_fld_bias_f32(k->bs, k->ws.dtype, k->v, (float *)r[6]);
    return end;
}

/* The sparse path's dws and dbs after the last chunk: NaN everywhere when a row was poisoned
 * (the NaN policy, kdloss.h: a poisoned row's gradient is NaN in every element, outside S too,
 * as the full-vocabulary path's dz row; one fill a call, only then), then cast or stored. */
static void sparse_store_grads(const kd_fld_call *k, const kd_topk_sparse *a, int nan_row) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    if (nan_row) {
        if (a->dws)
            for (int64_t c = 0; c < k->v; c++)
                for (int64_t h = 0; h < k->hs; h++) a->dws[c * a->ldd + h] = NAN;
        if (a->dbs)
            for (int64_t c = 0; c < k->v; c++) a->dbs[c] = NAN;
    }
    if (a->dws && k->xs.dtype == KDLOSS_BF16)
        kd_f32_rows_to_bf16(a->dws, k->hs, k->v, k->hs, (uint16_t *)o->dws.data, o->dws.ld, 1);
    if (a->dbs) kd_fld_store_vec(a->dbs, k->v, k->ws.dtype, o->dbs);
}

/* dws and dbs accumulate over rows: they start from zero (the caller's fp32, or ours), timed
 * with the scatter that accumulates them. */
static void sparse_zero_grads(const kd_fld_call *k, const kd_topk_sparse *a) {
    kd_ph_enter(KD_PH_GEMM_DW);
    if (a->dws) {
        kdloss_mat m = {a->dws, KDLOSS_F32, a->ldd};
        kd_fld_zero_mat(m, k->v, k->hs);
    }
    if (a->dbs) memset(a->dbs, 0, (size_t)k->v * sizeof(float));
    kd_ph_leave();
}

kdloss_status kd_topk_sparse_run(const kd_fld_call *k, const kd_fld_plan *pl, char *base) {
    const kdloss_fused_linear_distill_params *p = &k->p;
    const kdloss_fused_linear_distill_out *o = &k->out;
    int sb = k->xs.dtype == KDLOSS_BF16;
    /* as run(): the soft part only when weighted or asked for (no cross-entropy here) */
    int want_soft = p->weight_soft_loss > 0.0 || o->soft_loss || o->row_soft;
    if (k->n_valid == 0 || !want_soft) {
        kd_fld_write_zero(k);
        return KDLOSS_OK;
    }
    double nv = (double)k->n_valid, t_fac = p->t2_scale ? p->temperature : 1.0 / p->temperature;
    kd_topk_sparse a = {0, 0, k->hs, k->xs.data, k->xs.dtype, k->xs.ld, k->ws.data, k->ws.ld,
                        NULL, &k->topk, k->labels, p->ignore_index, kd_div_coef_make(&p->div),
                        (double)(float)(1.0 / p->temperature), /* fp32-exact: topk_row.h */
                        k->grad ? (float)(p->grad_scale * p->weight_soft_loss * t_fac / nv) : 0.0f,
                        NULL, NULL, NULL, NULL, o->dxs, NULL, 0, NULL, p->row_weights};
    sparse_layout(k, pl, base, &a);
    sparse_zero_grads(k, &a);
    void (*scatter)(const kd_topk_sparse *) = kd_cpu_kernels()->sparse_scatter;
    void (*rows)(const kd_topk_sparse *) = kd_cpu_kernels()->sparse_rows;
    double soft_sum = 0.0;
    int nan_row = 0; /* a poisoned row (the rows kernel's flag in col[K]) */
    size_t scr = kd_topk_row_scratch(k->topk.k);
    for (int64_t r0 = 0; r0 < k->bt; r0 += pl->chunk) {
        a.n = kd_min64(pl->chunk, k->bt - r0);
        a.row0 = r0;
        if (sb) {
            kd_ph_enter(KD_PH_WIDEN);
            kd_bf16_rows_to_f32((const uint16_t *)k->xs.data + r0 * k->xs.ld, k->xs.ld, a.n,
                                k->hs, a.x32, 1);
            kd_ph_leave();
        }
        kd_ph_enter(KD_PH_ROWS);
        rows(&a);
        kd_ph_leave();
        for (int64_t i = 0; i < a.n; i++) {
            soft_sum += a.w ? (double)a.w[r0 + i] * a.row_soft[i] : a.row_soft[i]; /* w times */
            if (o->row_soft) o->row_soft[r0 + i] = (float)a.row_soft[i];
            nan_row |= ((const int64_t *)(a.tk + (size_t)i * scr))[k->topk.k] != 0;
        }
        if (sb && o->dxs.data) {
            kd_ph_enter(KD_PH_ROUND);
            kd_f32_rows_to_bf16(a.d32, k->hs, a.n, k->hs,
                                (uint16_t *)o->dxs.data + r0 * o->dxs.ld, o->dxs.ld, 1);
            kd_ph_leave();
        }
        if (k->grad && a.gs != 0.0f) { /* a factor of 0: the zeros written above */
            kd_ph_enter(KD_PH_GEMM_DW);
            scatter(&a);
            kd_ph_leave();
        }
    }
    int store = nan_row || a.dbs || (a.dws && sb);
    if (store) kd_ph_enter(KD_PH_ROUND); /* the NaN fill too, when a row was poisoned */
    sparse_store_grads(k, &a, nan_row);
    if (store) kd_ph_leave();
    double t2 = p->t2_scale ? p->temperature * p->temperature : 1.0, soft = soft_sum * t2 / nv;
    kd_fld_write_losses(o, (float)(p->weight_soft_loss * soft), (float)soft, 0.0f);
    return KDLOSS_OK;
}

int kd_topk_sparse_takes(const kd_fld_call *k) { return !k->comm && sparse_eligible(k); }

size_t kd_topk_sparse_bytes(const kd_fld_call *k, const kd_fld_plan *pl) {
    return sparse_layout(k, pl, NULL, NULL);
}

kdloss_status kdloss_fused_linear_topk_distill(
    const kdloss_fused_linear_topk_distill_params *params, int64_t bt, int64_t hs, int64_t v,
    kdloss_cmat xs, kdloss_cmat ws, const void *bs, kdloss_topk_teacher teacher,
    kdloss_labels labels, kdloss_fused_linear_distill_out *out, void *workspace,
    size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_topk_check_fused_params(params);
    if (st != KDLOSS_OK) return st;
    kdloss_fused_linear_distill_params p = kd_topk_fld_params(params);
    kd_fld_teacher t = {0, {NULL, KDLOSS_F32, 0}, {NULL, KDLOSS_F32, 0}, NULL, &teacher,
                       (int)params->tail};
    return kd_fld_run_checked(&p, bt, hs, v, xs, ws, bs, &t, labels, out, workspace,
                              workspace_bytes);
}
