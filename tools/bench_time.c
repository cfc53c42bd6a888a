/* The timing loop shared by every kernel benchmark, its statistics, and peak RSS. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, gmtime_r under strict -std=c11 */

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "bench.h"

#define KB_FLUSH_BYTES ((size_t)64 << 20)     /* written between calls when the set is small */
#define KB_FLUSH_BELOW ((size_t)256 << 20)    /* working sets below this get the flush */

double kb_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

double kb_epoch_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kb_quantile(double *x, int64_t n, double q) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double pos = q * (double)(n - 1);
    int64_t lo = (int64_t)pos;
    if (lo >= n - 1) return x[n - 1];
    double frac = pos - (double)lo;
    return x[lo] + frac * (x[lo + 1] - x[lo]);
}

/* Writes every cache line of the flush buffer, in parallel like the kernels, so the lines of
 * the previous call's tensors are evicted from every core's caches and the shared L3. */
static void flush_caches(unsigned char *buf, size_t n, unsigned pass) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 64) buf[i] = (unsigned char)(i + pass);
}

static kb_pair_fn pair_fn; /* kb_time_pair_next's hook, taken by the next kb_time */
static void *pair_ctx;

void kb_time_pair_next(kb_pair_fn fn, void *ctx) {
    pair_fn = fn;
    pair_ctx = ctx;
}

kdloss_status kb_time(kb_call_fn fn, void *ctx, int64_t warmup, int64_t reps,
                      size_t working_set_bytes, kb_stats *out) {
    kb_pair_fn pf = pair_fn;
    void *pc = pair_ctx;
    pair_fn = NULL;
    if (reps < 1 || warmup < 0) return KDLOSS_ERR_INVALID_PARAM; /* no samples, no median */
    unsigned char *flush = NULL;
    if (working_set_bytes < KB_FLUSH_BELOW) flush = kb_alloc(KB_FLUSH_BYTES, "cache flush buffer");
    double *ns = malloc((size_t)reps * sizeof *ns);
    if (!ns) {
        kb_free(flush);
        return KDLOSS_ERR_OUT_OF_MEMORY;
    }
    kdloss_status st = KDLOSS_OK;
    for (int64_t k = 0; k < warmup && st == KDLOSS_OK; k++) st = fn(ctx);
    for (int64_t k = 0; k < reps && st == KDLOSS_OK; k++) {
        if (flush) flush_caches(flush, KB_FLUSH_BYTES, (unsigned)k);
        double t0 = kb_now_ns();
        st = fn(ctx);
        ns[k] = kb_now_ns() - t0;
        if (pf && st == KDLOSS_OK) pf(pc, ns[k]);
    }
    if (st == KDLOSS_OK) {
        out->n = reps;
        out->min_ns = kb_quantile(ns, reps, 0.0);
        out->max_ns = kb_quantile(ns, reps, 1.0);
        out->p20_ns = kb_quantile(ns, reps, 0.2);
        out->median_ns = kb_quantile(ns, reps, 0.5);
        out->p80_ns = kb_quantile(ns, reps, 0.8);
    }
    free(ns);
    kb_free(flush);
    return st;
}

size_t kb_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024u; /* Linux reports kilobytes */
}
