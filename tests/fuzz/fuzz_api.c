/* libFuzzer target over the whole C API (issue 12): kdloss_kl_div, kdloss_jsd,
 * kdloss_fused_linear_jsd, kdloss_fljsd_workspace_size and kdloss_fljsd_min_budget, and the
 * sparse top-k teacher (issue 10): kdloss_topk_distill_logits, kdloss_fused_linear_topk_distill
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
 * Built with clang -fsanitize=fuzzer,address,undefined (make fuzz; a bounded run in make test).
 * Counters are printed at exit: calls, rejected calls with untouched arenas, reference checks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void report(void) {
    fprintf(stderr, "fuzz_api: %lu calls, %lu rejected with nothing written, %lu accepted, "
            "%lu checked against the double reference\n",
            n_calls, n_rejected, n_valid, n_ref_checked);
    fprintf(stderr, "fuzz_api: top-k: logits form %lu accepted, %lu checked; fused form %lu "
            "accepted, %lu checked\n",
            n_topk_valid[0], n_topk_checked[0], n_topk_valid[1], n_topk_checked[1]);
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
     * reference uses that rounded factor (issue 25, D7: a false positive with 1e-45) */
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
    switch (pick(&r, 9)) {
    case 0: fuzz_kl(&r); break;
    case 1: fuzz_jsd(&r); break;
    case 2: case 3: fuzz_fld(&r, 0); break;
    case 4: fuzz_fld(&r, 1); break;
    case 5: case 6: fuzz_topk_logits(&r); break;
    case 7: fuzz_topk_fused(&r, 0); break;
    default: fuzz_topk_fused(&r, 1); break;
    }
    return 0;
}
