/* Row kernels of the elementwise divergences (KL, the divergence family) on the CPU. One job describes a whole
 * call; a row function processes one row and returns that row's loss sum (in double). */
#ifndef KDLOSS_CPU_ELEMENTWISE_H
#define KDLOSS_CPU_ELEMENTWISE_H

#include <string.h>

#include "div_coef.h"
#include "isa.h"
#include "kdloss.h"

/* Columns per tile: inputs in bf16/fp16 are converted tile by tile into fp32 stack buffers
 * (3 x 4 KiB, stays in L1), and each tile's fp32 lane sums go into a double, so no fp32
 * accumulator ever sums more than TILE / lanes terms. */
#define KD_TILE 1024

typedef struct kd_ew_job {
    int64_t v;
    const char *x; /* KL input y / student X, (BT x V) of xdt with row stride ldx */
    kdloss_dtype xdt;
    int64_t ldx;
    const char *t; /* KL target / teacher Y, (BT x V) of tdt */
    kdloss_dtype tdt;
    int64_t ldt;
    char *g; /* gradient (BT x V) of xdt, or NULL */
    int64_t ldg;
    float *elem; /* KL reduction "none": elementwise loss (BT x V) fp32, or NULL */
    int64_t lde;
    float gscale;  /* multiplies every gradient element */
    int want_loss; /* 0: only the gradient is wanted (KL then never reads x) */
    int stream_grad; /* gradient larger than the caches: write it with non-temporal stores */
    int log_target;
    float eps;
    kd_div_coef coef;     /* the family's element operation (kdloss_distill) */
    kdloss_labels labels; /* labels.data NULL: no labels */
    int64_t ignore_index;
} kd_ew_job;

typedef double (*kd_row_fn)(const kd_ew_job *job, int64_t row);

/* One of each per ISA of the registry (isa.h): elementwise_scalar.c's, elementwise_vec.c's. */
#define KD_EW_DECL(ID, name, layer, has, flags)                                                 \
    double kd_kl_row_##name(const kd_ew_job *job, int64_t row);                                \
    double kd_div_row_##name(const kd_ew_job *job, int64_t row);
KD_ISAS(KD_EW_DECL)
#undef KD_EW_DECL

/* Gradients above this many bytes are streamed (non-temporal stores): larger than a typical
 * last-level cache, they would be evicted before anyone reads them anyway. */
#define KD_STREAM_BYTES ((int64_t)32 << 20)

/* Runs fn over rows [0, bt) on OpenMP threads and returns the sum of the row values, added in
 * an order that depends on bt alone (so results do not change with the thread count).
 * row_loss, if not NULL, receives each row's value as fp32. */
double kd_rows_sum(int64_t bt, kd_row_fn fn, const kd_ew_job *job, float *row_loss);

/* The same sum for row values already computed (rl[bt], in double), for a caller that runs its
 * rows its own way: the same bits as kd_rows_sum with those values. */
double kd_rows_total(int64_t bt, const double *rl, float *row_loss);

/* kd_rows_sum and kd_rows_total with per-row weights w[bt] (or NULL: the functions above): the
 * total is sum w[r] value[r] (docs/MATH.md section 12), row_loss the unweighted values. */
double kd_rows_sum_w(int64_t bt, kd_row_fn fn, const kd_ew_job *job, const float *w,
                     float *row_loss);
double kd_rows_total_w(int64_t bt, const double *rl, const float *w, float *row_loss);

/* 1 if a call of bt rows of v columns is worth running on OpenMP threads (kd_rows_sum's test). */
int kd_rows_parallel(int64_t bt, int64_t v);

/* 1 if row r is skipped because its label is ignore_index. */
static inline int kd_row_ignored(const kd_ew_job *j, int64_t r) {
    if (!j->labels.data) return 0;
    int64_t y = j->labels.dtype == KDLOSS_I64 ? ((const int64_t *)j->labels.data)[r]
                                               : (int64_t)((const int32_t *)j->labels.data)[r];
    return y == j->ignore_index;
}

/* The NaN policy (kdloss.h) on log-prob inputs: ck, the row's sum of (x + y) 2^-100 (per lane,
 * then across lanes; each term at most 2^28, so no finite row overflows it), is NaN or +inf
 * exactly when some x or y is NaN or +inf. */
static inline int kd_poisoned(float ck) { return !(ck < __builtin_inff()); }

/* A poisoned row: every element of its gradient (grow, dtype xdt; zeros when the gradient
 * factor is 0) and of its elementwise loss (erow) NaN; returns the row's NaN value. */
static inline double kd_poison_row(const kd_ew_job *j, char *grow, float *erow) {
    if (grow) {
        float g = j->gscale != 0.0f ? __builtin_nanf("") : 0.0f;
        for (int64_t c = 0; c < j->v; c++) {
            if (j->xdt == KDLOSS_F32) ((float *)grow)[c] = g;
            else ((uint16_t *)grow)[c] = g == 0.0f ? 0 : j->xdt == KDLOSS_BF16 ? 0x7fc0 : 0x7e00;
        }
    }
    if (erow)
        for (int64_t c = 0; c < j->v; c++) erow[c] = __builtin_nanf("");
    return __builtin_nan("");
}

/* A gradient factor of 0 writes zeros (kdloss.h), also where the unscaled element is infinite
 * (reverse KL at a teacher's -inf log-prob: inf x 0 would be NaN): a row kernel then runs its row
 * without a gradient and, once it has read the row (the gradient may overwrite the input in
 * place), zeros the gradient row gz (when not NULL) here; returns ret. One branch a row. */
static inline double kd_zero_grad_row(const kd_ew_job *j, char *gz, double ret) {
    if (gz) memset(gz, 0, (size_t)j->v * kdloss_dtype_size(j->xdt));
    return ret;
}

#endif
