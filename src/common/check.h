/* Argument checks shared by every backend. Each returns KDLOSS_OK or the status the public
 * function must return; none writes anything the caller owns. */
#ifndef KDLOSS_CHECK_H
#define KDLOSS_CHECK_H

#include <stdint.h>

#include "kdloss.h"

#ifdef __cplusplus
extern "C" { /* the CUDA sources (C++) call these C functions */
#endif

/* Bytes [lo, hi) a matrix view spans; lo == hi for an absent view. */
typedef struct kd_span {
    const char *lo;
    const char *hi;
} kd_span;

/* 1 if p is a multiple of `align` bytes (NULL is aligned). */
static inline int kd_aligned(const void *p, size_t align) {
    return align == 0 || (uintptr_t)p % align == 0;
}

/* 1 if x is finite and stays finite when rounded to fp32: |x| below FLT_MAX + half an ulp
 * (NaN fails the comparison). */
static inline int kd_fp32_finite(double x) {
    return x < 0x1.ffffffp+127 && x > -0x1.ffffffp+127;
}

/* 1 if x > 0 is a finite, normal fp32 whose reciprocal is a finite fp32: the one rule for a
 * temperature (every loss on logits: the distillation, top-k and fused losses, both backends)
 * and a softcap. A subnormal T makes the logit gaps / T overflow (an inf loss where 2.5e38 is
 * finite) and a subnormal cap carries too few bits for z / cap near the cap's saturation (the
 * gradient factor 1 - (z / cap)^2 is then not 0); a T or cap beyond FLT_MAX is no fp32. */
static inline int kd_fp32_normal_pos(double x) {
    return x > 0.0 && kd_fp32_finite(x) && (float)x >= 0x1p-126f && kd_fp32_finite(1.0 / x);
}

/* 1 if T passes kd_fp32_normal_pos and grad_scale and grad_scale / T are finite fp32 values:
 * the losses on logits scale the logits by 1/T and the gradient by grad_scale / T, in fp32. */
static inline int kd_temperature_ok(double t, double grad_scale) {
    return kd_fp32_normal_pos(t) && kd_fp32_finite(grad_scale) && kd_fp32_finite(grad_scale / t);
}

/* 1 for F32, BF16, F16. */
int kd_is_float_dtype(kdloss_dtype dt);

/* kdloss_error_detail's thread-local text: kd_detail sets it (printf format), kd_detail_clear
 * empties it (at the start of each entry point's checks), kd_named(name, st) prefixes it with
 * the operand's name when st is an error (the status string when no detail was set) and
 * returns st. */
void kd_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kd_detail_clear(void);
kdloss_status kd_named(const char *name, kdloss_status st);

/* Checks a (rows x cols) view whose data must be non-NULL: dtype in the allowed float set,
 * ld >= cols (0 means cols), byte size representable. Writes the effective ld and the span. */
kdloss_status kd_check_fmat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                            int64_t ld, int64_t *ld_out, kd_span *span);

/* kd_check_fmat for a view of any known dtype (the teacher's int ids). */
kdloss_status kd_check_mat(int64_t rows, int64_t cols, const void *data, kdloss_dtype dt,
                           int64_t ld, int64_t *ld_out, kd_span *span);

/* Span of a contiguous vector of n elements of `elem` bytes (NULL data gives an empty span). */
kd_span kd_vec_span(const void *data, int64_t n, size_t elem);

/* 1 if the two spans share a byte. Empty spans overlap nothing. */
int kd_spans_overlap(kd_span a, kd_span b);

/* Checks labels (I64 or I32, non-NULL) : each is ignore_index or in [0, v).
 * Counts the rows that are not ignored into *n_valid. */
kdloss_status kd_check_labels(kdloss_labels labels, int64_t bt, int64_t v, int64_t ignore_index,
                              int64_t *n_valid);
/* kd_check_labels without reading them (device memory): non-NULL, I64 or I32, and aligned to
 * their element size when `align`. */
kdloss_status kd_check_label_view(kdloss_labels labels, int align);
/* The sparse teacher's ids by value (host memory, effective ld or 0): each -1 or in [0, v), no
 * used id twice in a row; else KDLOSS_ERR_INVALID_ID. OUT_OF_MEMORY when its scratch (v bits,
 * on the stack up to 2^18 ids) cannot be allocated (src/common/topk_ids.c). */
kdloss_status kd_topk_check_ids(kdloss_topk_teacher t, int64_t bt, int64_t v);

/* Per-row weights (host memory, docs/MATH.md section 12): NULL is valid (every row weighs 1);
 * else each of the bt weights finite and >= 0, or KDLOSS_ERR_INVALID_PARAM naming the first bad
 * one. */
kdloss_status kd_check_row_weights(const float *w, int64_t bt);
/* Whether row r is kept: its label is not ignore_index (no labels: every label kept) and its
 * weight, when weights are given, is not 0. */
static inline int kd_row_weight_keeps(const float *w, int64_t r) { return !w || w[r] != 0.0f; }

/* Label of row r as int64 (labels already checked). */
static inline int64_t kd_label_at(kdloss_labels labels, int64_t r) {
    return labels.dtype == KDLOSS_I64 ? ((const int64_t *)labels.data)[r]
                                      : (int64_t)((const int32_t *)labels.data)[r];
}

/* KL: params, sizes, reduction and the loss / elementwise-loss outputs it allows (has_loss,
 * has_elem: whether those outputs were given), in the order both backends report them. */
kdloss_status kd_kl_check_args(const kdloss_kl_params *p, int64_t bt, int64_t v, int has_loss,
                               int has_elem);
/* Loss scale of a reduction: 1 (none, sum), 1/(BT*V) (mean), 1/BT (batchmean). */
double kd_kl_reduction_scale(kdloss_reduction r, int64_t bt, int64_t v);

/* The divergence and its beta, alpha (d not NULL): INVALID_PARAM when out of range. */
kdloss_status kd_div_check(const kdloss_div_params *d);

/* kdloss_distill parameters (NULL -> NULL_POINTER), shared by the CPU and CUDA backends. */
kdloss_status kd_distill_check_params(const kdloss_distill_params *p);
/* kdloss_distill_logits parameters (NULL -> NULL_POINTER): kdloss_distill's and the
 * temperature, shared by the CPU and CUDA backends. */
kdloss_status kd_distill_logits_check_params(const kdloss_distill_logits_params *p);
/* kdloss_jsd's parameters as kdloss_distill's (divergence JSD). */
kdloss_distill_params kd_distill_from_jsd(const kdloss_jsd_params *p);

/* Fused-linear parameters (p not NULL) and sizes, shared by the CPU and CUDA backends. */
/* The largest temperature the fused losses accept with t2_scale (kdloss.h). */
#define KD_T2_SCALE_MAX_T 100.0

kdloss_status kd_fld_check_params(const kdloss_fused_linear_distill_params *p);
/* kdloss_fljsd_params / _out as the fused_linear_distill ones (divergence JSD, no T^2). */
kdloss_fused_linear_distill_params kd_fld_from_jsd(const kdloss_fljsd_params *p);
kdloss_fused_linear_distill_out kd_fld_out_from_jsd(const kdloss_fljsd_out *o);
kdloss_status kd_fld_check_sizes(int64_t bt, int64_t hs, int64_t ht, int64_t v);

/* The sparse top-k teacher (src/common/topk.c). The divergence, and the tail mode it may be
 * used with (renorm_teacher: forward KL only). */
kdloss_status kd_topk_check_tail(const kdloss_div_params *d, kdloss_topk_tail tail);
/* kdloss_topk_distill_logits's parameters (NULL -> NULL_POINTER). */
kdloss_status kd_topk_check_logits_params(const kdloss_topk_distill_params *p);
/* The fused top-k parameters: the tail, then every check of the dense fused loss. */
kdloss_status kd_topk_check_fused_params(const kdloss_fused_linear_topk_distill_params *p);
/* The fused top-k parameters as the dense fused loss's (the tail dropped). */
kdloss_fused_linear_distill_params kd_topk_fld_params(
    const kdloss_fused_linear_topk_distill_params *p);
/* The teacher's views for BT rows: K >= 1, ids I32 / I64 and log-probs a float dtype, each
 * (BT x K) with a valid ld (effective ld written out) and aligned. Not the ids' values. */
kdloss_status kd_topk_check_teacher(kdloss_topk_teacher t, int64_t bt, kd_span *ids_span,
                                    kd_span *lp_span, int64_t *ld_ids, int64_t *ld_lp);

#ifdef __cplusplus
}
#endif

#endif /* KDLOSS_CHECK_H */
