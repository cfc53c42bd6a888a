/* The shared part of the in-process A/B tools (tools/ab/): builds of libkdloss dlopen'ed side
 * by side (RTLD_LOCAL: each keeps its own symbols; copy each build's libkdloss.so.0 to its own
 * file first), their calls alternated round by round (A B, B A, ...) after warm-up calls, so
 * that a machine whose speed drifts between runs (a shared VM) still gives a fair ratio; then
 * per library the min / p20 / median / p80 time, the median of the per-round ratios to the
 * first library and the loss (the builds should agree). Header-only, for the tools alone. */
#ifndef KDLOSS_AB_COMMON_H
#define KDLOSS_AB_COMMON_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdloss.h"

#define AB_MAX_LIBS 8
#define AB_MAX_ROUNDS 256

static double ab_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int ab_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* n values uniform in [lo, hi) (rand(), seeded) as fp32 or bf16 (rounded to nearest even), on a
 * 64-byte boundary; NULL when out of memory. */
static void *ab_uniform(size_t n, int bf16, float lo, float hi, unsigned seed) {
    void *p = aligned_alloc(64, (n * (bf16 ? 2 : 4) + 63) / 64 * 64);
    if (!p) return NULL;
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        float f = lo + (hi - lo) * (float)(rand() % 1000000) / 1e6f;
        if (bf16) {
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        } else {
            ((float *)p)[i] = f;
        }
    }
    return p;
}

/* Symbol `name` of the library at `path` (opened once per call: dlopen counts references), or
 * NULL with a message. */
static void *ab_sym(const char *path, const char *name) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL), *f = h ? dlsym(h, name) : NULL;
    if (!f) fprintf(stderr, "ab: %s: %s\n", path, h ? "lacks the symbol" : dlerror());
    return f;
}

/* Library i's call on the shared inputs in ctx; its loss into *loss. */
typedef kdloss_status (*ab_call_fn)(void *ctx, int i, float *loss);

/* `warm` calls of each library, then `rounds` alternated timed rounds: ms[i][r]. Returns 0, or 1
 * after printing the first failing status. */
static int ab_run(ab_call_fn call, void *ctx, char **names, int nl, int rounds, int warm,
                  double ms[][AB_MAX_ROUNDS], float *loss) {
    for (int w = 0; w < warm; w++)
        for (int i = 0; i < nl; i++) call(ctx, i, &loss[i]);
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < nl; j++) {
            int i = r % 2 ? nl - 1 - j : j; /* alternate the order round by round */
            double t0 = ab_now_ms();
            kdloss_status st = call(ctx, i, &loss[i]);
            ms[i][r] = ab_now_ms() - t0;
            if (st != KDLOSS_OK) {
                fprintf(stderr, "ab: %s: status %d\n", names[i], (int)st);
                return 1;
            }
        }
    return 0;
}

/* One line a library; with bytes > 0 also GB/s of that much traffic at the median. */
static void ab_print(char **names, int nl, int rounds, double ms[][AB_MAX_ROUNDS],
                     const float *loss, double bytes) {
    for (int i = 0; i < nl; i++) {
        double ratio[AB_MAX_ROUNDS], x[AB_MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) ratio[r] = ms[i][r] / ms[0][r], x[r] = ms[i][r];
        qsort(x, (size_t)rounds, sizeof *x, ab_cmp_double);
        qsort(ratio, (size_t)rounds, sizeof *ratio, ab_cmp_double);
        double med = x[rounds / 2];
        printf("%-40s min %7.1f p20 %7.1f med %7.1f p80 %7.1f ms  ratio %.3f  loss %.7g", names[i],
               x[0], x[rounds / 5], med, x[rounds * 4 / 5], ratio[rounds / 2], loss[i]);
        if (bytes > 0) printf("  %.1f GB/s", bytes / med / 1e6);
        printf("\n");
    }
}

#endif
