/* ab_distill_logits: kdloss_distill_logits from two or more builds of libkdloss, side by side in
 * one process, the calls alternated (tools/ab/ab_common.h).
 *
 *   ab_distill_logits [-d DIV] [-r ROUNDS] [-b BT] [-v V] [-t fp32|bf16] [-T TEMP]
 *                     LIB_A LIB_B [LIB...]
 *
 * DIV is the kdloss_divergence number (`kdloss divergences` lists them), default 0; 9 rounds,
 * BT 4096, V 32768, fp32, temperature 1. Inputs: uniform logits in [-10, 10), no labels, with the
 * gradient. Prints per library the min / p20 / median / p80 time, the median of the per-round
 * ratios to the first library, the loss (the builds should agree) and GB/s of compulsory
 * traffic (read both logits, write the gradient). Threads: OMP_NUM_THREADS; code path:
 * KDLOSS_CPU_ISA. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab_common.h"

typedef kdloss_status (*distill_fn)(const kdloss_distill_logits_params *, int64_t, int64_t,
                                    kdloss_cmat, kdloss_cmat, kdloss_labels, float *, float *,
                                    kdloss_mat);
typedef void (*defaults_fn)(kdloss_distill_logits_params *);

static void usage(void) {
    fprintf(stderr, "usage: ab_distill_logits [-d DIV] [-r ROUNDS] [-b BT] [-v V] [-t fp32|bf16] "
                    "[-T TEMP] LIB_A LIB_B [LIB...]\n");
    exit(2);
}

typedef struct dl_ctx {
    distill_fn fn[AB_MAX_LIBS];
    kdloss_distill_logits_params p;
    int64_t bt, v;
    kdloss_cmat s, t;
    kdloss_mat g;
} dl_ctx;

static kdloss_status dl_call(void *ctx, int i, float *loss) {
    const dl_ctx *c = ctx;
    kdloss_labels none = {NULL, KDLOSS_I64};
    return c->fn[i](&c->p, c->bt, c->v, c->s, c->t, none, loss, NULL, c->g);
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
    if (nl < 2 || nl > AB_MAX_LIBS || rounds < 1 || rounds > AB_MAX_ROUNDS || bt < 1 || v < 1)
        usage();
    static dl_ctx c;
    defaults_fn def = NULL;
    for (int i = 0; i < nl; i++) {
        c.fn[i] = (distill_fn)ab_sym(argv[a + i], "kdloss_distill_logits");
        if (!def) def = (defaults_fn)ab_sym(argv[a + i], "kdloss_distill_logits_params_default");
        if (!c.fn[i] || !def) return 1;
    }
    size_t n = (size_t)bt * (size_t)v, es = bf16 ? 2 : 4;
    void *s = ab_uniform(n, bf16, -10.0f, 10.0f, 7), *t = ab_uniform(n, bf16, -10.0f, 10.0f, 8);
    void *g = aligned_alloc(64, (n * es + 63) / 64 * 64);
    static double ms[AB_MAX_LIBS][AB_MAX_ROUNDS];
    float loss[AB_MAX_LIBS];
    if (!s || !t || !g) {
        fprintf(stderr, "ab_distill_logits: out of memory\n");
        return 1;
    }
    memset(g, 0, n * es); /* first touch before timing */
    def(&c.p);
    c.p.div.divergence = (kdloss_divergence)div;
    c.p.temperature = temp;
    kdloss_dtype dt = bf16 ? KDLOSS_BF16 : KDLOSS_F32;
    c.bt = bt;
    c.v = v;
    c.s = (kdloss_cmat){s, dt, v};
    c.t = (kdloss_cmat){t, dt, v};
    c.g = (kdloss_mat){g, dt, v};
    /* warm-up: pages, caches, the OpenMP team */
    if (ab_run(dl_call, &c, argv + a, nl, rounds, 2, ms, loss)) return 1;
    printf("divergence %d, BT %lld, V %lld, %s, T %g, %d rounds\n", div, (long long)bt,
           (long long)v, bf16 ? "bf16" : "fp32", temp, rounds);
    ab_print(argv + a, nl, rounds, ms, loss, 3.0 * (double)(n * es));
    free(s), free(t), free(g);
    return 0;
}
