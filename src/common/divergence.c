/* Names, defaults and the parameter check of the divergence family (kdloss.h), shared by every
 * backend and every op that takes a kdloss_div_params; the names come from the registry
 * (KD_DIVERGENCES, div_coef.h). */
#include <string.h>

#include "check.h"
#include "div_coef.h"

/* The names, in kdloss_divergence order (the registry's rows, div_coef.h). */
static const char *const DIV_NAMES[] = {
#define KD_DIV_NAME(E, name, P, b) name,
    KD_DIVERGENCES(KD_DIV_NAME)
#undef KD_DIV_NAME
};
#define N_DIV ((int)(sizeof DIV_NAMES / sizeof DIV_NAMES[0]))
_Static_assert(N_DIV == KDLOSS_DIV_COUNT, "a kdloss_divergence without its registry row, or "
                                          "a registry row without its enum value");
/* each row's position is its enum value */
enum {
#define KD_DIV_POS(E, name, P, b) KD_DIV_POS_##E,
    KD_DIVERGENCES(KD_DIV_POS)
#undef KD_DIV_POS
};
#define KD_DIV_SAME(E, name, P, b)                                                             \
    _Static_assert((int)KD_DIV_POS_##E == (int)KDLOSS_DIV_##E, "registry order: " name);
KD_DIVERGENCES(KD_DIV_SAME)
#undef KD_DIV_SAME

void kdloss_div_params_default(kdloss_div_params *p) {
    if (!p) return;
    p->divergence = KDLOSS_DIV_FORWARD_KL;
    p->beta = 0.5;
    p->alpha = 0.1;
}

const char *kdloss_divergence_name(kdloss_divergence d) {
    return (int)d >= 0 && (int)d < N_DIV ? DIV_NAMES[d] : "unknown";
}

kdloss_status kdloss_divergence_from_name(const char *name, kdloss_divergence *d) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!name || !d) return KDLOSS_ERR_NULL_POINTER;
    for (int i = 0; i < N_DIV; i++)
        if (!strcmp(name, DIV_NAMES[i])) {
            *d = (kdloss_divergence)i;
            return KDLOSS_OK;
        }
    return KDLOSS_ERR_INVALID_PARAM;
}

kdloss_status kd_div_check(const kdloss_div_params *d) {
    kd_detail_clear(); /* the first check of every entry point that takes a divergence */
    if ((int)d->divergence < 0 || (int)d->divergence >= N_DIV) {
        kd_detail("divergence %d is not one of the %d (kdloss_divergence_name)", (int)d->divergence,
                  N_DIV);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    /* both are checked whatever the divergence, so a bad value never hides (NaN fails too) */
    if (!(d->beta >= 0.0 && d->beta <= 1.0) || !(d->alpha >= 0.0 && d->alpha <= 1.0)) {
        kd_detail("beta %g and alpha %g must both lie in [0, 1] (whichever divergence)", d->beta,
                  d->alpha);
        return KDLOSS_ERR_INVALID_PARAM;
    }
    return KDLOSS_OK;
}

void kdloss_distill_params_default(kdloss_distill_params *p) {
    if (!p) return;
    kdloss_div_params_default(&p->div);
    p->ignore_index = -100;
    p->grad_scale = 1.0;
}

kdloss_status kd_distill_check_params(const kdloss_distill_params *p) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    kdloss_status st = kd_div_check(&p->div);
    if (st != KDLOSS_OK) return st;
    /* grad_scale / n_valid is used as an fp32: grad_scale must be one */
    if (kd_fp32_finite(p->grad_scale)) return KDLOSS_OK;
    kd_detail("grad_scale = %g: must be a finite fp32", p->grad_scale);
    return KDLOSS_ERR_INVALID_PARAM;
}

/* Here rather than with the CPU function: the CUDA entry takes the same parameters, and a
 * CUDA-only build (bench/gpu_check.sh's fallback) has src/common but no CPU kernels. */
void kdloss_distill_logits_params_default(kdloss_distill_logits_params *p) {
    if (!p) return;
    kdloss_div_params_default(&p->div);
    p->temperature = 1.0;
    p->ignore_index = -100;
    p->grad_scale = 1.0;
    p->row_weights = NULL; /* every row weighs 1 */
    p->row_entropy = NULL; /* not wanted */
}

kdloss_status kd_distill_logits_check_params(const kdloss_distill_logits_params *p) {
    if (!p) return KDLOSS_ERR_NULL_POINTER;
    const kdloss_distill_params dp = {p->div, p->ignore_index, p->grad_scale};
    kdloss_status st = kd_distill_check_params(&dp);
    if (st != KDLOSS_OK) return st;
    if (kd_temperature_ok(p->temperature, p->grad_scale)) return KDLOSS_OK;
    kd_detail("temperature %g with grad_scale %g: T > 0, T, 1/T and grad_scale / T finite fp32",
              p->temperature, p->grad_scale);
    return KDLOSS_ERR_INVALID_PARAM;
}

kdloss_distill_params kd_distill_from_jsd(const kdloss_jsd_params *p) {
    kdloss_distill_params d;
    kdloss_distill_params_default(&d);
    d.div.divergence = KDLOSS_DIV_JSD;
    d.div.beta = p->beta;
    d.ignore_index = p->ignore_index;
    d.grad_scale = p->grad_scale;
    return d;
}
