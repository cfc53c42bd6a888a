/* The checks of one operand view, label vector or parameter set (check.h), which every
 * operation's checks (args.c, args_fld.c) are built from, and the fused losses' defaults. */
#include "check.h"

#include <float.h>
#include <math.h>

#include <stdint.h>
#include <stdio.h>

#include "logit_map.h"

int kd_is_float_dtype(kdloss_dtype dt) {
    return dt == KDLOSS_F32 || dt == KDLOSS_BF16 || dt == KDLOSS_F16;
}

kdloss_status kd_check_fmat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                            int64_t ld, int64_t *ld_out, kd_span *span) {
    if (data && rows > 0 && cols > 0 && !kd_is_float_dtype(dt)) {
        kd_detail("dtype %s (%d), expected fp32, bf16 or fp16", kdloss_dtype_name(dt), (int)dt);
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    return kd_check_mat(rows, cols, data, dt, ld, ld_out, span);
}

kdloss_status kd_check_mat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                           int64_t ld, int64_t *ld_out, kd_span *span) {
    if (!data) return KDLOSS_ERR_NULL_POINTER;
    if (rows <= 0 || cols <= 0) {
        kd_detail("%lld x %lld: sizes must be positive", (long long)rows, (long long)cols);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    if (kdloss_dtype_size(dt) == 0) {
        kd_detail("unknown dtype %d", (int)dt);
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    if (!kd_aligned(data, kdloss_dtype_size(dt))) {
        kd_detail("address %p is not a multiple of its %s element size %zu", data,
                  kdloss_dtype_name(dt), kdloss_dtype_size(dt));
        return KDLOSS_ERR_MISALIGNED;
    }
    if (ld == 0) ld = cols;
    if (ld < cols) {
        kd_detail("ld %lld below its row length %lld", (long long)ld, (long long)cols);
        return KDLOSS_ERR_INVALID_STRIDE;
    }
    int64_t es = (int64_t)kdloss_dtype_size(dt);
    /* elements spanned = (rows - 1) * ld + cols; it and its byte count must fit in int64 */
    int64_t n = 0;
    if (rows - 1 > (INT64_MAX - cols) / ld || (n = (rows - 1) * ld + cols) > INT64_MAX / es ||
        (uint64_t)(n * es) > (uint64_t)(UINTPTR_MAX - (uintptr_t)data)) {
        kd_detail("%lld x %lld with ld %lld spans beyond the address space", (long long)rows,
                  (long long)cols, (long long)ld);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    *ld_out = ld;
    span->lo = (const char *)data;
    span->hi = (const char *)data + n * es;
    return KDLOSS_OK;
}

kd_span kd_vec_span(const void *data, int64_t n, size_t elem) {
    kd_span s = {(const char *)data, (const char *)data};
    if (data && n > 0) s.hi += (size_t)n * elem;
    return s;
}

int kd_spans_overlap(kd_span a, kd_span b) {
    if (a.lo == a.hi || b.lo == b.hi) return 0;
    return a.lo < b.hi && b.lo < a.hi;
}

kdloss_status kd_check_label_view(kdloss_labels labels, int align) {
    if (!labels.data) return kd_named("labels", KDLOSS_ERR_NULL_POINTER);
    if (labels.dtype != KDLOSS_I64 && labels.dtype != KDLOSS_I32) {
        kd_detail("labels: dtype %s, expected int64 or int32", kdloss_dtype_name(labels.dtype));
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    if (align && !kd_aligned(labels.data, kdloss_dtype_size(labels.dtype))) {
        kd_detail("labels: address %p is not a multiple of %zu", labels.data,
                  kdloss_dtype_size(labels.dtype));
        return KDLOSS_ERR_MISALIGNED;
    }
    return KDLOSS_OK;
}

kdloss_status kd_check_labels(kdloss_labels labels, int64_t bt, int64_t v, int64_t ignore_index,
                              int64_t *n_valid) {
    kdloss_status st = kd_check_label_view(labels, 1);
    if (st != KDLOSS_OK) return st;
    int64_t n = 0;
    for (int64_t r = 0; r < bt; r++) {
        int64_t y = kd_label_at(labels, r);
        if (y == ignore_index) continue;
        if (y < 0 || y >= v) {
            kd_detail("labels[%lld] = %lld is neither ignore_index (%lld) nor in [0, %lld)",
                      (long long)r, (long long)y, (long long)ignore_index, (long long)v);
            return KDLOSS_ERR_LABEL_OUT_OF_RANGE;
        }
        n++;
    }
    *n_valid = n;
    return KDLOSS_OK;
}

kdloss_status kd_check_row_weights(const float *w, int64_t bt) {
    if (!w) return KDLOSS_OK;
    for (int64_t r = 0; r < bt; r++) {
        float x = w[r];
        if (!(x >= 0.0f && x <= FLT_MAX)) { /* NaN fails both compares */
            kd_detail("row_weights[%lld] = %g is not finite and >= 0", (long long)r, (double)x);
            return KDLOSS_ERR_INVALID_PARAM;
        }
    }
    return KDLOSS_OK;
}

/* KDLOSS_ERR_INVALID_PARAM with its detail. */
static kdloss_status bad_param(const char *what, double value, const char *want) {
    kd_detail("%s = %g: %s", what, value, want);
    return KDLOSS_ERR_INVALID_PARAM;
}

kdloss_status kd_kl_check_args(const kdloss_kl_params *p, int64_t bt, int64_t v, int has_loss,
                               int has_elem) {
    kd_detail_clear();
    if (!p) return kd_named("params", KDLOSS_ERR_NULL_POINTER);
    if (bt <= 0 || v <= 0) {
        kd_detail("bt %lld, v %lld: sizes must be positive", (long long)bt, (long long)v);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    if (p->reduction < KDLOSS_REDUCTION_NONE || p->reduction > KDLOSS_REDUCTION_BATCHMEAN) {
        kd_detail("reduction %d is not none, sum, mean or batchmean", (int)p->reduction);
        return KDLOSS_ERR_INVALID_REDUCTION;
    }
    /* eps and the gradient factor are used as fp32: they must stay finite there */
    if (p->log_target != 0 && p->log_target != 1)
        return bad_param("log_target", p->log_target, "must be 0 or 1");
    if (!(p->eps >= 0.0) || !kd_fp32_finite(p->eps))
        return bad_param("eps", p->eps, "must be >= 0 and a finite fp32");
    if (!kd_fp32_finite(p->grad_scale) ||
        !kd_fp32_finite(kd_kl_reduction_scale(p->reduction, bt, v) * p->grad_scale))
        return bad_param("grad_scale", p->grad_scale,
                         "it and its product with the reduction's scale must be finite fp32");
    int none = p->reduction == KDLOSS_REDUCTION_NONE;
    /* "none" has no scalar loss; an elementwise loss exists only for "none" */
    if (none && has_loss) {
        kd_detail("loss: reduction none has no scalar loss (row_loss and elem_loss do)");
        return KDLOSS_ERR_INVALID_PARAM;
    }
    if (!none && has_elem) {
        kd_detail("elem_loss: only with reduction none (this call's is %d)", (int)p->reduction);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    return KDLOSS_OK;
}

double kd_kl_reduction_scale(kdloss_reduction r, int64_t bt, int64_t v) {
    switch (r) {
    case KDLOSS_REDUCTION_MEAN: return 1.0 / ((double)bt * (double)v);
    case KDLOSS_REDUCTION_BATCHMEAN: return 1.0 / (double)bt;
    default: return 1.0;
    }
}

/* The fused losses' defaults, here beside their checks: both backends (and a CUDA-only build)
 * take them from src/common. */
void kdloss_fljsd_params_default(kdloss_fljsd_params *p) {
    if (!p) return;
    p->beta = 0.5;
    p->temperature = 1.0;
    p->weight_hard_loss = 0.5;
    p->weight_soft_loss = 0.5;
    p->ignore_index = -100;
    p->chunk_size = 0;
    p->memory_budget = 0;
    p->grad_scale = 1.0;
}

void kdloss_fused_linear_distill_params_default(kdloss_fused_linear_distill_params *p) {
    if (!p) return;
    kdloss_div_params_default(&p->div);
    p->div.divergence = KDLOSS_DIV_JSD;
    p->temperature = 1.0;
    p->weight_hard_loss = 0.5;
    p->weight_soft_loss = 0.5;
    p->t2_scale = 0;
    p->ignore_index = -100;
    p->chunk_size = 0;
    p->memory_budget = 0;
    p->grad_scale = 1.0;
    p->student_map = (kdloss_logit_map){1.0, 0.0};
    p->teacher_map = (kdloss_logit_map){1.0, 0.0};
    p->row_weights = NULL; /* every row weighs 1 */
}

/* Fused-linear parameter and size checks, shared by the CPU and CUDA backends (their size
 * queries and calls), so both return the same codes. */

/* A head's logit map (kdloss.h): scale 0 (the identity) or a positive finite fp32; softcap 0 or
 * positive with softcap, 1/softcap and scale/softcap finite fp32 (they are used as fp32). */
static kdloss_status check_map(const char *who, kdloss_logit_map m) {
    char what[32];
    snprintf(what, sizeof what, "%s.scale", who);
    if (!(m.scale >= 0.0) || !kd_fp32_finite(m.scale))
        return bad_param(what, m.scale, "must be 0 (the identity) or > 0, a finite fp32");
    snprintf(what, sizeof what, "%s.softcap", who);
    double s = kd_logit_map_scale(m);
    if (!(m.softcap >= 0.0) ||
        (m.softcap != 0.0 && (!kd_fp32_normal_pos(m.softcap) || !kd_fp32_finite(s / m.softcap))))
        return bad_param(what, m.softcap,
                         "must be 0 (none) or > 0, a normal fp32, with 1/softcap and "
                         "scale/softcap finite fp32");
    return KDLOSS_OK;
}

kdloss_status kd_fld_check_params(const kdloss_fused_linear_distill_params *p) {
    kdloss_status st = kd_div_check(&p->div);
    if (st != KDLOSS_OK) return st;
    if (!kd_fp32_normal_pos(p->temperature)) /* the rule of every loss on logits (check.h) */
        return bad_param("temperature", p->temperature,
                         "must be > 0, a finite normal fp32, with 1/T finite");
    if (!(p->weight_hard_loss >= 0.0) || !isfinite(p->weight_hard_loss))
        return bad_param("weight_hard_loss", p->weight_hard_loss, "must be >= 0 and finite");
    if (!(p->weight_soft_loss >= 0.0) || !isfinite(p->weight_soft_loss))
        return bad_param("weight_soft_loss", p->weight_soft_loss, "must be >= 0 and finite");
    if (p->t2_scale != 0 && p->t2_scale != 1)
        return bad_param("t2_scale", p->t2_scale, "must be 0 or 1");
    /* T^2 times a divergence of ~1/T^2 formed in fp32: beyond KD_T2_SCALE_MAX_T the rounding of
     * the log-probs (~1e-7 absolute, random per element) times T^2 is no longer small against
     * the loss (kdloss.h) */
    if (p->t2_scale && p->temperature > KD_T2_SCALE_MAX_T)
        return bad_param("temperature", p->temperature,
                         "with t2_scale must be at most KD_T2_SCALE_MAX_T (kdloss.h)");
    if (!kd_fp32_finite(p->grad_scale))
        return bad_param("grad_scale", p->grad_scale, "must be a finite fp32");
    if (p->chunk_size < 0) return bad_param("chunk_size", (double)p->chunk_size, "must be >= 0");
    /* the gradient factors the row kernels use in fp32, at their largest (n_valid = 1):
     * grad_scale w_soft (T^2 or 1) / (n_valid T) and grad_scale w_hard / n_valid */
    if ((st = check_map("student_map", p->student_map)) != KDLOSS_OK ||
        (st = check_map("teacher_map", p->teacher_map)) != KDLOSS_OK)
        return st;
    /* ... times the student map's scale, which the row pass folds into them (logit_map.h) */
    double t_fac = p->t2_scale ? p->temperature : 1.0 / p->temperature;
    double s = kd_logit_map_scale(p->student_map);
    if (!kd_fp32_finite(p->grad_scale * p->weight_soft_loss * t_fac * s) ||
        !kd_fp32_finite(p->grad_scale * p->weight_hard_loss * s))
        return bad_param("grad_scale", p->grad_scale,
                         "times the loss weights, temperature factor and student_map.scale must "
                         "stay a finite fp32");
    return KDLOSS_OK;
}

kdloss_fused_linear_distill_params kd_fld_from_jsd(const kdloss_fljsd_params *p) {
    kdloss_fused_linear_distill_params d;
    kdloss_fused_linear_distill_params_default(&d);
    d.div.divergence = KDLOSS_DIV_JSD;
    d.div.beta = p->beta;
    d.temperature = p->temperature;
    d.weight_hard_loss = p->weight_hard_loss;
    d.weight_soft_loss = p->weight_soft_loss;
    d.t2_scale = 0;
    d.ignore_index = p->ignore_index;
    d.chunk_size = p->chunk_size;
    d.memory_budget = p->memory_budget;
    d.grad_scale = p->grad_scale;
    return d;
}

kdloss_fused_linear_distill_out kd_fld_out_from_jsd(const kdloss_fljsd_out *o) {
    kdloss_fused_linear_distill_out d = {o->loss, o->soft_loss, o->hard_loss, o->dxs, o->dws,
                                         o->dbs, NULL, NULL, NULL, NULL};
    return d;
}

kdloss_status kd_fld_check_sizes(int64_t bt, int64_t hs, int64_t ht, int64_t v) {
    if (bt <= 0 || hs <= 0 || ht <= 0 || v <= 0) { /* the first bad one named */
        const char *what = bt <= 0   ? "bt (rows of student_input)"
                           : hs <= 0 ? "hs (the student's hidden size, student_input's columns)"
                           : ht <= 0 ? "ht (the teacher's hidden size, teacher_input's columns)"
                                     : "v (the vocabulary, student_weight's rows)";
        kd_detail("%s is %lld: must be positive (bt %lld, hs %lld, ht %lld, v %lld)", what,
                  (long long)(bt <= 0 ? bt : hs <= 0 ? hs : ht <= 0 ? ht : v), (long long)bt,
                  (long long)hs, (long long)ht, (long long)v);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    /* GEMM dimensions are CBLAS ints */
    if (hs > INT32_MAX || ht > INT32_MAX || v > INT32_MAX) {
        kd_detail("hs %lld, ht %lld, v %lld: GEMM dimensions must fit a 32-bit int",
                  (long long)hs, (long long)ht, (long long)v);
        return KDLOSS_ERR_UNSUPPORTED;
    }
    return KDLOSS_OK;
}
