/* Fault injection into the GEMM layer itself: the product sequence of a
 * fused-linear call, run through kd_gemm_prepare and kd_sgemm as src/cpu/fld.c runs it, with
 * every allocation of a warm call failed in turn (LD_PRELOAD shim malloc_shim.c, a forked child
 * per request, 30 s timeout, as test_fault_inject.c).
 *
 * The mimic, per chunk of CH rows of BT, into a workspace and two outputs:
 *   kd_gemm_prepare(the four shapes below) once at the start, before anything is written
 *   zs = xs ws^T (CH x V x HS), zt = xt wt^T (CH x V x HT)          workspace
 *   dz = zs - 0.5 zt (the row pass's stand-in: elementwise)          workspace
 *   dws (+)= dz^T xs (V x HS x CH, beta 0 on the first chunk)       output, accumulated
 *   dxs rows = dz ws (CH x HS x V)                                  output
 * The shapes make every product several tiles on two processors, so the refused allocations
 * fall in parallel tiles and in later chunks, after outputs were written.
 *
 * Verdict: every warm injection must end in success (bitwise the warm result, or, where the
 * fallback redid a tile, the warm result to fp32 rounding) or in KDLOSS_ERR_OUT_OF_MEMORY with
 * both outputs untouched; never in OUT_OF_MEMORY after outputs were written, another status,
 * exit, a signal or a hang. Besides: a warm kd_gemm_prepare allocates nothing, and after it every
 * allocation of dnnl_sgemm can fail without the sequence failing (the fallback takes over).
 *
 * The GEMM layer is compiled into this program (its functions are hidden in libkdloss). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gemm.h"
#include "fault_driver.h"

#define TIMEOUT_S 30

enum { BT = 192, CH = 64, HS = 128, HT = 96, V = 8192 };

static kdfi_state *sh; /* MAP_SHARED */
static volatile int *child_result;
static float *xs, *ws, *xt, *wt, *zs, *zt;

typedef struct outs {
    float *dws, *dxs;
} outs;

static int failures;

static kdloss_status gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                          int64_t ldc) {
    kd_gemm g = {ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc};
    return kd_sgemm(&g);
}

/* The mimic of one fused-linear call (see the top). */
static kdloss_status call(outs *o) {
    kd_gemm_shape shapes[4] = {{CH, V, HT}, {CH, V, HS}, {V, HS, CH}, {CH, HS, V}};
    kdloss_status st = kd_gemm_prepare(shapes, 4);
    for (int64_t r0 = 0; r0 < BT && st == KDLOSS_OK; r0 += CH) {
        st = gemm(0, 1, CH, V, HT, xt + r0 * HT, HT, wt, HT, 0.0f, zt, V);
        if (st == KDLOSS_OK) st = gemm(0, 1, CH, V, HS, xs + r0 * HS, HS, ws, HS, 0.0f, zs, V);
        if (st != KDLOSS_OK) break;
        for (int64_t i = 0; i < (int64_t)CH * V; i++) zs[i] -= 0.5f * zt[i];
        st = gemm(1, 0, V, HS, CH, zs, V, xs + r0 * HS, HS, r0 ? 1.0f : 0.0f, o->dws, HS);
        if (st == KDLOSS_OK) st = gemm(0, 0, CH, HS, V, zs, V, ws, HS, 0.0f, o->dxs + r0 * HS, HS);
    }
    return st;
}

static const uint32_t POISON = 0x7fc0dead; /* a quiet NaN no product yields */

static void poison(outs *o) {
    for (int64_t i = 0; i < (int64_t)V * HS; i++) memcpy(&o->dws[i], &POISON, 4);
    for (int64_t i = 0; i < (int64_t)BT * HS; i++) memcpy(&o->dxs[i], &POISON, 4);
}

static int poisoned(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&p[i], &POISON, 4)) return 0;
    return 1;
}

/* 1 when every element of o is within fp32 rounding of the warm result w (the products have at
 * most V terms of size ~1: 1e-4 of the output's largest magnitude is far above their rounding
 * and far below any wrong term). */
static int close_to(const float *o, const float *w, int64_t n) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)w[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)o[i] - (double)w[i]) <= 1e-4 * mx)) return 0;
    return 1;
}

enum { R_NONE = 0, R_OOM_CLEAN, R_OK_SAME, R_OK_CLOSE, R_NOT_REACHED, R_OOM_WRITTEN, R_OK_WRONG,
       R_OTHER };
static const char *r_name[] = {"no report",
                               "OUT_OF_MEMORY, outputs untouched",
                               "success, same results",
                               "success, the fallback redid a tile (results within rounding)",
                               "not reached",
                               "OUT_OF_MEMORY after outputs were written",
                               "success, WRONG results",
                               "other status"};

static void outs_alloc(outs *o) {
    o->dws = malloc(sizeof(float) * (size_t)V * HS);
    o->dxs = malloc(sizeof(float) * (size_t)BT * HS);
    if (!o->dws || !o->dxs) _exit(90);
}

/* In the child: two unarmed calls, then the armed one failing request fail_at (-1: count). */
static void child(long fail_at) {
    outs base, o;
    outs_alloc(&base);
    outs_alloc(&o);
    for (int i = 0; i < 2; i++)
        if (call(&base) != KDLOSS_OK) _exit(91);
    poison(&o);
    sh->count = 0;
    sh->fail_at = fail_at;
    sh->failed = 0;
    sh->where[0] = 0;
    __atomic_store_n(&sh->counting, 1, __ATOMIC_SEQ_CST);
    kdloss_status st = call(&o);
    __atomic_store_n(&sh->counting, 0, __ATOMIC_SEQ_CST);
    int r;
    int untouched = poisoned(o.dws, (int64_t)V * HS) && poisoned(o.dxs, (int64_t)BT * HS);
    if (fail_at >= 0 && !sh->failed) r = R_NOT_REACHED;
    else if (st == KDLOSS_ERR_OUT_OF_MEMORY) r = untouched ? R_OOM_CLEAN : R_OOM_WRITTEN;
    else if (st != KDLOSS_OK) r = R_OTHER;
    else if (!memcmp(o.dws, base.dws, sizeof(float) * (size_t)V * HS) &&
             !memcmp(o.dxs, base.dxs, sizeof(float) * (size_t)BT * HS))
        r = R_OK_SAME;
    else if (close_to(o.dws, base.dws, (int64_t)V * HS) &&
             close_to(o.dxs, base.dxs, (int64_t)BT * HS))
        r = R_OK_CLOSE;
    else r = R_OK_WRONG;
    *child_result = r;
    _exit(0);
}

static void child_fn(void *fail_at) { child(*(long *)fail_at); }

static int run_child(long fail_at, char *buf, size_t n) {
    *child_result = R_NONE;
    if (!kdfi_fork(TIMEOUT_S, child_fn, &fail_at, buf, n)) return 0;
    int r = *child_result;
    snprintf(buf, n, "%s", r_name[r]);
    return r == R_OOM_CLEAN || r == R_OK_SAME || r == R_OK_CLOSE || r == R_NOT_REACHED;
}

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAILED: %s\n", what);
        failures++;
    }
}

int main(int argc, char **argv) {
    (void)argc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (kdfi_attach("test_fault_gemm", argv, &sh, &child_result)) return 1;
    if (kd_gemm_provider_in_use() != KDLOSS_GEMM_ONEDNN) {
        printf("test_fault_gemm: the provider in use is not oneDNN: skipped\n");
        return 0;
    }

    /* inputs ~ U(-1, 1) from a fixed LCG, workspace */
    size_t nx = (size_t)BT * (HS > HT ? HS : HT), nw = (size_t)V * (HS > HT ? HS : HT);
    xs = malloc(4 * nx), xt = malloc(4 * nx), ws = malloc(4 * nw), wt = malloc(4 * nw);
    zs = malloc(sizeof(float) * (size_t)CH * V), zt = malloc(sizeof(float) * (size_t)CH * V);
    if (!xs || !xt || !ws || !wt || !zs || !zt) return 1;
    uint64_t s = 88172645463325252ull;
    float *all[4] = {xs, xt, ws, wt};
    size_t cnt[4] = {nx, nx, nw, nw};
    for (int j = 0; j < 4; j++)
        for (size_t i = 0; i < cnt[j]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            all[j][i] = (float)((double)(s >> 11) * 0x1p-52 - 1.0);
        }
    printf("mimic: BT %d in chunks of %d, Hs %d, Ht %d, V %d; timeout %d s per child\n", BT, CH,
           HS, HT, V, TIMEOUT_S);

    char buf[160];
    if (!run_child(-1, buf, sizeof buf)) {
        printf("the counting run failed: %s\n", buf);
        return 1;
    }
    long n = sh->count;
    printf("warm call: %ld allocation requests\n", n);
    int bad = 0, tally[R_OTHER + 1] = {0};
    for (long i = 0; i < n; i++) {
        int good = run_child(i, buf, sizeof buf);
        if (!good) bad++;
        else tally[*child_result]++;
        printf("  request %3ld from %-24s -> %s\n", i, sh->where[0] ? sh->where : "(not reached)",
               buf);
    }
    printf("summary: %ld injected: %d OUT_OF_MEMORY untouched, %d success (same), %d success "
           "(fallback), %d not reached, %d exit/signal/hang/partly written/wrong\n",
           n, tally[R_OOM_CLEAN], tally[R_OK_SAME], tally[R_OK_CLOSE], tally[R_NOT_REACHED], bad);
    /* a warm kd_gemm_prepare allocates nothing (here last: the parent must not start OpenMP's
     * threads before it forks, a child would wait for them forever) */
    {
        outs o;
        outs_alloc(&o);
        check(call(&o) == KDLOSS_OK, "an unarmed call");
        kd_gemm_shape shapes[4] = {{CH, V, HT}, {CH, V, HS}, {V, HS, CH}, {CH, HS, V}};
        sh->count = 0;
        __atomic_store_n(&sh->counting, 1, __ATOMIC_SEQ_CST);
        kdloss_status st = kd_gemm_prepare(shapes, 4);
        __atomic_store_n(&sh->counting, 0, __ATOMIC_SEQ_CST);
        printf("warm kd_gemm_prepare: %s, %ld allocation requests\n", kdloss_status_string(st),
               sh->count);
        check(st == KDLOSS_OK && sh->count == 0, "a warm kd_gemm_prepare allocated");
        free(o.dws);
        free(o.dxs);
    }

    check(bad == 0, "some injections ended badly (see above)");
    check(n > 0, "no allocation to inject into (oneDNN allocates in every dnnl_sgemm)");
    printf("test_fault_gemm: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
