#include <stdlib.h>

#include "elementwise.h"
#include "omp_team.h"

/* At most this many row blocks: their partial sums live on the stack. */
#define KD_MAX_BLOCKS 1024

/* Threads only pay off once there is real work: ~64K elements. */
int kd_rows_parallel(int64_t bt, int64_t v) { return bt > 1 && bt * v >= 65536 && kd_omp_team(); }

double kd_rows_sum(int64_t bt, kd_row_fn fn, const kd_ew_job *job, float *row_loss) {
    return kd_rows_sum_w(bt, fn, job, NULL, row_loss);
}

/* A row's share of the total: its value, times its weight when weights are given (docs/MATH.md
 * section 12; a weight of 1 multiplies exactly, so all-1 weights give the unweighted bits). */
static inline double row_term(const float *w, int64_t r, double l) {
    return w ? (double)w[r] * l : l;
}

double kd_rows_sum_w(int64_t bt, kd_row_fn fn, const kd_ew_job *job, const float *w,
                     float *row_loss) {
    double part[KD_MAX_BLOCKS];
    int64_t bs = (bt + KD_MAX_BLOCKS - 1) / KD_MAX_BLOCKS; /* rows per block */
    int64_t nb = (bt + bs - 1) / bs;
#pragma omp parallel for schedule(static) if (kd_rows_parallel(bt, job->v))
    for (int64_t b = 0; b < nb; b++) {
        int64_t r1 = (b + 1) * bs < bt ? (b + 1) * bs : bt;
        double s = 0.0;
        for (int64_t r = b * bs; r < r1; r++) {
            double l = fn(job, r);
            if (row_loss) row_loss[r] = (float)l;
            s += row_term(w, r, l);
        }
        part[b] = s;
    }
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += part[b];
    return total;
}

double kd_rows_total(int64_t bt, const double *rl, float *row_loss) {
    return kd_rows_total_w(bt, rl, NULL, row_loss);
}

double kd_rows_total_w(int64_t bt, const double *rl, const float *w, float *row_loss) {
    int64_t bs = (bt + KD_MAX_BLOCKS - 1) / KD_MAX_BLOCKS; /* kd_rows_sum's blocks */
    double total = 0.0;
    for (int64_t r0 = 0; r0 < bt; r0 += bs) {
        int64_t r1 = r0 + bs < bt ? r0 + bs : bt;
        double s = 0.0;
        for (int64_t r = r0; r < r1; r++) {
            if (row_loss) row_loss[r] = (float)rl[r];
            s += row_term(w, r, rl[r]);
        }
        total += s;
    }
    return total;
}
