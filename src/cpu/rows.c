#include <stdlib.h>

#include "elementwise.h"

/* At most this many row blocks: their partial sums live on the stack. */
#define KD_MAX_BLOCKS 1024

double kd_rows_sum(int64_t bt, kd_row_fn fn, const kd_ew_job *job, float *row_loss) {
    double part[KD_MAX_BLOCKS];
    int64_t bs = (bt + KD_MAX_BLOCKS - 1) / KD_MAX_BLOCKS; /* rows per block */
    int64_t nb = (bt + bs - 1) / bs;
    /* Threads only pay off once there is real work: ~64K elements. */
    int par = bt > 1 && bt * job->v >= 65536;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r1 = (b + 1) * bs < bt ? (b + 1) * bs : bt;
        double s = 0.0;
        for (int64_t r = b * bs; r < r1; r++) {
            double l = fn(job, r);
            if (row_loss) row_loss[r] = (float)l;
            s += l;
        }
        part[b] = s;
    }
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += part[b];
    return total;
}
