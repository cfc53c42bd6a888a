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

typedef struct floor_bufs {
    int64_t bt, hs, ht, v;
    float *xs, *ws, *xt, *wt, *zs, *zt, *dxs, *dws;
} floor_bufs;

/* The four GEMMs, timed; 0, or -1 when the provider failed. */
static int one_round(const floor_bufs *b, kdloss_gemm_provider p, double ns[KB_GEMM_COUNT]) {
    int64_t bt = b->bt, hs = b->hs, ht = b->ht, v = b->v;
    kdloss_status st[KB_GEMM_COUNT];
    double t0 = kb_now_ns();
    st[0] = kdloss_gemm_f32(p, 0, 1, bt, v, hs, 1.0f, b->xs, hs, b->ws, hs, 0.0f, b->zs, v);
    double t1 = kb_now_ns();
    st[1] = ht ? kdloss_gemm_f32(p, 0, 1, bt, v, ht, 1.0f, b->xt, ht, b->wt, ht, 0.0f, b->zt, v)
               : KDLOSS_OK; /* no teacher GEMM (a sparse teacher) */
    double t2 = kb_now_ns();
    st[2] = kdloss_gemm_f32(p, 0, 0, bt, hs, v, 1.0f, b->zs, v, b->ws, hs, 0.0f, b->dxs, hs);
    double t3 = kb_now_ns();
    st[3] = kdloss_gemm_f32(p, 1, 0, v, hs, bt, 1.0f, b->zs, v, b->xs, hs, 0.0f, b->dws, hs);
    double t4 = kb_now_ns();
    ns[KB_GEMM_ZS] = t1 - t0;
    ns[KB_GEMM_ZT] = t2 - t1;
    ns[KB_GEMM_DXS] = t3 - t2;
    ns[KB_GEMM_DWS] = t4 - t3;
    for (int g = 0; g < KB_GEMM_COUNT; g++)
        if (st[g] != KDLOSS_OK) return -1;
    return 0;
}

int kb_floor_child_main(int argc, char **argv) {
    if (argc != 8 || atoll(argv[6]) < 0) return 2;
    int in = atoi(argv[2]), out = atoi(argv[3]);
    floor_bufs b = {atoll(argv[4]), atoll(argv[5]), atoll(argv[6]), atoll(argv[7]),
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
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
    int rc = write(out, &ok, 1) != 1 || !ok;
    char req;
    while (rc == 0 && read(in, &req, 1) == 1) {
        double ns[KB_GEMM_COUNT + 1];
        ns[KB_GEMM_COUNT] = one_round(&b, (kdloss_gemm_provider)req, ns);
        if (write(out, ns, sizeof ns) != (ssize_t)sizeof ns) rc = 1;
    }
    float *all[] = {b.xs, b.ws, b.xt, b.wt, b.zs, b.zt, b.dxs, b.dws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    return rc;
}

int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v) {
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
        char a[6][32];
        snprintf(a[0], 32, "%d", down[0]);
        snprintf(a[1], 32, "%d", up[1]);
        snprintf(a[2], 32, "%lld", (long long)bt);
        snprintf(a[3], 32, "%lld", (long long)hs);
        snprintf(a[4], 32, "%lld", (long long)ht);
        snprintf(a[5], 32, "%lld", (long long)v);
        execl(exe, exe, "__gemm-floor", a[0], a[1], a[2], a[3], a[4], a[5], (char *)NULL);
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

int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, double ns[KB_GEMM_COUNT]) {
    char req = (char)provider;
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

/* One round per loadable provider (after an untimed one unless a round is over a TFLOP): the
 * fastest is the floor the alternating rounds use; the others are printed beside it, so a slow
 * provider (the one the library uses, say) cannot hide. */
static void survey_providers(kb_floor_bench *b) {
    static const kdloss_gemm_provider all[2] = {KDLOSS_GEMM_ONEDNN, KDLOSS_GEMM_OPENBLAS};
    int n_gemm = floor_gemms(b);
    int warm = 2.0 * (double)b->bt * (double)b->v * (double)(3 * b->hs + b->ht) < 1e12;
    for (int i = 0; i < 2 && b->fl.pid; i++) {
        if (all[i] == KDLOSS_GEMM_OPENBLAS && b->providers == KB_FLOOR_ONEDNN) continue;
        if (kdloss_gemm_query(all[i], &b->info[b->n]) != KDLOSS_OK) continue;
        double ns[KB_GEMM_COUNT];
        int r = 0;
        for (int w = 0; w <= warm && r == 0; w++) r = kb_floor_round(&b->fl, all[i], ns);
        if (r < 0) return;
        double sum = 0.0;
        for (int g = 0; g < n_gemm; g++) sum += ns[g] * 1e-9;
        b->sum[b->n] = r == 0 ? sum : -1.0;
        if (r == 0 && (b->best < 0 || sum < b->sum[b->best])) b->best = b->n;
        b->n++;
    }
}

int kb_floor_bench_start(kb_floor_bench *b, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                         int forward, kb_floor_providers providers, int64_t reps, int n_calls) {
    memset(b, 0, sizeof *b);
    b->bt = bt, b->hs = hs, b->ht = ht, b->v = v, b->forward = forward;
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
    if (kb_floor_start(&b->fl, bt, hs, ht, v) != 0) {
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

kdloss_status kb_floor_bench_time(kb_floor_bench *b, const kb_call_fn *fns, void *const *ctxs,
                                  int64_t warmup, size_t working_set, kb_stats *stats) {
    int64_t reps = b->reps;
    int n_gemm = floor_gemms(b);
    kdloss_gemm_provider prov = b->best >= 0 ? b->info[b->best].provider : KDLOSS_GEMM_AUTO;
    for (int64_t r = 0; r < reps; r++) {
        for (int c = 0; c < b->n_calls; c++) {
            kb_stats one;
            kdloss_status st = kb_time(fns[c], ctxs[c], r == 0 ? warmup : 0, 1, working_set, &one);
            if (st != KDLOSS_OK) return st;
            b->kd[c * reps + r] = one.median_ns;
        }
        double ns[KB_GEMM_COUNT];
        if (!b->fl.pid || kb_floor_round(&b->fl, prov, ns) != 0) {
            kb_floor_stop(&b->fl);
            continue;
        }
        b->floor_sum[r] = 0.0;
        for (int g = 0; g < KB_GEMM_COUNT; g++) b->gemm_ns[g * reps + r] = ns[g];
        for (int g = 0; g < n_gemm; g++) b->floor_sum[r] += ns[g];
        b->paired[r] = b->kd[r] / b->floor_sum[r];
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
        const kdloss_gemm_info *g = &b->info[i];
        printf("gemm floor, %s %s (%s%s): ", g->name, g->version, g->kernel,
               g->generic ? ", GENERIC kernel on this CPU" : "");
        if (b->sum[i] < 0) printf("failed\n");
        else printf("%.3f s, %.0f GFLOP/s%s\n", b->sum[i], flop / b->sum[i] * 1e-9,
                    i == b->best ? "  <- fastest, the floor below" : "");
        char metric[32];
        snprintf(metric, sizeof metric, "gemm_floor_%s", g->name);
        if (b->sum[i] >= 0) kb_result_add_measure(res, metric, "one_round", "ns", b->sum[i] * 1e9);
    }
}

int kb_floor_bench_report(kb_floor_bench *b, kb_result *res, double kd_median_ns,
                          double *floor_ns, double *ratio) {
    int64_t reps = b->reps;
    if (b->best < 0) return -1;
    for (int64_t r = 0; r < reps; r++)
        if (b->floor_sum[r] < 0.0) return -1;
    printf("gemm floor (%s, fp32, in a child process, rounds alternating with the kdloss calls, "
           "median of %lld):", b->info[b->best].name, (long long)reps);
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

const char *kb_floor_bench_provider(const kb_floor_bench *b) {
    return b->best >= 0 ? b->info[b->best].name : "none";
}

void kb_floor_bench_end(kb_floor_bench *b) {
    kb_floor_stop(&b->fl);
    free(b->kd);
    b->kd = NULL;
}
