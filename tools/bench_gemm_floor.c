#define _POSIX_C_SOURCE 200809L /* fork, waitpid, readlink under strict -std=c11 */

#include "bench_gemm_floor.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "bench_dnnl.h"

const char *kb_gemm_name(int which) {
    static const char *const names[KB_GEMM_COUNT] = {"student logits", "teacher logits", "dXs",
                                                     "dWs"};
    return which >= 0 && which < KB_GEMM_COUNT ? names[which] : "?";
}

/* n floats in [lo, hi) from a fixed sequence, every page touched. */
static float *filled(size_t n, float lo, float hi, uint64_t seed) {
    float *p = malloc(n * sizeof(float));
    if (!p) return NULL;
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        p[i] = lo + (hi - lo) * (float)(z >> 40) * 0x1p-24f;
    }
    return p;
}

/* bf16 (nearest even) copy of n floats; NULL when out of memory. */
static uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *p = x ? malloc(n * sizeof(uint16_t)) : NULL;
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        p[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return p;
}

typedef struct floor_bufs {
    int64_t bt, hs, ht, v;
    float *xs, *ws, *xt, *wt, *zs, *zt, *dxs, *dws;
    /* bf16 copies (bf16 floors only): the operands, and zs16 the rounded dZ of the native
     * backward (dXs = dZ Ws, dWs = dZ^T Xs) */
    uint16_t *xs16, *ws16, *xt16, *wt16, *zs16;
} floor_bufs;

/* One product C (m x n, ldc) = op(A) op(B) of the round, in fp32 or bf16 by `kind`; the bf16
 * operands are the fp32 ones' copies at the same places. 0, or -1 on failure. */
static int floor_gemm(const floor_bufs *b, kdloss_gemm_provider p, kb_floor_kind kind, int ta,
                      int tb, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const float *bm, int64_t ldb, float *c, int64_t ldc) {
    if (kind == KB_FLOOR_F32)
        return kdloss_gemm_f32(p, ta, tb, m, n, k, 1.0f, a, lda, bm, ldb, 0.0f, c, ldc) ==
                       KDLOSS_OK ? 0 : -1;
    const float *f32[] = {b->xs, b->ws, b->xt, b->wt, b->zs};
    const uint16_t *h16[] = {b->xs16, b->ws16, b->xt16, b->wt16, b->zs16};
    const uint16_t *a16 = NULL, *b16 = NULL;
    for (int i = 0; i < 5; i++) {
        if (a == f32[i]) a16 = h16[i];
        if (bm == f32[i]) b16 = h16[i];
    }
    if (!a16 || !b16) return -1;
    if (kind == KB_FLOOR_BF16_DNNL)
        return kb_dnnl_bf16_matmul(ta, tb, m, n, k, a16, lda, b16, ldb, c, ldc, NULL, 0);
    return kdloss_gemm_bf16(p, ta, tb, m, n, k, a16, lda, b16, ldb, 0.0f, c, ldc) == KDLOSS_OK
               ? 0 : -1;
}

/* The four GEMMs, timed; 0, or -1 when the provider failed. */
static int one_round(const floor_bufs *b, kdloss_gemm_provider p, kb_floor_kind kind,
                     double ns[KB_GEMM_COUNT]) {
    int64_t bt = b->bt, hs = b->hs, ht = b->ht, v = b->v;
    int st[KB_GEMM_COUNT];
    if (kind != KB_FLOOR_F32 && !b->xs16) return -1;
    double t0 = kb_now_ns();
    st[0] = floor_gemm(b, p, kind, 0, 1, bt, v, hs, b->xs, hs, b->ws, hs, b->zs, v);
    double t1 = kb_now_ns();
    st[1] = ht ? floor_gemm(b, p, kind, 0, 1, bt, v, ht, b->xt, ht, b->wt, ht, b->zt, v)
               : 0; /* no teacher GEMM (a sparse teacher) */
    double t2 = kb_now_ns();
    st[2] = floor_gemm(b, p, kind, 0, 0, bt, hs, v, b->zs, v, b->ws, hs, b->dxs, hs);
    double t3 = kb_now_ns();
    st[3] = floor_gemm(b, p, kind, 1, 0, v, hs, bt, b->zs, v, b->xs, hs, b->dws, hs);
    double t4 = kb_now_ns();
    ns[KB_GEMM_ZS] = t1 - t0;
    ns[KB_GEMM_ZT] = t2 - t1;
    ns[KB_GEMM_DXS] = t3 - t2;
    ns[KB_GEMM_DWS] = t4 - t3;
    for (int g = 0; g < KB_GEMM_COUNT; g++)
        if (st[g] != 0) return -1;
    return 0;
}

int kb_floor_child_main(int argc, char **argv) {
    if (argc != 9 || atoll(argv[6]) < 0) return 2;
    int in = atoi(argv[2]), out = atoi(argv[3]), bf16 = atoi(argv[8]);
    floor_bufs b;
    memset(&b, 0, sizeof b);
    b.bt = atoll(argv[4]), b.hs = atoll(argv[5]), b.ht = atoll(argv[6]), b.v = atoll(argv[7]);
    size_t bt = (size_t)b.bt, v = (size_t)b.v;
    float as = 1.0f / sqrtf((float)b.hs), at = b.ht > 0 ? 1.0f / sqrtf((float)b.ht) : 0.0f;
    b.xs = filled(bt * (size_t)b.hs, 0.0f, 1.0f, 1);
    b.ws = filled(v * (size_t)b.hs, -as, as, 3);
    b.zs = filled(bt * v, 0.0f, 0.0f, 5);
    b.dxs = filled(bt * (size_t)b.hs, 0.0f, 0.0f, 7);
    b.dws = filled(v * (size_t)b.hs, 0.0f, 0.0f, 8);
    if (b.ht > 0) { /* ht = 0: no teacher model, no teacher buffers */
        b.xt = filled(bt * (size_t)b.ht, 0.0f, 1.0f, 2);
        b.wt = filled(v * (size_t)b.ht, -at, at, 4);
        b.zt = filled(bt * v, 0.0f, 0.0f, 6);
    }
    char ok = b.xs && b.ws && b.zs && b.dxs && b.dws && (b.ht == 0 || (b.xt && b.wt && b.zt));
    if (ok && bf16) { /* dZ's values: the logits of a warm-up round, as in the fp32 floor */
        b.xs16 = to_bf16(b.xs, bt * (size_t)b.hs), b.ws16 = to_bf16(b.ws, v * (size_t)b.hs);
        b.zs16 = to_bf16(b.zs, bt * v);
        if (b.ht > 0) b.xt16 = to_bf16(b.xt, bt * (size_t)b.ht), b.wt16 = to_bf16(b.wt, v * (size_t)b.ht);
        ok = b.xs16 && b.ws16 && b.zs16 && (b.ht == 0 || (b.xt16 && b.wt16));
    }
    int rc = write(out, &ok, 1) != 1 || !ok;
    char req;
    while (rc == 0 && read(in, &req, 1) == 1) {
        double ns[KB_GEMM_COUNT + 1];
        ns[KB_GEMM_COUNT] = one_round(&b, (kdloss_gemm_provider)(req & 15),
                                      (kb_floor_kind)(req >> 4), ns);
        if (write(out, ns, sizeof ns) != (ssize_t)sizeof ns) rc = 1;
    }
    float *all[] = {b.xs, b.ws, b.xt, b.wt, b.zs, b.zt, b.dxs, b.dws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    uint16_t *all16[] = {b.xs16, b.ws16, b.xt16, b.wt16, b.zs16};
    for (size_t i = 0; i < sizeof all16 / sizeof all16[0]; i++) free(all16[i]);
    return rc;
}

int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v, int bf16) {
    int down[2], up[2];
    char exe[PATH_MAX];
    memset(f, 0, sizeof *f);
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0 || pipe(down) != 0 || pipe(up) != 0) {
        perror("kdloss bench: gemm floor: readlink /proc/self/exe or pipe");
        return -1;
    }
    exe[len] = 0;
    fflush(NULL); /* the child must not flush the parent's buffered output a second time */
    pid_t pid = fork();
    if (pid < 0) {
        perror("kdloss bench: gemm floor: fork");
        return -1;
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        char a[7][32];
        snprintf(a[0], 32, "%d", down[0]);
        snprintf(a[1], 32, "%d", up[1]);
        snprintf(a[2], 32, "%lld", (long long)bt);
        snprintf(a[3], 32, "%lld", (long long)hs);
        snprintf(a[4], 32, "%lld", (long long)ht);
        snprintf(a[5], 32, "%lld", (long long)v);
        snprintf(a[6], 32, "%d", bf16 ? 1 : 0);
        execl(exe, exe, "__gemm-floor", a[0], a[1], a[2], a[3], a[4], a[5], a[6], (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    f->pid = (int)pid;
    f->to_child = down[1];
    f->from_child = up[0];
    char ok = 0;
    if (read(f->from_child, &ok, 1) != 1 || !ok) {
        fprintf(stderr, "kdloss bench: gemm floor: the child could not start or allocate\n");
        kb_floor_stop(f);
        return -1;
    }
    return 0;
}

int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, kb_floor_kind kind,
                   double ns[KB_GEMM_COUNT]) {
    char req = (char)((int)provider | (int)kind << 4);
    double r[KB_GEMM_COUNT + 1];
    if (!f->pid || write(f->to_child, &req, 1) != 1 ||
        read(f->from_child, r, sizeof r) != (ssize_t)sizeof r) {
        fprintf(stderr, "kdloss bench: gemm floor: the child stopped answering\n");
        return -1;
    }
    memcpy(ns, r, sizeof(double) * KB_GEMM_COUNT);
    return r[KB_GEMM_COUNT] != 0.0;
}

void kb_floor_stop(kb_floor *f) {
    if (!f->pid) return;
    close(f->to_child); /* the child's read sees end-of-file and it exits */
    close(f->from_child);
    int status;
    waitpid((pid_t)f->pid, &status, 0);
    f->pid = 0;
}

/* ---- the floor beside a timed benchmark: survey, alternating rounds, report ---------------- */

/* GEMMs that count in a round's sum: the logits ones in forward mode, all of them otherwise
 * (the teacher's is 0 s when ht = 0). */
static int floor_gemms(const kb_floor_bench *b) { return b->forward ? 2 : KB_GEMM_COUNT; }

/* Floating-point operations of the GEMMs that count. */
static double floor_flop(const kb_floor_bench *b) {
    return 2.0 * (double)b->bt * (double)b->v *
           (b->forward ? (double)(b->hs + b->ht) : (double)(3 * b->hs + b->ht));
}

static double median_of(double *x, int64_t n) { return kb_quantile(x, n, 0.5); }

/* The floor's candidates: fp32 through every provider; with bf16 operands also bf16 x bf16
 * through kdloss_gemm_bf16 with every provider and oneDNN's own threaded matmul. Fills b->cand
 * with those whose provider loads here (a bf16 one that turns out to be unsupported fails its
 * round and is printed so). */
static void candidates(kb_floor_bench *b) {
    static const kdloss_gemm_provider provs[2] = {KDLOSS_GEMM_ONEDNN, KDLOSS_GEMM_OPENBLAS};
    static const struct { kb_floor_kind kind; int prov; const char *what, *tag; } all[] = {
        {KB_FLOOR_F32, 0, "fp32 operands (kdloss tiles)", ""},
        {KB_FLOOR_F32, 1, "fp32 operands", ""},
        {KB_FLOOR_BF16, 0, "bf16 x bf16 -> fp32 (kdloss tiles)", "-bf16"},
        {KB_FLOOR_BF16_DNNL, 0, "bf16 x bf16 -> fp32 (its own matmul, its own threads)",
         "-bf16-mt"},
        {KB_FLOOR_BF16, 1, "bf16 x bf16 -> fp32 (cblas_sbgemm)", "-bf16"},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0] && b->n < KB_FLOOR_MAX; i++) {
        kdloss_gemm_provider p = provs[all[i].prov];
        if (all[i].kind != KB_FLOOR_F32 && !b->bf16) continue;
        if (p == KDLOSS_GEMM_OPENBLAS && b->providers == KB_FLOOR_ONEDNN) continue;
        kb_floor_cand c;
        memset(&c, 0, sizeof c);
        if (kdloss_gemm_query(p, &c.info) != KDLOSS_OK) continue;
        c.kind = all[i].kind;
        snprintf(c.what, sizeof c.what, "%s", all[i].what);
        snprintf(c.tag, sizeof c.tag, "%s%s", c.info.name, all[i].tag);
        b->cand[b->n++] = c;
    }
}

/* One round per candidate (after an untimed one unless a round is over a TFLOP): the fastest is
 * the floor the alternating rounds use; the others are printed beside it, so a slow provider
 * (the one the library uses, say) cannot hide. */
static void survey_providers(kb_floor_bench *b) {
    int n_gemm = floor_gemms(b);
    int warm = 2.0 * (double)b->bt * (double)b->v * (double)(3 * b->hs + b->ht) < 1e12;
    candidates(b);
    for (int i = 0; i < b->n && b->fl.pid; i++) {
        kb_floor_cand *c = &b->cand[i];
        double ns[KB_GEMM_COUNT];
        int r = 0;
        for (int w = 0; w <= warm && r == 0; w++)
            r = kb_floor_round(&b->fl, c->info.provider, c->kind, ns);
        if (r < 0) return;
        double sum = 0.0;
        for (int g = 0; g < n_gemm; g++) sum += ns[g] * 1e-9;
        c->sum = r == 0 ? sum : -1.0;
        if (r == 0 && (b->best < 0 || sum < b->cand[b->best].sum)) b->best = i;
    }
}

int kb_floor_bench_start(kb_floor_bench *b, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                         int forward, int bf16, kb_floor_providers providers, int64_t reps,
                         int n_calls) {
    memset(b, 0, sizeof *b);
    b->bt = bt, b->hs = hs, b->ht = ht, b->v = v, b->forward = forward, b->bf16 = bf16;
    b->providers = providers;
    b->reps = reps;
    b->n_calls = n_calls;
    b->best = -1;
    b->kd = malloc(sizeof(double) * (size_t)reps * ((size_t)n_calls + 2 + KB_GEMM_COUNT));
    if (!b->kd) {
        fprintf(stderr, "kdloss bench: out of memory\n");
        exit(1);
    }
    b->floor_sum = b->kd + (size_t)n_calls * (size_t)reps;
    b->paired = b->floor_sum + reps;
    b->gemm_ns = b->paired + reps;
    for (int64_t r = 0; r < reps; r++) b->floor_sum[r] = -1.0;
    if (providers == KB_FLOOR_NONE) return -1;
    if (kb_floor_start(&b->fl, bt, hs, ht, v, bf16) != 0) {
        printf("gemm floor: not measured (see above)\n");
        return -1;
    }
    survey_providers(b);
    if (b->best < 0) {
        kb_floor_stop(&b->fl);
        return -1;
    }
    return 0;
}

/* Whether the next round, as long as this one's timed calls and floor (round_s; the first
 * round's warm-up not counted), would end past b->deadline: then the SMALLER line. Never after
 * the last round. */
static int past_deadline(const kb_floor_bench *b, double round_s, int64_t r, int64_t reps) {
    double end = kb_epoch_s() + round_s;
    if (b->deadline <= 0 || r + 1 >= reps || end <= b->deadline) return 0;
    printf("SMALLER %s: %lld of %lld timed rounds: the next would end %.0f s past the step's "
           "deadline (--deadline / KDLOSS_BENCH_DEADLINE)\n", b->what ? b->what : "kdloss bench",
           (long long)(r + 1), (long long)reps, end - b->deadline);
    return 1;
}

kdloss_status kb_floor_bench_time(kb_floor_bench *b, const kb_call_fn *fns, void *const *ctxs,
                                  int64_t warmup, size_t working_set, kb_stats *stats) {
    int64_t reps = b->reps;
    int n_gemm = floor_gemms(b);
    const kb_floor_cand *best = b->best >= 0 ? &b->cand[b->best] : NULL;
    int64_t done = reps;
    for (int64_t r = 0; r < reps; r++) {
        double round_ns = 0.0;
        for (int c = 0; c < b->n_calls; c++) {
            kb_stats one;
            kdloss_status st = kb_time(fns[c], ctxs[c], r == 0 ? warmup : 0, 1, working_set, &one);
            if (st != KDLOSS_OK) return st;
            b->kd[c * reps + r] = one.median_ns;
            round_ns += one.median_ns;
        }
        double ns[KB_GEMM_COUNT], t_floor = kb_now_ns();
        int floor_failed = !best || !b->fl.pid ||
                           kb_floor_round(&b->fl, best->info.provider, best->kind, ns) != 0;
        round_ns += kb_now_ns() - t_floor;
        if (floor_failed) {
            kb_floor_stop(&b->fl);
        } else {
            b->floor_sum[r] = 0.0;
            for (int g = 0; g < KB_GEMM_COUNT; g++) b->gemm_ns[g * reps + r] = ns[g];
            for (int g = 0; g < n_gemm; g++) b->floor_sum[r] += ns[g];
            b->paired[r] = b->kd[r] / b->floor_sum[r];
        }
        if (past_deadline(b, round_ns * 1e-9, r, reps)) {
            done = r + 1;
            break;
        }
    }
    if (done < reps) { /* the per-call and per-GEMM rows to a stride of `done` */
        for (int c = 1; c < b->n_calls; c++)
            memmove(b->kd + c * done, b->kd + c * reps, sizeof(double) * (size_t)done);
        for (int g = 1; g < KB_GEMM_COUNT; g++)
            memmove(b->gemm_ns + g * done, b->gemm_ns + g * reps, sizeof(double) * (size_t)done);
        b->reps = reps = done;
    }
    for (int c = 0; c < b->n_calls; c++) { /* kb_quantile sorts: the pairs are in b->paired */
        double *kd = b->kd + c * reps;
        stats[c].n = reps;
        stats[c].min_ns = kb_quantile(kd, reps, 0.0);
        stats[c].max_ns = kb_quantile(kd, reps, 1.0);
        stats[c].p20_ns = kb_quantile(kd, reps, 0.2);
        stats[c].median_ns = kb_quantile(kd, reps, 0.5);
        stats[c].p80_ns = kb_quantile(kd, reps, 0.8);
    }
    return KDLOSS_OK;
}

void kb_floor_bench_print_survey(const kb_floor_bench *b, kb_result *res) {
    double flop = floor_flop(b);
    for (int i = 0; i < b->n; i++) {
        const kb_floor_cand *c = &b->cand[i];
        const kdloss_gemm_info *g = &c->info;
        printf("gemm floor, %s %s (%s%s), %s: ", g->name, g->version, g->kernel,
               g->generic ? ", GENERIC kernel on this CPU" : "", c->what);
        if (c->sum < 0) printf("failed or not available\n");
        else printf("%.3f s, %.0f GFLOP/s%s\n", c->sum, flop / c->sum * 1e-9,
                    i == b->best ? "  <- fastest, the floor below" : "");
        char metric[48];
        snprintf(metric, sizeof metric, "gemm_floor_%s", c->tag);
        if (c->sum >= 0) kb_result_add_measure(res, metric, "one_round", "ns", c->sum * 1e9);
    }
}

int kb_floor_bench_report(kb_floor_bench *b, kb_result *res, double kd_median_ns,
                          double *floor_ns, double *ratio) {
    int64_t reps = b->reps;
    if (b->best < 0) return -1;
    for (int64_t r = 0; r < reps; r++)
        if (b->floor_sum[r] < 0.0) return -1;
    printf("gemm floor (%s, %s, in a child process, rounds alternating with the kdloss calls, "
           "median of %lld):", b->cand[b->best].info.name, b->cand[b->best].what, (long long)reps);
    double med[KB_GEMM_COUNT];
    for (int g = 0; g < KB_GEMM_COUNT; g++) {
        med[g] = median_of(b->gemm_ns + g * reps, reps);
        if (g != KB_GEMM_ZT || b->ht > 0) printf(" %s %.3f s;", kb_gemm_name(g), med[g] * 1e-9);
    }
    double fl_med = median_of(b->floor_sum, reps), paired = median_of(b->paired, reps);
    const char *what = !b->forward ? "" : b->ht > 0 ? " of the two logits GEMMs" : " (the logits GEMM)";
    printf(" sum%s %.3f s\n", what, fl_med * 1e-9);
    printf("kdloss / gemm floor = %.3f (medians; kdloss %.3f s), %.3f (median of the %lld "
           "back-to-back pairs)\n",
           kd_median_ns / fl_med, kd_median_ns * 1e-9, paired, (long long)reps);
    kb_result_add_measure(res, "gemm_floor_latency", "median", "ns", fl_med);
    kb_result_add_measure(res, "gemm_student_logits", "median", "ns", med[KB_GEMM_ZS]);
    if (b->ht > 0)
        kb_result_add_measure(res, "gemm_teacher_logits", "median", "ns", med[KB_GEMM_ZT]);
    kb_result_add_measure(res, "gemm_dxs", "median", "ns", med[KB_GEMM_DXS]);
    kb_result_add_measure(res, "gemm_dws", "median", "ns", med[KB_GEMM_DWS]);
    kb_result_add_measure(res, "gemm_floor_ratio", "median", "x", kd_median_ns / fl_med);
    kb_result_add_measure(res, "gemm_floor_ratio_paired", "median", "x", paired);
    *floor_ns = fl_med;
    *ratio = kd_median_ns / fl_med;
    return 0;
}

double kb_floor_bench_paired(kb_floor_bench *b) { return median_of(b->paired, b->reps); }

double kb_floor_bench_gemm_median(kb_floor_bench *b, int g) {
    return median_of(b->gemm_ns + g * b->reps, b->reps);
}

const char *kb_floor_bench_provider(const kb_floor_bench *b) {
    return b->best >= 0 ? b->cand[b->best].tag : "none";
}

void kb_floor_bench_end(kb_floor_bench *b) {
    kb_floor_stop(&b->fl);
    free(b->kd);
    b->kd = NULL;
}
