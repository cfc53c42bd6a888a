/* ab_fused_linear: kdloss_fused_linear_distill from two or more builds of libkdloss, side by side
 * in one process, the calls alternated (tools/ab/ab_common.h).
 *
 *   ab_fused_linear [-d DIV] [-r ROUNDS] [-b BT] [-s HS] [-h HT] [-v V] [-t fp32|bf16]
 *                   [-m BUDGET_MIB] [-c SOFTCAP] LIB_A LIB_B [LIB...]
 *
 * DIV is the kdloss_divergence number (`kdloss divergences` lists them), default 2 (JSD);
 * 5 rounds, BT 2048, Hs 1024, Ht 2048, V 32768, bf16, the default 256 MiB budget: `kdloss bench distill_jsd`'s
 * workload (hidden states uniform in [0, 1), weights uniform in +-1/sqrt(H), labels in [0, V),
 * no bias, T 1, weights 0.5 / 0.5), loss, dxs and dws, each library with its own workspace of
 * the size it asks for, touched before timing. Prints per library the min / p20 / median / p80
 * time, the median of the per-round ratios to the first library and the loss. Threads:
 * OMP_NUM_THREADS; code path: KDLOSS_CPU_ISA. -c sets both heads' logit-map softcap (kdloss.h,
 * kdloss_logit_map); a library built before the maps existed reads the params without them, so
 * `-c 30 OLD NEW` times the map's cost side by side (the losses then differ). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ab_common.h"

typedef kdloss_status (*fused_fn)(const kdloss_fused_linear_distill_params *, int64_t, int64_t,
                                  int64_t, int64_t, kdloss_cmat, kdloss_cmat, const void *,
                                  kdloss_cmat, kdloss_cmat, const void *, kdloss_labels,
                                  kdloss_fused_linear_distill_out *, void *, size_t);
typedef kdloss_status (*size_fn)(const kdloss_fused_linear_distill_params *, int64_t, int64_t,
                                 int64_t, int64_t, kdloss_dtype, int, size_t *);
typedef void (*defaults_fn)(kdloss_fused_linear_distill_params *);

static void usage(void) {
    fprintf(stderr, "usage: ab_fused_linear [-d DIV] [-r ROUNDS] [-b BT] [-s HS] [-h HT] [-v V] "
                    "[-t fp32|bf16] [-m BUDGET_MIB] [-c SOFTCAP] LIB_A LIB_B [LIB...]\n");
    exit(2);
}

typedef struct fl_ctx {
    fused_fn fn[AB_MAX_LIBS];
    void *work[AB_MAX_LIBS];
    size_t work_bytes[AB_MAX_LIBS];
    kdloss_fused_linear_distill_params p;
    int64_t bt, hs, ht, v;
    kdloss_cmat xs, ws, xt, wt;
    kdloss_labels labels;
    kdloss_mat dxs, dws;
} fl_ctx;

static kdloss_status fl_call(void *ctx, int i, float *loss) {
    const fl_ctx *c = ctx;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = loss;
    o.dxs = c->dxs;
    o.dws = c->dws;
    return c->fn[i](&c->p, c->bt, c->hs, c->ht, c->v, c->xs, c->ws, NULL, c->xt, c->wt, NULL,
                    c->labels, &o, c->work[i], c->work_bytes[i]);
}

int main(int argc, char **argv) {
    int div = 2, rounds = 5, bf16 = 1, a = 1;
    int64_t bt = 2048, hs = 1024, ht = 2048, v = 32768, budget = 0;
    double softcap = 0.0;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        const char *o = argv[a], *x = argv[a + 1];
        if (!strcmp(o, "-d")) div = atoi(x);
        else if (!strcmp(o, "-r")) rounds = atoi(x);
        else if (!strcmp(o, "-b")) bt = atoll(x);
        else if (!strcmp(o, "-s")) hs = atoll(x);
        else if (!strcmp(o, "-h")) ht = atoll(x);
        else if (!strcmp(o, "-v")) v = atoll(x);
        else if (!strcmp(o, "-t")) bf16 = !strcmp(x, "bf16");
        else if (!strcmp(o, "-m")) budget = atoll(x);
        else if (!strcmp(o, "-c")) softcap = atof(x);
        else usage();
    }
    int nl = argc - a;
    if (nl < 2 || nl > AB_MAX_LIBS || rounds < 1 || rounds > AB_MAX_ROUNDS || bt < 1 || hs < 1 ||
        ht < 1 || v < 1 || budget < 0)
        usage();
    static fl_ctx c;
    defaults_fn def = NULL;
    kdloss_dtype dt = bf16 ? KDLOSS_BF16 : KDLOSS_F32;
    for (int i = 0; i < nl; i++) {
        c.fn[i] = (fused_fn)ab_sym(argv[a + i], "kdloss_fused_linear_distill");
        if (!def)
            def = (defaults_fn)ab_sym(argv[a + i], "kdloss_fused_linear_distill_params_default");
        if (!c.fn[i] || !def) return 1;
    }
    def(&c.p);
    c.p.div.divergence = (kdloss_divergence)div;
    c.p.memory_budget = (size_t)budget << 20;
    c.p.student_map.softcap = c.p.teacher_map.softcap = softcap;
    for (int i = 0; i < nl; i++) {
        size_fn sz = (size_fn)ab_sym(argv[a + i], "kdloss_fused_linear_distill_workspace_size");
        if (!sz || sz(&c.p, bt, hs, ht, v, dt, 1, &c.work_bytes[i]) != KDLOSS_OK ||
            !(c.work[i] = malloc(c.work_bytes[i]))) {
            fprintf(stderr, "ab_fused_linear: %s: no workspace\n", argv[a + i]);
            return 1;
        }
        memset(c.work[i], 0, c.work_bytes[i]); /* first touch before timing */
    }
    float as = 1.0f / sqrtf((float)hs), at = 1.0f / sqrtf((float)ht);
    size_t es = bf16 ? 2 : 4;
    void *xs = ab_uniform((size_t)(bt * hs), bf16, 0.0f, 1.0f, 1);
    void *xt = ab_uniform((size_t)(bt * ht), bf16, 0.0f, 1.0f, 2);
    void *ws = ab_uniform((size_t)(v * hs), bf16, -as, as, 3);
    void *wt = ab_uniform((size_t)(v * ht), bf16, -at, at, 4);
    void *dxs = calloc((size_t)(bt * hs), es), *dws = calloc((size_t)(v * hs), es);
    int64_t *labels = malloc((size_t)bt * sizeof *labels);
    if (!xs || !xt || !ws || !wt || !dxs || !dws || !labels) {
        fprintf(stderr, "ab_fused_linear: out of memory\n");
        return 1;
    }
    for (int64_t r = 0; r < bt; r++) labels[r] = (r * 7919) % v;
    c.bt = bt, c.hs = hs, c.ht = ht, c.v = v;
    c.xs = (kdloss_cmat){xs, dt, 0};
    c.ws = (kdloss_cmat){ws, dt, 0};
    c.xt = (kdloss_cmat){xt, dt, 0};
    c.wt = (kdloss_cmat){wt, dt, 0};
    c.labels = (kdloss_labels){labels, KDLOSS_I64};
    c.dxs = (kdloss_mat){dxs, dt, 0};
    c.dws = (kdloss_mat){dws, dt, 0};
    static double ms[AB_MAX_LIBS][AB_MAX_ROUNDS];
    float loss[AB_MAX_LIBS];
    if (ab_run(fl_call, &c, argv + a, nl, rounds, 1, ms, loss)) return 1;
    printf("divergence %d, BT %lld, Hs %lld, Ht %lld, V %lld, %s, budget %lld MiB, softcap %g, "
           "%d rounds\n", div, (long long)bt, (long long)hs, (long long)ht, (long long)v,
           bf16 ? "bf16" : "fp32", (long long)(budget ? budget : 256), softcap, rounds);
    ab_print(argv + a, nl, rounds, ms, loss, 0.0);
    void *all[] = {xs, xt, ws, wt, dxs, dws, labels};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    for (int i = 0; i < nl; i++) free(c.work[i]);
    return 0;
}
