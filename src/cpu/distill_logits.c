/* kdloss_distill_logits on the CPU: the divergence family on logits in one pass per row.
 *
 * Each row goes through the fused-linear loss's row kernel (fld_rows_vec.c / _scalar.c: row
 * maxima, tempered log-sum-exps, the divergence of div_elem.h, dzs = gs (g - q sum g)) with the
 * cross-entropy off, so every formula has one definition. The kernel works on fp32 rows that it
 * may overwrite (dzs over zs, g over zt); per row:
 *   - student: the fp32 gradient row itself when the gradient is fp32 (the student copied into
 *     it unless in place), the student row itself when no gradient is wanted, it is fp32 and the
 *     teacher is dense (the sparse teacher's pass masks its ids in the row), else the row widened
 *     into a per-thread buffer (then narrowed into the gradient);
 *   - teacher: the teacher row itself when it is fp32 and no gradient is wanted (the kernel only
 *     reads it then), else a copy in a per-thread buffer.
 * A dense teacher on the AVX2 / AVX-512 paths takes the logits row kernel instead
 * (logits_rows.h: two exps an element, the divergence in div_elem.h's KDE_PQ form), each thread
 * pipelining its span of rows (one row's last pass interleaved with the next row's first): fp32
 * logits read in place, narrower ones widened tile by tile into per-thread rows by pass 1.
 * Rows run on OpenMP threads (kd_rows_sum; run_pipelined on the vector paths), their values
 * summed in an order that depends on BT alone.
 * Per-row weights and the student's entropy (docs/MATH.md section 12): a row of weight 0 is
 * skipped as an ignored row; a kept row's gradient factor is gs w (the pipelined kernel's
 * per-row gs, the row phases' w) and its value counts w times in the total (row_loss stays
 * unweighted); the entropy comes from the kernels' own passes (logits_rows.h: pass 3; the row
 * phases: beside the student's sum of exps). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "dispatch.h"
#include "ew_common.h"
#include "fld_rows.h"
#include "half.h"
#include "logits_rows.h"
#include "topk.h"
#include "check.h"

/* How far, in columns, pass 1 of a pipelined row fetches ahead of its reads (into L1). */
#define KD_LR_AHEAD 2048

/* One call: the elementwise job (first member: kd_rows_sum hands it back to the row function)
 * and what the row kernel needs besides. */
typedef struct dl_job {
    kd_ew_job ew;
    kd_fld_rows tmpl;   /* n = 1; zs, zt, tk, row0, row_soft/row_hard set per row */
    void (*rows)(const kd_fld_rows *);
    double (*lstep)(kd_lrow *, kd_lrow *); /* the dense logits kernel, or NULL (scalar path,
                                              top-k) */
    kd_lrow ltmpl;      /* its per-call fields; the row pointers set per row */
    kdloss_topk_teacher topk; /* a sparse teacher (k > 0), its lds effective; k = 0: dense */
    float *bufs;        /* per thread: v floats for the student, then v floats for a dense
                           teacher's row or a sparse teacher's row scratch */
    int64_t buf_stride; /* floats per thread */
    int64_t bt;         /* rows of the call */
    int nthreads;
    const float *w;     /* [bt] the rows' weights, or NULL: all 1 (docs/MATH.md section 12) */
    float *ent;         /* [bt] out: the student's entropy per row, or NULL */
} dl_job;

static void widen_row(const void *src, kdloss_dtype dt, int64_t v, float *dst) {
    if (dt == KDLOSS_F32) {
        memcpy(dst, src, (size_t)v * sizeof(float));
    } else if (dt == KDLOSS_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t c = 0; c < v; c++) dst[c] = kd_bf16_to_f32(s[c]);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t c = 0; c < v; c++) dst[c] = kd_f16_to_f32(s[c]);
    }
}

static void narrow_row(const float *src, int64_t v, kdloss_dtype dt, void *dst) {
    uint16_t *d = (uint16_t *)dst;
    if (dt == KDLOSS_BF16)
        for (int64_t c = 0; c < v; c++) d[c] = kd_f32_to_bf16(src[c]);
    else
        for (int64_t c = 0; c < v; c++) d[c] = kd_f32_to_f16(src[c]);
}

/* The per-thread buffer of the dense logits kernel: 2 slots, each of es, et and, when the
 * logits are narrower than fp32, their widened rows ws, wt (v floats each, on cache lines),
 * then 2 of tiles (4 doubles a tile of KD_FLD_TILE columns). Pipelined rows alternate. */
static int64_t slot_rows(const dl_job *j) {
    return j->ew.xdt == KDLOSS_F32 && j->ew.tdt == KDLOSS_F32 ? 2 : 4;
}
static int64_t row_floats(const dl_job *j) { return (j->ew.v + 15) / 16 * 16; }
static int64_t tile_floats(const dl_job *j) { return (8 * j->ltmpl.ntiles + 15) / 16 * 16; }
static int64_t buf_floats(const dl_job *j) {
    return 2 * (slot_rows(j) * row_floats(j) + tile_floats(j));
}

/* 1 if row r is ignored (its label is ignore_index, or its weight 0: docs/MATH.md section 12),
 * its gradient row then zeroed (+0.0 in every float dtype) and its entropy 0. */
static int skip_ignored(const dl_job *j, int64_t r) {
    const kd_ew_job *ew = &j->ew;
    if (!kd_row_ignored(ew, r) && kd_row_weight_keeps(j->w, r)) return 0;
    size_t es = kdloss_dtype_size(ew->xdt);
    if (ew->g) memset(ew->g + (size_t)(r * ew->ldg) * es, 0, (size_t)ew->v * es);
    if (j->ent) j->ent[r] = 0.0f;
    return 1;
}

/* Row r's kernel arguments in slot i of buf: dz = g, fp32 streamed when the call asked for it
 * and the row is aligned; the next row (r + 1 < end) fetched ahead. */
static kd_lrow dense_args(const dl_job *j, int64_t r, int64_t end, float *buf, int i) {
    const kd_ew_job *ew = &j->ew;
    size_t xes = kdloss_dtype_size(ew->xdt), tes = kdloss_dtype_size(ew->tdt);
    int64_t vp = row_floats(j);
    float *slot = buf + i * slot_rows(j) * vp;
    kd_lrow a = j->ltmpl;
    a.xs = ew->x + (size_t)(r * ew->ldx) * xes;
    a.xt = ew->t + (size_t)(r * ew->ldt) * tes;
    a.xdt = ew->xdt;
    a.tdt = ew->tdt;
    a.xes = (int64_t)xes;
    a.tes = (int64_t)tes;
    a.es = slot;
    a.et = slot + vp;
    a.zs = ew->xdt == KDLOSS_F32 ? (const float *)a.xs : slot + 2 * vp;
    a.zt = ew->tdt == KDLOSS_F32 ? (const float *)a.xt : slot + 3 * vp;
    a.tiles = (double *)(buf + 2 * slot_rows(j) * vp + i * tile_floats(j)); /* 64-byte aligned */
    a.dz = ew->g ? ew->g + (size_t)(r * ew->ldg) * xes : NULL;
    a.nt = a.dz && ew->stream_grad && ew->xdt == KDLOSS_F32 && (uintptr_t)a.dz % 64 == 0;
    a.pf_off = KD_LR_AHEAD < ew->v ? KD_LR_AHEAD : ew->v;
    if (j->w) a.gs = j->ltmpl.gs * j->w[r]; /* the row's whole gradient times its weight */
    a.ent = j->ent != NULL;
    if (r + 1 < end) {
        a.next_s = a.xs + (size_t)ew->ldx * xes;
        a.next_t = a.xt + (size_t)ew->ldt * tes;
    }
    return a;
}

/* Row r (its arguments d) finished by a step with divergence l: its value, and its entropy
 * (the step's d->h) where wanted. */
static void pipelined_done(const dl_job *j, const kd_lrow *d, int64_t r, double l, double *rl) {
    rl[r] = l;
    if (j->ent) j->ent[r] = (float)d->h;
}

/* The dense teacher on the vector paths: each thread runs a contiguous span of rows, every step
 * finishing one row while it starts the next (kd_logits_step), the two rows' scratch in
 * alternate slots. Row values into rl[bt], summed as kd_rows_sum would. */
static double run_pipelined(const dl_job *j, double *rl, float *row_loss) {
    const kd_ew_job *ew = &j->ew;
    int64_t bt = j->bt, v = ew->v;
#pragma omp parallel if (kd_rows_parallel(bt, v))
    {
        int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        int64_t lo = bt * tid / nt, hi = bt * (tid + 1) / nt;
        float *buf = j->bufs + (size_t)(tid < j->nthreads ? tid : 0) * (size_t)j->buf_stride;
        kd_lrow rows[2], *prev = NULL;
        int64_t prev_r = 0;
        for (int64_t r = lo; r < hi; r++) {
            if (skip_ignored(j, r)) {
                rl[r] = 0.0;
                continue;
            }
            int i = prev == rows ? 1 : 0;
            rows[i] = dense_args(j, r, hi, buf, i);
            double l = j->lstep(prev, &rows[i]);
            if (prev) pipelined_done(j, prev, prev_r, l, rl);
            prev = &rows[i];
            prev_r = r;
        }
        if (prev) pipelined_done(j, prev, prev_r, j->lstep(prev, NULL), rl);
    }
    return kd_rows_total_w(bt, rl, j->w, row_loss);
}

static double logits_row(const kd_ew_job *ew, int64_t r) {
    const dl_job *j = (const dl_job *)ew; /* ew is j's first member */
    int64_t v = ew->v;
    size_t es = kdloss_dtype_size(ew->xdt);
    const char *xs = ew->x + (size_t)(r * ew->ldx) * es;
    const char *xt = ew->t ? ew->t + (size_t)(r * ew->ldt) * kdloss_dtype_size(ew->tdt) : NULL;
    char *g = ew->g ? ew->g + (size_t)(r * ew->ldg) * es : NULL;
    if (skip_ignored(j, r)) return 0.0;
    int tid = omp_get_thread_num();
    if (tid >= j->nthreads) tid = 0; /* cannot happen: the team is at most max_threads */
    /* the second part starts on a cache line: its top-k scratch holds int64 and double */
    float *bs = j->bufs + (size_t)tid * (size_t)j->buf_stride, *bt = bs + row_floats(j);
    float *zs, *zt;
    if (g && ew->xdt == KDLOSS_F32) {
        zs = (float *)g;
        if (g != xs) memcpy(zs, xs, (size_t)v * sizeof(float));
    } else if (!g && ew->xdt == KDLOSS_F32 && !j->topk.k) {
        /* read only: no bias, no gradient (a sparse teacher's row pass masks its ids in the
         * row, so it always gets a copy) */
        zs = (float *)(uintptr_t)xs;
    } else {
        widen_row(xs, ew->xdt, v, bs);
        zs = bs;
    }
    kd_fld_rows a = j->tmpl;
    double st[64];
    a.stat_max = st;
    a.stat_sum = st + 2;
    a.stat_div = st + 2 + a.n_sum;
    if (j->topk.k) {
        zt = NULL;
        a.tk = (char *)bt;
        a.stat_max = (double *)(a.tk + kd_topk_row_scratch(j->topk.k)); /* 4 + K may exceed st */
        a.stat_sum = a.stat_max + 2;
        a.stat_div = a.stat_sum + a.n_sum;
    } else if (!g && ew->tdt == KDLOSS_F32) {
        zt = (float *)(uintptr_t)xt; /* read only: no bias, g is not stored */
    } else {
        widen_row(xt, ew->tdt, v, bt);
        zt = bt;
    }
    double soft = 0.0, hard = 0.0;
    a.zs = zs;
    a.zt = zt;
    a.row_soft = &soft;
    a.row_hard = &hard;
    a.row0 = r; /* the teacher's, the labels' and the weights' row (the kernel's row 0 is r) */
    a.row_ent = j->ent ? j->ent + r : NULL;
    j->rows(&a);
    if (g && ew->xdt != KDLOSS_F32) narrow_row(zs, v, ew->xdt, g);
    return soft;
}


/* Runs a checked call (job.ew and job.topk filled): per-thread buffers, the row template, the
 * rows. tail is the sparse teacher's KD_TAIL_* (unused when dense). */
/* The row template every row copies (job->tmpl, and the pipelined kernel's job->ltmpl): one
 * row of v logits at temperature t, the soft part alone, gradient factor gs (grad_scale / (T
 * denom): the 1/T of d(z/T)/dz folded in) where a gradient is wanted. */
static void rows_template(dl_job *job, const kdloss_div_params *div, int tail, double t,
                          double gs, int64_t v, kdloss_labels labels, int64_t ignore_index,
                          kdloss_mat grad) {
    kd_fld_rows *a = &job->tmpl;
    a->n = 1;
    a->v = v;
    a->bias_s = a->bias_t = NULL;
    a->labels = labels; /* data NULL: every row kept */
    a->ignore_index = ignore_index;
    a->coef = kd_div_coef_make(div);
    a->inv_t = (float)(1.0 / t);
    a->inv_t64 = (double)a->inv_t; /* fp32-exact: topk_row.h */
    a->soft = 1;
    a->hard = 0;
    a->grad = grad.data != NULL;
    a->gs = grad.data ? (float)gs : 0.0f;
    a->gh = 0.0f;
    a->row_lse = NULL;
    a->topk = job->topk.k ? &job->topk : NULL;
    a->tail = tail;
    a->v_lo = 0;
    a->w = job->w; /* the row phases scale a kept row's gs by its weight */
    a->ent = job->ent != NULL;
    a->row_ent = NULL; /* per row (logits_row) */
    a->n_sum = kd_fld_n_sum(job->topk.k) + a->ent; /* the entropy's sum: kd_fld_ent_at() */
    job->rows = kd_cpu_kernels()->fld_rows;
    job->ltmpl.v = v;
    job->ltmpl.coef = a->coef;
    job->ltmpl.inv_t = a->inv_t;
    job->ltmpl.gs = a->gs;
}

static kdloss_status run(dl_job *job, const kdloss_div_params *div, int tail, double t,
                         double grad_scale, int64_t bt, int64_t v, int64_t n_valid,
                         kdloss_labels labels, int64_t ignore_index, float *loss, float *row_loss,
                         kdloss_mat grad) {
    /* per-thread row buffers, rounded to whole cache lines */
    job->nthreads = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    int64_t second = job->topk.k ? (int64_t)((kd_topk_row_scratch(job->topk.k) +
                                              kd_fld_n_stats(job->topk.k) * sizeof(double)) /
                                             sizeof(float))
                                 : v;
    job->lstep = job->topk.k ? NULL : kd_cpu_kernels()->logits_step;
    job->bt = bt;
    job->ltmpl.ntiles = (v + KD_FLD_TILE - 1) / KD_FLD_TILE;
    job->buf_stride = job->lstep ? buf_floats(job) : row_floats(job) + (second + 15) / 16 * 16;
    int pipelined = job->lstep != NULL; /* its row values kept in double */
    if ((uint64_t)job->buf_stride > ((uint64_t)1 << 56) / (uint64_t)job->nthreads)
        return KDLOSS_ERR_OUT_OF_MEMORY;
    double *rl = NULL;
    if (pipelined && !(rl = malloc((size_t)bt * sizeof *rl))) return KDLOSS_ERR_OUT_OF_MEMORY;
    size_t bytes = (size_t)job->nthreads * (size_t)job->buf_stride * sizeof(float);
    job->bufs = aligned_alloc(64, bytes);
    if (!job->bufs) {
        free(rl);
        return KDLOSS_ERR_OUT_OF_MEMORY;
    }

    double denom = n_valid > 0 ? (double)n_valid : 1.0; /* all ignored: loss 0, grad 0 */
    rows_template(job, div, tail, t, grad_scale / (t * denom), v, labels, ignore_index, grad);
    job->ew.stream_grad =
        grad.data && bt * v * (int64_t)kdloss_dtype_size(job->ew.xdt) > KD_STREAM_BYTES;
    job->ew.want_loss = 1;
    double total = pipelined ? run_pipelined(job, rl, row_loss)
                             : kd_rows_sum_w(bt, logits_row, &job->ew, job->w, row_loss);
    free(rl);
    free(job->bufs);
    if (loss) *loss = (float)(total / denom);
    return KDLOSS_OK;
}

kdloss_status kdloss_distill_logits(const kdloss_distill_logits_params *p, int64_t bt, int64_t v,
                                    kdloss_cmat student, kdloss_cmat teacher, kdloss_labels labels,
                                    float *loss, float *row_loss, kdloss_mat grad) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_distill_geom g;
    kd_spanset spans;
    int64_t n_valid;
    kdloss_status st = kd_check_distill_logits(&kd_cpu_rules, p, bt, v, student, teacher, labels,
                                               loss, row_loss, grad, &g, &n_valid, &spans);
    if (st) return st; /* src/common/args.c, shared with CUDA */

    dl_job job;
    memset(&job, 0, sizeof job);
    kd_ew_job_operands(&job.ew, v, student, g.ld_s, teacher, g.ld_t, grad, g.ld_g);
    kd_ew_job_labels(&job.ew, labels, p->ignore_index);
    job.w = p->row_weights;
    job.ent = p->row_entropy;
    return run(&job, &p->div, 0, p->temperature, p->grad_scale, bt, v, n_valid, labels,
               p->ignore_index, loss, row_loss, grad);
}

kdloss_status kdloss_topk_distill_logits(const kdloss_topk_distill_params *p, int64_t bt,
                                         int64_t v, kdloss_cmat student,
                                         kdloss_topk_teacher teacher, kdloss_labels labels,
                                         float *loss, float *row_loss, kdloss_mat grad) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kd_topk_geom g;
    kd_spanset spans;
    int64_t n_valid;
    kdloss_status st = kd_check_topk_logits(&kd_cpu_rules, p, bt, v, student, teacher, labels,
                                            loss, row_loss, grad, &g, &n_valid, &spans);
    if (st) return st; /* src/common/args.c, the ids' values included */

    dl_job job;
    memset(&job, 0, sizeof job);
    const kdloss_cmat none = {NULL, KDLOSS_F32, 0}; /* no dense teacher */
    kd_ew_job_operands(&job.ew, v, student, g.ld_s, none, 0, grad, g.ld_g);
    kd_ew_job_labels(&job.ew, labels, p->ignore_index);
    teacher.ids.ld = g.ld_ids;
    teacher.logprobs.ld = g.ld_lp;
    job.topk = teacher;
    job.w = p->row_weights;
    job.ent = p->row_entropy;
    return run(&job, &p->div, (int)p->tail, p->temperature, p->grad_scale, bt, v, n_valid, labels,
               p->ignore_index, loss, row_loss, grad);
}
