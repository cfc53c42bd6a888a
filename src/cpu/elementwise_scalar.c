/* Portable scalar path of the KL and divergence-family row kernels: the per-element functions of
 * div_math.h (the very ones the CUDA kernels run), tile by tile like the vector paths. */
#include <string.h>

#include "div_math.h"
#include "elementwise.h"
#include "half.h"

static float ld_elem(const char *row, kdloss_dtype dt, int64_t c) {
    switch (dt) {
    case KDLOSS_BF16: return kd_bf16_to_f32(((const uint16_t *)row)[c]);
    case KDLOSS_F16: return kd_f16_to_f32(((const uint16_t *)row)[c]);
    default: return ((const float *)row)[c];
    }
}

static void st_elem(char *row, kdloss_dtype dt, int64_t c, float x) {
    switch (dt) {
    case KDLOSS_BF16: ((uint16_t *)row)[c] = kd_f32_to_bf16(x); break;
    case KDLOSS_F16: ((uint16_t *)row)[c] = kd_f32_to_f16(x); break;
    default: ((float *)row)[c] = x; break;
    }
}

double kd_kl_row_scalar(const kd_ew_job *j, int64_t r) {
    size_t xes = kdloss_dtype_size(j->xdt), tes = kdloss_dtype_size(j->tdt);
    const char *xrow = j->x + (size_t)(r * j->ldx) * xes;
    const char *trow = j->t + (size_t)(r * j->ldt) * tes;
    char *grow = j->g ? j->g + (size_t)(r * j->ldg) * xes : NULL;
    float *erow = j->elem ? j->elem + r * j->lde : NULL;
    double sum = 0.0;
    float ck = 0.0f; /* the NaN policy: kd_poisoned */
    int grad_only = !j->want_loss && !erow;
    char *gz = grow && j->gscale == 0.0f ? grow : NULL; /* kd_zero_grad_row */
    if (gz) {
        grow = NULL;
        if (grad_only) return kd_zero_grad_row(j, gz, 0.0);
    }
    for (int64_t c0 = 0; c0 < j->v; c0 += KD_TILE) {
        int64_t c1 = c0 + KD_TILE < j->v ? c0 + KD_TILE : j->v;
        float acc = 0.0f;
        for (int64_t c = c0; c < c1; c++) {
            float t = ld_elem(trow, j->tdt, c), gr, l;
            if (grad_only) { /* gradient only: the input is never read */
                gr = j->log_target ? -expf(t) : -t;
                l = 0.0f;
            } else {
                float y = ld_elem(xrow, j->xdt, c);
                ck += y * 0x1p-100f + t * 0x1p-100f;
                l = kd_kl_elem(j->log_target, j->eps, y, t, &gr);
            }
            acc += l;
            if (erow) erow[c] = l;
            if (grow) st_elem(grow, j->xdt, c, gr * j->gscale);
        }
        sum += acc;
    }
    if (!grad_only && kd_poisoned(ck)) return kd_zero_grad_row(j, gz, kd_poison_row(j, grow, erow));
    return kd_zero_grad_row(j, gz, sum);
}

double kd_div_row_scalar(const kd_ew_job *j, int64_t r) {
    size_t xes = kdloss_dtype_size(j->xdt), tes = kdloss_dtype_size(j->tdt);
    char *grow = j->g ? j->g + (size_t)(r * j->ldg) * xes : NULL;
    if (kd_row_ignored(j, r)) {
        if (grow) memset(grow, 0, (size_t)j->v * xes);
        return 0.0;
    }
    const char *xrow = j->x + (size_t)(r * j->ldx) * xes;
    const char *trow = j->t + (size_t)(r * j->ldt) * tes;
    double sum = 0.0;
    float ck = 0.0f; /* the NaN policy: kd_poisoned */
    char *gz = grow && j->gscale == 0.0f ? grow : NULL; /* kd_zero_grad_row */
    if (gz) grow = NULL;
    for (int64_t c0 = 0; c0 < j->v; c0 += KD_TILE) {
        int64_t c1 = c0 + KD_TILE < j->v ? c0 + KD_TILE : j->v;
        float acc = 0.0f;
        for (int64_t c = c0; c < c1; c++) {
            float gr, x = ld_elem(xrow, j->xdt, c), y = ld_elem(trow, j->tdt, c);
            ck += x * 0x1p-100f + y * 0x1p-100f;
            acc += kd_div_elem(&j->coef, x, y, &gr);
            if (grow) st_elem(grow, j->xdt, c, gr * j->gscale);
        }
        sum += acc;
    }
    if (kd_poisoned(ck)) return kd_zero_grad_row(j, gz, kd_poison_row(j, grow, NULL));
    return kd_zero_grad_row(j, gz, sum);
}
