/* ab_distill_logits: kdloss_distill_logits from two or more builds of libkdloss, side by side in
 * one process, the calls alternated (A B, B A, ...), so that a machine whose speed drifts between
 * runs (a shared VM) still gives a fair ratio. Each library is dlopen'ed with RTLD_LOCAL, so the
 * builds keep their own symbols (copy each build's libkdloss.so.0 to its own file first).
 *
 *   ab_distill_logits [-d DIV] [-r ROUNDS] [-b BT] [-v V] [-t fp32|bf16] [-T TEMP]
 *                     LIB_A LIB_B [LIB...]
 *
 * DIV is the kdloss_divergence number (0 forward KL ... 5 TVD), default 0; 9 rounds, BT 4096,
 * V 32768, fp32, temperature 1. Inputs: uniform logits in [-10, 10), no labels, with the gradient. Prints per
 * library the min / p20 / median / p80 time, the median of the per-round ratios to the first
 * library, the loss (the builds should agree) and GB/s of compulsory traffic (read both logits,
 * write the gradient). Threads: OMP_NUM_THREADS; code path: KDLOSS_CPU_ISA. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdloss.h"

#define MAX_LIBS 8
#define MAX_ROUNDS 256

typedef kdloss_status (*distill_fn)(const kdloss_distill_logits_params *, int64_t, int64_t,
                                    kdloss_cmat, kdloss_cmat, kdloss_labels, float *, float *,
                                    kdloss_mat);
typedef void (*defaults_fn)(kdloss_distill_logits_params *);

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Uniform logits in [-10, 10) as fp32 or bf16 (the fp32 value's upper half). */
static void *make_logits(size_t n, int bf16, unsigned seed) {
    void *p = aligned_alloc(64, (n * (bf16 ? 2 : 4) + 63) / 64 * 64);
    if (!p) return NULL;
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        float f = (float)(rand() % 20000) / 1000.0f - 10.0f;
        if (bf16) {
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        } else {
            ((float *)p)[i] = f;
        }
    }
    return p;
}

static void usage(void) {
    fprintf(stderr, "usage: ab_distill_logits [-d DIV] [-r ROUNDS] [-b BT] [-v V] [-t fp32|bf16] "
                    "[-T TEMP] LIB_A LIB_B [LIB...]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int div = 0, rounds = 9, bf16 = 0, a = 1;
    double temp = 1.0;
    int64_t bt = 4096, v = 32768;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        const char *o = argv[a], *x = argv[a + 1];
        if (!strcmp(o, "-d")) div = atoi(x);
        else if (!strcmp(o, "-r")) rounds = atoi(x);
        else if (!strcmp(o, "-b")) bt = atoll(x);
        else if (!strcmp(o, "-v")) v = atoll(x);
        else if (!strcmp(o, "-t")) bf16 = !strcmp(x, "bf16");
        else if (!strcmp(o, "-T")) temp = atof(x);
        else usage();
    }
    int nl = argc - a;
    if (nl < 2 || nl > MAX_LIBS || rounds < 1 || rounds > MAX_ROUNDS || bt < 1 || v < 1) usage();
    distill_fn fn[MAX_LIBS];
    defaults_fn def = NULL;
    for (int i = 0; i < nl; i++) {
        void *h = dlopen(argv[a + i], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "ab_distill_logits: %s\n", dlerror());
            return 1;
        }
        fn[i] = (distill_fn)dlsym(h, "kdloss_distill_logits");
        if (!def) def = (defaults_fn)dlsym(h, "kdloss_distill_logits_params_default");
        if (!fn[i] || !def) {
            fprintf(stderr, "ab_distill_logits: %s lacks kdloss_distill_logits\n", argv[a + i]);
            return 1;
        }
    }
    size_t n = (size_t)bt * (size_t)v, es = bf16 ? 2 : 4;
    void *s = make_logits(n, bf16, 7), *t = make_logits(n, bf16, 8);
    void *g = aligned_alloc(64, (n * es + 63) / 64 * 64);
    static double ms[MAX_LIBS][MAX_ROUNDS];
    float loss[MAX_LIBS];
    if (!s || !t || !g) {
        fprintf(stderr, "ab_distill_logits: out of memory\n");
        return 1;
    }
    memset(g, 0, n * es); /* first touch before timing */
    kdloss_distill_logits_params p;
    def(&p);
    p.div.divergence = (kdloss_divergence)div;
    p.temperature = temp;
    kdloss_dtype dt = bf16 ? KDLOSS_BF16 : KDLOSS_F32;
    kdloss_cmat cs = {s, dt, v}, ct = {t, dt, v};
    kdloss_mat mg = {g, dt, v};
    kdloss_labels none = {NULL, KDLOSS_I64};
    for (int w = 0; w < 2; w++) /* warm-up: pages, caches, the OpenMP team */
        for (int i = 0; i < nl; i++) fn[i](&p, bt, v, cs, ct, none, &loss[i], NULL, mg);
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < nl; j++) {
            int i = r % 2 ? nl - 1 - j : j; /* alternate the order round by round */
            double t0 = now_ms();
            kdloss_status st = fn[i](&p, bt, v, cs, ct, none, &loss[i], NULL, mg);
            ms[i][r] = now_ms() - t0;
            if (st != KDLOSS_OK) {
                fprintf(stderr, "ab_distill_logits: %s: status %d\n", argv[a + i], (int)st);
                return 1;
            }
        }
    printf("divergence %d, BT %lld, V %lld, %s, T %g, %d rounds\n", div, (long long)bt,
           (long long)v, bf16 ? "bf16" : "fp32", temp, rounds);
    for (int i = 0; i < nl; i++) {
        double ratio[MAX_ROUNDS], x[MAX_ROUNDS];
        for (int r = 0; r < rounds; r++) ratio[r] = ms[i][r] / ms[0][r], x[r] = ms[i][r];
        qsort(x, (size_t)rounds, sizeof *x, cmp_double);
        qsort(ratio, (size_t)rounds, sizeof *ratio, cmp_double);
        double med = x[rounds / 2];
        printf("%-40s min %7.1f p20 %7.1f med %7.1f p80 %7.1f ms  ratio %.3f  loss %.7g  "
               "%.1f GB/s\n",
               argv[a + i], x[0], x[rounds / 5], med, x[rounds * 4 / 5], ratio[rounds / 2],
               loss[i], 3.0 * (double)(n * es) / med / 1e6);
    }
    free(s), free(t), free(g);
    return 0;
}
