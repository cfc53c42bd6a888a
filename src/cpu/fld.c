/* CPU driver of the chunked fused-linear distillation losses (docs/MATH.md sections 4 and 8):
 * per chunk of rows the logits GEMMs (zt = xt wt^T, zs = xs ws^T, fp32 from the accumulator),
 * the row pass (fld_rows_*: bias, softmaxes, divergence, cross-entropy, row losses, dzs over
 * zs), then dbs += column sums of dzs, dWs += dzs^T xs (fp32 across chunks) and the chunk's dxs
 * rows = dzs ws; the sparse renorm_both path needs no GEMM at all. Every GEMM goes through the
 * GEMM layer (gemm.h) on the same OpenMP threads as the row pass; row losses are summed in row
 * order in double, so nothing depends on the thread count. A GEMM failure ends the call with
 * its status (kdloss.h: outputs may then be partly written). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_rows.h"
#include "dispatch.h"
#include "fld.h"
#include "fld_phase.h"
#include "fld_rows.h"
#include "gemm.h"
#include "half.h"
#include "omp_team.h"
#include "topk.h"
#include "check.h"

/* A weight matrix W (rows x cols) as the GEMMs read it: the caller's fp32 in place, a whole
 * fp32 copy, or bf16 widened panel by panel into `panel` (panel_rows x cols; panel_floats in
 * all). */
typedef struct wsrc {
    const void *data;
    kdloss_dtype dt;
    int64_t ld, rows, cols;
    const float *f32; /* whole fp32 copy, or NULL */
    float *panel;
    int64_t panel_rows;
    size_t panel_floats;
} wsrc;

/* Rows [r0, r0 + n) of W as fp32; *ld gets their row stride. */
static const float *w_rows(const wsrc *w, int64_t r0, int64_t n, int64_t *ld) {
    if (w->dt == KDLOSS_F32) {
        *ld = w->ld;
        return (const float *)w->data + r0 * w->ld;
    }
    *ld = w->cols;
    if (w->f32) return w->f32 + r0 * w->cols;
    kd_ph_enter(KD_PH_WIDEN);
    kd_bf16_rows_to_f32((const uint16_t *)w->data + r0 * w->ld, w->ld, n, w->cols, w->panel, 1);
    kd_ph_leave();
    return w->panel;
}

/* Rows of W one GEMM reads: all of them unless W is widened panel by panel. */
static int64_t w_step(const wsrc *w) {
    return w->dt == KDLOSS_F32 || w->f32 ? w->rows : w->panel_rows;
}

/* z (n x V, ld V) = a (n x H, lda) W^T: a chunk's logits before the bias, timed as phase ph
 * (fld_phase.h). bf16 W without a whole copy is widened inside the product's tiles when the
 * GEMM layer can (kd_sgemm_nt_b16: no widening pass over a panel and no barrier before its
 * multiplies), else panel by panel. */
static kdloss_status gemm_logits(int64_t n, const float *a, int64_t lda, const wsrc *w, float *z,
                                 int ph) {
    int64_t step = w_step(w), ldw;
    kdloss_status st = KDLOSS_OK;
    if (step < w->rows) {
        kd_ph_enter(ph);
        st = kd_sgemm_nt_b16(n, w->rows, w->cols, a, lda, (const uint16_t *)w->data, w->ld, z,
                             w->rows, w->panel, w->panel_floats);
        kd_ph_leave();
        if (st != KDLOSS_ERR_UNSUPPORTED) return st;
        st = KDLOSS_OK;
    }
    for (int64_t p0 = 0; p0 < w->rows && st == KDLOSS_OK; p0 += step) {
        int64_t np = kd_min64(step, w->rows - p0);
        const float *wp = w_rows(w, p0, np, &ldw);
        kd_gemm g = {0, 1, n, np, w->cols, 1.0f, a, lda, wp, ldw, 0.0f, z + p0, w->rows};
        kd_ph_enter(ph);
        st = kd_sgemm(&g);
        kd_ph_leave();
    }
    return st;
}

/* The same from bf16 rows x (n x H, ld) and bf16 W, multiplied natively (kd_gemm_bf16_native). */
static kdloss_status gemm_logits_bf16(int64_t n, const uint16_t *x, int64_t ldx, const wsrc *w,
                                      float *z, int ph) {
    kd_gemm_bf16 g = {0, 1, n, w->rows, w->cols, x, ldx, (const uint16_t *)w->data, w->ld, z,
                      w->rows, 0.0f};
    kd_ph_enter(ph);
    kdloss_status st = kd_gemm_bf16_run(&g);
    kd_ph_leave();
    return st;
}

/* dx (n x H, ldd) = dz (n x V, ld V) W; over panels the GEMM accumulates the K split in fp32. */
static kdloss_status gemm_dx(int64_t n, const float *dz, const wsrc *w, float *dx, int64_t ldd) {
    int64_t step = w_step(w), ldw;
    kdloss_status st = KDLOSS_OK;
    for (int64_t p0 = 0; p0 < w->rows && st == KDLOSS_OK; p0 += step) {
        int64_t np = kd_min64(step, w->rows - p0);
        const float *wp = w_rows(w, p0, np, &ldw);
        kd_gemm g = {0,  0,   n,  w->cols, np, 1.0f, dz + p0, w->rows, wp, ldw, p0 ? 1.0f : 0.0f,
                     dx, ldd};
        kd_ph_enter(KD_PH_GEMM_DX);
        st = kd_sgemm(&g);
        kd_ph_leave();
    }
    return st;
}

/* Rows [r0, r0 + n) of x (cols wide) as fp32: in place, or widened into buf; *ld their stride. */
static const float *x_rows(kdloss_cmat x, int64_t r0, int64_t n, int64_t cols, float *buf,
                           int64_t *ld) {
    if (x.dtype == KDLOSS_F32) {
        *ld = x.ld;
        return (const float *)x.data + r0 * x.ld;
    }
    kd_ph_enter(KD_PH_WIDEN);
    kd_bf16_rows_to_f32((const uint16_t *)x.data + r0 * x.ld, x.ld, n, cols, buf, 1);
    kd_ph_leave();
    *ld = cols;
    return buf;
}

/* acc[c] (= or +=) sum over rows i of dz[i][c], dz (n x v): each column summed in row order
 * (OpenMP over column blocks), so the result does not depend on the thread count. */
static void col_block(const float *dz, int64_t n, int64_t v, float *acc, int first, int64_t c0) {
    int64_t c1 = kd_min64(c0 + 512, v);
    if (first) memset(acc + c0, 0, (size_t)(c1 - c0) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = c0; c < c1; c++) acc[c] += dz[i * v + c];
}

static void col_sums(const float *dz, int64_t n, int64_t v, float *acc, int first) {
    /* no parallel region at all when serial: libgomp mallocs a team for an if(0) region */
    if (n * v >= KD_FLD_PAR_MIN && kd_omp_team()) {
#pragma omp parallel for schedule(static)
        for (int64_t c0 = 0; c0 < v; c0 += 512) col_block(dz, n, v, acc, first, c0);
    } else {
        for (int64_t c0 = 0; c0 < v; c0 += 512) col_block(dz, n, v, acc, first, c0);
    }
}

/* fp32 vector -> n elements of dt (F32 or BF16) at dst. */
void kd_fld_store_vec(const float *src, int64_t n, kdloss_dtype dt, void *dst) {
    if (dt == KDLOSS_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else kd_f32_rows_to_bf16(src, n, 1, n, (uint16_t *)dst, n, 0);
}

/* Fills a (rows x cols, ld) matrix of dt with zeros (+0 is all-zero bits in fp32 and bf16). */
void kd_fld_zero_mat(kdloss_mat m, int64_t rows, int64_t cols) {
    size_t es = kdloss_dtype_size(m.dtype);
    for (int64_t r = 0; r < rows; r++)
        memset((char *)m.data + (size_t)(r * m.ld) * es, 0, (size_t)cols * es);
}

void kd_fld_write_losses(const kdloss_fused_linear_distill_out *o, float loss, float soft,
                         float hard) {
    if (o->loss) *o->loss = loss;
    if (o->soft_loss) *o->soft_loss = soft;
    if (o->hard_loss) *o->hard_loss = hard;
}

/* Every row ignored, or nothing weighted or asked for: loss 0 and zero gradients. */
void kd_fld_write_zero(const kd_fld_call *k) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    kd_fld_write_losses(o, 0.0f, 0.0f, 0.0f);
    float *rows[4] = {o->row_soft, o->row_hard, o->row_lse, o->row_entropy};
    for (int i = 0; i < 4; i++)
        if (rows[i]) memset(rows[i], 0, (size_t)k->bt * sizeof(float));
    if (o->dxs.data) kd_fld_zero_mat(o->dxs, k->bt, k->hs);
    if (o->dws.data) kd_fld_zero_mat(o->dws, k->v, k->hs);
    if (o->dbs) memset(o->dbs, 0, (size_t)k->v * kdloss_dtype_size(k->ws.dtype));
}

/* [v] bias of dtype dt as fp32 (into buf when it is bf16); NULL stays NULL. */
const float *kd_fld_bias_f32(const void *b, kdloss_dtype dt, int64_t v, float *buf) {
    if (!b || dt == KDLOSS_F32) return (const float *)b;
    kd_ph_enter(KD_PH_WIDEN);
    kd_bf16_rows_to_f32((const uint16_t *)b, v, 1, v, buf, 0);
    kd_ph_leave();
    return buf;
}


/* The row work of a vocabulary-parallel chunk: each phase over every row, the statistics
 * all-reduced in between (fld_row_phases.h): MAX of 2 doubles a row, SUM of n_sum, and for
 * the dense teacher SUM of 2. */
static kdloss_status rows_vp_phases(const kdloss_comm *c, const kd_fld_rows *r) {
    void (*phase)(const kd_fld_rows *, int) = kd_cpu_kernels()->fld_phase;
    phase(r, 1);
    if (c->allreduce(c->ctx, r->stat_max, 2 * r->n, KDLOSS_F64, KDLOSS_COMM_MAX))
        return KDLOSS_ERR_COMM;
    phase(r, 2);
    if (c->allreduce(c->ctx, r->stat_sum, r->n_sum * r->n, KDLOSS_F64, KDLOSS_COMM_SUM))
        return KDLOSS_ERR_COMM;
    phase(r, 3);
    if (!r->topk && c->allreduce(c->ctx, r->stat_div, 2 * r->n, KDLOSS_F64, KDLOSS_COMM_SUM))
        return KDLOSS_ERR_COMM;
    phase(r, 4);
    return KDLOSS_OK;
}

/* The same, timed as the row pass (fld_phase.h). */
static kdloss_status rows_vp(const kdloss_comm *c, const kd_fld_rows *r) {
    kd_ph_enter(KD_PH_ROWS);
    kdloss_status st = rows_vp_phases(c, r);
    kd_ph_leave();
    return st;
}

/* Whole fp32 copies of the bf16 weights when the plan has room for them (pl->whole); the
 * student's only when some GEMM reads it in fp32 (need_s), the teacher's only when its logits
 * are computed and not multiplied natively in bf16. */
static void widen_whole(const kd_fld_plan *pl, char *base, int soft, int native, int need_s,
                        wsrc *w_s, wsrc *w_t) {
    if (!pl->whole) return;
    kd_ph_enter(KD_PH_WIDEN);
    if (need_s && w_s->dt == KDLOSS_BF16) {
        float *c = (float *)(base + pl->off_ws32);
        kd_bf16_rows_to_f32((const uint16_t *)w_s->data, w_s->ld, w_s->rows, w_s->cols, c, 1);
        w_s->f32 = c;
    }
    if (soft && !native && w_t->dt == KDLOSS_BF16) {
        float *c = (float *)(base + pl->off_wt32);
        kd_bf16_rows_to_f32((const uint16_t *)w_t->data, w_t->ld, w_t->rows, w_t->cols, c, 1);
        w_t->f32 = c;
    }
    kd_ph_leave();
}

/* z (n x V) = rows [r0, r0 + n) of x times W^T: natively from bf16 when `native` (x and W are
 * then both bf16), else from fp32 rows (x widened into buf when it is bf16). *a and *lda get
 * the fp32 rows when they were formed (NULL otherwise). */
static kdloss_status chunk_logits(kdloss_cmat x, int64_t r0, int64_t n, const wsrc *w, int native,
                                  float *buf, float *z, const float **a, int64_t *lda, int ph) {
    if (native) {
        *a = NULL;
        return gemm_logits_bf16(n, (const uint16_t *)x.data + r0 * x.ld, x.ld, w, z, ph);
    }
    *a = x_rows(x, r0, n, w->cols, buf, lda);
    return gemm_logits(n, *a, *lda, w, z, ph);
}

/* Whether chunk row i's dz is 0 by the rules, its xs unread (kdloss.h): an ignored row, or a
 * top-k row with no used slot and no cross-entropy gradient. */
static int zero_dz_row(const kd_fld_rows *r, int64_t i) {
    if (r->labels.data && kd_label_at(r->labels, r->row0 + i) == r->ignore_index) return 1;
    if (!kd_row_weight_keeps(r->w, r->row0 + i)) return 1; /* weight 0: an ignored row */
    if (!r->topk || r->gh != 0.0f) return 0;
    return ((const int64_t *)(r->tk + (size_t)i * kd_topk_row_scratch(r->topk->k)))[r->topk->k] == 0;
}

/* Whether row `row` of x (fp32 or bf16, cols wide) holds a NaN or an inf. */
static int x_row_nonfinite(kdloss_cmat x, int64_t row, int64_t cols) {
    for (int64_t h = 0; h < cols; h++) {
        float f = x.dtype == KDLOSS_BF16 ? kd_bf16_to_f32(((const uint16_t *)x.data)[row * x.ld + h])
                                         : ((const float *)x.data)[row * x.ld + h];
        if (!(fabsf(f) <= 3.40282347e38f)) return 1;
    }
    return 0;
}

/* dWs (+)= dz^T xs for chunk rows [r0, r0 + n): one GEMM, or, where a row whose dz is 0 by the
 * rules (zero_dz_row) holds a NaN or inf in xs, one GEMM per run of the other rows, so that its
 * unread xs does not reach dWs (0 x NaN; the test costs a look at such rows' xs only). From the
 * fp32 dz and xs rows `as` (lda), or natively from the bf16 dz16 (ld 2V) and xs. */
static kdloss_status dws_gemm(const kd_fld_call *k, const kd_fld_rows *r, float *c, int64_t ldc,
                              const float *dz, const uint16_t *dz16, const float *as, int64_t lda,
                              int64_t r0, int64_t n) {
    int64_t v = k->v, hs = k->hs, i0 = 0;
    int first = 1;
    kdloss_status st = KDLOSS_OK;
    kd_ph_enter(KD_PH_MASK); /* the scan; the GEMMs inside count as theirs */
    for (int64_t i = 0; i <= n && st == KDLOSS_OK; i++) {
        if (i < n && !(zero_dz_row(r, i) && x_row_nonfinite(k->xs, r0 + i, hs))) continue;
        if (i > i0) {
            float beta = first && r0 == 0 ? 0.0f : 1.0f;
            kd_ph_enter(KD_PH_GEMM_DW);
            if (dz16) {
                kd_gemm_bf16 g = {1, 0, v, hs, i - i0, dz16 + i0 * 2 * v, 2 * v,
                                  (const uint16_t *)k->xs.data + (r0 + i0) * k->xs.ld, k->xs.ld, c,
                                  ldc, beta};
                st = kd_gemm_bf16_run(&g);
            } else {
                kd_gemm g = {1, 0, v, hs, i - i0, 1.0f, dz + i0 * v, v, as + i0 * lda, lda, beta, c,
                             ldc};
                st = kd_sgemm(&g);
            }
            kd_ph_leave();
            first = 0;
        }
        i0 = i + 1;
    }
    kd_ph_leave();
    if (st == KDLOSS_OK && first && r0 == 0) /* no row: dWs starts at 0 */
        for (int64_t j = 0; j < v; j++) memset(c + j * ldc, 0, (size_t)hs * sizeof(float));
    return st;
}

/* The native form of chunk_grads' two GEMMs (kd_gemm_bf16_grad_native; xs and ws are bf16):
 * dz (n x V fp32, dbs already summed from it) rounded to bf16 in place (ld 2V), then
 * dWs (+)= dz^T xs into the fp32 accumulator and dx (n x Hs, ld Hs) = dz ws, both from the
 * bf16 operands as they are. */
static kdloss_status grads_native(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                                  const kd_fld_rows *r, float *dz, int64_t r0, int64_t n, float *dx) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    int64_t hs = k->hs, v = k->v;
    kd_ph_enter(KD_PH_ROUND);
    kd_f32_rows_to_bf16_inplace(dz, n, v, 1);
    kd_ph_leave();
    const uint16_t *dz16 = (const uint16_t *)dz;
    kdloss_status st = KDLOSS_OK;
    if (o->dws.data) st = dws_gemm(k, r, (float *)(base + pl->off_dws), hs, NULL, dz16, NULL, 0, r0, n);
    if (st == KDLOSS_OK && o->dxs.data && dx) {
        kd_gemm_bf16 g = {0, 0, n, hs, v, dz16, 2 * v, (const uint16_t *)k->ws.data, k->ws.ld,
                          dx, hs, 0.0f};
        kd_ph_enter(KD_PH_GEMM_DX);
        st = kd_gemm_bf16_run(&g);
        kd_ph_leave();
    }
    return st;
}

/* dx rows [0, n) (stride ldd) = dz ws over each row's local columns in S alone: top-k
 * renorm_both without the cross-entropy's gradient, where dz is 0 outside S (its student
 * normalizer is over S). K axpys a row instead of a V-wide GEMM, and a weight row outside S,
 * which the loss never reads, is not read here either (a GEMM's 0 x NaN would make dxs NaN
 * where the sparse path, which reads S alone, does not: docs/MATH.md 10). */
static void topk_dx(const kd_fld_call *k, const kd_fld_rows *r, const float *dz, int64_t r0,
                    int64_t n, float *dx, int64_t ldd) {
    int64_t kk = k->topk.k, hs = k->hs, v = k->v;
    int bf = k->ws.dtype == KDLOSS_BF16;
    for (int64_t i = 0; i < n; i++) {
        float *d = dx + i * ldd;
        memset(d, 0, (size_t)hs * sizeof(float));
        if (r->labels.data && kd_label_at(r->labels, r0 + i) == r->ignore_index) continue;
        if (!kd_row_weight_keeps(r->w, r0 + i)) continue;
        const int64_t *col = (const int64_t *)(r->tk + (size_t)i * kd_topk_row_scratch(kk));
        for (int64_t j = 0; j < col[kk]; j++) {
            if (col[j] < 0) continue; /* another rank's id */
            float c = dz[i * v + col[j]];
            if (bf) {
                const uint16_t *w = (const uint16_t *)k->ws.data + col[j] * k->ws.ld;
                for (int64_t h = 0; h < hs; h++) d[h] += c * kd_bf16_to_f32(w[h]);
            } else {
                const float *w = (const float *)k->ws.data + col[j] * k->ws.ld;
                for (int64_t h = 0; h < hs; h++) d[h] += c * w[h];
            }
        }
    }
}

/* The gradients of chunk rows [r0, r0 + n) from its dzs (n x V, over zs): dbs += column sums,
 * dWs (+)= dzs^T xs (as: the chunk's fp32 xs rows, stride lda), dxs rows = dzs ws (topk_dx
 * where dz is 0 outside S); natively from a bf16 dzs (grads_native, which rounds dz in place)
 * when `native`. */
static kdloss_status chunk_grads(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                                 const wsrc *w_s, const kd_fld_rows *r, float *dz,
                                 const float *as, int64_t lda, int64_t r0, int64_t n, int native) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    int64_t hs = k->hs, v = k->v;
    int sb = k->xs.dtype == KDLOSS_BF16;
    kdloss_status st = KDLOSS_OK;
    if (o->dbs) {
        kd_ph_enter(KD_PH_DBS);
        col_sums(dz, n, v, (float *)(base + pl->off_dbs), r0 == 0);
        kd_ph_leave();
    }
    float *tmp = (float *)(base + pl->off_xconv);
    int direct = !sb && !k->comm; /* dxs rows straight into the caller's fp32 */
    int sdx = o->dxs.data && k->topk.k && k->tail == KDLOSS_TAIL_RENORM_BOTH && r->gh == 0.0f;
    if (sdx) { /* before grads_native rounds dz */
        kd_ph_enter(KD_PH_GEMM_DX);
        topk_dx(k, r, dz, r0, n, direct ? (float *)o->dxs.data + r0 * o->dxs.ld : tmp,
                direct ? o->dxs.ld : hs);
        kd_ph_leave();
    }
    if (native) { /* sb: the fp32 dxs rows into tmp, then cast as below */
        st = grads_native(k, pl, base, r, dz, r0, n, sdx ? NULL : tmp);
        if (st != KDLOSS_OK || !o->dxs.data) return st;
    } else {
        if (o->dws.data)
            st = dws_gemm(k, r, sb ? (float *)(base + pl->off_dws) : (float *)o->dws.data,
                          sb ? hs : o->dws.ld, dz, NULL, as, lda, r0, n);
        if (st != KDLOSS_OK || !o->dxs.data) return st;
        if (direct)
            return sdx ? st : gemm_dx(n, dz, w_s, (float *)o->dxs.data + r0 * o->dxs.ld, o->dxs.ld);
        /* fp32 rows first (the chunk's teacher rows are spent): cast to bf16, and with a
         * vocabulary split summed over the ranks first, one all-reduce per chunk */
        if (!sdx) st = gemm_dx(n, dz, w_s, tmp, hs);
    }
    if (st == KDLOSS_OK && k->comm &&
        k->comm->allreduce(k->comm->ctx, tmp, n * hs, KDLOSS_F32, KDLOSS_COMM_SUM))
        st = KDLOSS_ERR_COMM;
    if (st != KDLOSS_OK) return st;
    if (sb) {
        kd_ph_enter(KD_PH_ROUND);
        kd_f32_rows_to_bf16(tmp, hs, n, hs, (uint16_t *)o->dxs.data + r0 * o->dxs.ld, o->dxs.ld,
                            1);
        kd_ph_leave();
    } else
        for (int64_t i = 0; i < n; i++)
            memcpy((float *)o->dxs.data + (r0 + i) * o->dxs.ld, tmp + i * hs,
                   (size_t)hs * sizeof(float));
    return st;
}

/* The row-pass parameters that stay the same for every chunk. */
static void rows_setup(const kd_fld_call *k, const kd_fld_plan *pl, char *base, int soft,
                       int hard, kd_fld_rows *r) {
    const kdloss_fused_linear_distill_params *p = &k->p;
    double nv = (double)k->n_valid;
    /* the soft part's factor in the loss: T^2 with t2_scale; in the gradient it meets the 1/T
     * of d(z/T)/dz */
    double t_fac = p->t2_scale ? p->temperature : 1.0 / p->temperature;
    float *bias = (float *)(base + pl->off_bias);
    r->v = k->v;
    r->zs = (float *)(base + pl->off_zs);
    r->zt = k->topk.k ? NULL : (float *)(base + pl->off_zt);
    r->bias_s = kd_fld_bias_f32(k->bs, k->ws.dtype, k->v, bias);
    /* several teachers add their biases to their runs' logits (heads_logits) */
    r->bias_t = soft && !k->topk.k && !k->heads
                    ? kd_fld_bias_f32(k->bt_bias, k->wt.dtype, k->v, bias + k->v)
                    : NULL;
    r->topk = k->topk.k ? &k->topk : NULL;
    r->tail = k->tail;
    r->tk = base + pl->off_tk;
    r->v_lo = k->v_lo;
    /* the entropy's sum joins the SUM of stat_sum (the plan reserves its double) */
    r->ent = k->out.row_entropy != NULL;
    r->n_sum = kd_fld_n_sum(k->topk.k) + r->ent;
    r->w = p->row_weights;
    r->row_ent = NULL; /* per chunk (run_chunk) */
    r->stat_max = (double *)(base + pl->off_stat);
    r->stat_sum = r->stat_max + 2 * pl->chunk;
    r->stat_div = r->stat_sum + r->n_sum * pl->chunk;
    r->labels = k->labels;
    r->ignore_index = p->ignore_index;
    r->coef = kd_div_coef_make(&p->div);
    r->inv_t = (float)(1.0 / p->temperature);
    r->inv_t64 = (double)r->inv_t; /* fp32-exact: topk_row.h */
    r->soft = soft;
    r->hard = hard;
    r->grad = k->grad;
    r->map_s = kd_logit_map_make(p->student_map);
    r->map_t = kd_logit_map_make(p->teacher_map);
    /* the student map's scale is dz/du's constant factor (logit_map.h) */
    double s = k->grad ? (double)r->map_s.scale : 0.0;
    r->gs = (float)(s * p->grad_scale * p->weight_soft_loss * t_fac / nv);
    r->gh = (float)(s * p->grad_scale * p->weight_hard_loss / nv);
    r->row_soft = (double *)(base + pl->off_rows);
    r->row_hard = r->row_soft + pl->chunk;
}

kdloss_status kd_fld_prepare(const kd_fld_call *k, const kd_fld_plan *pl) {
    /* the GEMMs' fallback scratch (gemm.h), reserved before anything is written: zt = xt wt^T,
     * zs = xs ws^T, dWs += dz^T xs, dxs = dz ws; panels and the last chunk are no larger */
    kd_gemm_shape shapes[4] = {{pl->chunk, k->v, k->ht > 0 ? k->ht : k->hs},
                               {pl->chunk, k->v, k->hs},
                               {k->v, k->hs, pl->chunk},
                               {pl->chunk, k->hs, k->v}};
    return kd_gemm_prepare(shapes, 4) == KDLOSS_OK ? KDLOSS_OK : KDLOSS_ERR_OUT_OF_MEMORY;
}

/* The computation of a checked call in the workspace at `base` (aligned). A GEMM failure stops
 * it with that status (outputs may then be partly written; kdloss.h says so). */
/* bf16 operands: the logits GEMMs multiply bf16 natively (oneDNN's bf16 gemm, fp32 accumulation)
 * where the GEMM layer says it pays (kd_gemm_bf16_native: measured once per process), else widen
 * to fp32. Where the student's logits are native, so are its gradient GEMMs (unless
 * kdloss_gemm_set_bf16_grad asked for EXACT): dzs is rounded to bf16 in place after dbs has
 * summed it, and dWs += dzs^T xs, dxs = dzs ws multiply the bf16 operands as they are (no fp32
 * copy of ws or xs). Otherwise widened bf16 weights are whole fp32 copies when the memory budget
 * holds them besides a chunk of all rows; else the logits GEMMs widen W inside their tiles
 * (kd_sgemm_nt_b16) and dXs widens it panel by panel, and the gradient GEMMs run in fp32 on the
 * fp32 dz. */

/* The state of one dense call (run): which parts are computed, the GEMM kinds, the weights'
 * sources, the row arguments and the row-ordered loss sums. */
typedef struct fld_run {
    int soft, hard;       /* the loss parts computed (weighted or asked for) */
    int native_s, native_t, native_g; /* bf16 GEMMs natively: student / teacher logits, grads */
    int dense_t;          /* the teacher's logits are computed (form->logits, soft part on) */
    const struct fld_form *form; /* the call's teacher form (FLD_FORMS) */
    int zero_g;           /* both gradient factors 0: zeros written at the end, no GEMM */
    wsrc w_s, w_t;
    kd_fld_rows r;
    double soft_sum, hard_sum;
} fld_run;

/* zt (n x V, the chunk's teacher logits) for rows [r0, r0 + n) with several teachers
 * (kdloss_teacher_heads, docs/MATH.md section 13): one GEMM per run of rows that share a head,
 * bf16 heads widened in panels per run (the plan holds one head, never all of them: where it
 * holds a whole copy, that space is the panel), its bias added
 * to the run's logits here (the row pass's bias_t is NULL then; the same fp32 sum either way). */
static kdloss_status heads_logits(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                                  const fld_run *u, int64_t r0, int64_t n) {
    const kdloss_teacher_heads *h = k->heads;
    float *xbuf = (float *)(base + pl->off_xconv), *bbuf = (float *)(base + pl->off_bias) + k->v;
    kdloss_status st = KDLOSS_OK;
    for (int64_t i0 = 0, i1; i0 < n && st == KDLOSS_OK; i0 = i1) {
        int32_t j = h->index[r0 + i0];
        for (i1 = i0 + 1; i1 < n && h->index[r0 + i1] == j;) i1++;
        wsrc w = u->w_t;
        w.data = h->wt[j].data;
        w.ld = h->wt[j].ld ? h->wt[j].ld : k->ht;
        w.f32 = NULL;
        if (pl->whole) { /* no panel region then: the one head's fp32 copy space is the panel */
            w.panel = (float *)(base + pl->off_wt32);
            w.panel_rows = k->v;
            w.panel_floats = (size_t)k->v * (size_t)k->ht;
        }
        const float *a;
        int64_t lda;
        float *z = u->r.zt + i0 * k->v;
        st = chunk_logits(k->xt, r0 + i0, i1 - i0, &w, u->native_t, xbuf, z, &a, &lda,
                          KD_PH_GEMM_ZT);
        const float *b = h->bias ? kd_fld_bias_f32(h->bias[j], k->wt.dtype, k->v, bbuf) : NULL;
        for (int64_t i = 0; b && st == KDLOSS_OK && i < i1 - i0; i++)
            for (int64_t c = 0; c < k->v; c++) z[i * k->v + c] += b[c];
    }
    return st;
}

/* zt (n x V) for rows [r0, r0 + n) with the one teacher head wt. */
static kdloss_status dense_logits(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                                  const fld_run *u, int64_t r0, int64_t n) {
    const float *a;
    int64_t lda;
    return chunk_logits(k->xt, r0, n, &u->w_t, u->native_t, (float *)(base + pl->off_xconv),
                        u->r.zt, &a, &lda, KD_PH_GEMM_ZT);
}

static int form_heads(const kd_fld_call *k) { return k->heads != NULL; }
static int form_topk(const kd_fld_call *k) { return k->topk.k > 0; }
static int form_dense(const kd_fld_call *k) { return !k->heads && !k->topk.k; }

/* The teacher forms of the chunked loop, first match wins: how a chunk's teacher logits zt are
 * formed (docs/MATH.md sections 4, 8 and 13), or NULL for a teacher without logits (the top-k
 * teacher's log-probs go to the row pass as they are). A new teacher form is a row here. */
typedef struct fld_form {
    int (*takes)(const kd_fld_call *k);
    kdloss_status (*logits)(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                            const fld_run *u, int64_t r0, int64_t n);
} fld_form;

static const fld_form FLD_FORMS[] = {
    {form_heads, heads_logits},
    {form_topk, NULL},
    {form_dense, dense_logits},
};

static const fld_form *form_of(const kd_fld_call *k) {
    const fld_form *f = FLD_FORMS;
    while (!f->takes(k)) f++; /* the forms cover every checked call */
    return f;
}

/* The GEMM kinds, the weights (widened whole where the plan has room) and the row arguments. */
static void run_setup(const kd_fld_call *k, const kd_fld_plan *pl, char *base, fld_run *u) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    u->native_s = k->xs.dtype == KDLOSS_BF16 && kd_gemm_bf16_native();
    u->native_t = k->xt.dtype == KDLOSS_BF16 && u->native_s;
    u->native_g = k->grad && u->native_s && kd_gemm_bf16_grad_native(); /* gradient GEMMs */
    u->form = form_of(k);
    u->dense_t = u->soft && u->form->logits;
    float *panel = (float *)(base + pl->off_panel);
    wsrc w_s = {k->ws.data, k->ws.dtype, k->ws.ld, k->v, k->hs, NULL, panel, pl->panel_rows,
                pl->panel_floats};
    wsrc w_t = {k->wt.data, k->wt.dtype, k->wt.ld, k->v, k->ht, NULL, panel, pl->panel_rows,
                pl->panel_floats};
    u->w_s = w_s;
    u->w_t = w_t;
    /* the student's weights in fp32: for the widened logits, or for dxs from an fp32 dz */
    int need_ws32 = !u->native_s || (o->dxs.data && !u->native_g);
    widen_whole(pl, base, u->dense_t && !k->heads, u->native_t, need_ws32, &u->w_s, &u->w_t);
    rows_setup(k, pl, base, u->soft, u->hard, &u->r);
    /* both gradient factors 0: the gradients are zeros (kdloss.h), written once at the end; no
     * gradient GEMM (0 x a NaN weight or input would be NaN) */
    u->zero_g = k->grad && u->r.gs == 0.0f && u->r.gh == 0.0f;
    if (u->zero_g) u->r.grad = 0;
    u->soft_sum = u->hard_sum = 0.0;
}

/* Rows [r0, r0 + n): the logits GEMMs, the row pass (or its vocabulary-parallel phases), the
 * row outputs and sums in row order (so they do not depend on the chunk), the gradient GEMMs. */
static kdloss_status run_chunk(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                               fld_run *u, int64_t r0, int64_t n) {
    const kdloss_fused_linear_distill_out *o = &k->out;
    kd_fld_rows *r = &u->r;
    int64_t lda;
    const float *as;
    kdloss_status st = KDLOSS_OK;
    if (u->dense_t) st = u->form->logits(k, pl, base, u, r0, n);
    if (st == KDLOSS_OK)
        st = chunk_logits(k->xs, r0, n, &u->w_s, u->native_s, (float *)(base + pl->off_xs32),
                          r->zs, &as, &lda, KD_PH_GEMM_ZS);
    if (st != KDLOSS_OK) return st;
    if (!as && o->dws.data && !u->native_g) /* dWs from fp32 dz needs fp32 xs rows */
        as = x_rows(k->xs, r0, n, k->hs, (float *)(base + pl->off_xs32), &lda);
    r->n = n;
    r->row0 = r0;
    r->row_lse = o->row_lse ? o->row_lse + r0 : NULL;
    r->row_ent = o->row_entropy ? o->row_entropy + r0 : NULL;
    if (k->comm) {
        st = rows_vp(k->comm, r);
    } else {
        kd_ph_enter(KD_PH_ROWS);
        kd_cpu_kernels()->fld_rows(r);
        kd_ph_leave();
    }
    if (st != KDLOSS_OK) return st;
    const float *w = k->p.row_weights; /* a kept row's terms count w times (row outputs: once) */
    for (int64_t i = 0; i < n; i++) {
        u->soft_sum += w ? (double)w[r0 + i] * r->row_soft[i] : r->row_soft[i];
        u->hard_sum += w ? (double)w[r0 + i] * r->row_hard[i] : r->row_hard[i];
        if (o->row_soft) o->row_soft[r0 + i] = (float)r->row_soft[i];
        if (o->row_hard) o->row_hard[r0 + i] = (float)r->row_hard[i];
    }
    if (k->grad && !u->zero_g)
        st = chunk_grads(k, pl, base, &u->w_s, r, r->zs, as, lda, r0, n, u->native_g);
    return st;
}

/* After the last chunk: the gradients' final form (zeros, or the fp32 accumulators cast) and the
 * three losses. */
static void run_finish(const kd_fld_call *k, const kd_fld_plan *pl, char *base,
                       const fld_run *u) {
    const kdloss_fused_linear_distill_params *p = &k->p;
    const kdloss_fused_linear_distill_out *o = &k->out;
    int64_t hs = k->hs, v = k->v;
    if (u->zero_g) {
        if (o->dxs.data) kd_fld_zero_mat(o->dxs, k->bt, hs);
        if (o->dws.data) kd_fld_zero_mat(o->dws, v, hs);
        if (o->dbs) memset(o->dbs, 0, (size_t)v * kdloss_dtype_size(k->ws.dtype));
    } else if ((o->dws.data && k->xs.dtype == KDLOSS_BF16) || o->dbs) {
        kd_ph_enter(KD_PH_ROUND); /* a copy for fp32 dbs */
        if (o->dws.data && k->xs.dtype == KDLOSS_BF16)
            kd_f32_rows_to_bf16((const float *)(base + pl->off_dws), hs, v, hs,
                                (uint16_t *)o->dws.data, o->dws.ld, 1);
        if (o->dbs) kd_fld_store_vec((const float *)(base + pl->off_dbs), v, k->ws.dtype, o->dbs);
        kd_ph_leave();
    }
    double nv = (double)k->n_valid, t2 = p->t2_scale ? p->temperature * p->temperature : 1.0;
    double soft_mean = u->soft ? u->soft_sum * t2 / nv : 0.0;
    double hard_mean = u->hard ? u->hard_sum / nv : 0.0;
    kd_fld_write_losses(o,
                 (float)(p->weight_hard_loss * hard_mean + p->weight_soft_loss * soft_mean),
                 (float)soft_mean, (float)hard_mean);
}

static kdloss_status run(const kd_fld_call *k, const kd_fld_plan *pl, char *base) {
    const kdloss_fused_linear_distill_params *p = &k->p;
    const kdloss_fused_linear_distill_out *o = &k->out;
    fld_run u;
    /* A loss part is computed when it is weighted or asked for: weight_hard_loss = 0 skips all
     * cross-entropy work unless the caller wants hard_loss itself (its gradient is skipped
     * then too); the same for the soft part, which also skips the teacher GEMM. */
    u.soft = p->weight_soft_loss > 0.0 || o->soft_loss || o->row_soft;
    u.hard = p->weight_hard_loss > 0.0 || o->hard_loss || o->row_hard || o->row_lse;
    /* the entropy alone still runs the student's logits and its tempered pass (fld_rows.h) */
    if (k->n_valid == 0 || (!u.soft && !u.hard && !o->row_entropy)) {
        kd_fld_write_zero(k);
        return KDLOSS_OK;
    }
    if (kd_fld_prepare(k, pl) != KDLOSS_OK) return KDLOSS_ERR_OUT_OF_MEMORY;
    run_setup(k, pl, base, &u);
    for (int64_t r0 = 0; r0 < k->bt; r0 += pl->chunk) {
        kdloss_status st = run_chunk(k, pl, base, &u, r0, kd_min64(pl->chunk, k->bt - r0));
        if (st != KDLOSS_OK) return st;
    }
    run_finish(k, pl, base, &u);
    return KDLOSS_OK;
}

static size_t run_bytes(const kd_fld_call *k, const kd_fld_plan *pl) {
    (void)k;
    return pl->bytes;
}

/* The ways a checked fused call runs, first match wins (docs/MATH.md sections 4 and 8): the
 * sparse renorm_both path of a top-k teacher (fld_topk.c), else the chunked full-vocabulary
 * loop above, which serves every teacher form (fld_form). A new way to run a fused loss is a
 * row here and a file. */
typedef struct fld_path {
    int (*takes)(const kd_fld_call *k);
    size_t (*bytes)(const kd_fld_call *k, const kd_fld_plan *pl); /* when allocated here */
    kdloss_status (*run)(const kd_fld_call *k, const kd_fld_plan *pl, char *base);
} fld_path;

static int run_takes(const kd_fld_call *k) {
    (void)k;
    return 1;
}

static const fld_path FLD_PATHS[] = {
    {kd_topk_sparse_takes, kd_topk_sparse_bytes, kd_topk_sparse_run},
    {run_takes, run_bytes, run},
};

kdloss_status kd_fld_execute(const kd_fld_call *call, const kd_fld_plan *plan,
                             void *workspace) {
    const fld_path *path = FLD_PATHS;
    while (!path->takes(call)) path++; /* the last row takes every call */
    void *mem = NULL;
    kd_ph_call_begin(); /* the per-phase counters, when this thread attached (fld_phase.h) */
    if (!workspace) {
        mem = malloc(path->bytes(call, plan));
        if (!mem) {
            kd_ph_call_end();
            return KDLOSS_ERR_OUT_OF_MEMORY;
        }
        workspace = mem;
    }
    uintptr_t a = ((uintptr_t)workspace + KD_FLD_ALIGN - 1) & ~(uintptr_t)(KD_FLD_ALIGN - 1);
    kdloss_status st = path->run(call, plan, (char *)a);
    free(mem);
    kd_ph_call_end();
    return st;
}

kdloss_status kd_fld_run_checked(const kdloss_fused_linear_distill_params *params, int64_t bt,
                                 int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                                 const void *bs, const kd_fld_teacher *t, kdloss_labels labels,
                                 kdloss_fused_linear_distill_out *out, void *workspace,
                                 size_t workspace_bytes) {
    kd_fld_call call;
    kd_fld_plan plan;
    kdloss_status st = kd_fld_check(params, bt, hs, v, v, xs, ws, bs, t, labels, out, workspace,
                                    workspace_bytes, &call, &plan);
    if (st != KDLOSS_OK) return st;
    return kd_fld_execute(&call, &plan, workspace);
}

kdloss_status kdloss_fused_linear_distill(const kdloss_fused_linear_distill_params *params,
                                          int64_t bt, int64_t hs, int64_t ht, int64_t v,
                                          kdloss_cmat xs, kdloss_cmat ws, const void *bs,
                                          kdloss_cmat xt, kdloss_cmat wt, const void *bt_bias,
                                          kdloss_labels labels,
                                          kdloss_fused_linear_distill_out *out, void *workspace,
                                          size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_fld_teacher t = {ht, xt, wt, bt_bias, NULL, 0};
    return kd_fld_run_checked(params, bt, hs, v, xs, ws, bs, &t, labels, out, workspace,
                              workspace_bytes);
}

/* The JSD-only name: a wrapper (divergence JSD(beta), no T^2, no row outputs). */
kdloss_status kdloss_fused_linear_jsd(const kdloss_fljsd_params *params, int64_t bt, int64_t hs,
                                      int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat ws,
                                      const void *bs, kdloss_cmat xt, kdloss_cmat wt,
                                      const void *bt_bias, kdloss_labels labels,
                                      kdloss_fljsd_out *out, void *workspace,
                                      size_t workspace_bytes) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!params || !out) return KDLOSS_ERR_NULL_POINTER;
    kdloss_fused_linear_distill_params p = kd_fld_from_jsd(params);
    kdloss_fused_linear_distill_out o = kd_fld_out_from_jsd(out);
    return kdloss_fused_linear_distill(&p, bt, hs, ht, v, xs, ws, bs, xt, wt, bt_bias, labels, &o,
                                       workspace, workspace_bytes);
}
