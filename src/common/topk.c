/* Names, defaults and the host-side checks of the sparse top-k teacher (kdloss.h), shared by
 * every backend: the tail mode and its divergence, the teacher's views (shape, dtypes, strides,
 * alignment), and the fused parameters as the dense fused loss's. The ids' VALUES are checked
 * on the host when they are host memory (topk_ids.c, args.c); on the GPU they are device memory
 * and the kernels report them through the status word. */
#include <string.h>

#include "check.h"

static const char *const TAIL_NAMES[] = {"bucket", "renorm_both", "renorm_teacher"};
#define N_TAIL ((int)(sizeof TAIL_NAMES / sizeof TAIL_NAMES[0]))

const char *kdloss_topk_tail_name(kdloss_topk_tail t) {
    return (int)t >= 0 && (int)t < N_TAIL ? TAIL_NAMES[t] : "unknown";
}

kdloss_status kdloss_topk_tail_from_name(const char *name, kdloss_topk_tail *t) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!name || !t) return KDLOSS_ERR_NULL_POINTER;
    for (int i = 0; i < N_TAIL; i++)
        if (!strcmp(name, TAIL_NAMES[i])) {
            *t = (kdloss_topk_tail)i;
            return KDLOSS_OK;
        }
    return KDLOSS_ERR_INVALID_PARAM;
}

void kdloss_topk_distill_params_default(kdloss_topk_distill_params *p) {
    if (!p) return;
    kdloss_div_params_default(&p->div);
    p->tail = KDLOSS_TAIL_BUCKET;
    p->temperature = 1.0;
    p->ignore_index = -100;
    p->grad_scale = 1.0;
    p->row_weights = NULL; /* every row weighs 1 */
    p->row_entropy = NULL; /* not wanted */
}

void kdloss_fused_linear_topk_distill_params_default(kdloss_fused_linear_topk_distill_params *p) {
    if (!p) return;
    kdloss_div_params_default(&p->div);
    p->tail = KDLOSS_TAIL_BUCKET;
    p->temperature = 1.0;
    p->weight_hard_loss = 0.0;
    p->weight_soft_loss = 1.0;
    p->t2_scale = 0;
    p->ignore_index = -100;
    p->chunk_size = 0;
    p->memory_budget = 0;
    p->grad_scale = 1.0;
    p->student_map = (kdloss_logit_map){1.0, 0.0};
    p->row_weights = NULL; /* every row weighs 1 */
}

kdloss_status kd_topk_check_tail(const kdloss_div_params *d, kdloss_topk_tail tail) {
    kdloss_status st = kd_div_check(d);
    if (st != KDLOSS_OK) return st;
    if ((int)tail < 0 || (int)tail >= N_TAIL) {
        kd_detail("tail %d is not one of the %d (kdloss_topk_tail_name)", (int)tail, N_TAIL);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    /* renorm_teacher is a forward-KL convention, not a pair of distributions */
    if (tail == KDLOSS_TAIL_RENORM_TEACHER && d->divergence != KDLOSS_DIV_FORWARD_KL) {
        kd_detail("tail renorm_teacher takes forward_kl only, not %s",
                  kdloss_divergence_name(d->divergence));
        return KDLOSS_ERR_INVALID_PARAM;
    }
    return KDLOSS_OK;
}

kdloss_status kd_topk_check_logits_params(const kdloss_topk_distill_params *p) {
    kd_detail_clear(); /* the first check of its entry points */
    if (!p) return kd_named("params", KDLOSS_ERR_NULL_POINTER);
    kdloss_status st = kd_topk_check_tail(&p->div, p->tail);
    if (st != KDLOSS_OK) return st;
    if (kd_temperature_ok(p->temperature, p->grad_scale)) return KDLOSS_OK;
    kd_detail("temperature %g with grad_scale %g: T > 0, T, 1/T and grad_scale / T finite fp32",
              p->temperature, p->grad_scale);
    return KDLOSS_ERR_INVALID_PARAM;
}

kdloss_fused_linear_distill_params kd_topk_fld_params(
    const kdloss_fused_linear_topk_distill_params *p) {
    kdloss_fused_linear_distill_params d = {p->div,          p->temperature, p->weight_hard_loss,
                                            p->weight_soft_loss, p->t2_scale, p->ignore_index,
                                            p->chunk_size,   p->memory_budget, p->grad_scale,
                                            p->student_map,  {1.0, 0.0},     p->row_weights};
    return d;
}

kdloss_status kd_topk_check_fused_params(const kdloss_fused_linear_topk_distill_params *p) {
    kd_detail_clear();
    if (!p) return kd_named("params", KDLOSS_ERR_NULL_POINTER);
    kdloss_status st = kd_topk_check_tail(&p->div, p->tail);
    if (st != KDLOSS_OK) return st;
    kdloss_fused_linear_distill_params d = kd_topk_fld_params(p);
    return kd_fld_check_params(&d);
}

kdloss_status kd_topk_check_teacher(kdloss_topk_teacher t, int64_t bt, kd_span *ids_span,
                                    kd_span *lp_span, int64_t *ld_ids, int64_t *ld_lp) {
    if (t.k <= 0) {
        kd_detail("teacher k = %lld: must be positive", (long long)t.k);
        return KDLOSS_ERR_INVALID_SIZE;
    }
    if (t.ids.dtype != KDLOSS_I32 && t.ids.dtype != KDLOSS_I64) {
        kd_detail("teacher ids: dtype %s, expected int32 or int64", kdloss_dtype_name(t.ids.dtype));
        return KDLOSS_ERR_INVALID_DTYPE;
    }
    kdloss_status st = kd_named(
        "teacher ids", kd_check_mat(bt, t.k, t.ids.data, t.ids.dtype, t.ids.ld, ld_ids, ids_span));
    if (st != KDLOSS_OK) return st;
    return kd_named("teacher logprobs", kd_check_fmat(bt, t.k, t.logprobs.data, t.logprobs.dtype,
                                                     t.logprobs.ld, ld_lp, lp_span));
}
