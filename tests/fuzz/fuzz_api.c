/* libFuzzer target over the whole C API: kdloss_kl_div, kdloss_jsd,
 * kdloss_fused_linear_jsd, kdloss_fljsd_workspace_size and kdloss_fljsd_min_budget, and the
 * sparse top-k teacher: kdloss_topk_distill_logits, kdloss_fused_linear_topk_distill
 * and its workspace size (ids written per call into the input arena's last 1 KiB: mostly valid,
 * sometimes out of range, -2 or repeated; padding -2), with the
 * argument space drawn from the fuzz input: shapes (small, zero, negative, huge), leading
 * dimensions, dtypes (valid and not), NULL / misaligned / aliasing pointers, labels, parameters
 * (NaN, inf, values whose fp32 products overflow, ...), budgets, chunk sizes, workspaces.
 * Every pointer lies in one of two arenas (inputs, outputs); both are snapshotted before a call.
 *  - A call that returns an error must leave BOTH arenas byte-identical (nothing written).
 *  - A valid call is checked against the double references of tests/support (KL / JSD loss and
 *    fp32 gradients, the fused loss; top-k: loss, row losses and fp32 gradients of the logits
 *    form, loss, row_soft and row_lse of the fused form, tests/support/ref_topk.c) when its inputs
 *    are finite (teacher log-probs finite or -inf). A valid top-k logits call whose outputs all
 *    lie in the output arena must leave the input arena unchanged.
 * kdloss_distill and kdloss_distill_logits (fuzz_distill: the NaN policy per row,
 * the double references), and both _vp entry points on 2-3 ranks as threads with an adversarial
 * in-process communicator (fuzz_vp; its section says what it varies and checks).
 * Built with clang -fsanitize=fuzzer,address,undefined (make fuzz; a bounded run in make test).
 * the public GEMMs (fuzz_gemm) and the queries, names and settings (fuzz_misc), so
 * every public entry point is reached (the kdloss_cuda_* ones too in a CUDA build: not here).
 * Counters are printed at exit: calls, rejected calls with untouched arenas, reference checks. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdloss.h"
#include "reference.h"
#include "ref_fld.h"
#include "ref_topk.h"
#include "testutil.h"

#define ARENA 8192
static _Alignas(64) unsigned char in_arena[ARENA], out_arena[ARENA];
static unsigned char in_snap[ARENA], out_snap[ARENA];
static unsigned long n_calls, n_rejected, n_valid, n_ref_checked;
static unsigned long n_topk_valid[2], n_topk_checked[2]; /* logits form, fused form */
static unsigned long n_dist_valid[2], n_dist_checked[2], n_dist_nanrows[2]; /* distill, _logits */
static unsigned long n_vp_runs[2], n_vp_ok[2], n_vp_compared[2], n_vp_faults, n_vp_nanrun; /* dense, top-k */

static void report(void) {
    fprintf(stderr, "fuzz_api: %lu calls, %lu rejected with nothing written, %lu accepted, "
            "%lu checked against the double reference\n",
            n_calls, n_rejected, n_valid, n_ref_checked);
    fprintf(stderr, "fuzz_api: top-k: logits form %lu accepted, %lu checked; fused form %lu "
            "accepted, %lu checked\n",
            n_topk_valid[0], n_topk_checked[0], n_topk_valid[1], n_topk_checked[1]);
    fprintf(stderr, "fuzz_api: distill: %lu accepted, %lu checked, %lu NaN rows; distill_logits: %lu "
            "accepted, %lu checked, %lu NaN rows\n",
            n_dist_valid[0], n_dist_checked[0], n_dist_nanrows[0], n_dist_valid[1], n_dist_checked[1],
            n_dist_nanrows[1]);
    fprintf(stderr, "fuzz_api: vocabulary-parallel (2-3 ranks): dense %lu runs, %lu accepted, %lu "
            "compared with the single-process call; top-k %lu runs, %lu accepted, %lu compared; %lu "
            "with a failing or tampering communicator; %lu compared runs with NaN rows\n",
            n_vp_runs[0], n_vp_ok[0], n_vp_compared[0], n_vp_runs[1], n_vp_ok[1], n_vp_compared[1],
            n_vp_faults, n_vp_nanrun);
}

/* ---- input reader ---- */
typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static uint64_t take(rd *r, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (r->n ? *r->p : 0);
        if (r->n) r->p++, r->n--;
    }
    return v;
}
static int pick(rd *r, int n) { return (int)(take(r, 1) % (uint64_t)n); }

static int64_t size_arg(rd *r, int64_t max) {
    switch (pick(r, 16)) {
    case 0: return 0;
    case 1: return -1 - pick(r, 3);
    case 2: return (int64_t)1 << (31 + pick(r, 32));
    case 3: return INT64_MAX - pick(r, 2);
    default: return 1 + pick(r, (int)max);
    }
}
static double param(rd *r, double lo, double hi) {
    static const double odd[] = {0.0, -0.0, 1.0, -1.0, NAN, INFINITY, -INFINITY, 1e39, 3e-39,
                                 1e-30, 3.4028234e38, 3.4028236e38, 1e-45, 1e10, 0.5, 2.0};
    int k = pick(r, 24);
    if (k < 16) return odd[k];
    return lo + (hi - lo) * (double)take(r, 2) / 65535.0;
}
static kdloss_dtype dtype_arg(rd *r) {
    int k = pick(r, 16);
    return k < 12 ? (kdloss_dtype)(k % 3) : (kdloss_dtype)(k - 13); /* -1..2 rarely, else F32/BF16/F16 */
}
/* A pointer into an arena: NULL, aligned at a multiple of 64 plus a small offset, or misaligned. */
static void *ptr_arg(rd *r, unsigned char *arena, int can_null) {
    int k = pick(r, 32);
    if (can_null && k == 0) return NULL;
    size_t off = (size_t)pick(r, 64) * 64;
    if (k == 1) off += 1 + pick(r, 3);
    else if (k == 2) off += 2;
    return arena + off;
}
static int64_t ld_arg(rd *r, int64_t cols) {
    switch (pick(r, 12)) {
    case 0: return cols - 1;
    case 1: return -1;
    case 2: return INT64_MAX / 2;
    case 3: return cols > 0 && cols < 4096 ? cols + pick(r, 5) : 0;
    default: return 0;
    }
}

/* Views must stay inside their arena when the call is valid: a view that does not fit is
 * replaced by NULL data... no: by a view that does fit (the library cannot know arena sizes). */
/* 1 when the matrix at p lies inside its arena, or when the library must reject it anyway (no
 * pointer, a size <= 0, a stride below the row, an extent that overflows int64 bytes). A call
 * with a valid but larger shape would read or write past the arena: the caller skips it. */
static int fits(const void *p, const unsigned char *arena, int64_t rows, int64_t cols, int64_t ld,
                kdloss_dtype dt) {
    if (!p || rows <= 0 || cols <= 0) return 1;
    size_t es = kdloss_dtype_size(dt);
    if (!es) return 1;
    if (ld == 0) ld = cols;
    if (ld < cols) return 1;
    int64_t ext;
    if (__builtin_mul_overflow(rows - 1, ld, &ext) || __builtin_add_overflow(ext, cols, &ext) ||
        __builtin_mul_overflow(ext, (int64_t)es, &ext))
        return 1;
    return ext <= (int64_t)ARENA - (int64_t)((const unsigned char *)p - arena);
}

static double getv(const unsigned char *snap, const unsigned char *arena, const void *p,
                   kdloss_dtype dt, int64_t ld, int64_t r, int64_t c) {
    const void *q = snap + ((const unsigned char *)p - arena);
    return kt_get(q, dt, ld, r, c);
}

static void fill_inputs(uint64_t seed) {
    kt_rng g;
    kt_rng_seed(&g, seed);
    for (int i = 0; i < ARENA / 4; i++) {
        float f = (float)(-12.0 * kt_uniform(&g));
        if (i % 61 == 7) f = -INFINITY;
        if (i % 53 == 5) f = 0.0f;
        memcpy(in_arena + 4 * i, &f, 4);
    }
}

/* An fp32 loss or gradient element against its double reference: within tol (+ one rounding), equal (infinities
 * included), or the reference beyond fp32's range and the loss the infinity of its sign. */
static int loss_ok(float got, double want, double tol) {
    if (got == want || fabs(got - want) <= tol + 0x1p-24 * fabs(want)) return 1;
    if (isnan(want)) return isnan(got); /* inf * 0 in the formula: NaN in both */
    return fabs(want) > 3.4028234663852886e38 && isinf(got) && (got < 0) == (want < 0);
}

#define FAIL(...)                                                                               \
    do {                                                                                        \
        fprintf(stderr, __VA_ARGS__);                                                           \
        fputc('\n', stderr);                                                                    \
        abort();                                                                                \
    } while (0)

/* Every API call is bracketed by these two. call_begin snapshots both arenas: an accepted call's
 * reference reads its inputs from the snapshot, a rejected one is held to it. call_rejected
 * counts the call and returns 1 when it was rejected, after aborting if it wrote anywhere in
 * either arena: an error must leave the caller's memory as it was, outputs included. */
static void call_begin(void) {
    memcpy(in_snap, in_arena, ARENA);
    memcpy(out_snap, out_arena, ARENA);
    n_calls++;
}

static int call_rejected(kdloss_status st, const char *name) {
    if (st == KDLOSS_OK) {
        n_valid++;
        return 0;
    }
    if (memcmp(in_arena, in_snap, ARENA) != 0 || memcmp(out_arena, out_snap, ARENA) != 0)
        FAIL("%s returned %d but wrote memory", name, st);
    n_rejected++;
    return 1;
}

static void fuzz_kl(rd *r) {
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    if (pick(r, 2)) p.reduction = (kdloss_reduction)(pick(r, 6) - 1);
    if (pick(r, 4) == 0) p.log_target = pick(r, 3);
    if (pick(r, 3) == 0) p.eps = param(r, 0, 1);
    if (pick(r, 3) == 0) p.grad_scale = param(r, -4, 4);
    int64_t bt = size_arg(r, 6), v = size_arg(r, 40);
    kdloss_cmat x = {ptr_arg(r, in_arena, 1), dtype_arg(r), ld_arg(r, v)};
    kdloss_cmat t = {ptr_arg(r, in_arena, 1), dtype_arg(r), ld_arg(r, v)};
    float *loss = pick(r, 2) ? (float *)ptr_arg(r, out_arena, 1) : NULL;
    float *row = pick(r, 3) == 0 ? (float *)ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1) : NULL;
    kdloss_mat el = {pick(r, 4) == 0 ? ptr_arg(r, out_arena, 1) : NULL, dtype_arg(r), ld_arg(r, v)};
    kdloss_mat g = {pick(r, 2) ? ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1) : NULL, x.dtype,
                    ld_arg(r, v)};
    if (pick(r, 6) == 0) g.data = (void *)x.data, g.ld = x.ld; /* in place */
    if (!fits(x.data, in_arena, bt, v, x.ld, x.dtype) || !fits(t.data, in_arena, bt, v, t.ld, t.dtype) ||
        !fits(el.data, out_arena, bt, v, el.ld, el.dtype) ||
        !fits(g.data, (unsigned char *)g.data >= in_arena && (unsigned char *)g.data < in_arena + ARENA ? in_arena : out_arena, bt, v, g.ld, g.dtype) ||
        !fits(row, (unsigned char *)row >= in_arena && (unsigned char *)row < in_arena + ARENA ? in_arena : out_arena, 1, bt, 0, KDLOSS_F32) ||
        !fits(loss, out_arena, 1, 1, 0, KDLOSS_F32))
        return;
    call_begin();
    kdloss_status st = kdloss_kl_div(&p, bt, v, x, t, loss, row, el, g);
    if (call_rejected(st, "kl_div")) return;
    /* reference: loss and fp32 gradient */
    double sum = 0, mag = 0, scale = p.reduction == KDLOSS_REDUCTION_MEAN ? 1.0 / ((double)bt * v)
                                    : p.reduction == KDLOSS_REDUCTION_BATCHMEAN ? 1.0 / bt : 1.0;
    int64_t ldx = x.ld ? x.ld : v, ldt = t.ld ? t.ld : v, ldg = g.ld ? g.ld : v;
    for (int64_t i = 0; i < bt; i++)
        for (int64_t c = 0; c < v; c++) {
            double y = getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c);
            double tv = getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c);
            if (!isfinite(y) || (p.log_target ? !(tv <= 80) : !(tv >= 0 && tv <= 1e4))) return;
        }
    for (int64_t i = 0; i < bt; i++)
        for (int64_t c = 0; c < v; c++) {
            double gr, m, y = getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c);
            double tv = getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c);
            sum += ref_kl_elem(p.log_target, (double)(float)p.eps, y, tv, &gr, &m);
            mag += m;
            if (g.data && g.dtype == KDLOSS_F32) {
                double want = gr * (double)(float)(scale * p.grad_scale);
                double got = ((float *)g.data)[i * ldg + c];
                double tol = 64 * 0x1p-24 * (fabs(gr) + m) * fabs(scale * p.grad_scale) + 1e-30;
                if (!loss_ok((float)got, want, tol))
                    FAIL("kl grad (%lld,%lld): got %.9g want %.9g", (long long)i, (long long)c, got, want);
            }
        }
    if (loss && isfinite(sum)) {
        double want = sum * scale, tol = 256 * 0x1p-24 * mag * scale + 1e-30;
        if (!loss_ok(*loss, want, tol))
            FAIL("kl loss: got %.9g want %.9g (tol %g)", *loss, want, tol);
    }
    n_ref_checked++;
}

static void fuzz_jsd(rd *r) {
    kdloss_jsd_params p;
    kdloss_jsd_params_default(&p);
    if (pick(r, 2)) p.beta = pick(r, 2) ? param(r, 0, 1) : pick(r, 3) * 0.5;
    if (pick(r, 3) == 0) p.grad_scale = param(r, -4, 4);
    if (pick(r, 4) == 0) p.ignore_index = pick(r, 5) - 2;
    int64_t bt = size_arg(r, 6), v = size_arg(r, 40);
    kdloss_cmat x = {ptr_arg(r, in_arena, 1), dtype_arg(r), ld_arg(r, v)};
    kdloss_cmat t = {ptr_arg(r, in_arena, 1), dtype_arg(r), ld_arg(r, v)};
    kdloss_labels lab = {NULL, KDLOSS_I64};
    if (pick(r, 2)) { /* labels in the output arena's last 512 bytes, sometimes misaligned */
        lab.dtype = pick(r, 8) ? (kdloss_dtype)(3 + pick(r, 2)) : dtype_arg(r);
        lab.data = out_arena + ARENA - 512 + (pick(r, 16) == 0 ? 4 : 0);
    }
    float *loss = pick(r, 2) ? (float *)ptr_arg(r, out_arena, 1) : NULL;
    float *row = pick(r, 3) == 0 ? (float *)ptr_arg(r, out_arena, 1) : NULL;
    kdloss_mat g = {pick(r, 2) ? ptr_arg(r, out_arena, 1) : NULL, x.dtype, ld_arg(r, v)};
    if (pick(r, 6) == 0) g.data = (void *)x.data, g.ld = x.ld;
    if (lab.data) { /* labels live in the output arena's upper half here: write them now */
        unsigned char *l = (unsigned char *)lab.data;
        for (int64_t i = 0; bt > 0 && bt < 64 && i < bt; i++) {
            int64_t y = pick(r, 8) == 0 ? p.ignore_index : pick(r, (int)(v > 0 && v < 64 ? v + 2 : 3)) - (pick(r, 16) == 0);
            if (lab.dtype == KDLOSS_I32) { int32_t y32 = (int32_t)y; memcpy(l + 4 * i, &y32, 4); }
            else memcpy(l + 8 * i, &y, 8);
        }
    }
    if (!fits(x.data, in_arena, bt, v, x.ld, x.dtype) || !fits(t.data, in_arena, bt, v, t.ld, t.dtype) ||
        !fits(g.data, (unsigned char *)g.data >= in_arena && (unsigned char *)g.data < in_arena + ARENA ? in_arena : out_arena, bt, v, g.ld, g.dtype) ||
        !fits(row, out_arena, 1, bt, 0, KDLOSS_F32) || !fits(loss, out_arena, 1, 1, 0, KDLOSS_F32))
        return;
    call_begin();
    kdloss_status st = kdloss_jsd(&p, bt, v, x, t, lab, loss, row, g);
    if (call_rejected(st, "jsd")) return;
    int64_t ldx = x.ld ? x.ld : v, ldt = t.ld ? t.ld : v, ldg = g.ld ? g.ld : v, nv = 0;
    for (int64_t i = 0; i < bt; i++) {
        if (lab.data) {
            const unsigned char *q = out_snap + ((const unsigned char *)lab.data - out_arena);
            int64_t y;
            if (lab.dtype == KDLOSS_I32) { int32_t y32; memcpy(&y32, q + 4 * i, 4); y = y32; }
            else memcpy(&y, q + 8 * i, 8);
            if (y == p.ignore_index) continue;
        }
        nv++;
        for (int64_t c = 0; c < v; c++)
            if (isnan(getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c)) ||
                isnan(getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c)) ||
                getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c) > 0 ||
                getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c) > 0)
                return; /* the reference is for log-probs */
    }
    double den = nv ? (double)nv : 1.0, gs = (double)(float)(p.grad_scale / den), sum = 0, mag = 0;
    for (int64_t i = 0; i < bt; i++) {
        int ign = 0;
        if (lab.data) {
            const unsigned char *q = out_snap + ((const unsigned char *)lab.data - out_arena);
            int64_t y;
            if (lab.dtype == KDLOSS_I32) { int32_t y32; memcpy(&y32, q + 4 * i, 4); y = y32; }
            else memcpy(&y, q + 8 * i, 8);
            ign = y == p.ignore_index;
        }
        for (int64_t c = 0; c < v; c++) {
            double gr = 0, m = 0;
            if (!ign) {
                sum += ref_jsd_elem(p.beta, getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c),
                                    getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c), &gr, &m);
                mag += m;
            }
            if (g.data && g.dtype == KDLOSS_F32) {
                double want = gr * gs, got = ((float *)g.data)[i * ldg + c];
                /* + 2^-149: an fp32 gradient below the smallest subnormal rounds to 0 */
                double tol = 64 * 0x1p-24 * (fabs(gr) + m) * fabs(gs) + 0x1p-140 * fabs(gs) * (1 + m) + 0x1p-149;
                if (!loss_ok((float)got, want, tol))
                    FAIL("jsd grad (%lld,%lld): got %.9g want %.9g (x %g y %g beta %g gs %g gr %g)", (long long)i, (long long)c, got, want, getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c), getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c), p.beta, gs, gr);
            }
        }
    }
    if (loss) {
        double want = sum / den, tol = 256 * 0x1p-24 * mag / den + 1e-30;
        if (!loss_ok(*loss, want, tol))
            FAIL("jsd loss: got %.9g want %.9g (tol %g)", *loss, want, tol);
    }
    n_ref_checked++;
}

/* The fused calls' labels, in the output arena's last 512 bytes (bt < 64): mostly in [0, v), some
 * ignore_index, some out of range. */
static void write_labels(rd *r, int64_t bt, int64_t v, int64_t ignore_index, kdloss_dtype dt) {
    if (bt <= 0 || bt >= 64) return;
    unsigned char *l = out_arena + ARENA - 512;
    for (int64_t i = 0; i < bt; i++) {
        int64_t y = pick(r, 6) == 0 ? ignore_index : pick(r, (int)(v > 0 && v < 64 ? v + 1 : 3)) - (pick(r, 32) == 0);
        if (dt == KDLOSS_I32) { int32_t y32 = (int32_t)y; memcpy(l + 4 * i, &y32, 4); }
        else memcpy(l + 8 * i, &y, 8);
    }
}

static void fuzz_fld(rd *r, int query) {
    kdloss_fljsd_params p;
    kdloss_fljsd_params_default(&p);
    if (pick(r, 2)) p.beta = pick(r, 2) ? param(r, 0, 1) : pick(r, 3) * 0.5;
    if (pick(r, 3) == 0) p.temperature = param(r, 0.25, 4);
    if (pick(r, 3) == 0) p.weight_hard_loss = param(r, 0, 2);
    if (pick(r, 3) == 0) p.weight_soft_loss = param(r, 0, 2);
    if (pick(r, 3) == 0) p.grad_scale = param(r, -4, 4);
    if (pick(r, 3) == 0) p.chunk_size = pick(r, 8) - 1;
    if (pick(r, 3) == 0) p.memory_budget = pick(r, 2) ? (size_t)take(r, 3) : (size_t)take(r, 8);
    int64_t bt = size_arg(r, 6), hs = size_arg(r, 6), ht = size_arg(r, 6), v = size_arg(r, 12);
    if (query) {
        size_t b1 = 7, b2 = 7;
        kdloss_dtype dt = dtype_arg(r);
        int want = pick(r, 2);
        kdloss_status s1 = kdloss_fljsd_workspace_size(&p, bt, hs, ht, v, dt, want, &b1);
        kdloss_status s2 = kdloss_fljsd_min_budget(&p, bt, hs, ht, v, dt, want, &b2);
        n_calls += 2;
        if (s1 != KDLOSS_OK) { if (b1 != 7) FAIL("workspace_size wrote on error %d", s1); n_rejected++; }
        else n_valid++;
        if (s2 != KDLOSS_OK) { if (b2 != 7) FAIL("min_budget wrote on error %d", s2); n_rejected++; }
        else n_valid++;
        if (s1 == KDLOSS_OK && s2 == KDLOSS_OK && p.memory_budget && p.memory_budget < b2)
            FAIL("budget %zu below the minimum %zu accepted", p.memory_budget, b2);
        return;
    }
    kdloss_dtype ds = pick(r, 4) ? (kdloss_dtype)pick(r, 2) : dtype_arg(r);
    kdloss_dtype dtt = pick(r, 4) ? (kdloss_dtype)pick(r, 2) : dtype_arg(r);
    kdloss_cmat xs = {ptr_arg(r, in_arena, 1), ds, ld_arg(r, hs)};
    kdloss_cmat ws = {ptr_arg(r, in_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    kdloss_cmat xt = {ptr_arg(r, in_arena, 1), dtt, ld_arg(r, ht)};
    kdloss_cmat wt = {ptr_arg(r, in_arena, 1), pick(r, 8) ? dtt : dtype_arg(r), ld_arg(r, ht)};
    const void *bs = pick(r, 2) ? ptr_arg(r, in_arena, 1) : NULL;
    const void *btb = pick(r, 2) ? ptr_arg(r, in_arena, 1) : NULL;
    kdloss_labels lab = {out_arena + ARENA - 512, pick(r, 8) ? (kdloss_dtype)(3 + pick(r, 2)) : dtype_arg(r)};
    if (pick(r, 16) == 0) lab.data = NULL;
    if (lab.data && pick(r, 16) == 0) lab.data = (const unsigned char *)lab.data + 4;
    kdloss_fljsd_out o;
    memset(&o, 0, sizeof o);
    if (pick(r, 2)) o.loss = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 3) == 0) o.soft_loss = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 3) == 0) o.hard_loss = (float *)ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1);
    if (pick(r, 2)) o.dxs = (kdloss_mat){ptr_arg(r, out_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    if (pick(r, 2)) o.dws = (kdloss_mat){ptr_arg(r, out_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    if (pick(r, 3) == 0) o.dbs = ptr_arg(r, out_arena, 1);
    void *work = NULL;
    size_t work_bytes = 0;
    if (pick(r, 4) == 0) work = ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 0), work_bytes = (size_t)take(r, 2);
    write_labels(r, bt, v, p.ignore_index, lab.dtype);
    kdloss_dtype es = ds, et = dtt;
    unsigned char *oa = out_arena;
    if (!fits(xs.data, in_arena, bt, hs, xs.ld, xs.dtype) || !fits(ws.data, in_arena, v, hs, ws.ld, ws.dtype) ||
        !fits(xt.data, in_arena, bt, ht, xt.ld, xt.dtype) || !fits(wt.data, in_arena, v, ht, wt.ld, wt.dtype) ||
        !fits(bs, in_arena, 1, v, 0, es) || !fits(btb, in_arena, 1, v, 0, et) ||
        !fits(o.dxs.data, oa, bt, hs, o.dxs.ld, o.dxs.dtype) || !fits(o.dws.data, oa, v, hs, o.dws.ld, o.dws.dtype) ||
        !fits(o.dbs, oa, 1, v, 0, es) || (work && (size_t)((unsigned char *)work - (work >= (void *)oa ? oa : in_arena)) + work_bytes > ARENA) ||
        (o.hard_loss && (unsigned char *)o.hard_loss >= in_arena && (unsigned char *)o.hard_loss < in_arena + ARENA && 0))
        return;
    if (o.dxs.data && (unsigned char *)o.dxs.data + 1 > oa + ARENA - 512) return; /* keep off the labels */
    call_begin();
    kdloss_status st = kdloss_fused_linear_jsd(&p, bt, hs, ht, v, xs, ws, bs, xt, wt, btb, lab, &o, work, work_bytes);
    if (call_rejected(st, "fused_linear_jsd")) return;
    if (!o.loss || xs.dtype != KDLOSS_F32 || xt.dtype != KDLOSS_F32 || work) return;
    /* double reference of the loss */
    double *x1 = calloc((size_t)(bt * hs), 8), *w1 = calloc((size_t)(v * hs), 8), *b1 = bs ? calloc((size_t)v, 8) : NULL;
    double *x2 = calloc((size_t)(bt * ht), 8), *w2 = calloc((size_t)(v * ht), 8), *b2 = btb ? calloc((size_t)v, 8) : NULL;
    double *zs = calloc((size_t)(bt * v), 8), *zt = calloc((size_t)(bt * v), 8);
    int64_t *l64 = calloc((size_t)bt, 8);
    int ok = 1;
    for (int64_t i = 0; i < bt; i++) for (int64_t c = 0; c < hs; c++) x1[i * hs + c] = getv(in_snap, in_arena, xs.data, KDLOSS_F32, xs.ld ? xs.ld : hs, i, c);
    for (int64_t i = 0; i < v; i++) for (int64_t c = 0; c < hs; c++) w1[i * hs + c] = getv(in_snap, in_arena, ws.data, KDLOSS_F32, ws.ld ? ws.ld : hs, i, c);
    for (int64_t i = 0; i < bt; i++) for (int64_t c = 0; c < ht; c++) x2[i * ht + c] = getv(in_snap, in_arena, xt.data, KDLOSS_F32, xt.ld ? xt.ld : ht, i, c);
    for (int64_t i = 0; i < v; i++) for (int64_t c = 0; c < ht; c++) w2[i * ht + c] = getv(in_snap, in_arena, wt.data, KDLOSS_F32, wt.ld ? wt.ld : ht, i, c);
    for (int64_t c = 0; c < v; c++) {
        if (b1) b1[c] = getv(in_snap, in_arena, bs, KDLOSS_F32, v, 0, c);
        if (b2) b2[c] = getv(in_snap, in_arena, btb, KDLOSS_F32, v, 0, c);
    }
    for (int64_t i = 0; i < bt; i++) {
        const unsigned char *q = out_snap + ARENA - 512;
        if (lab.dtype == KDLOSS_I32) { int32_t y32; memcpy(&y32, q + 4 * i, 4); l64[i] = y32; }
        else memcpy(&l64[i], q + 8 * i, 8);
    }
    double zmax = 0;
    for (int64_t i = 0; i < bt * hs; i++) ok &= isfinite(x1[i]);
    for (int64_t i = 0; i < v * hs; i++) ok &= isfinite(w1[i]);
    for (int64_t i = 0; i < bt * ht; i++) ok &= isfinite(x2[i]);
    for (int64_t i = 0; i < v * ht; i++) ok &= isfinite(w2[i]);
    for (int64_t c = 0; c < v; c++) ok &= (!b1 || isfinite(b1[c])) && (!b2 || isfinite(b2[c]));
    if (ok) kt_ref_logits(bt, hs, v, x1, w1, b1, zs);
    for (int64_t i = 0; i < bt && ok; i++) { /* tempered log-probs within fp32 (as above) */
        double zlo = INFINITY, zhi = -INFINITY;
        for (int64_t c = 0; c < v; c++) zlo = fmin(zlo, zs[i * v + c]), zhi = fmax(zhi, zs[i * v + c]);
        ok = (zhi - zlo) / p.temperature <= 3.4028234663852886e38 && zhi - zlo <= 3.4028234663852886e38;
    }
    if (ok) {
        kt_ref_logits(bt, ht, v, x2, w2, b2, zt);
        for (int64_t i = 0; i < bt * v; i++) zmax = fmax(zmax, fmax(fabs(zs[i]), fabs(zt[i])));
        kt_fld_cfg cf = {p.beta, p.temperature, p.weight_hard_loss, p.weight_soft_loss, p.grad_scale, p.ignore_index};
        double L, S, H;
        kt_ref_fld_dz(&cf, bt, v, zs, zt, l64, &L, &S, &H, NULL, NULL);
        /* fp32 logits carry ~H u |x||w| error, amplified by 1/T in the soft part */
        double tol = 1e-5 * (1 + zmax) * (1 + 1 / p.temperature) * (p.weight_hard_loss + p.weight_soft_loss + 1) + 1e-5 * fabs(L);
        if (isfinite(L) && !loss_ok(*o.loss, L, tol))
            FAIL("fused loss: got %.9g want %.9g (tol %g)", *o.loss, L, tol);
        n_ref_checked++;
    }
    free(x1); free(w1); free(b1); free(x2); free(w2); free(b2); free(zs); free(zt); free(l64);
}

/* ---- the sparse top-k teacher ---- */

/* Ids live in the input arena's last 1024 bytes (sometimes misaligned), written per call after
 * the arena is filled: mostly valid (distinct ids in [0, v) or -1), sometimes an invalid one (v,
 * -2, a repeat). Returns the teacher view; the ids are written only when they fit (else the
 * call is skipped by the caller's fits()). */
#define IDS_OFF (ARENA - 1024)
static kdloss_topk_teacher topk_teacher_arg(rd *r, int64_t bt, int64_t v, int64_t k) {
    kdloss_topk_teacher t;
    t.k = k;
    t.ids.dtype = pick(r, 8) ? (kdloss_dtype)(KDLOSS_I32 + pick(r, 2)) : dtype_arg(r);
    t.ids.data = in_arena + IDS_OFF + (pick(r, 24) == 0 ? 4 : 0);
    t.ids.ld = ld_arg(r, k);
    t.logprobs.data = ptr_arg(r, in_arena, 1);
    t.logprobs.dtype = pick(r, 12) ? dtype_arg(r) : (kdloss_dtype)(KDLOSS_I32 + pick(r, 2));
    t.logprobs.ld = ld_arg(r, k);
    size_t es = kdloss_dtype_size(t.ids.dtype);
    int64_t ld = t.ids.ld ? t.ids.ld : k;
    if (bt > 0 && bt <= 64 && k > 0 && k <= 64 && ld >= k && ld <= 64 && v > 0 && es &&
        (size_t)(bt * ld) * es + 4 <= 1024) {
        unsigned char *base = (unsigned char *)(uintptr_t)t.ids.data;
        for (int64_t i = 0; i < bt; i++) {
            int64_t used[64];
            int nu = 0;
            for (int64_t j = 0; j < ld; j++) {
                int64_t id = -1;
                int c = pick(r, 8);
                if (j >= k) id = -2; /* padding: never read */
                else if (c == 0) id = -1;
                else if (pick(r, 48) == 0) /* invalid */
                    id = pick(r, 3) == 0 ? v : pick(r, 2) && nu ? used[0] : -2;
                else if (nu < v && v <= 64) {
                    int64_t start = pick(r, (int)v);
                    for (int64_t d = 0; d < v; d++) { /* the next id not used yet */
                        int64_t cand = (start + d) % v, dup = 0;
                        for (int q = 0; q < nu; q++) dup |= used[q] == cand;
                        if (!dup) { id = cand; break; }
                    }
                } else if (v > 64)
                    id = pick(r, 64); /* a huge V is rejected by fits() anyway */
                if (id >= 0 && nu < 64) used[nu++] = id;
                if (t.ids.dtype == KDLOSS_I32) { int32_t y32 = (int32_t)id; memcpy(base + 4 * (i * ld + j), &y32, 4); }
                else if (es == 8) memcpy(base + 8 * (i * ld + j), &id, 8);
            }
        }
    }
    return t;
}

static int64_t snap_id(const kdloss_topk_teacher *t, int64_t i, int64_t j) {
    int64_t ld = t->ids.ld ? t->ids.ld : t->k;
    const unsigned char *q = in_snap + ((const unsigned char *)t->ids.data - in_arena);
    if (t->ids.dtype == KDLOSS_I32) { int32_t y32; memcpy(&y32, q + 4 * (i * ld + j), 4); return y32; }
    int64_t y;
    memcpy(&y, q + 8 * (i * ld + j), 8);
    return y;
}

static int64_t snap_label(kdloss_labels lab, const unsigned char *snap, const unsigned char *arena, int64_t i) {
    const unsigned char *q = snap + ((const unsigned char *)lab.data - arena);
    if (lab.dtype == KDLOSS_I32) { int32_t y32; memcpy(&y32, q + 4 * i, 4); return y32; }
    int64_t y;
    memcpy(&y, q + 8 * i, 8);
    return y;
}

/* Reads a row's teacher (ids, log-probs) from the snapshot into ids[k], lp[k]; 0 when a used
 * slot's value is not a log-prob (NaN or above 0: the reference is for log-probs, as fuzz_jsd's;
 * -inf is one). */
static int snap_teacher_row(const kdloss_topk_teacher *t, int64_t i, int64_t *ids, double *lp) {
    int64_t ldl = t->logprobs.ld ? t->logprobs.ld : t->k;
    for (int64_t j = 0; j < t->k; j++) {
        ids[j] = snap_id(t, i, j);
        lp[j] = ids[j] >= 0 ? getv(in_snap, in_arena, t->logprobs.data, t->logprobs.dtype, ldl, i, j) : NAN;
        if (ids[j] >= 0 && !(lp[j] <= 0.0)) return 0;
    }
    return 1;
}

static kdloss_div_params div_arg(rd *r) {
    kdloss_div_params d;
    kdloss_div_params_default(&d);
    d.divergence = (kdloss_divergence)(pick(r, 16) ? pick(r, 6) : pick(r, 9) - 1);
    if (pick(r, 2)) d.beta = pick(r, 2) ? param(r, 0, 1) : pick(r, 3) * 0.5;
    if (pick(r, 2)) d.alpha = pick(r, 2) ? param(r, 0, 1) : pick(r, 3) * 0.5;
    return d;
}

static void fuzz_topk_logits(rd *r) {
    kdloss_topk_distill_params p;
    kdloss_topk_distill_params_default(&p);
    if (pick(r, 4)) p.div = div_arg(r);
    if (pick(r, 2)) p.tail = (kdloss_topk_tail)(pick(r, 12) ? pick(r, 3) : pick(r, 5) - 1);
    if (pick(r, 3) == 0) p.temperature = param(r, 0.25, 4);
    if (pick(r, 3) == 0) p.grad_scale = param(r, -4, 4);
    if (pick(r, 4) == 0) p.ignore_index = pick(r, 5) - 2;
    int64_t bt = size_arg(r, 6), v = size_arg(r, 40), k = size_arg(r, 10);
    kdloss_cmat x = {ptr_arg(r, in_arena, 1), dtype_arg(r), ld_arg(r, v)};
    kdloss_topk_teacher t = topk_teacher_arg(r, bt, v, k);
    kdloss_labels lab = {NULL, KDLOSS_I64};
    if (pick(r, 2)) { /* labels in the output arena's last 512 bytes, sometimes misaligned */
        lab.dtype = pick(r, 8) ? (kdloss_dtype)(3 + pick(r, 2)) : dtype_arg(r);
        lab.data = out_arena + ARENA - 512 + (pick(r, 16) == 0 ? 4 : 0);
        unsigned char *l = (unsigned char *)(uintptr_t)lab.data;
        for (int64_t i = 0; bt > 0 && bt < 64 && i < bt; i++) {
            int64_t y = pick(r, 6) == 0 ? p.ignore_index : pick(r, (int)(v > 0 && v < 64 ? v + 1 : 3)) - (pick(r, 32) == 0);
            if (lab.dtype == KDLOSS_I32) { int32_t y32 = (int32_t)y; memcpy(l + 4 * i, &y32, 4); }
            else memcpy(l + 8 * i, &y, 8);
        }
    }
    float *loss = pick(r, 2) ? (float *)ptr_arg(r, out_arena, 1) : NULL;
    float *row = pick(r, 3) == 0 ? (float *)ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1) : NULL;
    kdloss_mat g = {pick(r, 2) ? ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1) : NULL, x.dtype, ld_arg(r, v)};
    if (pick(r, 6) == 0) g.data = (void *)(uintptr_t)x.data, g.ld = x.ld; /* in place */
    unsigned char *ga = (unsigned char *)g.data >= in_arena && (unsigned char *)g.data < in_arena + ARENA ? in_arena : out_arena;
    unsigned char *ra = (unsigned char *)row >= in_arena && (unsigned char *)row < in_arena + ARENA ? in_arena : out_arena;
    if (!fits(x.data, in_arena, bt, v, x.ld, x.dtype) || !fits(t.logprobs.data, in_arena, bt, k, t.logprobs.ld, t.logprobs.dtype) ||
        !fits(t.ids.data, in_arena, bt, k, t.ids.ld, t.ids.dtype) || !fits(g.data, ga, bt, v, g.ld, g.dtype) ||
        !fits(row, ra, 1, bt, 0, KDLOSS_F32) || !fits(loss, out_arena, 1, 1, 0, KDLOSS_F32))
        return;
    if (g.data && ga == out_arena && (unsigned char *)g.data + 1 > out_arena + ARENA - 512) return; /* keep off the labels */
    call_begin();
    kdloss_status st = kdloss_topk_distill_logits(&p, bt, v, x, t, lab, loss, row, g);
    if (call_rejected(st, "topk_distill_logits")) return;
    n_topk_valid[0]++;
    if (ga == out_arena && ra == out_arena && memcmp(in_arena, in_snap, ARENA) != 0)
        FAIL("topk_distill_logits wrote into its inputs (no output lies there)");
    /* the double reference (tests/support/ref_topk.c) when the inputs are finite logits and
     * log-probs that are finite or -inf */
    int64_t ldx = x.ld ? x.ld : v, ldg = g.ld ? g.ld : v, nv = 0;
    int64_t ids[64];
    double lp[64], *z = calloc((size_t)v, sizeof(double)), *dz = calloc((size_t)v, sizeof(double));
    double *dm = calloc((size_t)v, sizeof(double)), *dc = calloc((size_t)v, sizeof(double));
    int ok = 1;
    for (int64_t i = 0; i < bt && ok; i++) {
        if (lab.data && snap_label(lab, out_snap, out_arena, i) == p.ignore_index) continue;
        nv++;
        double zlo = INFINITY, zhi = -INFINITY;
        for (int64_t c = 0; c < v; c++) {
            double zc = getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c);
            ok &= isfinite(zc);
            zlo = fmin(zlo, zc), zhi = fmax(zhi, zc);
        }
        /* the kernels hold log-probs in fp32 (MATH.md 7): a tempered log-prob beyond -FLT_MAX
         * (T near FLT_MIN) is outside what they represent, the reference is not for it */
        ok = ok && (zhi - zlo) / p.temperature <= 3.4028234663852886e38;
        ok = ok && snap_teacher_row(&t, i, ids, lp);
    }
    double den = nv ? (double)nv : 1.0, sc = p.grad_scale / den, sum = 0.0, tol = 0.0;
    /* the library folds grad_scale / (T n_valid) into one fp32 factor (kdloss.h): a finite
     * grad_scale such as 1e-45 can make it round to 0 (zeros written) or to a subnormal, so the
     * reference uses that rounded factor (a false positive with 1e-45) */
    double sce = (double)(float)(p.grad_scale / (p.temperature * den)) * p.temperature;
    double sca = fmax(fabs(sc), fabs(sce));
    for (int64_t i = 0; i < bt && ok; i++) {
        int ign = lab.data && snap_label(lab, out_snap, out_arena, i) == p.ignore_index;
        ref_topk_row_out ro = {0.0, 0.0, 0.0, 0, 0};
        if (!ign) {
            for (int64_t c = 0; c < v; c++) z[c] = getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c);
            snap_teacher_row(&t, i, ids, lp);
            ro = ref_topk_row(&p.div, p.tail, z, v, ids, lp, k, p.temperature, dz, dm, dc);
            if (isnan(ro.loss)) { ok = 0; break; } /* a renormalized teacher without mass: undefined */
        }
        double rt = 256 * 0x1p-24 * ro.mag + ro.cond + 1e-30;
        if (row && !loss_ok(row[i], ro.loss, rt))
            FAIL("topk row_loss[%lld]: got %.9g want %.9g (tol %g)", (long long)i, row[i], ro.loss, rt);
        sum += ro.loss, tol += rt;
        if (g.data && g.dtype == KDLOSS_F32 && isfinite(ro.loss))
            for (int64_t c = 0; c < v; c++) {
                double want = ign ? 0.0 : dz[c] * sce, got = ((float *)g.data)[i * ldg + c];
                double gt = ign ? 0.0 : (64 * 0x1p-24 * dm[c] + dc[c]) * sca + 0x1p-140 * sca * (1 + dm[c]) + 0x1p-149;
                if (!loss_ok((float)got, want, gt))
                    FAIL("topk grad (%lld,%lld): got %.9g want %.9g (tol %g; tail %d div %d T %g)", (long long)i, (long long)c, got, want, gt, p.tail, p.div.divergence, p.temperature);
            }
    }
    if (ok && loss && !loss_ok(*loss, sum / den, tol / den))
        FAIL("topk loss: got %.9g want %.9g (tol %g)", *loss, sum / den, tol / den);
    if (ok) n_ref_checked++, n_topk_checked[0]++;
    free(z), free(dz), free(dm), free(dc);
}

/* A one-rank communicator for the vocabulary-parallel entry points: the all-reduce of one rank
 * is the identity; fz_comm_fail makes it report a failure (kdloss must then return
 * KDLOSS_ERR_COMM from the agreement, before anything is written). */
static int fz_comm_fail;
static int fz_allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    (void)ctx, (void)buf, (void)n, (void)dt, (void)op;
    return fz_comm_fail;
}

static void fuzz_topk_fused(rd *r, int query) {
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params_default(&p);
    if (pick(r, 4)) p.div = div_arg(r);
    if (pick(r, 2)) p.tail = (kdloss_topk_tail)(pick(r, 12) ? pick(r, 3) : pick(r, 5) - 1);
    if (pick(r, 3) == 0) p.temperature = param(r, 0.25, 4);
    if (pick(r, 3) == 0) p.weight_hard_loss = param(r, 0, 2);
    if (pick(r, 3) == 0) p.weight_soft_loss = param(r, 0, 2);
    if (pick(r, 4) == 0) p.t2_scale = pick(r, 8) ? 1 : pick(r, 4) - 1;
    if (pick(r, 3) == 0) p.grad_scale = param(r, -4, 4);
    if (pick(r, 3) == 0) p.chunk_size = pick(r, 8) - 1;
    if (pick(r, 3) == 0) p.memory_budget = pick(r, 2) ? (size_t)take(r, 3) : (size_t)take(r, 8);
    int64_t bt = size_arg(r, 6), hs = size_arg(r, 6), v = size_arg(r, 12), k = size_arg(r, 6);
    if (query) {
        size_t b1 = 7;
        kdloss_dtype dt = dtype_arg(r);
        kdloss_status s1 = kdloss_fused_linear_topk_distill_workspace_size(pick(r, 32) ? &p : NULL, bt, hs, v, k, dt, pick(r, 2), &b1);
        n_calls++;
        if (s1 != KDLOSS_OK) { if (b1 != 7) FAIL("topk workspace_size wrote on error %d", s1); n_rejected++; }
        else n_valid++;
        return;
    }
    kdloss_dtype ds = pick(r, 4) ? (kdloss_dtype)pick(r, 2) : dtype_arg(r);
    kdloss_cmat xs = {ptr_arg(r, in_arena, 1), ds, ld_arg(r, hs)};
    kdloss_cmat ws = {ptr_arg(r, in_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    const void *bs = pick(r, 2) ? ptr_arg(r, in_arena, 1) : NULL;
    kdloss_topk_teacher t = topk_teacher_arg(r, bt, v, k);
    kdloss_labels lab = {out_arena + ARENA - 512, pick(r, 8) ? (kdloss_dtype)(3 + pick(r, 2)) : dtype_arg(r)};
    if (pick(r, 4) == 0) lab.data = NULL;
    if (lab.data && pick(r, 16) == 0) lab.data = (const unsigned char *)lab.data + 4;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    if (pick(r, 2)) o.loss = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 3) == 0) o.soft_loss = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 3) == 0) o.hard_loss = (float *)ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 1);
    if (pick(r, 4) == 0) o.row_soft = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 5) == 0) o.row_hard = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 5) == 0) o.row_lse = (float *)ptr_arg(r, out_arena, 1);
    if (pick(r, 2)) o.dxs = (kdloss_mat){ptr_arg(r, out_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    if (pick(r, 2)) o.dws = (kdloss_mat){ptr_arg(r, out_arena, 1), pick(r, 8) ? ds : dtype_arg(r), ld_arg(r, hs)};
    if (pick(r, 3) == 0) o.dbs = ptr_arg(r, out_arena, 1);
    void *work = NULL;
    size_t work_bytes = 0;
    if (pick(r, 4) == 0) work = ptr_arg(r, pick(r, 8) ? out_arena : in_arena, 0), work_bytes = (size_t)take(r, 2);
    write_labels(r, bt, v, p.ignore_index, lab.dtype);
    unsigned char *oa = out_arena;
    float *rows[3] = {o.row_soft, o.row_hard, o.row_lse};
    for (int i = 0; i < 3; i++)
        if (!fits(rows[i], oa, 1, bt, 0, KDLOSS_F32)) return;
    if (!fits(xs.data, in_arena, bt, hs, xs.ld, xs.dtype) || !fits(ws.data, in_arena, v, hs, ws.ld, ws.dtype) ||
        !fits(bs, in_arena, 1, v, 0, ds) || !fits(t.logprobs.data, in_arena, bt, k, t.logprobs.ld, t.logprobs.dtype) ||
        !fits(t.ids.data, in_arena, bt, k, t.ids.ld, t.ids.dtype) ||
        !fits(o.dxs.data, oa, bt, hs, o.dxs.ld, o.dxs.dtype) || !fits(o.dws.data, oa, v, hs, o.dws.ld, o.dws.dtype) ||
        !fits(o.dbs, oa, 1, v, 0, ds) || (work && (size_t)((unsigned char *)work - (work >= (void *)oa ? oa : in_arena)) + work_bytes > ARENA))
        return;
    if (o.dxs.data && (unsigned char *)o.dxs.data + 1 > oa + ARENA - 512) return; /* keep off the labels */
    call_begin();
    /* a quarter of the calls through the vocabulary-parallel entry with one rank (the whole
     * vocabulary, or a shard that does not tile it), which must give the same results */
    int vp = pick(r, 4) == 0;
    kdloss_comm comm = {0, 1, fz_allreduce, NULL};
    int bad_rank = vp && pick(r, 16) == 0;
    if (bad_rank) comm.rank = pick(r, 2) ? -1 : 1;
    fz_comm_fail = vp && pick(r, 16) == 0;
    int64_t v_off = v > INT64_MIN + 1 && v < INT64_MAX && pick(r, 16) == 0 ? 1 - 2 * pick(r, 2) : 0;
    kdloss_vocab_shard shard = {&comm, v + v_off, pick(r, 16) ? 0 : 1};
    kdloss_status st = vp ? kdloss_fused_linear_topk_distill_vp(&p, &shard, bt, hs, v, xs, ws, bs, t, lab, &o, work, work_bytes)
                          : kdloss_fused_linear_topk_distill(&p, bt, hs, v, xs, ws, bs, t, lab, &o, work, work_bytes);
    if (vp && st == KDLOSS_OK && (fz_comm_fail || bad_rank || shard.v_total != v || shard.v_begin != 0))
        FAIL("vocab-parallel call accepted a failing comm, rank %d or shard %lld/%lld", comm.rank,
             (long long)shard.v_begin, (long long)shard.v_total);
    if (call_rejected(st, vp ? "fused_linear_topk_distill_vp" : "fused_linear_topk_distill"))
        return;
    n_topk_valid[1]++;
    if (!o.loss || xs.dtype != KDLOSS_F32 || work) return;
    /* double reference of the loss and the row outputs */
    double *x1 = calloc((size_t)(bt * hs), 8), *w1 = calloc((size_t)(v * hs), 8), *b1 = bs ? calloc((size_t)v, 8) : NULL;
    double *zs = calloc((size_t)(bt * v), 8), *lp = calloc((size_t)(bt * k), 8), *err = calloc((size_t)bt, 8);
    int64_t *l64 = calloc((size_t)bt, 8), *ids = calloc((size_t)(bt * k), 8);
    ref_topk_fused_row *rr = calloc((size_t)bt, sizeof *rr);
    int ok = 1;
    for (int64_t i = 0; i < bt; i++) for (int64_t c = 0; c < hs; c++) x1[i * hs + c] = getv(in_snap, in_arena, xs.data, KDLOSS_F32, xs.ld ? xs.ld : hs, i, c);
    for (int64_t i = 0; i < v; i++) for (int64_t c = 0; c < hs; c++) w1[i * hs + c] = getv(in_snap, in_arena, ws.data, KDLOSS_F32, ws.ld ? ws.ld : hs, i, c);
    for (int64_t c = 0; c < v && b1; c++) b1[c] = getv(in_snap, in_arena, bs, KDLOSS_F32, v, 0, c);
    for (int64_t i = 0; i < bt; i++) {
        if (lab.data) l64[i] = snap_label(lab, out_snap, out_arena, i);
        ok = ok && snap_teacher_row(&t, i, ids + i * k, lp + i * k);
    }
    for (int64_t i = 0; i < bt * hs; i++) ok &= isfinite(x1[i]);
    for (int64_t i = 0; i < v * hs; i++) ok &= isfinite(w1[i]);
    for (int64_t c = 0; c < v && b1; c++) ok &= isfinite(b1[c]);
    if (ok) kt_ref_logits(bt, hs, v, x1, w1, b1, zs);
    for (int64_t i = 0; i < bt && ok; i++) { /* tempered log-probs within fp32 (as above) */
        double zlo = INFINITY, zhi = -INFINITY;
        for (int64_t c = 0; c < v; c++) zlo = fmin(zlo, zs[i * v + c]), zhi = fmax(zhi, zs[i * v + c]);
        ok = (zhi - zlo) / p.temperature <= 3.4028234663852886e38 && zhi - zlo <= 3.4028234663852886e38;
    }
    if (ok) {
        ref_topk_cfg cf = {p.div, p.tail, p.temperature, p.weight_hard_loss, p.weight_soft_loss, p.grad_scale, p.t2_scale, p.ignore_index};
        ref_topk_fused_out ro;
        ref_topk_tols tt;
        const int64_t *labs = lab.data ? l64 : NULL;
        ref_topk_fused(&cf, bt, v, k, zs, ids, lp, labs, &ro, rr, NULL, NULL, NULL);
        ref_topk_logit_err(bt, hs, v, x1, w1, b1, err);
        double *ts = calloc((size_t)bt, 8), *th = calloc((size_t)bt, 8), *tl = calloc((size_t)bt, 8);
        ref_topk_fused_tols(&cf, bt, v, zs, labs, &ro, rr, err, &tt, ts, th, tl);
        if (!isnan(ro.loss)) { /* NaN: a renormalized teacher without mass, undefined */
            if (!loss_ok(*o.loss, ro.loss, tt.loss))
                FAIL("fused topk loss: got %.9g want %.9g (tol %g)", *o.loss, ro.loss, tt.loss);
            for (int64_t i = 0; i < bt; i++) {
                if (o.row_soft && !loss_ok(o.row_soft[i], rr[i].soft, ts[i] + 1e-30))
                    FAIL("fused topk row_soft[%lld]: got %.9g want %.9g", (long long)i, o.row_soft[i], rr[i].soft);
                if (o.row_lse && !loss_ok(o.row_lse[i], rr[i].lse, tl[i] + 1e-30))
                    FAIL("fused topk row_lse[%lld]: got %.9g want %.9g", (long long)i, o.row_lse[i], rr[i].lse);
            }
            n_ref_checked++, n_topk_checked[1]++;
        }
        free(ts), free(th), free(tl);
    }
    free(x1); free(w1); free(b1); free(zs); free(lp); free(err); free(l64); free(ids); free(rr);
}

/* ---- kdloss_distill and kdloss_distill_logits ---- */

/* Writes a special value (0 NaN, 1 +inf, 2 -inf, 3 the dtype's largest, 4 its negative, 5 zero)
 * at element (i, c) of a float matrix in the input arena. */
static void put_special(const void *p, kdloss_dtype dt, int64_t ld, int64_t i, int64_t c, int kind) {
    unsigned char *q = (unsigned char *)(uintptr_t)p;
    size_t es = kdloss_dtype_size(dt);
    if (dt == KDLOSS_F32) {
        const float f[6] = {NAN, INFINITY, -INFINITY, 3.4028234e38f, -3.4028234e38f, 0.0f};
        memcpy(q + (size_t)(i * ld + c) * es, &f[kind], 4);
    } else if (dt == KDLOSS_BF16 || dt == KDLOSS_F16) {
        static const uint16_t b[6] = {0x7fc0, 0x7f80, 0xff80, 0x7f7f, 0xff7f, 0};
        static const uint16_t h[6] = {0x7e00, 0x7c00, 0xfc00, 0x7bff, 0xfbff, 0};
        memcpy(q + (size_t)(i * ld + c) * es, dt == KDLOSS_BF16 ? &b[kind] : &h[kind], 2);
    }
}

/* out = log_softmax(z / t) in double with the maximum subtracted before the division:
 * (z - m) / t - log(sum e^((z - m) / t)). reference.c's ref_log_softmax forms z / t - lse, which
 * loses lse whole once |max z / t| is ~1e16 times it (logits near FLT_MAX: two at 3.4e38 gave
 * X = 0 for both, Q summing to 2, and wrong references: h30g-crash-70017563, h30g-crash-360f9dfa).
 * z - m is exact or within a double rounding of the larger (z are fp32 values); a finite m is
 * assumed (the caller's domain check: a row with a finite logit and no NaN / +inf). */
static void fz_log_softmax(const double *z, int64_t v, double t, double *out) {
    double m = -INFINITY, s = 0.0;
    for (int64_t c = 0; c < v; c++) m = fmax(m, z[c]);
    for (int64_t c = 0; c < v; c++) s += exp((z[c] - m) / t);
    double ls = log(s);
    for (int64_t c = 0; c < v; c++) out[c] = (z[c] - m) / t - ls;
}

/* The reference row of kdloss_distill_logits (tests/test_distill_logits.c's, with 0 * inf = 0 in
 * the magnitudes so -inf logits are in its domain, and fz_log_softmax): D(P, Q), dz = dD/dzs
 * (unscaled), the magnitudes of the loss terms (*mag) and of each gradient element (gm). x, y,
 * g: scratch. */
static double ref_logits_row(const kdloss_div_params *d, const double *zs, const double *zt,
                             int64_t v, double t, double *x, double *y, double *g, double *dz,
                             double *gm, double *mag) {
    double lw = 0, w0 = d->divergence == KDLOSS_DIV_JSD ? d->beta : d->alpha;
    if (w0 > 0 && w0 < 1) lw = fabs(log(w0)) + fabs(log1p(-w0));
    fz_log_softmax(zs, v, t, x);
    fz_log_softmax(zt, v, t, y);
    double loss = 0, sg = 0, m = 0, sgm = 0;
    for (int64_t k = 0; k < v; k++) {
        double mg;
        loss += ref_div_elem(d, x[k], y[k], &g[k], &mg);
        m += mg;
        sg += g[k];
        double w = exp(x[k]) + exp(y[k]), e = 2 + fabs(x[k]) + fabs(y[k]) + lw;
        m += ref_wmul(w, e);
        gm[k] = fabs(g[k]) + ref_wmul(w, e);
        sgm += gm[k];
    }
    for (int64_t k = 0; k < v; k++) {
        double q = exp(x[k]);
        dz[k] = (g[k] - q * sg) / t;
        gm[k] = (gm[k] + ref_wmul(q, sgm + fabs(sg) * (2 + fabs(x[k])))) / t;
    }
    *mag = m;
    return loss;
}

/* kdloss_distill (logits = 0: log-probs) and kdloss_distill_logits (logits = 1): every divergence
 * and its parameters (valid and not), temperatures, dtypes, strides, labels (ignore_index, out of
 * range, misaligned, I32 / I64 / others), in place, NULL / misaligned / aliasing outputs, and
 * special values (NaN, +-inf, the dtype's largest, 0) written into the inputs. An accepted call:
 * ignored rows' loss and gradient 0; the NaN policy (kdloss.h): a kept row that reads a NaN (or a
 * +inf) has a NaN row loss, a NaN total loss and (factor not 0) an all-NaN gradient row;
 * grad_scale 0 writes zeros; the other rows against the double reference (row loss, gradient in
 * every dtype, the total when every row is in its domain); the input arena unchanged when no
 * output lies there. */
static void fuzz_distill(rd *r, int logits) {
    kdloss_div_params dv;
    kdloss_div_params_default(&dv);
    if (pick(r, 4)) dv = div_arg(r);
    double T = 1.0, gsc = 1.0;
    int64_t ign = -100;
    if (logits && pick(r, 3) == 0) T = pick(r, 2) ? param(r, 0.25, 4) : 0.5 + pick(r, 4);
    if (pick(r, 3) == 2) gsc = param(r, -4, 4);
    if (pick(r, 4) == 3) ign = pick(r, 5) - 2;
    kdloss_distill_params p;
    kdloss_distill_logits_params q;
    kdloss_distill_params_default(&p);
    kdloss_distill_logits_params_default(&q);
    p.div = q.div = dv;
    q.temperature = T;
    p.grad_scale = q.grad_scale = gsc;
    p.ignore_index = q.ignore_index = ign;
    int64_t bt = size_arg(r, 6), v = size_arg(r, 40);
    kdloss_cmat x = {ptr_arg(r, in_arena, 1), pick(r, 2) ? (kdloss_dtype)pick(r, 3) : dtype_arg(r), ld_arg(r, v)};
    kdloss_cmat t = {ptr_arg(r, in_arena, 1), pick(r, 2) ? (kdloss_dtype)pick(r, 3) : dtype_arg(r), ld_arg(r, v)};
    kdloss_labels lab = {NULL, KDLOSS_I64};
    if (pick(r, 2)) { /* labels in the output arena's last 512 bytes, sometimes misaligned */
        lab.dtype = pick(r, 8) ? (kdloss_dtype)(3 + pick(r, 2)) : dtype_arg(r);
        lab.data = out_arena + ARENA - 512 + (pick(r, 16) == 0 ? 4 : 0);
        unsigned char *l = (unsigned char *)(uintptr_t)lab.data;
        for (int64_t i = 0; bt > 0 && bt < 64 && i < bt; i++) {
            int64_t y = pick(r, 5) == 0 ? ign : pick(r, (int)(v > 0 && v < 64 ? v + 1 : 3)) - (pick(r, 32) == 0);
            if (pick(r, 64) == 0) y = INT64_MIN + pick(r, 2) * (INT64_MAX - 1);
            if (lab.dtype == KDLOSS_I32) { int32_t y32 = (int32_t)y; memcpy(l + 4 * i, &y32, 4); }
            else memcpy(l + 8 * i, &y, 8);
        }
    }
    float *loss = pick(r, 2) == 0 ? (float *)ptr_arg(r, out_arena, 1) : NULL;
    float *row = pick(r, 3) != 2 ? (float *)ptr_arg(r, pick(r, 8) != 7 ? out_arena : in_arena, 1) : NULL;
    kdloss_mat g = {pick(r, 3) != 2 ? ptr_arg(r, pick(r, 8) != 7 ? out_arena : in_arena, 1) : NULL,
                    pick(r, 8) != 7 ? x.dtype : dtype_arg(r), ld_arg(r, v)};
    if (pick(r, 6) == 5) g.data = (void *)(uintptr_t)x.data, g.ld = x.ld, g.dtype = x.dtype; /* in place */
    unsigned char *ga = (unsigned char *)g.data >= in_arena && (unsigned char *)g.data < in_arena + ARENA ? in_arena : out_arena;
    unsigned char *ra = (unsigned char *)row >= in_arena && (unsigned char *)row < in_arena + ARENA ? in_arena : out_arena;
    if (!fits(x.data, in_arena, bt, v, x.ld, x.dtype) || !fits(t.data, in_arena, bt, v, t.ld, t.dtype) ||
        !fits(g.data, ga, bt, v, g.ld, g.dtype) || !fits(row, ra, 1, bt, 0, KDLOSS_F32) ||
        !fits(loss, out_arena, 1, 1, 0, KDLOSS_F32))
        return;
    if (lab.data && bt >= 64) return; /* labels not written: their bytes would be stale */
    if (g.data && ga == out_arena && (unsigned char *)g.data + 1 > out_arena + ARENA - 512) return; /* keep off the labels */
    if (row && ra == out_arena && (unsigned char *)row + 1 > out_arena + ARENA - 512) return;
    int64_t ldx = x.ld ? x.ld : v, ldt = t.ld ? t.ld : v, ldg = g.ld ? g.ld : v;
    /* special values: a few elements of the student or the teacher (a valid view only) */
    if (x.data && t.data && bt > 0 && v > 0 && bt < 64 && v < 4096 && kdloss_dtype_size(x.dtype) &&
        kdloss_dtype_size(t.dtype) && x.dtype <= KDLOSS_F16 && t.dtype <= KDLOSS_F16 && ldx >= v && ldt >= v &&
        ldx < 4096 && ldt < 4096) /* (fits() passes a view whose extent overflows: the call rejects it) */
        for (int n = pick(r, 4) == 3 ? 1 + pick(r, 3) : 0; n > 0; n--) {
            int which = pick(r, 2), kind = pick(r, 6);
            int64_t i = pick(r, (int)bt), c = pick(r, (int)(v < 255 ? v : 255));
            put_special(which ? t.data : x.data, which ? t.dtype : x.dtype, which ? ldt : ldx, i, c, kind);
        }
    call_begin();
    kdloss_status st = logits ? kdloss_distill_logits(&q, bt, v, x, t, lab, loss, row, g)
                              : kdloss_distill(&p, bt, v, x, t, lab, loss, row, g);
    const char *name = logits ? "distill_logits" : "distill";
    if (call_rejected(st, name)) return;
    n_dist_valid[logits]++;
    if (ga == out_arena && ra == out_arena && memcmp(in_arena, in_snap, ARENA) != 0)
        FAIL("%s wrote into its inputs (no output lies there)", name);
    int64_t nv = 0;
    for (int64_t i = 0; i < bt; i++) nv += !lab.data || snap_label(lab, out_snap, out_arena, i) != ign;
    double den = nv ? (double)nv : 1.0;
    /* the gradient factor as the library forms it: one fp32 (kdloss.h); 0 writes zeros */
    double gfac = logits ? (double)(float)(gsc / (T * den)) * T : (double)(float)(gsc / den);
    double sc = gsc / den, sca = fmax(fabs(sc), fabs(gfac));
    double geps = g.dtype == KDLOSS_F32 ? 0 : kt_eps(g.dtype);
    double *zs = malloc(sizeof(double) * (size_t)v * 7), *zt = zs + v, *xx = zt + v, *yy = xx + v;
    double *gg = yy + v, *dz = gg + v, *gm = dz + v;
    double sum = 0, tol = 0;
    int all_ref = 1, any_nan = 0;
    for (int64_t i = 0; i < bt; i++) {
        int ignored = lab.data && snap_label(lab, out_snap, out_arena, i) == ign;
        if (ignored) { /* loss 0, gradient 0, whatever the row holds */
            if (row && row[i] != 0.0f) FAIL("%s: ignored row %lld has loss %g", name, (long long)i, row[i]);
            for (int64_t c = 0; g.data && c < v; c++)
                if (kt_get(g.data, g.dtype, ldg, i, c) != 0.0)
                    FAIL("%s: ignored row %lld has gradient %g at %lld", name, (long long)i, kt_get(g.data, g.dtype, ldg, i, c), (long long)c);
            continue;
        }
        int nanrow = 0, dom = 1, sfin = 0, tfin = 0;
        double slo = INFINITY, shi = -INFINITY, tlo = INFINITY, thi = -INFINITY;
        for (int64_t c = 0; c < v; c++) {
            zs[c] = getv(in_snap, in_arena, x.data, x.dtype, ldx, i, c);
            zt[c] = getv(in_snap, in_arena, t.data, t.dtype, ldt, i, c);
            nanrow |= isnan(zs[c]) || isnan(zt[c]) || zs[c] == INFINITY || zt[c] == INFINITY;
            if (isfinite(zs[c])) sfin = 1, slo = fmin(slo, zs[c]), shi = fmax(shi, zs[c]);
            if (isfinite(zt[c])) tfin = 1, tlo = fmin(tlo, zt[c]), thi = fmax(thi, zt[c]);
            if (!logits && (zs[c] > 0 || zt[c] > 0)) dom = 0; /* the reference is for log-probs */
        }
        if (g.data && gsc == 0.0 && (nanrow || (dom && !logits))) /* a factor of 0 writes zeros, NaN rows included */
            for (int64_t c = 0; c < v; c++)
                if (kt_get(g.data, g.dtype, ldg, i, c) != 0.0)
                    FAIL("%s: grad_scale 0 but gradient %g at (%lld,%lld)", name, kt_get(g.data, g.dtype, ldg, i, c), (long long)i, (long long)c);
        if (nanrow) { /* the NaN policy */
            any_nan = 1;
            n_dist_nanrows[logits]++;
            if (row && !isnan(row[i])) FAIL("%s: row %lld reads a NaN / +inf but its loss is %g", name, (long long)i, row[i]);
            if (g.data && gfac != 0.0 && fabs(gfac) >= 0x1p-120)
                for (int64_t c = 0; c < v; c++)
                    if (!isnan(kt_get(g.data, g.dtype, ldg, i, c)))
                        FAIL("%s: row %lld reads a NaN / +inf but its gradient is %g at %lld (div %d T %g gs %g)", name, (long long)i, kt_get(g.data, g.dtype, ldg, i, c), (long long)c, dv.divergence, T, gsc);
            continue;
        }
        if (logits) { /* a row of -inf only: softmax undefined; tempered log-probs beyond fp32 */
            dom = dom && sfin && tfin && (shi - slo) / T <= 3.4028234663852886e38 && shi - slo <= 3.4028234663852886e38 &&
                  (thi - tlo) / T <= 3.4028234663852886e38 && thi - tlo <= 3.4028234663852886e38;
        }
        if (!dom) { all_ref = 0; continue; }
        if (g.data && gsc == 0.0 && logits) /* (distill: above; values > 0 are no log-probs, exp may overflow) */
            for (int64_t c = 0; c < v; c++)
                if (kt_get(g.data, g.dtype, ldg, i, c) != 0.0)
                    FAIL("%s: grad_scale 0 but gradient %g at (%lld,%lld)", name, kt_get(g.data, g.dtype, ldg, i, c), (long long)i, (long long)c);
        double rl = 0, rmag = 0;
        if (logits) {
            rl = ref_logits_row(&dv, zs, zt, v, T, xx, yy, gg, dz, gm, &rmag);
        } else {
            for (int64_t c = 0; c < v; c++) {
                double mg;
                rl += ref_div_elem(&dv, zs[c], zt[c], &gg[c], &mg);
                rmag += mg;
            }
        }
        double rt = 256 * 0x1p-24 * rmag + 1e-30;
        if (row && !loss_ok(row[i], rl, rt))
            FAIL("%s row_loss[%lld]: got %.9g want %.9g (tol %g; div %d beta %g alpha %g T %g)", name, (long long)i, row[i], rl, rt, dv.divergence, dv.beta, dv.alpha, T);
        sum += rl, tol += rt;
        if (!g.data || gsc == 0.0 || !isfinite(rl)) continue;
        for (int64_t c = 0; c < v; c++) {
            double want, gt;
            if (logits) {
                want = dz[c] * gfac;
                gt = 64 * 0x1p-24 * gm[c] * sca + 0x1p-140 * sca * (1 + gm[c]);
                if (dv.divergence == KDLOSS_DIV_TVD) gt += 2 * (exp(xx[c]) + exp(yy[c])) * sca / T;
            } else {
                double w = exp(zs[c]) + exp(zt[c]), lw = 0, w0 = dv.divergence == KDLOSS_DIV_JSD ? dv.beta : dv.alpha;
                if (w0 > 0 && w0 < 1) lw = fabs(log(w0)) + fabs(log1p(-w0));
                want = gg[c] * gfac;
                gt = 16 * 0x1p-24 * (fabs(gg[c]) + ref_wmul(w, 2 + fabs(zs[c]) + fabs(zt[c]) + lw)) * sca +
                     0x1p-140 * sca * (1 + fabs(zs[c]) + fabs(zt[c]));
                if (dv.divergence == KDLOSS_DIV_TVD && fabs(exp(zs[c]) - exp(zt[c])) <= 1e-5 * w) gt += exp(zs[c]) * sca;
            }
            gt += geps * fabs(want) + kt_tiny(g.dtype) + 0x1p-149;
            double got = kt_get(g.data, g.dtype, ldg, i, c);
            if (g.dtype == KDLOSS_F16 && fabs(want) > 65000) continue; /* beyond fp16: inf */
            if (g.dtype != KDLOSS_F32 && fabs(want) > 3.3e38) continue;
            /* a value within the tolerance may lie beyond the narrow dtype's largest finite
             * value, and its cast is then an infinity (a fuzz finding: fp16, want 0, tol 2.2e9) */
            double top = g.dtype == KDLOSS_F16 ? 65504.0 : 3.38e38;
            if (g.dtype != KDLOSS_F32 && isinf(got) && fabs(want) + gt >= top) continue;
            if (!loss_ok((float)got, want, gt))
                FAIL("%s grad (%lld,%lld): got %.9g want %.9g (tol %g; div %d beta %g alpha %g T %g gs %g dt %d)", name, (long long)i, (long long)c, got, want, gt, dv.divergence, dv.beta, dv.alpha, T, gsc, g.dtype);
        }
    }
    if (loss) {
        if (any_nan && !isnan(*loss)) FAIL("%s: a kept row reads a NaN but the loss is %g", name, *loss);
        if (!any_nan && all_ref && !loss_ok(*loss, sum / den, tol / den))
            FAIL("%s loss: got %.9g want %.9g (tol %g)", name, *loss, sum / den, tol / den);
        if (nv == 0 && *loss != 0.0f) FAIL("%s: every row ignored but the loss is %g", name, *loss);
    }
    if (all_ref && !any_nan) n_ref_checked++, n_dist_checked[logits]++;
    free(zs);
}

/* ---- the vocabulary-parallel entry points with 2 or 3 ranks ----
 *
 * The ranks are threads of this process (a pool created once, one thread a rank, each with one
 * OpenMP thread, as the MPI tests run their ranks), the collectives go through an in-process
 * rendezvous all-reduce (tests/test_vp_agree.c's: every rank reduces every buffer in rank order,
 * calls whose count, dtype or op differ between ranks fail on every rank as MPI would fail them)
 * that gives up after VP_TIMEOUT_S, so a hang is a finding, not a stuck fuzzer. Small shapes (BT
 * <= 8, H <= 16, V <= 64, K <= 8) with data drawn from the input (NaN / inf sometimes), blocks of
 * random sizes, and from the input:
 *  - one rank's arguments differ: v_total, its block, temperature, divergence, weights, t2_scale,
 *    ignore_index, grad_scale, the tail, Ht / K, the outputs wanted (dxs, any gradient, the
 *    hard part), dtypes, biases, labels (none; other values with the same kept rows, which no
 *    rank can see); or are bad (temperature, NULL or misaligned xs, a workspace too small, a
 *    budget too small, a label out of range); or only its chunk size differs;
 *  - the callback fails on one rank at a given call (a communicator that fails that collective
 *    on every rank, as MPI and NCCL do, kdloss.h);
 *  - one slot of what one rank, or every rank, reads back from a given call is tampered with
 *    (NaN, 0, huge, -1, +-inf, 2.5, the flag flipped, x + 1, -x). Never what one rank alone reads
 *    from the confirmation (the agreement's second call): a communicator that lies to one rank
 *    there can make it stop while the others go on (no protocol can tell), so that would hang.
 * Checks: every rank returns (no timeout), every rank's collectives are the same (count, dtype,
 * op); with an honest communicator all ranks accept or none does, and none does when a rank's
 * arguments differ in what they must share; a callback failure that happened: no rank accepts;
 * a rank that returns an error has not written its outputs (the exception of kdloss.h: COMM
 * after the agreement); when every rank accepts and nothing was tampered after the agreement,
 * every rank's loss, soft / hard loss, row outputs and dxs are bitwise the same, and (no
 * argument differs but the chunk) equal to the single-process call on the whole heads: losses
 * and rows to 1e-4, dxs, the rank's block of dws / dbs to 1e-4 of their largest (bf16: 2e-2),
 * NaN where that call has NaN (the NaN policy). */
#define VP_MAXR 3
#define VP_BT 8
#define VP_H 16
#define VP_V 64
#define VP_K 8
#define VP_TIMEOUT_S 3
#define VP_LOG 64

typedef struct vp_world {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned gen;
    int broken, timed_out, fail_fired;
    int mismatch[VP_MAXR], late[VP_MAXR]; /* a call whose count / dtype / op differ; a tampering after the agreement */
    void *bufs[VP_MAXR];
    int64_t cur_n[VP_MAXR];
    int cur_dt[VP_MAXR], cur_op[VP_MAXR];
    int ncalls[VP_MAXR];
    int64_t log_n[VP_MAXR][VP_LOG];
    int log_dt[VP_MAXR][VP_LOG], log_op[VP_MAXR][VP_LOG];
    int fail_rank, fail_call;             /* -1: none */
    int tamper_rank, tamper_call, tamper_kind; /* tamper_rank -1: every rank; -2: none */
    int64_t tamper_slot;
} vp_world;

static vp_world vpw;

static int vp_rendezvous(vp_world *w) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += VP_TIMEOUT_S;
    pthread_mutex_lock(&w->mu);
    if (w->broken) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    unsigned g = w->gen;
    if (++w->arrived == w->size) {
        w->arrived = 0;
        w->gen++;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    while (g == w->gen && !w->broken)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) == ETIMEDOUT && g == w->gen) {
            w->broken = w->timed_out = 1;
            pthread_cond_broadcast(&w->cv);
        }
    int ok = g != w->gen;
    pthread_mutex_unlock(&w->mu);
    return ok ? 0 : -1;
}

static double vp_tamper_value(int kind, double x) {
    switch (kind) {
    case 0: return NAN;
    case 1: return 0.0;
    case 2: return 1e300;
    case 3: return -1.0;
    case 4: return -INFINITY;
    case 5: return INFINITY;
    case 6: return 2.5;
    case 7: return x == 0.0 ? 1.0 : x == 1.0 ? 0.0 : -x; /* a flag flipped */
    case 8: return x + 1.0;
    case 9: return x - 1.0;
    case 10: return -x;
    default: return 1e6;
    }
}

static int vp_allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    vp_world *w = &vpw;
    int me = (int)(intptr_t)ctx, call = w->ncalls[me];
    if (call < VP_LOG) w->log_n[me][call] = n, w->log_dt[me][call] = dt, w->log_op[me][call] = op;
    w->ncalls[me]++;
    if (me == w->fail_rank && call == w->fail_call) { /* fails this collective on every rank */
        pthread_mutex_lock(&w->mu);
        w->broken = w->fail_fired = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    if (n < 0 || n > (1 << 20) || (dt != KDLOSS_F64 && dt != KDLOSS_F32) || !buf) {
        FAIL("vp: rank %d's all-reduce %d has n %lld dtype %d buf %p", me, call, (long long)n, dt, buf);
    }
    w->bufs[me] = buf;
    w->cur_n[me] = n, w->cur_dt[me] = dt, w->cur_op[me] = op;
    if (vp_rendezvous(w)) return -1;
    int same = 1;
    for (int r = 0; r < w->size; r++) same &= w->cur_n[r] == n && w->cur_dt[r] == (int)dt && w->cur_op[r] == (int)op;
    size_t es = dt == KDLOSS_F64 ? 8 : 4;
    void *tmp = malloc((size_t)n * es + 8);
    if (same)
        for (int64_t i = 0; i < n; i++) {
            double acc = 0.0;
            for (int r = 0; r < w->size; r++) {
                double x = dt == KDLOSS_F64 ? ((double *)w->bufs[r])[i] : (double)((float *)w->bufs[r])[i];
                acc = r == 0 ? x : op == KDLOSS_COMM_MAX ? (x > acc ? x : acc) : acc + x;
            }
            if (dt == KDLOSS_F64) ((double *)tmp)[i] = acc;
            else ((float *)tmp)[i] = (float)acc;
        }
    else
        w->mismatch[me] = 1;
    int rc = vp_rendezvous(w); /* every rank has read every buffer */
    if (same && !rc) memcpy(buf, tmp, (size_t)n * es);
    free(tmp);
    if (!same || rc) return -1;
    if (w->tamper_rank != -2 && call == w->tamper_call && (w->tamper_rank < 0 || w->tamper_rank == me) && n > 0) {
        int64_t s = w->tamper_slot % n;
        if (dt == KDLOSS_F64) ((double *)buf)[s] = vp_tamper_value(w->tamper_kind, ((double *)buf)[s]);
        else ((float *)buf)[s] = (float)vp_tamper_value(w->tamper_kind, ((float *)buf)[s]);
        if (call >= 2) w->late[me] = 1;
    }
    return 0;
}

/* ---- the data (replicated or whole heads; each rank points at its block) ---- */
typedef struct vp_data {
    float xs[VP_BT * VP_H], ws[VP_V * VP_H], bs[VP_V], xt[VP_BT * VP_H], wt[VP_V * VP_H], bt[VP_V];
    float lp[VP_BT * VP_K];
    uint16_t xs16[VP_BT * VP_H], ws16[VP_V * VP_H], bs16[VP_V], xt16[VP_BT * VP_H], wt16[VP_V * VP_H], bt16[VP_V];
    uint16_t lp16[VP_BT * VP_K];
    int64_t lab64[VP_BT], ids64[VP_BT * VP_K];
    int32_t lab32[VP_BT], ids32[VP_BT * VP_K];
} vp_data;
static _Alignas(64) vp_data vpd;

/* One rank's outputs (room for fp32), poisoned with 0xA5 before every call. */
typedef struct vp_outs {
    float sc[3];
    float rows[3 * VP_BT];
    float dxs[VP_BT * VP_H];
    float dws[VP_V * VP_H];
    float dbs[VP_V];
    _Alignas(64) unsigned char work[64];
} vp_outs;

typedef struct vp_job {
    int rank, topk;
    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_comm comm;
    kdloss_vocab_shard shard;
    int64_t bt, hs, ht, v, k, lo;
    kdloss_dtype dt, tdt;   /* student's dtype (xs, ws, bs); the teacher's (xt, wt, bt / lp) */
    kdloss_dtype ids_dt;
    int bias, want_bits;    /* want_bits: loss, soft, hard, row_soft, row_hard, row_lse, dxs, dws, dbs */
    int xs_null, xs_mis, small_work;
    kdloss_labels lab;
    int64_t lab64[VP_BT];
    int32_t lab32[VP_BT];
    _Alignas(64) vp_outs o;
    kdloss_status st;
} vp_job;

static vp_job vp_jobs[VP_MAXR];
static vp_outs vp_poison_ref;
static char vp_desc[256];

static uint16_t vp_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static const void *vp_ptr(const float *f32, const uint16_t *b16, kdloss_dtype dt, int64_t off) {
    return dt == KDLOSS_BF16 ? (const void *)(b16 + off) : (const void *)(f32 + off);
}

static kdloss_fused_linear_distill_out vp_view(vp_outs *o, int bits, kdloss_dtype dt, int64_t hs) {
    kdloss_fused_linear_distill_out out;
    memset(&out, 0, sizeof out);
    out.loss = bits & 1 ? &o->sc[0] : NULL;
    out.soft_loss = bits & 2 ? &o->sc[1] : NULL;
    out.hard_loss = bits & 4 ? &o->sc[2] : NULL;
    out.row_soft = bits & 8 ? o->rows : NULL;
    out.row_hard = bits & 16 ? o->rows + VP_BT : NULL;
    out.row_lse = bits & 32 ? o->rows + 2 * VP_BT : NULL;
    out.dxs = (kdloss_mat){bits & 64 ? o->dxs : NULL, dt, hs};
    out.dws = (kdloss_mat){bits & 128 ? o->dws : NULL, dt, hs};
    out.dbs = bits & 256 ? o->dbs : NULL;
    return out;
}

static void vp_job_run(vp_job *j) {
    const vp_data *d = &vpd;
    kdloss_cmat xs = {vp_ptr(d->xs, d->xs16, j->dt, 0), j->dt, VP_H};
    if (j->xs_null) xs.data = NULL;
    if (j->xs_mis) xs.data = (const unsigned char *)xs.data + 1;
    kdloss_cmat ws = {vp_ptr(d->ws, d->ws16, j->dt, j->lo * VP_H), j->dt, VP_H};
    const void *bs = j->bias ? vp_ptr(d->bs, d->bs16, j->dt, j->lo) : NULL;
    kdloss_fused_linear_distill_out out = vp_view(&j->o, j->want_bits, j->dt, j->hs);
    void *work = j->small_work ? j->o.work : NULL;
    size_t wb = j->small_work ? sizeof j->o.work : 0;
    if (j->topk) {
        kdloss_topk_teacher tk = {j->k, {j->ids_dt == KDLOSS_I32 ? (const void *)d->ids32 : (const void *)d->ids64, j->ids_dt, VP_K},
                                  {vp_ptr(d->lp, d->lp16, j->tdt, 0), j->tdt, VP_K}};
        j->st = kdloss_fused_linear_topk_distill_vp(&j->tp, &j->shard, j->bt, j->hs, j->v, xs, ws, bs, tk, j->lab, &out, work, wb);
    } else {
        kdloss_cmat xt = {vp_ptr(d->xt, d->xt16, j->tdt, 0), j->tdt, VP_H};
        kdloss_cmat wt = {vp_ptr(d->wt, d->wt16, j->tdt, j->lo * VP_H), j->tdt, VP_H};
        const void *tb = j->bias ? vp_ptr(d->bt, d->bt16, j->tdt, j->lo) : NULL;
        j->st = kdloss_fused_linear_distill_vp(&j->dp, &j->shard, j->bt, j->hs, j->ht, j->v, xs, ws, bs, xt, wt, tb, j->lab, &out, work, wb);
    }
}

/* ---- the rank threads: created once, one OpenMP thread each ---- */
static pthread_mutex_t vp_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t vp_pool_go = PTHREAD_COND_INITIALIZER, vp_pool_done = PTHREAD_COND_INITIALIZER;
static unsigned vp_round;
static int vp_round_size, vp_pending;

static void vp_omp_one_thread(void) { /* this thread's OpenMP teams: one thread (both runtimes) */
    static const char *libs[] = {"libomp.so.5", "libomp.so", "libgomp.so.1", "libiomp5.so"};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_NOLOAD);
        if (!h) continue;
        void (*set)(int) = (void (*)(int))dlsym(h, "omp_set_num_threads");
        if (set) set(1);
        dlclose(h);
    }
}

static void *vp_worker(void *arg) {
    int me = (int)(intptr_t)arg;
    unsigned seen = 0;
    vp_omp_one_thread();
    for (;;) {
        pthread_mutex_lock(&vp_pool_mu);
        for (;;) {
            if (vp_round != seen) {
                seen = vp_round;
                if (me < vp_round_size) break;
            }
            pthread_cond_wait(&vp_pool_go, &vp_pool_mu);
        }
        pthread_mutex_unlock(&vp_pool_mu);
        vp_job_run(&vp_jobs[me]);
        pthread_mutex_lock(&vp_pool_mu);
        if (--vp_pending == 0) pthread_cond_signal(&vp_pool_done);
        pthread_mutex_unlock(&vp_pool_mu);
    }
    return NULL;
}

static void vp_run_ranks(int size) {
    static int started;
    if (!started) {
        for (int i = 0; i < VP_MAXR; i++) {
            pthread_t th;
            if (pthread_create(&th, NULL, vp_worker, (void *)(intptr_t)i)) FAIL("vp: pthread_create failed");
            pthread_detach(th);
        }
        started = 1;
    }
    pthread_mutex_lock(&vp_pool_mu);
    vp_round_size = size;
    vp_pending = size;
    vp_round++;
    pthread_cond_broadcast(&vp_pool_go);
    while (vp_pending) pthread_cond_wait(&vp_pool_done, &vp_pool_mu);
    pthread_mutex_unlock(&vp_pool_mu);
}

/* Values equal (NaN-aware: NaN where want is NaN) within atol + rtol |want|. */
static int vp_close(double got, double want, double atol, double rtol) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (got == want) return 1;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* A gradient element against the single-process one: finite ones within atol + rtol |want|;
 * a NaN on either side needs a NaN on the other (the NaN policy), except where the call's loss is
 * infinite (inf_loss): inf - inf and 0 x inf inside the GEMMs are then each implementation's own
 * (oneDNN's bf16 kernels spread one NaN over C, its fp32 sgemm does not), and a non-finite
 * element needs a non-finite one on the other side. An infinity needs a non-finite element. */
static int vp_grad_close(double got, double want, double atol, double rtol, int inf_loss) {
    if (isnan(want) || isnan(got))
        return inf_loss ? !isfinite(want) && !isfinite(got) : isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return !isfinite(want) && !isfinite(got);
    return vp_close(got, want, atol, rtol);
}

/* The largest finite |element| of n (the tolerance's scale). */
static double vp_max_finite(const void *p, kdloss_dtype dt, int64_t off, int64_t n) {
    double mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = fabs(kt_get(p, dt, 0, 0, off + i));
        if (isfinite(x)) mx = fmax(mx, x);
    }
    return mx;
}

enum { VPM_NONE, VPM_VT_UP, VPM_VT_DOWN, VPM_TEMP, VPM_DIV, VPM_NO_DXS, VPM_NO_GRAD, VPM_ROW_LSE,
       VPM_BF16, VPM_TDT, VPM_BAD_TEMP, VPM_XS_NULL, VPM_XS_MIS, VPM_SMALL_WORK, VPM_CHUNK,
       VPM_BLOCK, VPM_NO_BIAS, VPM_NO_LABELS, VPM_LABEL_VALUES, VPM_GRAD_SCALE, VPM_WEIGHT,
       VPM_IGNORE, VPM_T2, VPM_LABEL_RANGE, VPM_BUDGET, VPM_SHAPE, VPM_TAIL, VPM_N };

static void fuzz_vp(rd *r, int topk) {
    vp_world *w = &vpw;
    /* the decisions first, and zero bytes (a short input) decode to an honest, valid call */
    int size = 2 + pick(r, 2), fault = pick(r, 4);
    int mut = pick(r, 3) == 2 ? 1 + pick(r, VPM_N - 1) : VPM_NONE, mr = pick(r, size);
    int fail_rank = -1, fail_call = -1, tamper_rank = -2, tamper_call = 0, tamper_kind = 0;
    int64_t tamper_slot = 0;
    if (fault == 2) {
        fail_rank = pick(r, size);
        fail_call = pick(r, 3) == 0 ? pick(r, 2) : pick(r, 16);
    } else if (fault == 3) {
        tamper_rank = pick(r, 2) ? -1 : pick(r, size);
        tamper_call = pick(r, 3) == 0 ? 0 : pick(r, 3) == 0 ? 1 : pick(r, 16);
        if (tamper_rank >= 0 && tamper_call == 1) tamper_rank = -1; /* see above */
        tamper_slot = (int64_t)take(r, 1);
        tamper_kind = pick(r, 12);
    }
    int64_t bt = 1 + pick(r, VP_BT), hs = 1 + pick(r, VP_H), ht = 1 + pick(r, VP_H);
    int64_t vt = size + pick(r, VP_V - size + 1), k = 1 + pick(r, VP_K);
    /* the data */
    kt_rng g;
    kt_rng_seed(&g, take(r, 2));
    vp_data *d = &vpd;
    for (int i = 0; i < VP_BT * VP_H; i++) d->xs[i] = (float)kt_normal(&g), d->xt[i] = (float)kt_normal(&g);
    for (int i = 0; i < VP_V * VP_H; i++) d->ws[i] = (float)(0.3 * kt_normal(&g)), d->wt[i] = (float)(0.3 * kt_normal(&g));
    for (int i = 0; i < VP_V; i++) d->bs[i] = (float)(0.5 * kt_normal(&g)), d->bt[i] = (float)(0.5 * kt_normal(&g));
    int xs_special = 0, ws_special = 0, lp_special = 0;
    for (int n = pick(r, 6) == 5 ? 1 + pick(r, 2) : 0; n > 0; n--) { /* NaN / inf / huge somewhere */
        static const float sp[4] = {NAN, INFINITY, -INFINITY, 3e38f};
        float *m[6] = {d->xs, d->ws, d->bs, d->xt, d->wt, d->bt};
        int which = pick(r, 6);
        xs_special |= which == 0, ws_special |= which == 1 || which == 2;
        int64_t rows = which == 0 || which == 3 ? bt : which == 2 || which == 5 ? 1 : vt;
        int64_t cols = which == 2 || which == 5 ? vt : which == 3 || which == 4 ? ht : hs;
        m[which][pick(r, (int)rows) * (which == 2 || which == 5 ? 0 : VP_H) + pick(r, (int)cols)] = sp[pick(r, 4)];
    }
    int ign = pick(r, 8) == 0 ? -1 : -100;
    for (int64_t i = 0; i < bt; i++) {
        int64_t y = pick(r, 5) == 4 ? ign : (int64_t)kt_randint(&g, vt);
        if (pick(r, 64) == 63) y = vt; /* out of range on every rank */
        d->lab64[i] = y, d->lab32[i] = (int32_t)y;
        for (int64_t j = 0; j < VP_K; j++) { /* distinct ids in [0, vt), some unused */
            int64_t id;
            int dup;
            do {
                id = kt_randint(&g, vt);
                dup = 0;
                for (int64_t q = 0; q < j && j < vt; q++) dup |= d->ids64[i * VP_K + q] == id;
            } while (dup && j < vt);
            if (j >= vt || kt_uniform(&g) < 0.15) id = -1;
            d->ids64[i * VP_K + j] = id, d->ids32[i * VP_K + j] = (int32_t)id;
            d->lp[i * VP_K + j] = (float)(-0.5 - 3.0 * kt_uniform(&g));
        }
    }
    if (pick(r, 8) == 7) d->lp[pick(r, (int)(bt * VP_K))] = pick(r, 2) ? -INFINITY : NAN, lp_special = 1;
    for (int i = 0; i < VP_BT * VP_H; i++) d->xs16[i] = vp_bf16(d->xs[i]), d->xt16[i] = vp_bf16(d->xt[i]);
    for (int i = 0; i < VP_V * VP_H; i++) d->ws16[i] = vp_bf16(d->ws[i]), d->wt16[i] = vp_bf16(d->wt[i]);
    for (int i = 0; i < VP_V; i++) d->bs16[i] = vp_bf16(d->bs[i]), d->bt16[i] = vp_bf16(d->bt[i]);
    for (int i = 0; i < VP_BT * VP_K; i++) d->lp16[i] = vp_bf16(d->lp[i]);
    /* the shared arguments */
    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_fused_linear_distill_params_default(&dp);
    kdloss_fused_linear_topk_distill_params_default(&tp);
    if (pick(r, 2)) dp.div = tp.div = div_arg(r);
    if (topk && pick(r, 2)) tp.tail = (kdloss_topk_tail)(pick(r, 16) ? pick(r, 3) : pick(r, 5) - 1);
    if (topk && tp.tail == KDLOSS_TAIL_RENORM_TEACHER && pick(r, 4)) tp.div.divergence = KDLOSS_DIV_FORWARD_KL;
    double T = pick(r, 8) == 7 ? param(r, 0.25, 4) : 1.0 + 0.5 * pick(r, 6);
    dp.temperature = tp.temperature = T;
    if (pick(r, 3) == 2) dp.weight_hard_loss = tp.weight_hard_loss = pick(r, 4) ? 0.25 * pick(r, 5) : param(r, 0, 2);
    if (pick(r, 4) == 3) dp.weight_soft_loss = tp.weight_soft_loss = pick(r, 4) ? 0.25 * pick(r, 5) : param(r, 0, 2);
    if (pick(r, 4) == 3) dp.t2_scale = tp.t2_scale = 1;
    if (pick(r, 4) == 3) dp.grad_scale = tp.grad_scale = pick(r, 4) ? 0.5 * pick(r, 5) : param(r, -4, 4);
    dp.ignore_index = tp.ignore_index = ign;
    size_t budget = pick(r, 16) == 15 ? (size_t)take(r, 3) : 0;
    /* outputs: loss, soft, hard, row_soft, row_hard, row_lse, dxs, dws, dbs (zero: loss, dxs, dws) */
    int want = ((int)take(r, 2) ^ (1 | 64 | 128)) & 511, bias = pick(r, 3) != 0, labels = pick(r, 8) != 7;
    if (!topk && !labels && pick(r, 2)) labels = 1;
    kdloss_dtype dt = pick(r, 4) != 3 ? KDLOSS_F32 : KDLOSS_BF16, tdt = pick(r, 4) != 3 ? KDLOSS_F32 : KDLOSS_BF16;
    kdloss_dtype ids_dt = pick(r, 2) ? KDLOSS_I32 : KDLOSS_I64, lab_dt = pick(r, 2) ? KDLOSS_I32 : KDLOSS_I64;
    /* blocks of random sizes, each at least one row */
    int64_t lo[VP_MAXR], nn[VP_MAXR], left = vt;
    for (int q = 0; q < size; q++) {
        nn[q] = q == size - 1 ? left : 1 + pick(r, (int)(left - (size - 1 - q)));
        lo[q] = vt - left;
        left -= nn[q];
    }
    /* the communicator's fault */
    memset(w, 0, sizeof *w);
    w->size = size;
    w->fail_rank = fail_rank, w->fail_call = fail_call;
    w->tamper_rank = tamper_rank, w->tamper_call = tamper_call, w->tamper_slot = tamper_slot, w->tamper_kind = tamper_kind;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int must_fail = 0; /* a difference in what the ranks must share: no rank may accept */
    for (int q = 0; q < size; q++) {
        vp_job *j = &vp_jobs[q];
        memset(j, 0, offsetof(vp_job, o));
        j->rank = q, j->topk = topk;
        j->dp = dp, j->tp = tp;
        j->dp.memory_budget = j->tp.memory_budget = budget;
        j->bt = bt, j->hs = hs, j->ht = ht, j->k = k, j->v = nn[q], j->lo = lo[q];
        j->dt = dt, j->tdt = tdt, j->ids_dt = ids_dt, j->bias = bias;
        j->want_bits = want & (bias ? 511 : 255);
        if (pick(r, 4) == 3) j->dp.chunk_size = j->tp.chunk_size = pick(r, VP_BT + 1);
        memcpy(j->lab64, d->lab64, sizeof j->lab64);
        memcpy(j->lab32, d->lab32, sizeof j->lab32);
        j->comm = (kdloss_comm){q, size, vp_allreduce, (void *)(intptr_t)q};
        j->shard = (kdloss_vocab_shard){&j->comm, vt, lo[q]};
    }
    vp_job *m = &vp_jobs[mr];
    int hard_on = m->dp.weight_hard_loss > 0 || (m->want_bits & (4 | 16));
    int grad_bits = 64 | 128 | 256;
    if (topk) hard_on = m->tp.weight_hard_loss > 0 || (m->want_bits & (4 | 16));
    switch (mut) {
    case VPM_VT_UP: m->shard.v_total++, must_fail = 1; break;
    case VPM_VT_DOWN: m->shard.v_total--, must_fail = 1; break;
    case VPM_TEMP: m->dp.temperature = m->tp.temperature = T == 2.0 ? 1.0 : 2.0, must_fail = 1; break;
    case VPM_DIV: /* from the divergence this entry point takes: the defaults differ (fused JSD, its
                     top-k form forward KL), so dp's plus 1..5 could be tp's own (h30f-crash-94a3cf14) */
        m->dp.div.divergence = m->tp.div.divergence =
            (kdloss_divergence)(((topk ? tp.div.divergence : dp.div.divergence) + 1 + pick(r, 5)) % 6);
        must_fail = 1;
        break;
    case VPM_NO_DXS: must_fail = (m->want_bits & 64) != 0, m->want_bits &= ~64; break;
    case VPM_NO_GRAD: must_fail = (m->want_bits & grad_bits) != 0, m->want_bits &= ~grad_bits; break;
    case VPM_ROW_LSE: /* the hard part (cross-entropy) with or without it */
        must_fail = !hard_on, m->want_bits ^= 32;
        break;
    case VPM_BF16: must_fail = m->dt == KDLOSS_F32, m->dt = KDLOSS_BF16; break;
    case VPM_TDT:
        if (topk) m->ids_dt = m->ids_dt == KDLOSS_I32 ? KDLOSS_I64 : KDLOSS_I32, must_fail = 1;
        else must_fail = m->tdt == KDLOSS_F32, m->tdt = KDLOSS_BF16;
        break;
    case VPM_BAD_TEMP: m->dp.temperature = m->tp.temperature = -1.0; break;
    case VPM_XS_NULL: m->xs_null = 1; break;
    case VPM_XS_MIS: m->xs_mis = 1; break;
    case VPM_SMALL_WORK: m->small_work = 1; break;
    case VPM_CHUNK: m->dp.chunk_size = m->tp.chunk_size = 1 + pick(r, VP_BT); break;
    case VPM_BLOCK: m->shard.v_begin += pick(r, 2) ? 1 : -1, must_fail = 1; break;
    case VPM_NO_BIAS: must_fail = m->bias, m->bias = 0, m->want_bits &= 255; break;
    case VPM_NO_LABELS: must_fail = labels, labels = labels ? 2 : 0; break; /* 2: not on this rank */
    case VPM_LABEL_VALUES: /* other labels in range with the same kept rows: not detectable */
        for (int64_t i = 0; i < bt; i++)
            if (m->lab64[i] >= 0 && m->lab64[i] < vt) m->lab64[i] = m->lab32[i] = (int32_t)((m->lab64[i] + 1) % vt);
        break;
    case VPM_GRAD_SCALE: m->dp.grad_scale = m->tp.grad_scale = dp.grad_scale == 1.0 ? 2.0 : 1.0, must_fail = 1; break;
    case VPM_WEIGHT: m->dp.weight_soft_loss = m->tp.weight_soft_loss = (topk ? tp.weight_soft_loss : dp.weight_soft_loss) == 0.5 ? 0.75 : 0.5, must_fail = 1; break;
    case VPM_IGNORE: m->dp.ignore_index = m->tp.ignore_index = ign == -100 ? -7 : -100, must_fail = 1; break;
    case VPM_T2: m->dp.t2_scale = m->tp.t2_scale = !dp.t2_scale, must_fail = 1; break;
    case VPM_LABEL_RANGE: {
        int i = pick(r, (int)bt);
        m->lab64[i] = vt + pick(r, 2), m->lab32[i] = (int32_t)m->lab64[i];
        break;
    }
    case VPM_BUDGET: m->dp.memory_budget = m->tp.memory_budget = 1; break;
    case VPM_SHAPE:
        if (topk) m->k = k == 1 ? 2 : k - 1;
        else m->ht = ht == 1 ? 2 : ht - 1;
        must_fail = 1;
        break;
    case VPM_TAIL:
        if (topk) m->tp.tail = (kdloss_topk_tail)((tp.tail + 1 + pick(r, 2)) % 3), must_fail = 1;
        break;
    }
    for (int q = 0; q < size; q++) {
        vp_job *j = &vp_jobs[q];
        int has = labels == 1 || (labels == 2 && q != mr);
        j->lab = (kdloss_labels){has ? (lab_dt == KDLOSS_I32 ? (const void *)j->lab32 : (const void *)j->lab64) : NULL, lab_dt};
        memset(&j->o, 0xA5, sizeof j->o);
    }
    memset(&vp_poison_ref, 0xA5, sizeof vp_poison_ref);
    snprintf(vp_desc, sizeof vp_desc,
             "%s size %d bt %lld hs %lld ht %lld k %lld vt %lld mut %d on rank %d fault %d (fail r%d c%d; tamper r%d c%d slot %lld kind %d) want %d T %g div %d tail %d wh %g ws %g special xs %d w/b %d lp %d",
             topk ? "topk" : "dense", size, (long long)bt, (long long)hs, (long long)ht, (long long)k, (long long)vt, mut, mr, fault,
             w->fail_rank, w->fail_call, w->tamper_rank, w->tamper_call, (long long)w->tamper_slot, w->tamper_kind, want, T,
             topk ? tp.div.divergence : dp.div.divergence, topk ? (int)tp.tail : -1, topk ? tp.weight_hard_loss : dp.weight_hard_loss,
             topk ? tp.weight_soft_loss : dp.weight_soft_loss, xs_special, ws_special, lp_special);
    n_calls++;
    n_vp_runs[topk]++;
    vp_run_ranks(size);
    /* every rank returned: now the checks */
    if (w->timed_out) FAIL("vp: a rank waited %d s in a collective (a hang): %s", VP_TIMEOUT_S, vp_desc);
    int mism = 0, late = 0;
    for (int q = 0; q < size; q++) mism |= w->mismatch[q], late |= w->late[q];
    if (mism) FAIL("vp: the ranks' all-reduces differ in count, dtype or op: %s", vp_desc);
    int nok = 0;
    for (int q = 0; q < size; q++) nok += vp_jobs[q].st == KDLOSS_OK;
    if (fault >= 2) n_vp_faults++;
    for (int q = 1; q < size; q++) { /* the same collectives on every rank */
        int same = w->ncalls[q] == w->ncalls[0];
        for (int i = 0; same && i < w->ncalls[0] && i < VP_LOG; i++)
            same = w->log_n[q][i] == w->log_n[0][i] && w->log_dt[q][i] == w->log_dt[0][i] && w->log_op[q][i] == w->log_op[0][i];
        if (!same && !w->fail_fired) FAIL("vp: rank %d's all-reduces differ from rank 0's (%d and %d calls): %s", q, w->ncalls[q], w->ncalls[0], vp_desc);
    }
    if (nok && nok != size)
        FAIL("vp: %d of %d ranks accepted (statuses %d %d %d): %s", nok, size, vp_jobs[0].st, vp_jobs[1].st, size > 2 ? vp_jobs[2].st : 0, vp_desc);
    if (nok && w->fail_fired) FAIL("vp: the callback failed but the ranks accepted: %s", vp_desc);
    if (nok && must_fail && fault != 3)
        FAIL("vp: rank %d's arguments differ in what the ranks must share (mutation %d) but every rank accepted: %s", mr, mut, vp_desc);
    for (int q = 0; q < size; q++) {
        vp_job *j = &vp_jobs[q];
        if (j->st == KDLOSS_OK) continue;
        n_rejected++;
        int after = j->st == KDLOSS_ERR_COMM && w->ncalls[q] > 2; /* may have written (kdloss.h) */
        if (!after && memcmp(&j->o, &vp_poison_ref, sizeof j->o) != 0)
            FAIL("vp: rank %d returned %d but wrote its outputs: %s", q, j->st, vp_desc);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    if (!nok) return;
    n_valid++;
    n_vp_ok[topk]++;
    if (late || mut == VPM_LABEL_VALUES) return;
    /* every rank the same results, bitwise */
    vp_job *j0 = &vp_jobs[0];
    for (int q = 1; q < size; q++) { /* the outputs both ranks asked for; NaN equals NaN */
        vp_job *j = &vp_jobs[q];
        int both = j->want_bits & j0->want_bits;
        for (int i = 0; i < 3; i++) {
            if ((both >> i) & 1 && memcmp(&j->o.sc[i], &j0->o.sc[i], 4) && !(isnan(j->o.sc[i]) && isnan(j0->o.sc[i])))
                FAIL("vp: rank %d's scalar %d differs from rank 0's (%.9g vs %.9g): %s", q, i, j->o.sc[i], j0->o.sc[i], vp_desc);
            for (int64_t e = 0; (both >> (3 + i)) & 1 && e < bt; e++) {
                float a = j->o.rows[i * VP_BT + e], b = j0->o.rows[i * VP_BT + e];
                if (memcmp(&a, &b, 4) && !(isnan(a) && isnan(b)))
                    FAIL("vp: rank %d's row output %d [%lld] differs from rank 0's (%.9g vs %.9g): %s", q, i, (long long)e, a, b, vp_desc);
            }
        }
        size_t dxb = (size_t)(bt * hs) * kdloss_dtype_size(j->dt);
        if ((both & 64) && j->dt == j0->dt && memcmp(j->o.dxs, j0->o.dxs, dxb))
            for (int64_t e = 0; e < bt * hs; e++) {
                double a = kt_get(j->o.dxs, j->dt, 0, 0, e), b = kt_get(j0->o.dxs, j0->dt, 0, 0, e);
                if (!(a == b || (isnan(a) && isnan(b))))
                    FAIL("vp: rank %d's dxs[%lld] differs from rank 0's (%.9g vs %.9g): %s", q, (long long)e, a, b, vp_desc);
            }
    }
    if (mut != VPM_NONE && mut != VPM_CHUNK) return;
    /* the single-process call on the whole heads */
    static _Alignas(64) vp_outs full;
    memset(&full, 0xA5, sizeof full);
    kdloss_fused_linear_distill_out out = vp_view(&full, j0->want_bits | 1, dt, hs); /* the loss: see inf_loss */
    kdloss_cmat xs = {vp_ptr(d->xs, d->xs16, dt, 0), dt, VP_H}, ws = {vp_ptr(d->ws, d->ws16, dt, 0), dt, VP_H};
    const void *bs = bias ? vp_ptr(d->bs, d->bs16, dt, 0) : NULL;
    kdloss_status st;
    if (topk) {
        kdloss_topk_teacher tk = {k, {ids_dt == KDLOSS_I32 ? (const void *)d->ids32 : (const void *)d->ids64, ids_dt, VP_K},
                                  {vp_ptr(d->lp, d->lp16, tdt, 0), tdt, VP_K}};
        st = kdloss_fused_linear_topk_distill(&j0->tp, bt, hs, vt, xs, ws, bs, tk, j0->lab, &out, NULL, 0);
    } else {
        kdloss_cmat xt = {vp_ptr(d->xt, d->xt16, tdt, 0), tdt, VP_H}, wt = {vp_ptr(d->wt, d->wt16, tdt, 0), tdt, VP_H};
        st = kdloss_fused_linear_distill(&j0->dp, bt, hs, ht, vt, xs, ws, bs, xt, wt, bias ? vp_ptr(d->bt, d->bt16, tdt, 0) : NULL,
                                         j0->lab, &out, NULL, 0);
    }
    if (st != KDLOSS_OK) {
        if (budget == 0) FAIL("vp: every rank accepted, the single-process call returned %d: %s", st, vp_desc);
        return;
    }
    /* values only where the parameters keep the sums well conditioned */
    double gs = topk ? tp.grad_scale : dp.grad_scale, wh = topk ? tp.weight_hard_loss : dp.weight_hard_loss;
    double wsft = topk ? tp.weight_soft_loss : dp.weight_soft_loss;
    if (!(T >= 0.25 && T <= 8 && fabs(gs) <= 8 && (gs == 0 || fabs(gs) >= 1e-3) && wh <= 4 && wsft <= 4)) return;
    int nanin = 0;
    double rt = dt == KDLOSS_BF16 || tdt == KDLOSS_BF16 ? 2e-3 : 1e-4;
    for (int i = 0; i < 3; i++)
        if (((j0->want_bits >> i) & 1) && !vp_close(j0->o.sc[i], full.sc[i], rt, rt))
            FAIL("vp: scalar %d: ranks %.9g, single-process %.9g: %s", i, j0->o.sc[i], full.sc[i], vp_desc);
    for (int i = 0; i < 3; i++)
        for (int64_t q = 0; ((j0->want_bits >> (3 + i)) & 1) && q < bt; q++) {
            nanin |= isnan(full.rows[i * VP_BT + q]);
            float a = j0->o.rows[i * VP_BT + q], b = full.rows[i * VP_BT + q];
            /* an inf hidden state or weight gives +-inf or NaN logits by each GEMM's own special
             * arithmetic (oneDNN's native bf16 matmul of the whole head gave NaN where a rank's
             * one-column product gave the IEEE -inf; a fuzz finding: bf16, xs +inf, both logits
             * -inf, row_lse -inf vs NaN): both non-finite then passes */
            if ((xs_special || ws_special) && !isfinite(a) && !isfinite(b)) continue;
            if (!vp_close(j0->o.rows[i * VP_BT + q], full.rows[i * VP_BT + q], rt, rt))
                FAIL("vp: row output %d [%lld]: ranks %.9g, single-process %.9g: %s", i, (long long)q, j0->o.rows[i * VP_BT + q], full.rows[i * VP_BT + q], vp_desc);
        }
    /* An infinite loss (a divergence at a probability 0, e.g. reverse KL at a -inf teacher
     * log-prob, or a logit of -inf from an infinite weight) has infinite gradient elements, and
     * inf - inf, 0 x inf inside the GEMMs are each implementation's own (a fuzz finding: a bf16
     * top-k bucket call, reverse KL, one -inf log-prob gave dws NaN in the single-process call,
     * -inf in a rank's slice): vp_grad_close then asks for non-finite against non-finite */
    int inf_loss = isinf(full.sc[0]);
    for (int i = 0; i < 3; i++) {
        inf_loss |= ((j0->want_bits >> i) & 1) && isinf(full.sc[i]);
        for (int64_t q = 0; ((j0->want_bits >> (3 + i)) & 1) && q < bt; q++) inf_loss |= isinf(full.rows[i * VP_BT + q]);
    }
    inf_loss |= xs_special || ws_special; /* inf x 0 = NaN or +-inf in the logits GEMMs themselves */
    double ge = dt == KDLOSS_BF16 ? 2e-2 : 1e-4;
    /* TVD: where P and Q agree to rounding the subgradient's sign may flip (a tie), moving an
     * element by up to Q_k: its gradients are not compared (its losses are) */
    int tvd = (topk ? tp.div.divergence : dp.div.divergence) == KDLOSS_DIV_TVD;
    if ((j0->want_bits & 64) && !tvd) {
        double mx = vp_max_finite(full.dxs, dt, 0, bt * hs);
        for (int64_t i = 0; i < bt * hs; i++)
            if (!vp_grad_close(kt_get(j0->o.dxs, dt, hs, 0, i), kt_get(full.dxs, dt, hs, 0, i), ge * mx + 1e-7, ge, inf_loss))
                FAIL("vp: dxs[%lld]: ranks %.9g, single-process %.9g: %s", (long long)i, kt_get(j0->o.dxs, dt, hs, 0, i), kt_get(full.dxs, dt, hs, 0, i), vp_desc);
    }
    for (int q = 0; q < size && !tvd; q++) {
        vp_job *j = &vp_jobs[q];
        for (int part = 0; part < 2; part++) {
            if (!(j->want_bits & (part ? 256 : 128))) continue;
            int64_t n = part ? j->v : j->v * hs, off = part ? j->lo : j->lo * hs;
            const void *a = part ? (const void *)j->o.dbs : (const void *)j->o.dws;
            const void *b = part ? (const void *)full.dbs : (const void *)full.dws;
            double mx = vp_max_finite(b, dt, off, n);
            for (int64_t i = 0; i < n; i++)
                if (!vp_grad_close(kt_get(a, dt, 0, 0, i), kt_get(b, dt, 0, 0, off + i), ge * mx + 1e-7, ge, inf_loss))
                    FAIL("vp: rank %d's %s[%lld]: %.9g, single-process %.9g: %s", q, part ? "dbs" : "dws", (long long)i, kt_get(a, dt, 0, 0, i), kt_get(b, dt, 0, 0, off + i), vp_desc);
        }
    }
    n_vp_nanrun += nanin;
    n_vp_compared[topk]++;
    n_ref_checked++;
}

/* ---- the public GEMMs (kdloss_gemm_f32, kdloss_gemm_bf16) ----
 * Arguments drawn as for the losses (providers valid and not, transposes 0 / 1 / 2, sizes,
 * strides, NULL / misaligned / aliasing pointers, alpha and beta special); a rejected call must
 * leave both arenas as they were, an accepted one with finite operands and a finite C is checked
 * against the product in double (each term of a bf16 product is exact in fp32). */
static void fuzz_gemm(rd *r, int bf16) {
    int prov = pick(r, 8) == 0 ? pick(r, 5) - 1 : pick(r, 4) == 0 ? KDLOSS_GEMM_ONEDNN : KDLOSS_GEMM_AUTO;
    int ta = pick(r, 8) == 0 ? 2 : pick(r, 2), tb = pick(r, 8) == 0 ? -1 : pick(r, 2);
    int64_t m = size_arg(r, 12), n = size_arg(r, 12), k = pick(r, 8) == 0 ? 0 : size_arg(r, 12);
    kdloss_dtype dt = bf16 ? KDLOSS_BF16 : KDLOSS_F32;
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ld_arg(r, ac), ldb = ld_arg(r, bc), ldc = ld_arg(r, n);
    if (lda == 0) lda = ac > 0 ? ac : 1;
    if (ldb == 0) ldb = bc > 0 ? bc : 1;
    if (ldc == 0) ldc = n > 0 ? n : 1;
    const void *a = ptr_arg(r, in_arena, 1), *b = ptr_arg(r, in_arena, 1);
    float *c = (float *)ptr_arg(r, pick(r, 12) ? out_arena : in_arena, 1);
    float alpha = (float)(pick(r, 3) ? 1.0 : param(r, -2, 2));
    float beta = (float)(pick(r, 2) ? 0.0 : pick(r, 3) ? 1.0 : param(r, -2, 2));
    unsigned char *ca = (unsigned char *)c >= in_arena && (unsigned char *)c < in_arena + ARENA ? in_arena : out_arena;
    if (!fits(a, in_arena, ar, ac, lda, dt) || !fits(b, in_arena, br, bc, ldb, dt) ||
        !fits(c, ca, m, n, ldc, KDLOSS_F32))
        return;
    call_begin();
    kdloss_status st = bf16 ? kdloss_gemm_bf16((kdloss_gemm_provider)prov, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc)
                            : kdloss_gemm_f32((kdloss_gemm_provider)prov, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (st == KDLOSS_ERR_UNSUPPORTED) { /* a provider or a bf16 GEMM this machine lacks: an error all the same */
        call_rejected(st, bf16 ? "gemm_bf16" : "gemm_f32");
        return;
    }
    if (call_rejected(st, bf16 ? "gemm_bf16" : "gemm_f32")) return;
    if (ca == in_arena || m > 12 || n > 12 || k > 12) return; /* C inside the operands' arena: not compared */
    if (bf16) alpha = 1.0f;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0, mag = 0, daz = 0;
            for (int64_t q = 0; q < k; q++) {
                double x = getv(in_snap, in_arena, a, dt, lda, ta ? q : i, ta ? i : q);
                double y = getv(in_snap, in_arena, b, dt, ldb, tb ? j : q, tb ? q : j);
                want += x * y, mag += fabs(x * y);
                /* native bf16 dot products (AVX512_BF16's) read a subnormal operand as 0
                 * (kdloss.h, kdloss_gemm_bf16): such a term may be there or not (a fuzz
                 * finding: a[0][2] = 1.1e-38 times -1.8e37) */
                if (bf16 && ((x != 0 && fabs(x) < 0x1p-126) || (y != 0 && fabs(y) < 0x1p-126))) daz += fabs(x * y);
            }
            double c0 = beta == 0.0f ? 0.0 : getv(out_snap, out_arena, c, KDLOSS_F32, ldc, i, j);
            want = (double)alpha * want + (double)beta * c0;
            mag = fabs((double)alpha) * mag + fabs((double)beta * c0);
            if (!isfinite(want) || !isfinite(mag) || mag > 1e30) continue;
            double got = c[i * ldc + j];
            if (!(fabs(got - want) <= 4 * (double)(k + 2) * 0x1p-24 * mag + daz + 1e-30))
                FAIL("gemm_%s (%lld,%lld): got %.9g want %.9g (m %lld n %lld k %lld ta %d tb %d "
                     "lda %lld ldb %lld ldc %lld beta %g alpha %g provider %d; a, b, c at %td, %td, %td)",
                     bf16 ? "bf16" : "f32", (long long)i, (long long)j, got, want, (long long)m,
                     (long long)n, (long long)k, ta, tb, (long long)lda, (long long)ldb,
                     (long long)ldc, beta, alpha, prov, (const unsigned char *)a - in_arena,
                     (const unsigned char *)b - in_arena, (unsigned char *)c - ca);
        }
    n_ref_checked++;
}

/* ---- the queries, names and settings: arguments from the input (names as bytes, enums in and
 * out of range, NULL outputs); each returns a status or a string, never crashes, and after an
 * error kdloss_error_detail() is a valid string. The settings are put back as they were. ---- */
static void fuzz_misc(rd *r) {
    char name[24];
    int len = pick(r, (int)sizeof name);
    for (int i = 0; i < len; i++) name[i] = (char)take(r, 1);
    name[len] = 0;
    static const char *const known[] = {"forward_kl", "reverse_kl", "jsd", "tvd", "bucket",
                                        "renorm_both", "renorm_teacher", "kdloss_kl_params"};
    const char *nm = pick(r, 3) == 0 ? known[pick(r, 8)] : pick(r, 16) == 0 ? NULL : name;
    int e = (int)take(r, 1) - 8;
    kdloss_divergence dv;
    kdloss_topk_tail tl;
    kdloss_gemm_info gi;
    kdloss_bf16_gemm_info bi;
    const char *field = NULL;
    size_t off = 0, sz = 0;
    kdloss_status st = KDLOSS_OK;
    switch (pick(r, 12)) {
    case 0: st = kdloss_divergence_from_name(nm, pick(r, 8) ? &dv : NULL); break;
    case 1: st = kdloss_topk_tail_from_name(nm, pick(r, 8) ? &tl : NULL); break;
    case 2: st = kdloss_abi_layout(nm, e, pick(r, 8) ? &field : NULL, &off, &sz); break;
    case 3: st = kdloss_gemm_query((kdloss_gemm_provider)e, pick(r, 8) ? &gi : NULL); break;
    case 4: st = kdloss_gemm_bf16_query(pick(r, 8) ? &bi : NULL); break;
    case 5: { /* a setting, then back to AUTO (the fuzzer's default) */
        st = kdloss_gemm_set_bf16_grad((kdloss_bf16_grad)e);
        kdloss_gemm_set_bf16_grad(KDLOSS_BF16_GRAD_AUTO);
        break;
    }
    case 6:
        st = kdloss_gemm_set_provider((kdloss_gemm_provider)e);
        kdloss_gemm_set_provider(KDLOSS_GEMM_AUTO);
        break;
    case 7:
        st = kdloss_gemm_set_bf16((kdloss_bf16_gemm)e);
        kdloss_gemm_set_bf16(KDLOSS_BF16_GEMM_AUTO);
        break;
    case 8:
        if (!kdloss_divergence_name((kdloss_divergence)e) || !kdloss_topk_tail_name((kdloss_topk_tail)e) ||
            !kdloss_dtype_name((kdloss_dtype)e) || !kdloss_status_string((kdloss_status)e) ||
            !kdloss_cpu_isa_name((kdloss_cpu_isa)e))
            FAIL("a name function returned NULL for %d", e);
        break;
    case 9: st = kdloss_cpu_set_isa((kdloss_cpu_isa)e); break; /* the next input sets it again */
    case 10: {
        size_t b = 0;
        kdloss_fused_linear_distill_params p;
        kdloss_fused_linear_distill_params_default(&p);
        if (pick(r, 2)) p.temperature = param(r, 0, 4);
        int64_t bt = size_arg(r, 64), hs = size_arg(r, 64), ht = size_arg(r, 64), v = size_arg(r, 4096);
        st = pick(r, 2) ? kdloss_fused_linear_distill_workspace_size(&p, bt, hs, ht, v, dtype_arg(r), pick(r, 3), pick(r, 8) ? &b : NULL)
                        : kdloss_fused_linear_distill_min_budget(&p, bt, hs, ht, v, dtype_arg(r), pick(r, 3), pick(r, 8) ? &b : NULL);
        break;
    }
    default: {
        size_t b = 0;
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        if (pick(r, 2)) p.tail = (kdloss_topk_tail)(pick(r, 5) - 1);
        int64_t bt = size_arg(r, 64), hs = size_arg(r, 64), v = size_arg(r, 4096), k = size_arg(r, 64);
        st = kdloss_fused_linear_topk_distill_min_budget(&p, bt, hs, v, k, dtype_arg(r), pick(r, 3), pick(r, 8) ? &b : NULL);
        break;
    }
    }
    if (st != KDLOSS_OK && (!kdloss_error_detail() || strlen(kdloss_error_detail()) >= 384))
        FAIL("an error left no valid detail string");
    n_calls++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int init;
    if (!init) {
        init = 1;
        atexit(report);
    }
    rd r = {data, size};
    fill_inputs(take(&r, 2));
    memset(out_arena, 0xA5, ARENA);
    int isa = pick(&r, 4);
    if (kdloss_cpu_isa_supported((kdloss_cpu_isa)isa)) kdloss_cpu_set_isa((kdloss_cpu_isa)isa);
    switch (pick(&r, 17)) {
    case 0: fuzz_kl(&r); break;
    case 1: fuzz_jsd(&r); break;
    case 2: case 3: fuzz_fld(&r, 0); break;
    case 4: fuzz_fld(&r, 1); break;
    case 5: case 6: fuzz_topk_logits(&r); break;
    case 7: fuzz_topk_fused(&r, 0); break;
    case 8: fuzz_topk_fused(&r, 1); break;
    case 9: fuzz_distill(&r, 0); break;
    case 10: fuzz_distill(&r, 1); break;
    case 11: fuzz_vp(&r, 0); break;
    case 12: fuzz_vp(&r, 1); break;
    case 13: fuzz_gemm(&r, 0); break;
    case 14: fuzz_gemm(&r, 1); break;
    case 15: fuzz_misc(&r); break;
    default: fuzz_vp(&r, pick(&r, 2)); break;
    }
    return 0;
}
