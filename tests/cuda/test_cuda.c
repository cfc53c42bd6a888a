/* CUDA backend test: every CUDA path against a float64 reference written here (the oracle), and
 * against the library's own CPU functions when they are linked (weak symbols: this branch may be
 * built before the CPU kernels land). Also: error codes (same as the CPU's), "nothing written on
 * error", the device status word for out-of-range labels, in-place and strided/misaligned
 * operands, and bitwise run-to-run reproducibility.
 *
 * Without a GPU, the argument checks still run (they return before any CUDA call, so any
 * pointer will do), then the binary prints "skipped: no CUDA device" and exits with the result
 * of those checks.
 *
 * KDLOSS_TEST_QUICK=1 runs a subset (for compute-sanitizer runs); the special cases always run.
 *
 * Tolerances (|got - want| <= atol + rtol |want|, per element, or normwise for GEMM outputs):
 *  - an output rounded to dtype d carries up to one unit roundoff u(d) (2^-24, 2^-8, 2^-11)
 *    from that rounding, plus the fp32 arithmetic of the kernels (~1e-6 relative; expf/logf
 *    of CUDA and of glibc differ by an ulp or two): rtol = 2 u(d) + 1e-5;
 *  - cancellation (JSD terms where X ~ log M) makes relative error meaningless near zero:
 *    atol = 1e-5 x the largest |reference| in the tensor (1e-6 for KL, whose gradient is -t);
 *  - scalar losses are double sums of fp32 terms: rtol 1e-4, atol 1e-5 x the sum of |terms|;
 *  - fused-linear gradients go through GEMMs: normwise 1e-4 in fp32 (no TF32), and 1.5e-2 in
 *    bf16, where dzs itself is rounded to bf16 (2^-9) before the two backward GEMMs.
 *
 * The divergence family (kdloss_cuda_distill, kdloss_cuda_fused_linear_distill): the JSD cases'
 * structure for every divergence and its alpha / beta end points, against ref_div_elem of
 * tests/support/reference.h (the CPU tests' float64 reference, written from the definitions);
 * the same tolerances, except TVD's subgradient, whose sign may differ where P and Q agree to
 * fp32 rounding (those elements are not compared). The fused cases also check t2_scale and the
 * per-row outputs row_soft, row_hard, row_lse (rtol 1e-4, or 1e-3 with bf16 operands).
 *
 * The vocabulary-parallel entry points (test_vp: 2 and 3 ranks as threads on one GPU, with this
 * file's own communicator) are compared with the single-process CUDA call instead, at
 * tests/mpi/test_vp.c's tolerances (losses 1e-6 relative, gradients 1e-5), and their all-reduce
 * sequence with the documented protocol; the NCCL adapter runs with one rank where CMake found
 * NCCL (KDLOSS_TEST_NCCL).
 *
 * The divergence family on logits (kdloss_cuda_distill_logits, tag "dlogits"): every case of
 * div_cases.h at T 1, 2, 0.7 against a float64 reference written here (log_softmax(z / T) in
 * double, ref_div_elem, dz = (g - Q sum g) / T), with the top-k logits loss's tolerances plus
 * what S = sum g carries to element j as Q_j dS: 64 u of its terms' magnitudes (the bound
 * test_distill_logits holds the CPU to; its scalar path sums S sequentially in fp32), and for
 * TVD Q_k of each element k where P and Q agree to fp32 rounding (either subgradient; that
 * element itself may move by Q_k).
 *
 * The NaN policy and wide rows (issue 25 D6, D4; tag "nan", test_nan): tests/test_nan_policy.c's
 * cases on the CUDA entry points (a poisoned middle row of 3: its loss, the total and every
 * element of its gradient NaN, the other rows bitwise the clean call's), and rows spanning more
 * than FLT_MAX against the CPU functions. KDLOSS_TEST_ONLY=nan runs that section alone. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kdloss.h"
#include "reference.h"
#include "ref_topk.h"
#include "div_cases.h"
#include "testutil.h"
#include "vp.h" /* the agreement buffer's slots (src/common), for the communicator's faults */
#ifdef KDLOSS_TEST_NCCL
#include "kdloss_nccl.h" /* built where CMake found NCCL: the adapter compiles and links here */
#endif

/* The CPU functions, when this build has them (resolved to NULL otherwise). */
#pragma weak kdloss_kl_div
#pragma weak kdloss_jsd
#pragma weak kdloss_fused_linear_jsd
#pragma weak kdloss_distill
#pragma weak kdloss_distill_logits
#pragma weak kdloss_fused_linear_distill
#pragma weak kdloss_topk_distill_logits
#pragma weak kdloss_fused_linear_topk_distill

static kdloss_cuda_context *g_ctx;
static cudaStream_t g_st;
static int g_gpu;

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("out of host memory\n");
        exit(1);
    }
    return p;
}

static void *dalloc(size_t n) {
    void *p = NULL;
    CK(cudaMalloc(&p, n ? n : 1));
    return p;
}
/* The library runs on g_st, a non-blocking stream, which does not wait for the legacy default
 * stream that cudaMemcpy/cudaMemset use (and a pageable host-to-device copy may still be in
 * flight when cudaMemcpy returns): the setup helpers therefore end with a device-wide sync, and
 * results are read only after cudaStreamSynchronize(g_st). */
static void h2d(void *d, const void *h, size_t n) {
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}
static void d2h(void *h, const void *d, size_t n) { CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
/* 0xFF bytes are NaN in every float dtype: an element still NaN afterwards was never written */
static void dpoison(void *d, size_t n) {
    CK(cudaMemset(d, 0xFF, n));
    CK(cudaDeviceSynchronize());
}

static double unit(kdloss_dtype d) { return kt_eps(d); }

/* Reads n = rows x cols elements of dtype dt (row pitch ld) into doubles. */
static double *to_double(const void *p, kdloss_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
    double *o = xmalloc((size_t)(rows * cols) * sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) o[r * cols + c] = kt_get(p, dt, ld, r, c);
    return o;
}

static double max_abs(const double *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

static int close1(double got, double want, double atol, double rtol) {
    if (isnan(want) || isinf(want)) return (isnan(want) && isnan(got)) || got == want;
    return isfinite(got) && fabs(got - want) <= atol + rtol * fabs(want);
}

/* One check per tensor; prints the first few mismatches. */
static void cmp_arr(const char *what, const double *got, const double *ref, int64_t n, double atol,
                    double rtol) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!close1(got[i], ref[i], atol, rtol)) {
            if (bad < 3)
                printf("  %s[%lld]: got %.9g want %.9g\n", what, (long long)i, got[i], ref[i]);
            bad++;
        }
    }
    KT_CHECK(bad == 0, "%s: %lld of %lld elements off (atol %.3g rtol %.3g)", what,
             (long long)bad, (long long)n, atol, rtol);
}

/* Normwise relative error ||got - ref|| / ||ref||, all elements finite. */
static void cmp_norm(const char *what, const double *got, const double *ref, int64_t n, double tol) {
    double num = 0, den = 0;
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) nonfinite++;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    KT_CHECK(nonfinite == 0 && rel <= tol, "%s: normwise error %.3g (tol %.3g), %lld non-finite",
             what, rel, tol, (long long)nonfinite);
}

/* 1 if the padding columns [v, ld) of every row still hold the 0xFF poison. */
static int pad_untouched(const void *h, kdloss_dtype dt, int64_t bt, int64_t v, int64_t ld) {
    const size_t es = kdloss_dtype_size(dt);
    const unsigned char *b = h;
    for (int64_t r = 0; r < bt; r++)
        for (size_t i = (size_t)(r * ld + v) * es; i < (size_t)((r + 1) * ld) * es; i++)
            if (b[i] != 0xFF) return 0;
    return 1;
}

static void cmp_bits(const char *what, const void *a, const void *b, size_t n) {
    KT_CHECK(memcmp(a, b, n) == 0, "%s: two runs differ bitwise", what);
}

static int32_t read_status(const void *dws) {
    int32_t s = 0;
    d2h(&s, dws, sizeof s);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* float64 references                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* KL elementwise: returns l, writes dl/dy (unscaled). */
static double cu_ref_kl_elem(int log_target, double eps, double y, double t, double *g) {
    if (log_target) {
        double et = exp(t);
        *g = -et;
        return et > 0 ? et * (t - y) : 0.0;
    }
    *g = -t;
    return t != 0 ? t * (log(t > eps ? t : eps) - y) : 0.0;
}

/* JSD(beta) elementwise on log-probs x (student), y (teacher): returns l, writes dl/dx. */
static double cu_ref_jsd_elem(double beta, double x, double y, double *g) {
    if (beta == 0.0) {
        double p = exp(y);
        *g = -p;
        return p > 0 ? p * (y - x) : 0.0;
    }
    if (beta == 1.0) {
        double q = exp(x);
        *g = q > 0 ? q * (x - y + 1.0) : 0.0;
        return q > 0 ? q * (x - y) : 0.0;
    }
    double a = log(beta) + y, b = log1p(-beta) + x;
    double m = a > b ? a : b;
    double lm = m == -INFINITY ? -INFINITY : m + log(exp(a - m) + exp(b - m));
    double p = exp(y), q = exp(x);
    double ta = p > 0 ? beta * p * (y - lm) : 0.0;
    double tb = q > 0 ? (1.0 - beta) * q * (x - lm) : 0.0;
    *g = tb;
    return ta + tb;
}

static double logsumexp(const double *z, int64_t n, double scale) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = z[i] * scale > m ? z[i] * scale : m;
    if (m == -INFINITY) return m;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += exp(z[i] * scale - m);
    return m + log(s);
}

/* ------------------------------------------------------------------------------------------ */
/* KL                                                                                          */
/* ------------------------------------------------------------------------------------------ */

static const char *red_name(kdloss_reduction r) {
    static const char *n[] = {"none", "sum", "mean", "batchmean"};
    return n[r];
}

/* One KL case. pad: extra columns per row (ld = v + pad); misalign: operands start one element
 * past a 16-byte boundary (scalar path); in_place: grad overwrites the input. */
static void test_kl_case(kt_rng *rng, int64_t bt, int64_t v, kdloss_dtype di, kdloss_dtype dt,
                         int log_target, kdloss_reduction red, int64_t pad, int misalign,
                         int in_place) {
    char tag[160];
    snprintf(tag, sizeof tag, "kl bt=%lld v=%lld in=%s t=%s log_target=%d %s pad=%lld mis=%d ip=%d",
             (long long)bt, (long long)v, kt_dtype_name(di), kt_dtype_name(dt), log_target,
             red_name(red), (long long)pad, misalign, in_place);
    const int64_t ld = v + pad, n = bt * v;
    const size_t ei = kdloss_dtype_size(di), et = kdloss_dtype_size(dt);
    double *y = xmalloc((size_t)n * 8), *t = xmalloc((size_t)n * 8);
    kt_gen_logprobs(rng, y, bt, v, 0, 0);
    kt_gen_logprobs(rng, t, bt, v, 1, 2);
    if (!log_target)
        for (int64_t i = 0; i < n; i++) t[i] = exp(t[i]);
    kt_round_to(y, n, di);
    kt_round_to(t, n, dt);
    void *hy = kt_pack(y, bt, v, ld, di), *ht = kt_pack(t, bt, v, ld, dt);

    const size_t off_i = misalign ? ei : 0, off_t = misalign ? et : 0;
    char *dy0 = dalloc((size_t)(bt * ld) * ei + 16), *dt0 = dalloc((size_t)(bt * ld) * et + 16);
    void *dy = dy0 + off_i, *dtg = dt0 + off_t;
    h2d(dy, hy, (size_t)(bt * ld) * ei);
    h2d(dtg, ht, (size_t)(bt * ld) * et);
    char *dg0 = in_place ? NULL : dalloc((size_t)(bt * ld) * ei + 16);
    void *dg = in_place ? dy : dg0 + off_i;
    if (!in_place) dpoison(dg, (size_t)(bt * ld) * ei);
    float *de = NULL, *dloss = NULL, *drow = dalloc((size_t)bt * 4);
    if (red == KDLOSS_REDUCTION_NONE) {
        de = dalloc((size_t)(bt * ld) * 4);
        dpoison(de, (size_t)(bt * ld) * 4);
    } else {
        dloss = dalloc(4);
        dpoison(dloss, 4);
    }
    dpoison(drow, (size_t)bt * 4);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(bt, v, &wsb) == KDLOSS_OK, "%s: ws size", tag);
    void *dws = dalloc(wsb);

    kdloss_kl_params p;
    p.reduction = red;
    p.log_target = log_target;
    p.eps = 1e-10;
    p.grad_scale = 0.75;
    kdloss_cmat in = {dy, di, ld}, tg = {dtg, dt, ld};
    kdloss_mat el = {de, KDLOSS_F32, ld}, gr = {dg, di, ld};
    kdloss_status s = kdloss_cuda_kl_div(g_ctx, g_st, &p, bt, v, in, tg, dloss, drow, el, gr, dws, wsb);
    CK(cudaStreamSynchronize(g_st));
    if (!KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) goto done;
    KT_CHECK(read_status(dws) == KDLOSS_OK, "%s: device status word", tag);

    {
        /* reference */
        double denom = red == KDLOSS_REDUCTION_MEAN ? (double)bt * (double)v
                       : red == KDLOSS_REDUCTION_BATCHMEAN ? (double)bt : 1.0;
        double scale = 0.75 / denom, feps = (double)(float)1e-10;
        double *rg = xmalloc((size_t)n * 8), *rl = xmalloc((size_t)n * 8);
        double *rrow = xmalloc((size_t)bt * 8), tot = 0, abs_tot = 0;
        for (int64_t r = 0; r < bt; r++) {
            double rs = 0;
            for (int64_t c = 0; c < v; c++) {
                double g;
                double l = cu_ref_kl_elem(log_target, feps, y[r * v + c], t[r * v + c], &g);
                rg[r * v + c] = g * scale;
                rl[r * v + c] = l;
                rs += l;
                abs_tot += fabs(l);
            }
            rrow[r] = rs;
            tot += rs;
        }
        void *hg = xmalloc((size_t)(bt * ld) * ei);
        d2h(hg, dg, (size_t)(bt * ld) * ei);
        double *gg = to_double(hg, di, bt, v, ld);
        char what[200];
        snprintf(what, sizeof what, "%s grad", tag);
        cmp_arr(what, gg, rg, n, 1e-6 * max_abs(rg, n) + (di == KDLOSS_F16 ? 6e-8 : 0),
                2 * unit(di) + 1e-5);
        if (!in_place) KT_CHECK(pad_untouched(hg, di, bt, v, ld), "%s: grad padding written", tag);
        if (de) {
            float *he = xmalloc((size_t)(bt * ld) * 4);
            d2h(he, de, (size_t)(bt * ld) * 4);
            double *ee = to_double(he, KDLOSS_F32, bt, v, ld);
            snprintf(what, sizeof what, "%s elem_loss", tag);
            cmp_arr(what, ee, rl, n, 1e-5 * max_abs(rl, n), 1e-5);
            KT_CHECK(pad_untouched(he, KDLOSS_F32, bt, v, ld), "%s: elem_loss padding written", tag);
            free(ee);
            free(he);
        }
        float *hrow = xmalloc((size_t)bt * 4);
        d2h(hrow, drow, (size_t)bt * 4);
        double *grow = to_double(hrow, KDLOSS_F32, 1, bt, bt);
        snprintf(what, sizeof what, "%s row_loss", tag);
        cmp_arr(what, grow, rrow, bt, 1e-5 * abs_tot / (double)bt + 1e-30, 1e-4);
        float hl = 0;
        if (dloss) {
            d2h(&hl, dloss, 4);
            kt_close(hl, tot / denom, 1e-5 * abs_tot / denom + 1e-30, 1e-4, "%s loss", tag);
        }

        /* same call again: bitwise the same (not in place: the input is gone) */
        if (!in_place) {
            void *hg2 = xmalloc((size_t)(bt * ld) * ei);
            float hl2 = 0;
            s = kdloss_cuda_kl_div(g_ctx, g_st, &p, bt, v, in, tg, dloss, drow, el, gr, dws, wsb);
            CK(cudaStreamSynchronize(g_st));
            d2h(hg2, dg, (size_t)(bt * ld) * ei);
            if (dloss) d2h(&hl2, dloss, 4);
            snprintf(what, sizeof what, "%s grad", tag);
            cmp_bits(what, hg, hg2, (size_t)(bt * ld) * ei);
            KT_CHECK(memcmp(&hl, &hl2, 4) == 0, "%s: loss differs between runs", tag);
            free(hg2);
        }

        /* the CPU function on the same inputs */
        if (kdloss_kl_div && !misalign) {
            void *cg = xmalloc((size_t)(bt * ld) * ei);
            float *ce = de ? xmalloc((size_t)(bt * ld) * 4) : NULL, *crow = xmalloc((size_t)bt * 4);
            float cl = 0;
            kdloss_cmat cin = {hy, di, ld}, ctg = {ht, dt, ld};
            kdloss_mat cel = {ce, KDLOSS_F32, ld}, cgr = {cg, di, ld};
            s = kdloss_kl_div(&p, bt, v, cin, ctg, dloss ? &cl : NULL, crow, cel, cgr);
            if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
                double *cgg = to_double(cg, di, bt, v, ld);
                snprintf(what, sizeof what, "%s grad vs CPU", tag);
                cmp_arr(what, gg, cgg, n, 1e-6 * max_abs(cgg, n) + (di == KDLOSS_F16 ? 6e-8 : 0),
                        2 * unit(di) + 1e-5);
                if (dloss) kt_close(hl, cl, 1e-5 * abs_tot / denom + 1e-30, 1e-4, "%s loss vs CPU", tag);
                free(cgg);
            }
            free(cg);
            free(ce);
            free(crow);
        }
        free(rg);
        free(rl);
        free(rrow);
        free(hg);
        free(gg);
        free(hrow);
        free(grow);
    }
done:
    CK(cudaFree(dy0));
    CK(cudaFree(dt0));
    if (dg0) CK(cudaFree(dg0));
    if (de) CK(cudaFree(de));
    if (dloss) CK(cudaFree(dloss));
    CK(cudaFree(drow));
    CK(cudaFree(dws));
    free(hy);
    free(ht);
    free(y);
    free(t);
}

static void test_kl(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    const int64_t vs[] = {1, 37, 4096, 9001};
    int k = 0;
    for (int red = 0; red < 4; red++)
        for (int lt = 0; lt < 2; lt++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++, k++)
                    if (!kt_quick() || k % 7 == 0)
                        test_kl_case(rng, 19, vs[k % 4], dts[i], dts[j], lt,
                                     (kdloss_reduction)red, 0, 0, 0);
    /* strided, misaligned (scalar path), in place, a larger tile count */
    test_kl_case(rng, 7, 4099, KDLOSS_BF16, KDLOSS_F32, 0, KDLOSS_REDUCTION_BATCHMEAN, 5, 0, 0);
    test_kl_case(rng, 7, 4099, KDLOSS_F16, KDLOSS_BF16, 1, KDLOSS_REDUCTION_SUM, 3, 1, 0);
    test_kl_case(rng, 7, 1000, KDLOSS_F32, KDLOSS_F32, 0, KDLOSS_REDUCTION_MEAN, 0, 1, 0);
    test_kl_case(rng, 9, 513, KDLOSS_F32, KDLOSS_F32, 1, KDLOSS_REDUCTION_BATCHMEAN, 0, 0, 1);
    test_kl_case(rng, 9, 513, KDLOSS_BF16, KDLOSS_BF16, 0, KDLOSS_REDUCTION_SUM, 8, 0, 1);
    test_kl_case(rng, 3, 100000, KDLOSS_BF16, KDLOSS_F32, 0, KDLOSS_REDUCTION_BATCHMEAN, 0, 0, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* JSD                                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* labels: 0 none, 1 I64 with ignored rows, 2 I32 with ignored rows, 3 I64 all ignored,
 * 4 I32 with one out-of-range label. */
/* Where -inf log-probs keep the divergence finite (as tests/test_distill.c): not in the
 * student for forward KL (P > 0 needs Q > 0), not in the teacher for reverse KL. */
static int div_fwd_like(const kdloss_div_params *d) {
    return d->divergence == KDLOSS_DIV_FORWARD_KL ||
           (d->divergence == KDLOSS_DIV_JSD && d->beta == 0.0) ||
           (d->divergence == KDLOSS_DIV_SKEW_FORWARD_KL && d->alpha == 0.0);
}
static int div_rev_like(const kdloss_div_params *d) {
    return d->divergence == KDLOSS_DIV_REVERSE_KL ||
           (d->divergence == KDLOSS_DIV_JSD && d->beta == 1.0) ||
           (d->divergence == KDLOSS_DIV_SKEW_REVERSE_KL && d->alpha == 0.0);
}

/* TVD's subgradient at (near) ties: P and Q equal to fp32 rounding, either sign is right. */
static int tvd_tie(const kdloss_div_params *d, double x, double y) {
    double p = exp(y), q = exp(x);
    return d->divergence == KDLOSS_DIV_TVD && fabs(p - q) <= 1e-5 * (p + q);
}

/* One elementwise case. dv NULL: kdloss_cuda_jsd with `beta` (its own reference); otherwise
 * kdloss_cuda_distill with *dv (beta unused), against ref_div_elem and kdloss_distill. */
static void test_div_case(kt_rng *rng, int64_t bt, int64_t v, kdloss_dtype ds, kdloss_dtype dt,
                          double beta, const kdloss_div_params *dv, int labels_kind, int64_t pad,
                          int misalign, int in_place) {
    char tag[200];
    kdloss_div_params d = {KDLOSS_DIV_JSD, beta, 0.1};
    if (dv) d = *dv;
    snprintf(tag, sizeof tag,
             "%s %s bt=%lld v=%lld s=%s t=%s beta=%g alpha=%g labels=%d pad=%lld mis=%d ip=%d",
             dv ? "distill" : "jsd", kdloss_divergence_name(d.divergence), (long long)bt,
             (long long)v, kt_dtype_name(ds), kt_dtype_name(dt), d.beta, d.alpha, labels_kind,
             (long long)pad, misalign, in_place);
    const int64_t ld = v + pad, n = bt * v;
    const size_t es = kdloss_dtype_size(ds), et = kdloss_dtype_size(dt);
    double *x = xmalloc((size_t)n * 8), *y = xmalloc((size_t)n * 8);
    /* -inf entries everywhere except where they make the loss infinite (and every tolerance
     * meaningless): student -inf under forward KL, teacher -inf under reverse KL */
    kt_gen_logprobs(rng, x, bt, v, !div_fwd_like(&d), 0);
    kt_gen_logprobs(rng, y, bt, v, !div_rev_like(&d), 3);
    kt_round_to(x, n, ds);
    kt_round_to(y, n, dt);
    void *hx = kt_pack(x, bt, v, ld, ds), *hy = kt_pack(y, bt, v, ld, dt);

    const int64_t ignore = -100;
    int64_t *lab = xmalloc((size_t)bt * 8);
    int n_valid = 0;
    for (int64_t r = 0; r < bt; r++) {
        lab[r] = labels_kind == 3 || r % 4 == 1 ? ignore : kt_randint(rng, v);
        if (labels_kind == 0) lab[r] = 0;
        if (lab[r] != ignore) n_valid++;
    }
    if (labels_kind == 4) lab[bt / 2] = v; /* out of range */
    kdloss_dtype ldt = labels_kind == 2 || labels_kind == 4 ? KDLOSS_I32 : KDLOSS_I64;
    void *dlab = NULL;
    if (labels_kind) {
        size_t lsz = kdloss_dtype_size(ldt);
        char *hl = xmalloc((size_t)bt * lsz);
        for (int64_t r = 0; r < bt; r++) {
            if (ldt == KDLOSS_I64) ((int64_t *)hl)[r] = lab[r];
            else ((int32_t *)hl)[r] = (int32_t)lab[r];
        }
        dlab = dalloc((size_t)bt * lsz);
        h2d(dlab, hl, (size_t)bt * lsz);
        free(hl);
    }

    const size_t off_s = misalign ? es : 0, off_t = misalign ? et : 0;
    char *dx0 = dalloc((size_t)(bt * ld) * es + 16), *dy0 = dalloc((size_t)(bt * ld) * et + 16);
    void *dx = dx0 + off_s, *dy = dy0 + off_t;
    h2d(dx, hx, (size_t)(bt * ld) * es);
    h2d(dy, hy, (size_t)(bt * ld) * et);
    char *dg0 = in_place ? NULL : dalloc((size_t)(bt * ld) * es + 16);
    void *dg = in_place ? dx : dg0 + off_s;
    if (!in_place) dpoison(dg, (size_t)(bt * ld) * es);
    float *dloss = dalloc(4), *drow = dalloc((size_t)bt * 4);
    dpoison(dloss, 4);
    dpoison(drow, (size_t)bt * 4);
    size_t wsb = 0;
    KT_CHECK((dv ? kdloss_cuda_distill_workspace_size(bt, v, &wsb)
                 : kdloss_cuda_jsd_workspace_size(bt, v, &wsb)) == KDLOSS_OK,
             "%s: ws size", tag);
    void *dws = dalloc(wsb);

    kdloss_jsd_params p;
    p.beta = beta;
    p.ignore_index = ignore;
    p.grad_scale = 1.25;
    kdloss_distill_params pd;
    kdloss_distill_params_default(&pd);
    pd.div = d;
    pd.ignore_index = ignore;
    pd.grad_scale = 1.25;
    kdloss_cmat cs = {dx, ds, ld}, ct = {dy, dt, ld};
    kdloss_labels L = {dlab, ldt};
    kdloss_mat gr = {dg, ds, ld};
#define DIV_CALL()                                                                            \
    (dv ? kdloss_cuda_distill(g_ctx, g_st, &pd, bt, v, cs, ct, L, dloss, drow, gr, dws, wsb)   \
        : kdloss_cuda_jsd(g_ctx, g_st, &p, bt, v, cs, ct, L, dloss, drow, gr, dws, wsb))
    kdloss_status s = DIV_CALL();
    CK(cudaStreamSynchronize(g_st));
    if (!KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) goto done;
    {
        int bad_label = labels_kind == 4;
        KT_CHECK(read_status(dws) == (bad_label ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK),
                 "%s: device status word %d", tag, (int)read_status(dws));
        /* reference; the out-of-range row counts as ignored for the others, NaN for itself */
        if (bad_label) n_valid = 0;
        for (int64_t r = 0; bad_label && r < bt; r++)
            if (lab[r] != ignore && lab[r] >= 0 && lab[r] < v) n_valid++;
        if (!labels_kind) n_valid = (int)bt;
        double scale = 1.25 / (n_valid > 0 ? n_valid : 1);
        double *rg = xmalloc((size_t)n * 8), *rrow = xmalloc((size_t)bt * 8), tot = 0, abs_tot = 0;
        for (int64_t r = 0; r < bt; r++) {
            int skip = labels_kind && lab[r] == ignore;
            int bad = labels_kind && !skip && (lab[r] < 0 || lab[r] >= v);
            double rs = 0;
            for (int64_t c = 0; c < v; c++) {
                double g = 0, l = 0, mag = 0;
                if (!skip && !bad)
                    l = dv ? ref_div_elem(&d, x[r * v + c], y[r * v + c], &g, &mag)
                           : cu_ref_jsd_elem(beta, x[r * v + c], y[r * v + c], &g);
                rg[r * v + c] = g * scale;
                rs += l;
                abs_tot += fabs(l) > mag ? fabs(l) : mag;
            }
            rrow[r] = bad ? NAN : rs;
            if (!skip && !bad) tot += rs;
        }
        void *hg = xmalloc((size_t)(bt * ld) * es);
        d2h(hg, dg, (size_t)(bt * ld) * es);
        double *gg = to_double(hg, ds, bt, v, ld);
        for (int64_t i = 0; i < n; i++) /* TVD ties: either subgradient */
            if (tvd_tie(&d, x[i], y[i]) && fabs(gg[i] - rg[i]) <= 1.25 * exp(x[i])) gg[i] = rg[i];
        char what[260];
        /* the mixtures' log-differences cancel to 0 where P = Q: fp32 rounding of the mixture
         * weights' logs (lw) then stays as an absolute error of a few u x (1 + lw) x scale */
        double w_mix = d.divergence == KDLOSS_DIV_JSD ? d.beta : d.alpha, lw = 0;
        if (dv && w_mix > 0 && w_mix < 1) lw = fabs(log(w_mix)) + fabs(log1p(-w_mix));
        double mix_atol = dv ? 64 * 0x1p-24 * (1 + lw) * scale : 0;
        snprintf(what, sizeof what, "%s grad", tag);
        cmp_arr(what, gg, rg, n, 1e-5 * max_abs(rg, n) + mix_atol + (ds == KDLOSS_F16 ? 6e-8 : 0),
                2 * unit(ds) + 1e-5);
        if (!in_place) KT_CHECK(pad_untouched(hg, ds, bt, v, ld), "%s: grad padding written", tag);
        float *hrow = xmalloc((size_t)bt * 4);
        d2h(hrow, drow, (size_t)bt * 4);
        double *grow = to_double(hrow, KDLOSS_F32, 1, bt, bt);
        snprintf(what, sizeof what, "%s row_loss", tag);
        cmp_arr(what, grow, rrow, bt, 1e-5 * abs_tot / (double)bt + 1e-30, 1e-4);
        float hl = 0;
        d2h(&hl, dloss, 4);
        double want = bad_label ? NAN : tot / (n_valid > 0 ? n_valid : 1);
        kt_close(hl, want, 1e-5 * abs_tot / (n_valid > 0 ? n_valid : 1) + 1e-30, 1e-4, "%s loss", tag);

        if (!in_place) {
            void *hg2 = xmalloc((size_t)(bt * ld) * es);
            float hl2 = 0;
            s = DIV_CALL();
            CK(cudaStreamSynchronize(g_st));
            d2h(hg2, dg, (size_t)(bt * ld) * es);
            d2h(&hl2, dloss, 4);
            snprintf(what, sizeof what, "%s grad", tag);
            cmp_bits(what, hg, hg2, (size_t)(bt * ld) * es);
            KT_CHECK(memcmp(&hl, &hl2, 4) == 0, "%s: loss differs between runs", tag);
            free(hg2);
        }

        if ((dv ? kdloss_distill != NULL : kdloss_jsd != NULL) && !misalign && !bad_label) {
            void *cg = xmalloc((size_t)(bt * ld) * es);
            float *crow = xmalloc((size_t)bt * 4), cl = 0;
            void *clab = NULL;
            if (labels_kind) {
                clab = xmalloc((size_t)bt * 8);
                for (int64_t r = 0; r < bt; r++) {
                    if (ldt == KDLOSS_I64) ((int64_t *)clab)[r] = lab[r];
                    else ((int32_t *)clab)[r] = (int32_t)lab[r];
                }
            }
            kdloss_cmat hcs = {hx, ds, ld}, hct = {hy, dt, ld};
            kdloss_labels hL = {clab, ldt};
            kdloss_mat hgr = {cg, ds, ld};
            s = dv ? kdloss_distill(&pd, bt, v, hcs, hct, hL, &cl, crow, hgr)
                   : kdloss_jsd(&p, bt, v, hcs, hct, hL, &cl, crow, hgr);
            if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
                double *cgg = to_double(cg, ds, bt, v, ld);
                for (int64_t i = 0; i < n; i++)
                    if (tvd_tie(&d, x[i], y[i]) && fabs(gg[i] - cgg[i]) <= 1.25 * exp(x[i]))
                        cgg[i] = gg[i];
                snprintf(what, sizeof what, "%s grad vs CPU", tag);
                cmp_arr(what, gg, cgg, n, 1e-5 * max_abs(cgg, n) + (ds == KDLOSS_F16 ? 6e-8 : 0),
                        2 * unit(ds) + 1e-5);
                kt_close(hl, cl, 1e-5 * abs_tot / (n_valid > 0 ? n_valid : 1) + 1e-30, 1e-4,
                         "%s loss vs CPU", tag);
                free(cgg);
            }
            free(cg);
            free(crow);
            free(clab);
        }
        free(rg);
        free(rrow);
        free(hg);
        free(gg);
        free(hrow);
        free(grow);
    }
#undef DIV_CALL
done:
    CK(cudaFree(dx0));
    CK(cudaFree(dy0));
    if (dg0) CK(cudaFree(dg0));
    if (dlab) CK(cudaFree(dlab));
    CK(cudaFree(dloss));
    CK(cudaFree(drow));
    CK(cudaFree(dws));
    free(hx);
    free(hy);
    free(x);
    free(y);
    free(lab);
}

static void test_jsd(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    const double betas[] = {0.0, 0.5, 1.0};
    const int64_t vs[] = {1, 37, 4096, 9001};
    int k = 0;
    for (int b = 0; b < 3; b++)
        for (int lk = 0; lk < 3; lk++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++, k++)
                    if (!kt_quick() || k % 7 == 0)
                        test_div_case(rng, 21, vs[k % 4], dts[i], dts[j], betas[b], NULL, lk, 0, 0, 0);
    test_div_case(rng, 8, 300, KDLOSS_F32, KDLOSS_BF16, 0.5, NULL, 3, 0, 0, 0); /* all ignored */
    test_div_case(rng, 8, 300, KDLOSS_BF16, KDLOSS_BF16, 0.5, NULL, 4, 0, 0, 0); /* bad label */
    test_div_case(rng, 7, 4099, KDLOSS_BF16, KDLOSS_F32, 0.3, NULL, 1, 5, 0, 0);
    test_div_case(rng, 7, 4099, KDLOSS_F16, KDLOSS_F16, 0.7, NULL, 2, 3, 1, 0);
    test_div_case(rng, 9, 513, KDLOSS_F32, KDLOSS_F32, 0.5, NULL, 1, 0, 0, 1);
    test_div_case(rng, 9, 513, KDLOSS_BF16, KDLOSS_F32, 1.0, NULL, 0, 8, 0, 1);
    test_div_case(rng, 3, 100000, KDLOSS_BF16, KDLOSS_BF16, 0.5, NULL, 1, 0, 0, 0);
}

/* Every divergence of the family and its alpha / beta end points (tests/support/div_cases.h). */
#define DIVS KT_DIV_CASES
#define NDIV KT_NDIV_CASES

static void test_distill(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    const int64_t vs[] = {1, 37, 4096, 9001};
    int k = 0;
    for (int i = 0; i < NDIV; i++)
        for (int lk = 0; lk < 3; lk++)
            for (int j = 0; j < 3; j++, k++)
                if (!kt_quick() || k % 7 == 0)
                    test_div_case(rng, 21, vs[k % 4], dts[j], dts[(j + i) % 3], 0.5, &DIVS[i], lk,
                                  0, 0, 0);
    for (int i = 0; i < NDIV; i++) { /* all ignored; a bad label; padding, misaligned, in place */
        test_div_case(rng, 8, 300, KDLOSS_F32, KDLOSS_BF16, 0.5, &DIVS[i], 3, 0, 0, 0);
        if (kt_quick() && i % 3) continue;
        test_div_case(rng, 8, 300, KDLOSS_BF16, KDLOSS_BF16, 0.5, &DIVS[i], 4, 0, 0, 0);
        test_div_case(rng, 7, 4099, KDLOSS_F16, KDLOSS_F16, 0.5, &DIVS[i], 2, 3, 1, 0);
        test_div_case(rng, 9, 513, KDLOSS_BF16, KDLOSS_F32, 0.5, &DIVS[i], 1, 8, 0, 1);
    }
    test_div_case(rng, 3, 100000, KDLOSS_BF16, KDLOSS_BF16, 0.5, &DIVS[12], 1, 0, 0, 0);
}

/* ------------------------------------------------------------------------------------------ */
/* Fused-linear JSD and the fused-linear divergence family                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct fl_case {
    int64_t bt, hs, ht, v;
    kdloss_dtype ds, dt;
    double beta, temperature, w_hard, w_soft;
    int bias;          /* both biases given (and dbs wanted) */
    int64_t chunk;     /* params.chunk_size */
    size_t budget;     /* params.memory_budget */
    int64_t pad;       /* extra columns on every ld */
    int bad_label;     /* one label = v */
    int forward_only;
    /* 0: kdloss_cuda_fused_linear_jsd (divergence JSD(beta)); 1: kdloss_cuda_fused_linear_distill
     * with divergence div (beta, alpha), t2_scale t2, and the per-row outputs */
    int distill;
    kdloss_divergence div;
    double alpha;
    int t2;
} fl_case;

static void fill_normal(kt_rng *rng, double *x, int64_t n, double sd) {
    for (int64_t i = 0; i < n; i++) x[i] = sd * kt_normal(rng);
}

static void test_fl_case(kt_rng *rng, const fl_case *k) {
    char tag[240];
    snprintf(tag, sizeof tag,
             "%s %s alpha=%g t2=%d bt=%lld hs=%lld ht=%lld v=%lld s=%s t=%s beta=%g T=%g wh=%g "
             "ws=%g bias=%d chunk=%lld budget=%zu pad=%lld bad=%d fwd=%d",
             k->distill ? "fldistill" : "fld_jsd",
             kdloss_divergence_name(k->distill ? k->div : KDLOSS_DIV_JSD), k->alpha, k->t2,
             (long long)k->bt, (long long)k->hs, (long long)k->ht, (long long)k->v,
             kt_dtype_name(k->ds), kt_dtype_name(k->dt), k->beta, k->temperature, k->w_hard,
             k->w_soft, k->bias, (long long)k->chunk, k->budget, (long long)k->pad, k->bad_label,
             k->forward_only);
    const int64_t bt = k->bt, hs = k->hs, ht = k->ht, v = k->v;
    const int64_t ldxs = hs + k->pad, ldws = hs + k->pad, ldxt = ht + k->pad, ldwt = ht + k->pad;
    const size_t es = kdloss_dtype_size(k->ds), et = kdloss_dtype_size(k->dt);
    double *xs = xmalloc((size_t)(bt * hs) * 8), *ws = xmalloc((size_t)(v * hs) * 8);
    double *xt = xmalloc((size_t)(bt * ht) * 8), *wt = xmalloc((size_t)(v * ht) * 8);
    double *bs = xmalloc((size_t)v * 8), *btb = xmalloc((size_t)v * 8);
    fill_normal(rng, xs, bt * hs, 1.0);
    fill_normal(rng, ws, v * hs, 3.0 / sqrt((double)hs)); /* logits of spread ~3: non-uniform */
    fill_normal(rng, xt, bt * ht, 1.0);
    fill_normal(rng, wt, v * ht, 3.0 / sqrt((double)ht));
    fill_normal(rng, bs, v, 0.5);
    fill_normal(rng, btb, v, 0.5);
    kt_round_to(xs, bt * hs, k->ds);
    kt_round_to(ws, v * hs, k->ds);
    kt_round_to(bs, v, k->ds);
    kt_round_to(xt, bt * ht, k->dt);
    kt_round_to(wt, v * ht, k->dt);
    kt_round_to(btb, v, k->dt);
    const int64_t ignore = -100;
    int64_t *lab = xmalloc((size_t)bt * 8);
    for (int64_t r = 0; r < bt; r++) lab[r] = r % 5 == 3 ? ignore : kt_randint(rng, v);
    if (k->bad_label) lab[bt - 1] = v;
    int64_t n_valid = 0;
    for (int64_t r = 0; r < bt; r++) n_valid += lab[r] != ignore && lab[r] >= 0 && lab[r] < v;
    const kdloss_dtype ldt = bt % 2 ? KDLOSS_I32 : KDLOSS_I64;

    /* device copies */
    void *hxs = kt_pack(xs, bt, hs, ldxs, k->ds), *hws = kt_pack(ws, v, hs, ldws, k->ds);
    void *hxt = kt_pack(xt, bt, ht, ldxt, k->dt), *hwt = kt_pack(wt, v, ht, ldwt, k->dt);
    void *hbs = kt_pack(bs, 1, v, v, k->ds), *hbt = kt_pack(btb, 1, v, v, k->dt);
    void *hlab = xmalloc((size_t)bt * 8);
    for (int64_t r = 0; r < bt; r++) {
        if (ldt == KDLOSS_I64) ((int64_t *)hlab)[r] = lab[r];
        else ((int32_t *)hlab)[r] = (int32_t)lab[r];
    }
    void *dxs = dalloc((size_t)(bt * ldxs) * es), *dwsm = dalloc((size_t)(v * ldws) * es);
    void *dxt = dalloc((size_t)(bt * ldxt) * et), *dwt = dalloc((size_t)(v * ldwt) * et);
    void *dbs = dalloc((size_t)v * es), *dbt = dalloc((size_t)v * et);
    void *dlab = dalloc((size_t)bt * 8);
    h2d(dxs, hxs, (size_t)(bt * ldxs) * es);
    h2d(dwsm, hws, (size_t)(v * ldws) * es);
    h2d(dxt, hxt, (size_t)(bt * ldxt) * et);
    h2d(dwt, hwt, (size_t)(v * ldwt) * et);
    h2d(dbs, hbs, (size_t)v * es);
    h2d(dbt, hbt, (size_t)v * et);
    h2d(dlab, hlab, (size_t)bt * kdloss_dtype_size(ldt));
    void *gdxs = dalloc((size_t)(bt * ldxs) * es), *gdws = dalloc((size_t)(v * ldws) * es);
    void *gdbs = dalloc((size_t)v * es);
    float *gl = dalloc(12), *grows = dalloc((size_t)bt * 12);
    dpoison(grows, (size_t)bt * 12);
    dpoison(gdxs, (size_t)(bt * ldxs) * es);
    dpoison(gdws, (size_t)(v * ldws) * es);
    dpoison(gdbs, (size_t)v * es);
    dpoison(gl, 12);

    kdloss_fljsd_params p;
    p.beta = k->beta;
    p.temperature = k->temperature;
    p.weight_hard_loss = k->w_hard;
    p.weight_soft_loss = k->w_soft;
    p.ignore_index = ignore;
    p.chunk_size = k->chunk;
    p.memory_budget = k->budget;
    p.grad_scale = 0.5;
    if (k->budget == 1) { /* "the smallest budget": one-row chunks (below it is an error now) */
        size_t min = 0;
        kdloss_fljsd_min_budget(&p, k->bt, k->hs, k->ht, k->v, k->ds, 1, &min);
        p.memory_budget = min;
    }
    kdloss_fused_linear_distill_params pd;
    kdloss_fused_linear_distill_params_default(&pd);
    pd.div.divergence = k->distill ? k->div : KDLOSS_DIV_JSD;
    pd.div.beta = k->beta;
    pd.div.alpha = k->distill ? k->alpha : 0.1;
    pd.temperature = k->temperature;
    pd.weight_hard_loss = k->w_hard;
    pd.weight_soft_loss = k->w_soft;
    pd.t2_scale = k->t2;
    pd.ignore_index = ignore;
    pd.chunk_size = k->chunk;
    pd.memory_budget = p.memory_budget;
    pd.grad_scale = 0.5;
    if (k->budget == 1) {
        size_t min = 0;
        kdloss_fused_linear_distill_min_budget(&pd, k->bt, k->hs, k->ht, k->v, k->ds, 1, &min);
        pd.memory_budget = min;
    }
    kdloss_fljsd_out out;
    memset(&out, 0, sizeof out);
    out.loss = gl;
    out.soft_loss = gl + 1;
    out.hard_loss = gl + 2;
    if (!k->forward_only) {
        out.dxs = (kdloss_mat){gdxs, k->ds, ldxs};
        out.dws = (kdloss_mat){gdws, k->ds, ldws};
        out.dbs = k->bias ? gdbs : NULL;
    }
    kdloss_fused_linear_distill_out outd;
    memset(&outd, 0, sizeof outd);
    outd.loss = out.loss;
    outd.soft_loss = out.soft_loss;
    outd.hard_loss = out.hard_loss;
    outd.dxs = out.dxs;
    outd.dws = out.dws;
    outd.dbs = out.dbs;
    outd.row_soft = grows;
    outd.row_hard = grows + bt;
    outd.row_lse = grows + 2 * bt;
    size_t wsb = 0;
    kdloss_status s =
        k->distill ? kdloss_cuda_fused_linear_distill_workspace_size(&pd, bt, hs, ht, v, k->ds,
                                                                     !k->forward_only, &wsb)
                   : kdloss_cuda_fljsd_workspace_size(&p, bt, hs, ht, v, k->ds, !k->forward_only,
                                                      &wsb);
    KT_CHECK(s == KDLOSS_OK, "%s: ws size %d", tag, (int)s);
    void *dwk = dalloc(wsb);
    kdloss_cmat cxs = {dxs, k->ds, ldxs}, cws = {dwsm, k->ds, ldws};
    kdloss_cmat cxt = {dxt, k->dt, ldxt}, cwt = {dwt, k->dt, ldwt};
    kdloss_labels L = {dlab, ldt};
#define FL_CALL()                                                                             \
    (k->distill ? kdloss_cuda_fused_linear_distill(g_ctx, g_st, &pd, bt, hs, ht, v, cxs, cws,   \
                                                   k->bias ? dbs : NULL, cxt, cwt,              \
                                                   k->bias ? dbt : NULL, L, &outd, dwk, wsb)    \
                : kdloss_cuda_fused_linear_jsd(g_ctx, g_st, &p, bt, hs, ht, v, cxs, cws,        \
                                               k->bias ? dbs : NULL, cxt, cwt,                  \
                                               k->bias ? dbt : NULL, L, &out, dwk, wsb))
    s = FL_CALL();
    CK(cudaStreamSynchronize(g_st));
    if (!KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) goto done;
    KT_CHECK(read_status(dwk) == (k->bad_label ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK),
             "%s: device status word", tag);
    {
        /* float64 reference */
        const double T = k->temperature, nv = n_valid > 0 ? (double)n_valid : 1.0;
        const double t2f = k->distill && k->t2 ? T * T : 1.0;
        const double ca = k->w_hard * 0.5 / nv, cb = k->w_soft * 0.5 * t2f / (nv * T);
        const kdloss_div_params dp = pd.div;
        double *rrow = calloc((size_t)bt * 3, 8), abs_row = 0; /* row_soft, row_hard, row_lse */
        double *dz = calloc((size_t)(bt * v), 8), *zs = xmalloc((size_t)v * 8);
        double *zt = xmalloc((size_t)v * 8), *g = xmalloc((size_t)v * 8);
        double soft = 0, hard = 0, abs_soft = 0;
        for (int64_t r = 0; r < bt; r++) {
            if (lab[r] == ignore || lab[r] < 0 || lab[r] >= v) continue;
            for (int64_t c = 0; c < v; c++) {
                double a1 = k->bias ? bs[c] : 0, a2 = k->bias ? btb[c] : 0;
                for (int64_t j = 0; j < hs; j++) a1 += xs[r * hs + j] * ws[c * hs + j];
                for (int64_t j = 0; j < ht; j++) a2 += xt[r * ht + j] * wt[c * ht + j];
                zs[c] = a1;
                zt[c] = a2;
            }
            double lh = logsumexp(zs, v, 1.0), la = logsumexp(zs, v, 1.0 / T);
            double lb = logsumexp(zt, v, 1.0 / T), S = 0, js = 0;
            hard += lh - zs[lab[r]];
            for (int64_t c = 0; c < v; c++) {
                double mag = 0, l;
                if (k->distill) l = ref_div_elem(&dp, zs[c] / T - la, zt[c] / T - lb, &g[c], &mag);
                else l = cu_ref_jsd_elem(k->beta, zs[c] / T - la, zt[c] / T - lb, &g[c]);
                js += l;
                abs_soft += fabs(l) > mag ? fabs(l) : mag;
                abs_row += fabs(l) > mag ? fabs(l) : mag;
                S += g[c];
            }
            soft += js;
            rrow[r] = js;
            rrow[bt + r] = lh - zs[lab[r]];
            rrow[2 * bt + r] = lh;
            for (int64_t c = 0; c < v; c++)
                dz[r * v + c] = ca * (exp(zs[c] - lh) - (c == lab[r] ? 1.0 : 0.0)) +
                                cb * (g[c] - exp(zs[c] / T - la) * S);
        }
        float hl[3];
        d2h(hl, gl, 12);
        double want_soft = soft * t2f / nv, want_hard = hard / nv;
        abs_soft *= t2f;
        double want = k->w_hard * want_hard + k->w_soft * want_soft;
        if (k->bad_label) want = want_soft = want_hard = NAN;
        double lt = 1e-4;
        if (k->ds == KDLOSS_BF16 || k->dt == KDLOSS_BF16) lt = 1e-3; /* fp32 GEMM of bf16 data */
        kt_close(hl[1], want_soft, 1e-5 * abs_soft / nv + 1e-6, lt, "%s soft_loss", tag);
        kt_close(hl[2], want_hard, 1e-6, lt, "%s hard_loss", tag);
        kt_close(hl[0], want, 1e-5 * abs_soft / nv + 1e-6, lt, "%s loss", tag);
        if (k->distill && !k->bad_label) {
            float *hr = xmalloc((size_t)bt * 12);
            d2h(hr, grows, (size_t)bt * 12);
            static const char *rn[3] = {"row_soft", "row_hard", "row_lse"};
            for (int o = 0; o < 3; o++)
                for (int64_t r = 0; r < bt; r++)
                    kt_close(hr[o * bt + r], rrow[o * bt + r],
                             (o ? 1e-6 : 1e-5 * abs_row / (double)bt + 1e-6), lt, "%s %s[%lld]",
                             tag, rn[o], (long long)r);
            free(hr);
        }
        if (!k->forward_only) {
            double *rdx = calloc((size_t)(bt * hs), 8), *rdw = calloc((size_t)(v * hs), 8);
            double *rdb = calloc((size_t)v, 8);
            for (int64_t r = 0; r < bt; r++)
                for (int64_t c = 0; c < v; c++) {
                    double d = dz[r * v + c];
                    if (d == 0) continue;
                    for (int64_t j = 0; j < hs; j++) {
                        rdx[r * hs + j] += d * ws[c * hs + j];
                        rdw[c * hs + j] += d * xs[r * hs + j];
                    }
                    rdb[c] += d;
                }
            double tol = k->ds == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
            void *h1 = xmalloc((size_t)(bt * ldxs) * es);
            d2h(h1, gdxs, (size_t)(bt * ldxs) * es);
            KT_CHECK(pad_untouched(h1, k->ds, bt, hs, ldxs), "%s: dxs padding written", tag);
            double *got = to_double(h1, k->ds, bt, hs, ldxs);
            char what[300];
            snprintf(what, sizeof what, "%s dxs", tag);
            cmp_norm(what, got, rdx, bt * hs, tol);
            free(got);
            void *h2 = xmalloc((size_t)(v * ldws) * es);
            d2h(h2, gdws, (size_t)(v * ldws) * es);
            KT_CHECK(pad_untouched(h2, k->ds, v, hs, ldws), "%s: dws padding written", tag);
            got = to_double(h2, k->ds, v, hs, ldws);
            snprintf(what, sizeof what, "%s dws", tag);
            cmp_norm(what, got, rdw, v * hs, tol);
            free(got);
            if (k->bias) {
                void *h3 = xmalloc((size_t)v * es);
                d2h(h3, gdbs, (size_t)v * es);
                got = to_double(h3, k->ds, 1, v, v);
                snprintf(what, sizeof what, "%s dbs", tag);
                cmp_norm(what, got, rdb, v, tol);
                free(got);
                free(h3);
            }
            /* same call again: bitwise the same */
            void *h1b = xmalloc((size_t)(bt * ldxs) * es), *h2b = xmalloc((size_t)(v * ldws) * es);
            float hlb[3];
            s = FL_CALL();
            CK(cudaStreamSynchronize(g_st));
            d2h(h1b, gdxs, (size_t)(bt * ldxs) * es);
            d2h(h2b, gdws, (size_t)(v * ldws) * es);
            d2h(hlb, gl, 12);
            snprintf(what, sizeof what, "%s dxs", tag);
            cmp_bits(what, h1, h1b, (size_t)(bt * ldxs) * es);
            snprintf(what, sizeof what, "%s dws", tag);
            cmp_bits(what, h2, h2b, (size_t)(v * ldws) * es);
            snprintf(what, sizeof what, "%s losses", tag);
            cmp_bits(what, hl, hlb, 12);

            if ((k->distill ? kdloss_fused_linear_distill != NULL
                            : kdloss_fused_linear_jsd != NULL) &&
                !k->bad_label) {
                void *c1 = xmalloc((size_t)(bt * ldxs) * es), *c2 = xmalloc((size_t)(v * ldws) * es);
                float cl[3];
                kdloss_fljsd_out co;
                memset(&co, 0, sizeof co);
                co.loss = cl;
                co.soft_loss = cl + 1;
                co.hard_loss = cl + 2;
                co.dxs = (kdloss_mat){c1, k->ds, ldxs};
                co.dws = (kdloss_mat){c2, k->ds, ldws};
                kdloss_cmat hcxs = {hxs, k->ds, ldxs}, hcws = {hws, k->ds, ldws};
                kdloss_cmat hcxt = {hxt, k->dt, ldxt}, hcwt = {hwt, k->dt, ldwt};
                kdloss_labels hL = {hlab, ldt};
                kdloss_fused_linear_distill_out cod;
                memset(&cod, 0, sizeof cod);
                cod.loss = co.loss;
                cod.soft_loss = co.soft_loss;
                cod.hard_loss = co.hard_loss;
                cod.dxs = co.dxs;
                cod.dws = co.dws;
                s = k->distill
                        ? kdloss_fused_linear_distill(&pd, bt, hs, ht, v, hcxs, hcws,
                                                      k->bias ? hbs : NULL, hcxt, hcwt,
                                                      k->bias ? hbt : NULL, hL, &cod, NULL, 0)
                        : kdloss_fused_linear_jsd(&p, bt, hs, ht, v, hcxs, hcws,
                                                  k->bias ? hbs : NULL, hcxt, hcwt,
                                                  k->bias ? hbt : NULL, hL, &co, NULL, 0);
                if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
                    kt_close(hl[0], cl[0], 1e-5 * abs_soft / nv + 1e-6, lt, "%s loss vs CPU", tag);
                    double *a1 = to_double(h1, k->ds, bt, hs, ldxs), *b1 = to_double(c1, k->ds, bt, hs, ldxs);
                    snprintf(what, sizeof what, "%s dxs vs CPU", tag);
                    cmp_norm(what, a1, b1, bt * hs, 2 * tol);
                    free(a1);
                    free(b1);
                    a1 = to_double(h2, k->ds, v, hs, ldws);
                    b1 = to_double(c2, k->ds, v, hs, ldws);
                    snprintf(what, sizeof what, "%s dws vs CPU", tag);
                    cmp_norm(what, a1, b1, v * hs, 2 * tol);
                    free(a1);
                    free(b1);
                }
                free(c1);
                free(c2);
            }
            free(h1);
            free(h2);
            free(h1b);
            free(h2b);
            free(rdx);
            free(rdw);
            free(rdb);
        }
        free(dz);
        free(zs);
        free(zt);
        free(g);
        free(rrow);
    }
#undef FL_CALL
done:
    CK(cudaFree(dxs));
    CK(cudaFree(dwsm));
    CK(cudaFree(dxt));
    CK(cudaFree(dwt));
    CK(cudaFree(dbs));
    CK(cudaFree(dbt));
    CK(cudaFree(dlab));
    CK(cudaFree(gdxs));
    CK(cudaFree(gdws));
    CK(cudaFree(gdbs));
    CK(cudaFree(gl));
    CK(cudaFree(grows));
    CK(cudaFree(dwk));
    free(hxs);
    free(hws);
    free(hxt);
    free(hwt);
    free(hbs);
    free(hbt);
    free(hlab);
    free(xs);
    free(ws);
    free(xt);
    free(wt);
    free(bs);
    free(btb);
    free(lab);
}

static void test_fl(kt_rng *rng) {
    const kdloss_dtype pairs[3][2] = {{KDLOSS_F32, KDLOSS_F32},
                                      {KDLOSS_BF16, KDLOSS_BF16},
                                      {KDLOSS_BF16, KDLOSS_F32}};
    const double betas[] = {0.0, 0.5, 1.0};
    const double temps[] = {1.0, 2.0};
    const double wts[3][2] = {{0.5, 0.5}, {0.0, 1.0}, {1.0, 0.0}};
    const int64_t chunks[] = {0, 16, 1, 7};
    int k = 0;
    for (int d = 0; d < 3; d++)
        for (int b = 0; b < 3; b++)
            for (int t = 0; t < 2; t++, k++) {
                fl_case c = {37, 24, 40, 300, pairs[d][0], pairs[d][1], betas[b], temps[t],
                             wts[k % 3][0], wts[k % 3][1], k % 2, chunks[k % 4], 0, 0, 0, 0,
                             0, KDLOSS_DIV_JSD, 0.1, 0};
                if (!kt_quick() || k % 5 == 0) test_fl_case(rng, &c);
            }
    /* pass 3 over more than one 4096-column tile (in-place narrowing across tiles), padded lds,
     * tiny memory budget (one row per chunk), a bad label, forward only */
    fl_case c1 = {9, 16, 24, 4100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 1, 4, 0, 3, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0};
    test_fl_case(rng, &c1);
    fl_case c2 = {9, 16, 24, 9001, KDLOSS_F32, KDLOSS_BF16, 0.3, 1.5, 0.5, 0.5, 1, 0, 1, 0, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0};
    test_fl_case(rng, &c2);
    fl_case c3 = {12, 16, 16, 100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 5, 0, 0, 1, 0, 0, KDLOSS_DIV_JSD, 0.1, 0};
    test_fl_case(rng, &c3);
    fl_case c4 = {12, 16, 16, 100, KDLOSS_F32, KDLOSS_F32, 0.5, 2.0, 0.5, 0.5, 1, 0, 0, 0, 0, 1, 0, KDLOSS_DIV_JSD, 0.1, 0};
    test_fl_case(rng, &c4);
    fl_case c5 = {130, 64, 32, 1000, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 64, 0, 0, 0, 0, 0, KDLOSS_DIV_JSD, 0.1, 0};
    test_fl_case(rng, &c5);
}

/* kdloss_cuda_fused_linear_distill: every divergence and edge x dtype pair x T x t2_scale, the
 * per-row outputs, chunking, biases, a tile boundary, a bad label, forward only. */
static void test_fld(kt_rng *rng) {
    const kdloss_dtype pairs[3][2] = {{KDLOSS_F32, KDLOSS_F32},
                                      {KDLOSS_BF16, KDLOSS_BF16},
                                      {KDLOSS_BF16, KDLOSS_F32}};
    const double temps[] = {1.0, 2.0};
    const double wts[3][2] = {{0.5, 0.5}, {0.0, 1.0}, {1.0, 0.0}};
    const int64_t chunks[] = {0, 16, 1, 7};
    int k = 0;
    for (int i = 0; i < NDIV; i++)
        for (int d = 0; d < 3; d++, k++) {
            if (kt_quick() && k % 5) continue;
            fl_case c = {37, 24, 40, 300, pairs[d][0], pairs[d][1], DIVS[i].beta, temps[k % 2],
                         wts[k % 3][0], wts[k % 3][1], k % 2, chunks[k % 4], 0, 0, 0, 0,
                         1, DIVS[i].divergence, DIVS[i].alpha, (k / 2) % 2};
            test_fl_case(rng, &c);
        }
    for (int i = 0; i < NDIV; i += kt_quick() ? 4 : 1) {
        fl_case c1 = {9, 16, 24, 4100, KDLOSS_BF16, KDLOSS_BF16, DIVS[i].beta, 1.5, 0.5, 0.5, 1,
                      4, 0, 3, 0, 0, 1, DIVS[i].divergence, DIVS[i].alpha, 1};
        test_fl_case(rng, &c1);
    }
    fl_case c2 = {9, 16, 24, 9001, KDLOSS_F32, KDLOSS_BF16, 0.3, 1.5, 0.5, 0.5, 1, 0, 1, 0, 0, 0,
                  1, KDLOSS_DIV_SKEW_REVERSE_KL, 0.3, 1};
    test_fl_case(rng, &c2);
    fl_case c3 = {12, 16, 16, 100, KDLOSS_BF16, KDLOSS_BF16, 0.5, 1.0, 0.5, 0.5, 0, 5, 0, 0, 1, 0,
                  1, KDLOSS_DIV_TVD, 0.1, 0};
    test_fl_case(rng, &c3);
    fl_case c4 = {12, 16, 16, 100, KDLOSS_F32, KDLOSS_F32, 0.5, 2.0, 0.5, 0.5, 1, 0, 0, 0, 0, 1,
                  1, KDLOSS_DIV_REVERSE_KL, 0.1, 1};
    test_fl_case(rng, &c4);
}

/* ------------------------------------------------------------------------------------------ */
/* Sparse top-k teacher (kdloss_cuda_topk_distill_logits, kdloss_cuda_fused_linear_topk_distill) */
/* ------------------------------------------------------------------------------------------ */

/* The slots of one row: the teacher's full distribution log_softmax(zt / T) in double, then by
 * kind (row index based): 0 the top k in order; 1 k random distinct ids, slots 1 and k-2
 * unused; 2 every slot unused; 3 the top k shuffled, the last slot's log-prob -inf (where the
 * divergence allows it); 4 every id of the row when k >= v (S = V, no tail), else as 0.
 * lp rounded to lpdt; unused slots hold NaN (never read). */
static void tk_gen_slots(kt_rng *rng, int64_t v, int64_t k, double T, int kind, int allow_ninf,
                         kdloss_dtype lpdt, int64_t *ids, double *lp) {
    double *zt = xmalloc((size_t)v * 8);
    char *used = calloc((size_t)v, 1);
    for (int64_t c = 0; c < v; c++) zt[c] = 2.5 * kt_normal(rng) + (c == 1 % v ? 8.0 : 0.0);
    const double lz = logsumexp(zt, v, 1.0 / T);
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        if (kind == 1) {
            do best = kt_randint(rng, v); while (used[best] && j < v);
        } else {
            for (int64_t c = 0; c < v; c++)
                if (!used[c] && (best < 0 || zt[c] > zt[best])) best = c;
        }
        if (best < 0 || used[best] || kind == 2 || (kind == 1 && (j == 1 || j == k - 2))) {
            ids[j] = -1, lp[j] = NAN;
            continue;
        }
        used[best] = 1;
        ids[j] = best;
        lp[j] = zt[best] / T - lz;
    }
    if (kind == 3)
        for (int64_t j = k - 1; j > 0; j--) { /* shuffle */
            const int64_t i = kt_randint(rng, j + 1);
            const int64_t ti = ids[i];
            const double tl = lp[i];
            ids[i] = ids[j], lp[i] = lp[j], ids[j] = ti, lp[j] = tl;
        }
    if (kind == 3 && allow_ninf && ids[k - 1] >= 0) lp[k - 1] = -INFINITY;
    kt_round_to(lp, k, lpdt);
    free(zt);
    free(used);
}

/* Invalid ids in row bt / 2 (kinds: 1 an id = v, 2 a repeated id, 3 the id -2). */
static void tk_break_ids(int64_t *ids, double *lp, int64_t bt, int64_t v, int64_t k, int kind) {
    int64_t *row = ids + (bt / 2) * k;
    if (kind == 1) row[0] = v;
    if (kind == 2 && k >= 2) {
        row[0] = row[1] = 3 % v;
        lp[(bt / 2) * k] = lp[(bt / 2) * k + 1] = -2.0;
    }
    if (kind == 3) row[k - 1] = -2;
}

/* Host and device copies of the ids (I32 / I64, ld) and log-probs. */
static void tk_upload_teacher(const int64_t *ids, const double *lp, int64_t bt, int64_t k,
                              int64_t ld, kdloss_dtype idt, kdloss_dtype lpdt, void **hid,
                              void **did, void **hlp, void **dlp) {
    const size_t ie = kdloss_dtype_size(idt), le = kdloss_dtype_size(lpdt);
    char *h = xmalloc((size_t)(bt * ld) * ie);
    memset(h, 0x5A, (size_t)(bt * ld) * ie);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t j = 0; j < k; j++) {
            if (idt == KDLOSS_I64) ((int64_t *)h)[r * ld + j] = ids[r * k + j];
            else ((int32_t *)h)[r * ld + j] = (int32_t)ids[r * k + j];
        }
    *hid = h;
    *did = dalloc((size_t)(bt * ld) * ie);
    h2d(*did, h, (size_t)(bt * ld) * ie);
    *hlp = kt_pack(lp, bt, k, ld, lpdt);
    *dlp = dalloc((size_t)(bt * ld) * le);
    h2d(*dlp, *hlp, (size_t)(bt * ld) * le);
}

/* Labels of a case: 0 none, 1 I64 with ignored rows, 2 I32 with ignored rows, 3 I64 all
 * ignored, 4 I32 with one out of range (row bt - 1). lab [bt] on the host; NULL device data
 * for kind 0. */
static kdloss_labels tk_make_labels(kt_rng *rng, int kind, int64_t bt, int64_t v, int64_t *lab,
                                    void **hlab) {
    kdloss_labels L = {NULL, kind == 2 || kind == 4 ? KDLOSS_I32 : KDLOSS_I64};
    for (int64_t r = 0; r < bt; r++)
        lab[r] = kind == 0 ? 0 : kind == 3 || r % 4 == 1 ? -100 : kt_randint(rng, v);
    if (kind == 4) lab[bt - 1] = v;
    *hlab = NULL;
    if (!kind) return L;
    const size_t ls = kdloss_dtype_size(L.dtype);
    char *h = xmalloc((size_t)bt * ls);
    for (int64_t r = 0; r < bt; r++) {
        if (L.dtype == KDLOSS_I64) ((int64_t *)h)[r] = lab[r];
        else ((int32_t *)h)[r] = (int32_t)lab[r];
    }
    void *d = dalloc((size_t)bt * ls);
    h2d(d, h, (size_t)bt * ls);
    *hlab = h;
    L.data = d;
    return L;
}

/* The row kinds the GPU reports (kdloss.h): 0 counted, 1 ignored, 2 bad label, 3 bad ids. */
static int tk_row_kind(const int64_t *ids, int64_t k, int64_t v, int has_labels, int64_t y) {
    for (int64_t j = 0; j < k; j++) {
        if (ids[j] == -1) continue;
        if (ids[j] < 0 || ids[j] >= v) return 3;
        for (int64_t i = 0; i < j; i++)
            if (ids[i] == ids[j]) return 3;
    }
    if (!has_labels) return 0;
    return y == -100 ? 1 : (y >= 0 && y < v) ? 0 : 2;
}

/* The status word a case expects: the code of the CPU function, which checks the labels first
 * in the logits loss and the ids first in the fused loss (ids_first). */
static int32_t tk_want_status(const int *kind, const int64_t *lab, int has_labels, int64_t bt,
                              int64_t v, int ids_first) {
    int bad_id = 0, bad_label = 0;
    for (int64_t r = 0; r < bt; r++) {
        bad_id |= kind[r] == 3;
        bad_label |= has_labels && lab[r] != -100 && (lab[r] < 0 || lab[r] >= v);
    }
    if (bad_id && (ids_first || !bad_label)) return KDLOSS_ERR_INVALID_ID;
    return bad_label ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK;
}

static const char *tk_tail_name(int tail) {
    static const char *n[] = {"bucket", "renorm_both", "renorm_teacher"};
    return n[tail];
}

typedef struct tk_case {
    int64_t bt, v, k;
    kdloss_dtype ds, lpdt, idt; /* student (and gradient), teacher log-probs, ids */
    int div;                    /* index into KT_DIV_CASES */
    int tail;
    double T;
    int labels;                 /* tk_make_labels's kinds */
    int bad_id;                 /* tk_break_ids's kinds, 0 none */
    int64_t pad;                /* extra columns on every ld (student, gradient, teacher) */
    int misalign, in_place;
} tk_case;

/* The float64 reference of a logits case (ref_topk_row, tests/support/ref_topk.h: written from
 * docs/MATH.md 8, not from topk_row.h): grad (bt x v), row [bt] (NaN on bad rows), the loss;
 * *abs_tot the summed error scales of the row losses. */
static double tk_ref_logits(const tk_case *c, const kdloss_div_params *d, const double *z,
                            const int64_t *ids, const double *lp, const int64_t *lab,
                            const int *kind, double gs, double *grad, double *row,
                            double *abs_tot) {
    const int64_t bt = c->bt, v = c->v, k = c->k;
    int64_t nv = 0;
    int bad = 0;
    for (int64_t r = 0; r < bt; r++) nv += kind[r] == 0, bad |= kind[r] >= 2;
    const double scale = gs / (nv > 0 ? (double)nv : 1.0); /* dz of ref_topk_row has the 1/T */
    double tot = 0.0;
    *abs_tot = 0.0;
    for (int64_t r = 0; r < bt; r++) {
        double *gr = grad + r * v;
        for (int64_t i = 0; i < v; i++) gr[i] = 0.0;
        row[r] = kind[r] == 1 ? 0.0 : NAN;
        if (kind[r] != 0) continue;
        const ref_topk_row_out o = ref_topk_row(d, (kdloss_topk_tail)c->tail, z + r * v, v,
                                                ids + r * k, lp + r * k, k, c->T, gr, NULL, NULL);
        row[r] = o.loss;
        for (int64_t i = 0; i < v; i++) gr[i] *= scale;
        tot += row[r];
        *abs_tot += o.mag;
    }
    (void)lab;
    return bad ? NAN : tot / (nv > 0 ? (double)nv : 1.0);
}

/* Student logits of spread ~2 with row offsets (0, +25, and a peak of +12 at one column). */
static double *tk_gen_logits(kt_rng *rng, int64_t bt, int64_t v, kdloss_dtype dt) {
    double *z = xmalloc((size_t)(bt * v) * 8);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t c = 0; c < v; c++)
            z[r * v + c] = 2.0 * kt_normal(rng) + (r % 3 == 1 ? 25.0 : 0.0) +
                           (r % 3 == 2 && c == (r * 7) % v ? 12.0 : 0.0);
    kt_round_to(z, bt * v, dt);
    return z;
}

/* The CPU function on the same (valid) inputs, when this build has it. */
static void tk_logits_vs_cpu(const tk_case *c, const char *tag, const kdloss_topk_distill_params *p,
                             const void *hx, int64_t ld, kdloss_topk_teacher ht,
                             kdloss_labels hL, const double *gg, float hl, double abs_tot,
                             double nvd) {
    const int64_t bt = c->bt, v = c->v;
    const size_t es = kdloss_dtype_size(c->ds);
    void *cg = xmalloc((size_t)(bt * ld) * es);
    float cl = 0, *crow = xmalloc((size_t)bt * 4);
    kdloss_cmat cs = {hx, c->ds, ld};
    kdloss_mat cgm = {cg, c->ds, ld};
    kdloss_status s = kdloss_topk_distill_logits(p, bt, v, cs, ht, hL, &cl, crow, cgm);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
        double *cgg = to_double(cg, c->ds, bt, v, ld);
        char what[300];
        snprintf(what, sizeof what, "%s grad vs CPU", tag);
        /* + two subnormal steps of the dtype: fp16 gradients near 1e-6 are subnormal there, and
         * two fp32 values a rounding apart may round to neighbouring steps */
        cmp_arr(what, gg, cgg, bt * v, 1e-5 * max_abs(cgg, bt * v) + kt_tiny(c->ds),
                2 * unit(c->ds) + 1e-5);
        kt_close(hl, cl, 1e-5 * abs_tot / nvd + 1e-30, 1e-4, "%s loss vs CPU", tag);
        free(cgg);
    }
    free(cg);
    free(crow);
}

/* abs(log w) + abs(log(1 - w)) of a mixture divergence's weight w in (0, 1), else 0: the size of
 * the constants whose fp32 rounding stays in the mixtures' log-differences. */
static double mix_log_weights(const kdloss_div_params *d) {
    const double w = d->divergence == KDLOSS_DIV_JSD ? d->beta : d->alpha;
    const int mix = d->divergence == KDLOSS_DIV_JSD ||
                    d->divergence == KDLOSS_DIV_SKEW_FORWARD_KL ||
                    d->divergence == KDLOSS_DIV_SKEW_REVERSE_KL;
    return mix && w > 0 && w < 1 ? fabs(log(w)) + fabs(log1p(-w)) : 0.0;
}

/* Checks of one call of a loss on logits (the top-k teacher's, or the dense one's with c->k 0)
 * against the reference (rrow / rg / want), and run-to-run bits. slack (bt x v, or NULL): how
 * far each gradient element may stray from rg beyond the tolerance (TVD's subgradient at ties).
 * Returns nothing; the tag names the case. */
static void logits_check(const tk_case *c, const char *tag, const kdloss_div_params *d,
                         void *dg, float *dloss, float *drow, void *dws, int32_t want_status,
                         const double *rg, const double *slack, const double *rrow, double want,
                         double abs_tot, double nvd, kdloss_status (*call)(void *), void *arg) {
    const int64_t bt = c->bt, v = c->v, ld = v + c->pad, n = bt * v;
    const size_t es = kdloss_dtype_size(c->ds);
    char what[300];
    KT_CHECK(read_status(dws) == want_status, "%s: device status word %d", tag,
             (int)read_status(dws));
    void *hg = xmalloc((size_t)(bt * ld) * es);
    d2h(hg, dg, (size_t)(bt * ld) * es);
    double *gg = to_double(hg, c->ds, bt, v, ld);
    for (int64_t i = 0; slack && i < n; i++)
        if (fabs(gg[i] - rg[i]) <= slack[i]) gg[i] = rg[i];
    const double lw = mix_log_weights(d);
    const double mix_atol = 64 * 0x1p-24 * (1 + lw) * 1.25 / (c->T * nvd);
    snprintf(what, sizeof what, "%s grad", tag);
    cmp_arr(what, gg, rg, n, 1e-5 * max_abs(rg, n) + mix_atol + kt_tiny(c->ds),
            2 * unit(c->ds) + 1e-5);
    if (!c->in_place) KT_CHECK(pad_untouched(hg, c->ds, bt, v, ld), "%s: grad padding written", tag);
    float *hrow = xmalloc((size_t)bt * 4), hl = 0;
    d2h(hrow, drow, (size_t)bt * 4);
    d2h(&hl, dloss, 4);
    double *grow = to_double(hrow, KDLOSS_F32, 1, bt, bt);
    snprintf(what, sizeof what, "%s row_loss", tag);
    cmp_arr(what, grow, rrow, bt, 1e-5 * abs_tot / (double)bt + 1e-30, 1e-4);
    kt_close(hl, want, 1e-5 * abs_tot / nvd + 1e-30, 1e-4, "%s loss", tag);
    if (!c->in_place) { /* the same call again: the same bits */
        void *hg2 = xmalloc((size_t)(bt * ld) * es);
        float hl2 = 0;
        KT_CHECK(call(arg) == KDLOSS_OK, "%s: second call", tag);
        CK(cudaStreamSynchronize(g_st));
        d2h(hg2, dg, (size_t)(bt * ld) * es);
        d2h(&hl2, dloss, 4);
        cmp_bits(what, hg, hg2, (size_t)(bt * ld) * es);
        KT_CHECK(memcmp(&hl, &hl2, 4) == 0, "%s: loss differs between runs", tag);
        free(hg2);
    }
    free(hg);
    free(gg);
    free(hrow);
    free(grow);
}

typedef struct tk_call {
    const kdloss_topk_distill_params *p;
    int64_t bt, v;
    kdloss_cmat s;
    kdloss_topk_teacher t;
    kdloss_labels L;
    float *loss, *row;
    kdloss_mat g;
    void *ws;
    size_t wsb;
} tk_call;

static kdloss_status tk_call_run(void *arg) {
    const tk_call *a = arg;
    return kdloss_cuda_topk_distill_logits(g_ctx, g_st, a->p, a->bt, a->v, a->s, a->t, a->L,
                                           a->loss, a->row, a->g, a->ws, a->wsb);
}

static void test_tk_logits_case(kt_rng *rng, const tk_case *c) {
    const kdloss_div_params d = KT_DIV_CASES[c->div];
    char tag[240];
    snprintf(tag, sizeof tag,
             "topk %s %s beta=%g alpha=%g bt=%lld v=%lld k=%lld s=%s lp=%s ids=%s T=%g "
             "labels=%d bad_id=%d pad=%lld mis=%d ip=%d",
             tk_tail_name(c->tail), kdloss_divergence_name(d.divergence), d.beta, d.alpha,
             (long long)c->bt, (long long)c->v, (long long)c->k, kt_dtype_name(c->ds),
             kt_dtype_name(c->lpdt), c->idt == KDLOSS_I64 ? "i64" : "i32", c->T, c->labels,
             c->bad_id, (long long)c->pad, c->misalign, c->in_place);
    const int64_t bt = c->bt, v = c->v, k = c->k, ld = v + c->pad, ldt = k + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    double *z = tk_gen_logits(rng, bt, v, c->ds);
    int64_t *ids = xmalloc((size_t)(bt * k) * 8), *lab = xmalloc((size_t)bt * 8);
    double *lp = xmalloc((size_t)(bt * k) * 8);
    for (int64_t r = 0; r < bt; r++)
        tk_gen_slots(rng, v, k, c->T, (int)(r % 5), !div_rev_like(&d), c->lpdt, ids + r * k,
                     lp + r * k);
    tk_break_ids(ids, lp, bt, v, k, c->bad_id);
    void *hlab;
    kdloss_labels L = tk_make_labels(rng, c->labels, bt, v, lab, &hlab);
    int *kind = xmalloc((size_t)bt * sizeof(int));
    for (int64_t r = 0; r < bt; r++) kind[r] = tk_row_kind(ids + r * k, k, v, c->labels, lab[r]);
    const int32_t want_status = tk_want_status(kind, lab, c->labels, bt, v, 0);

    void *hx = kt_pack(z, bt, v, ld, c->ds), *hid, *did, *hlp, *dlp;
    tk_upload_teacher(ids, lp, bt, k, ldt, c->idt, c->lpdt, &hid, &did, &hlp, &dlp);
    const size_t off = c->misalign ? es : 0;
    char *dx0 = dalloc((size_t)(bt * ld) * es + 16), *dg0 = NULL;
    void *dx = dx0 + off, *dg = dx;
    h2d(dx, hx, (size_t)(bt * ld) * es);
    if (!c->in_place) {
        dg0 = dalloc((size_t)(bt * ld) * es + 16);
        dg = dg0 + off;
        dpoison(dg, (size_t)(bt * ld) * es);
    }
    float *dloss = dalloc(4), *drow = dalloc((size_t)bt * 4);
    dpoison(dloss, 4);
    dpoison(drow, (size_t)bt * 4);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(bt, v, k, &wsb) == KDLOSS_OK,
             "%s: ws size", tag);
    void *dws = dalloc(wsb);
    kdloss_topk_distill_params p;
    memset(&p, 0, sizeof p);
    p.div = d;
    p.tail = (kdloss_topk_tail)c->tail;
    p.temperature = c->T;
    p.ignore_index = -100;
    p.grad_scale = 1.25;
    tk_call a = {&p, bt, v, {dx, c->ds, ld}, {k, {did, c->idt, ldt}, {dlp, c->lpdt, ldt}},
                 L, dloss, drow, {dg, c->ds, ld}, dws, wsb};
    kdloss_status s = tk_call_run(&a);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) {
        double *rg = xmalloc((size_t)(bt * v) * 8), *rrow = xmalloc((size_t)bt * 8), abs_tot;
        const double want = tk_ref_logits(c, &d, z, ids, lp, lab, kind, 1.25, rg, rrow, &abs_tot);
        int64_t nv = 0;
        for (int64_t r = 0; r < bt; r++) nv += kind[r] == 0;
        const double nvd = nv > 0 ? (double)nv : 1.0;
        logits_check(c, tag, &d, dg, dloss, drow, dws, want_status, rg, NULL, rrow, want, abs_tot,
                     nvd, tk_call_run, &a);
        if (!c->in_place) { /* the student's logits are an input: never written (nor masked) */
            void *hx2 = xmalloc((size_t)(bt * ld) * es);
            d2h(hx2, dx, (size_t)(bt * ld) * es);
            KT_CHECK(memcmp(hx, hx2, (size_t)(bt * ld) * es) == 0, "%s: student logits written", tag);
            free(hx2);
        }
        if (kdloss_topk_distill_logits && want_status == KDLOSS_OK && !c->misalign && !c->in_place) {
            void *hg = xmalloc((size_t)(bt * ld) * es);
            float hl;
            d2h(hg, dg, (size_t)(bt * ld) * es);
            d2h(&hl, dloss, 4);
            double *gg = to_double(hg, c->ds, bt, v, ld);
            kdloss_topk_teacher ht = {k, {hid, c->idt, ldt}, {hlp, c->lpdt, ldt}};
            kdloss_labels hL = {hlab, L.dtype};
            tk_logits_vs_cpu(c, tag, &p, hx, ld, ht, hL, gg, hl, abs_tot, nvd);
            free(hg);
            free(gg);
        }
        free(rg);
        free(rrow);
    }
    CK(cudaFree(dx0));
    if (dg0) CK(cudaFree(dg0));
    CK(cudaFree(did));
    CK(cudaFree(dlp));
    if (L.data) CK(cudaFree((void *)L.data));
    CK(cudaFree(dloss));
    CK(cudaFree(drow));
    CK(cudaFree(dws));
    free(z), free(ids), free(lab), free(lp), free(kind), free(hx), free(hid), free(hlp), free(hlab);
}

static void test_topk_logits(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    const int64_t vs[] = {37, 300, 4099};
    const double temps[] = {1.0, 2.0, 0.7};
    int n = 0;
    for (int i = 0; i < NDIV; i++) /* every divergence case x bucket and renorm_both */
        for (int tail = 0; tail < 2; tail++, n++) {
            if (kt_quick() && n % 5) continue;
            tk_case c = {13, vs[n % 3], 8, dts[n % 3], n % 4 == 3 ? KDLOSS_BF16 : KDLOSS_F32,
                         n % 2 ? KDLOSS_I32 : KDLOSS_I64, i, tail, temps[(n / 3) % 3], n % 4,
                         0, 0, 0, 0};
            test_tk_logits_case(rng, &c);
        }
    for (int j = 0; j < 3; j++) { /* renorm_teacher: forward KL only */
        tk_case c = {13, vs[j], 8, dts[j], KDLOSS_F32, KDLOSS_I64, 0, KDLOSS_TAIL_RENORM_TEACHER,
                     temps[j], j, 0, 0, 0, 0};
        test_tk_logits_case(rng, &c);
    }
    for (int tail = 0; tail < 3; tail++) { /* S = V in most rows (k > v): no tail */
        tk_case c = {10, 6, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, tail == 2 ? 0 : 4, tail, 1.5,
                     1, 0, 0, 0, 0};
        test_tk_logits_case(rng, &c);
    }
    /* labels: all ignored, one out of range; invalid ids of each kind in row bt / 2 (with all
     * labels ignored: an ignored row's ids count too); an out-of-range label and invalid ids */
    const tk_case sp[] = {
        {8, 300, 8, KDLOSS_F32, KDLOSS_BF16, KDLOSS_I64, 4, 0, 1.0, 3, 0, 0, 0, 0},
        {8, 300, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I32, 0, 1, 1.0, 4, 0, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 0, 1.0, 0, 1, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I32, 1, 1, 2.0, 1, 2, 0, 0, 0},
        {13, 300, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I64, 14, 0, 1.0, 3, 3, 0, 0, 0},
        {13, 300, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 2, 1.0, 4, 1, 0, 0, 0}, /* both */
        /* padding, misaligned, in place, across tiles with a larger k, fp16 log-probs */
        {7, 4099, 16, KDLOSS_BF16, KDLOSS_F16, KDLOSS_I32, 7, 0, 1.0, 1, 0, 5, 1, 0},
        {7, 4099, 16, KDLOSS_F16, KDLOSS_F32, KDLOSS_I64, 12, 1, 2.0, 2, 0, 3, 1, 0},
        {9, 513, 8, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 2, 0, 1.0, 1, 0, 0, 0, 1},
        {9, 513, 8, KDLOSS_BF16, KDLOSS_F32, KDLOSS_I64, 0, 2, 0.7, 0, 0, 8, 0, 1},
        {4, 9001, 64, KDLOSS_F32, KDLOSS_F32, KDLOSS_I64, 0, 0, 1.0, 1, 0, 0, 0, 0},
        {4, 9001, 64, KDLOSS_BF16, KDLOSS_BF16, KDLOSS_I32, 11, 1, 1.0, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_tk_logits_case(rng, &sp[i]);
}

/* ---- the fused loss ---- */

typedef struct fltk_case {
    int64_t bt, hs, v, k;
    kdloss_dtype ds, lpdt;
    int div, tail;
    double T, w_hard, w_soft;
    int t2, bias;
    int64_t chunk, pad;
    int labels;   /* tk_make_labels's kinds 0, 1, 3, 4 (0: w_hard must be 0) */
    int bad_id;   /* tk_break_ids's kinds */
    int fwd_only; /* 1: losses only; 2: dxs only (no dws / dbs) */
    int rows;     /* 1: row_lse (and row_hard with labels): renorm_both then runs dense */
} fltk_case;

/* Float64 reference of a fused case: zs = xs ws^T + bs, per counted row the CE and ref_topk_row,
 * dz (bt x v) with the loss's factors; rr (3 x bt) row_soft, row_hard, row_lse; L[3] loss,
 * soft, hard. Returns the summed magnitudes of the soft terms. */
static double fltk_ref(const fltk_case *c, const kdloss_div_params *d, const double *xs,
                       const double *ws, const double *bs, const int64_t *ids, const double *lp,
                       const int64_t *lab, const int *kind, double *dz, double *rr, double L[3]) {
    const int64_t bt = c->bt, hs = c->hs, v = c->v, k = c->k;
    int64_t nv = 0;
    int bad = 0;
    for (int64_t r = 0; r < bt; r++) nv += kind[r] == 0, bad |= kind[r] >= 2;
    const double nvd = nv > 0 ? (double)nv : 1.0, t2f = c->t2 ? c->T * c->T : 1.0;
    const double ca = c->w_hard * 0.5 / nvd, cb = c->w_soft * 0.5 * t2f / nvd;
    double *zs = xmalloc((size_t)v * 8), *dd = xmalloc((size_t)v * 8), soft = 0, hard = 0;
    double abs_soft = 0;
    for (int64_t r = 0; r < bt; r++) {
        const double x = kind[r] == 1 ? 0.0 : NAN;
        rr[r] = rr[bt + r] = rr[2 * bt + r] = x;
        for (int64_t i = 0; i < v; i++) dz[r * v + i] = 0.0;
        if (kind[r] != 0) continue;
        for (int64_t i = 0; i < v; i++) {
            double a = c->bias ? bs[i] : 0.0;
            for (int64_t j = 0; j < hs; j++) a += xs[r * hs + j] * ws[i * hs + j];
            zs[i] = a;
        }
        const double lh = logsumexp(zs, v, 1.0), h = c->labels ? lh - zs[lab[r]] : 0.0;
        const ref_topk_row_out o = ref_topk_row(d, (kdloss_topk_tail)c->tail, zs, v, ids + r * k,
                                                lp + r * k, k, c->T, dd, NULL, NULL);
        for (int64_t i = 0; i < v; i++) /* dd = dD/dzs, the 1/T included */
            dz[r * v + i] = ca * (exp(zs[i] - lh) - (c->labels && i == lab[r] ? 1.0 : 0.0)) +
                            cb * dd[i];
        rr[r] = o.loss, rr[bt + r] = h, rr[2 * bt + r] = lh;
        soft += o.loss, hard += h, abs_soft += o.mag;
    }
    L[1] = bad ? NAN : soft * t2f / nvd;
    L[2] = bad ? NAN : hard / nvd;
    L[0] = bad ? NAN : c->w_hard * L[2] + c->w_soft * L[1];
    free(zs);
    free(dd);
    return abs_soft * t2f;
}

/* dxs = dz ws, dws = dz^T xs, dbs = column sums of dz, in double. */
static void fltk_ref_grads(const fltk_case *c, const double *dz, const double *xs,
                           const double *ws, double *rdx, double *rdw, double *rdb) {
    const int64_t bt = c->bt, hs = c->hs, v = c->v;
    memset(rdx, 0, (size_t)(bt * hs) * 8);
    memset(rdw, 0, (size_t)(v * hs) * 8);
    memset(rdb, 0, (size_t)v * 8);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t i = 0; i < v; i++) {
            const double g = dz[r * v + i];
            if (g == 0) continue;
            for (int64_t j = 0; j < hs; j++) {
                rdx[r * hs + j] += g * ws[i * hs + j];
                rdw[i * hs + j] += g * xs[r * hs + j];
            }
            rdb[i] += g;
        }
}

typedef struct fltk_call {
    kdloss_fused_linear_topk_distill_params p;
    int64_t bt, hs, v;
    kdloss_cmat xs, ws;
    const void *bs;
    kdloss_topk_teacher t;
    kdloss_labels L;
    kdloss_fused_linear_distill_out o;
    void *wk;
    size_t wkb;
} fltk_call;

static kdloss_status fltk_call_run(void *arg) {
    fltk_call *a = arg;
    return kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &a->p, a->bt, a->hs, a->v, a->xs,
                                                 a->ws, a->bs, a->t, a->L, &a->o, a->wk, a->wkb);
}

/* Reads a device gradient (rows x cols, ld) and compares it normwise with ref, padding kept. */
static double *fltk_cmp_grad(const char *tag, const char *name, const void *d, kdloss_dtype dt,
                             int64_t rows, int64_t cols, int64_t ld, const double *ref, double tol,
                             void **host) {
    const size_t bytes = (size_t)(rows * ld) * kdloss_dtype_size(dt);
    void *h = xmalloc(bytes);
    d2h(h, d, bytes);
    if (ld > cols) KT_CHECK(pad_untouched(h, dt, rows, cols, ld), "%s: %s padding written", tag, name);
    double *got = to_double(h, dt, rows, cols, ld);
    char what[300];
    snprintf(what, sizeof what, "%s %s", tag, name);
    cmp_norm(what, got, ref, rows * cols, tol);
    *host = h;
    return got;
}

/* Losses, row outputs and gradients of a fused call against the reference; then the same call
 * again (bitwise the same). */
static void fltk_check(const fltk_case *c, const char *tag, fltk_call *a, int32_t want_status,
                       const double *rr, const double L[3], double abs_soft, double nvd,
                       const double *rdx, const double *rdw, const double *rdb) {
    const int64_t bt = c->bt, hs = c->hs, v = c->v;
    const double lt = c->ds == KDLOSS_BF16 ? 1e-3 : 1e-4, tol = c->ds == KDLOSS_BF16 ? 1.5e-2 : 1e-4;
    KT_CHECK(read_status(a->wk) == want_status, "%s: device status word %d", tag,
             (int)read_status(a->wk));
    float hl[3], *hr = xmalloc((size_t)bt * 12);
    d2h(hl, a->o.loss, 12);
    static const char *ln[3] = {"loss", "soft_loss", "hard_loss"};
    for (int i = 0; i < (c->labels ? 3 : 2); i++) /* no hard_loss without labels */
        kt_close(hl[i], L[i], 1e-5 * abs_soft / nvd + 1e-6, lt, "%s %s", tag, ln[i]);
    d2h(hr, a->o.row_soft, (size_t)bt * 12); /* row_soft, row_hard, row_lse: one buffer */
    static const char *rn[3] = {"row_soft", "row_hard", "row_lse"};
    for (int o = 0; o < (c->rows ? 3 : 1); o++) {
        if (o == 1 && !c->labels) continue;
        for (int64_t r = 0; r < bt; r++)
            kt_close(hr[o * bt + r], rr[o * bt + r], o ? 1e-6 : 1e-5 * abs_soft / bt + 1e-6, lt,
                     "%s %s[%lld]", tag, rn[o], (long long)r);
    }
    void *h1 = NULL, *h2 = NULL, *h3 = NULL;
    double *g1 = NULL, *g2 = NULL, *g3 = NULL;
    const int64_t ldx = a->o.dxs.ld, ldw = a->o.dws.ld;
    if (a->o.dxs.data) g1 = fltk_cmp_grad(tag, "dxs", a->o.dxs.data, c->ds, bt, hs, ldx, rdx, tol, &h1);
    if (a->o.dws.data) g2 = fltk_cmp_grad(tag, "dws", a->o.dws.data, c->ds, v, hs, ldw, rdw, tol, &h2);
    if (a->o.dbs) g3 = fltk_cmp_grad(tag, "dbs", a->o.dbs, c->ds, 1, v, v, rdb, tol, &h3);
    float hl2[3];
    KT_CHECK(fltk_call_run(a) == KDLOSS_OK, "%s: second call", tag);
    CK(cudaStreamSynchronize(g_st));
    d2h(hl2, a->o.loss, 12);
    KT_CHECK(memcmp(hl, hl2, c->labels ? 12 : 8) == 0, "%s: losses differ between runs", tag);
    const size_t es = kdloss_dtype_size(c->ds);
    if (h1) { /* gradients of the second call, bitwise */
        void *b = xmalloc((size_t)(bt * ldx) * es);
        d2h(b, a->o.dxs.data, (size_t)(bt * ldx) * es);
        cmp_bits(tag, h1, b, (size_t)(bt * ldx) * es);
        free(b);
    }
    if (h2) {
        void *b = xmalloc((size_t)(v * ldw) * es);
        d2h(b, a->o.dws.data, (size_t)(v * ldw) * es);
        cmp_bits(tag, h2, b, (size_t)(v * ldw) * es);
        free(b);
    }
    free(hr), free(h1), free(h2), free(h3), free(g1), free(g2), free(g3);
}

/* The CPU function on the same inputs (host copies in ha; only when every id and label is
 * valid), losses and gradients against the GPU's. */
static void fltk_vs_cpu(const fltk_case *c, const char *tag, const fltk_call *a,
                        const fltk_call *ha, double abs_soft, double nvd) {
    const int64_t bt = c->bt, hs = c->hs, v = c->v;
    const size_t es = kdloss_dtype_size(c->ds);
    const double lt = c->ds == KDLOSS_BF16 ? 1e-3 : 1e-4, tol = c->ds == KDLOSS_BF16 ? 3e-2 : 2e-4;
    fltk_call h = *ha;
    float cl[3], gl[3];
    h.o.loss = cl, h.o.soft_loss = cl + 1, h.o.hard_loss = c->labels ? cl + 2 : NULL;
    h.o.row_soft = h.o.row_hard = h.o.row_lse = NULL;
    void *c1 = a->o.dxs.data ? xmalloc((size_t)(bt * a->o.dxs.ld) * es) : NULL;
    void *c2 = a->o.dws.data ? xmalloc((size_t)(v * a->o.dws.ld) * es) : NULL;
    h.o.dxs.data = c1, h.o.dws.data = c2, h.o.dbs = NULL;
    kdloss_status s = kdloss_fused_linear_topk_distill(&h.p, bt, hs, v, h.xs, h.ws, h.bs, h.t,
                                                       h.L, &h.o, NULL, 0);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
        d2h(gl, a->o.loss, 12);
        for (int i = 0; i < (c->labels ? 3 : 2); i++)
            kt_close(gl[i], cl[i], 1e-5 * abs_soft / nvd + 1e-6, lt, "%s loss[%d] vs CPU", tag, i);
        char what[300];
        for (int w = 0; w < 2; w++) {
            void *cpu = w ? c2 : c1;
            const kdloss_mat m = w ? a->o.dws : a->o.dxs;
            const int64_t rows = w ? v : bt;
            if (!cpu) continue;
            void *gpu = xmalloc((size_t)(rows * m.ld) * es);
            d2h(gpu, m.data, (size_t)(rows * m.ld) * es);
            double *x = to_double(gpu, c->ds, rows, hs, m.ld), *y = to_double(cpu, c->ds, rows, hs, m.ld);
            snprintf(what, sizeof what, "%s %s vs CPU", tag, w ? "dws" : "dxs");
            cmp_norm(what, x, y, rows * hs, tol);
            free(gpu), free(x), free(y);
        }
    }
    free(c1), free(c2);
}

/* One fused case: operands as the dense fused test's (xs N(0, 1), ws of spread 3 / sqrt(hs),
 * bs N(0, 0.5)), the teacher's slots from tk_gen_slots on the reference's own logits' scale. */
static void test_fltk_case(kt_rng *rng, const fltk_case *c) {
    const kdloss_div_params d = KT_DIV_CASES[c->div];
    char tag[260];
    snprintf(tag, sizeof tag,
             "fltopk %s %s beta=%g alpha=%g bt=%lld hs=%lld v=%lld k=%lld s=%s lp=%s T=%g wh=%g "
             "ws=%g t2=%d bias=%d chunk=%lld pad=%lld labels=%d bad_id=%d fwd=%d rows=%d",
             tk_tail_name(c->tail), kdloss_divergence_name(d.divergence), d.beta, d.alpha,
             (long long)c->bt, (long long)c->hs, (long long)c->v, (long long)c->k,
             kt_dtype_name(c->ds), kt_dtype_name(c->lpdt), c->T, c->w_hard, c->w_soft, c->t2,
             c->bias, (long long)c->chunk, (long long)c->pad, c->labels, c->bad_id, c->fwd_only,
             c->rows);
    const int64_t bt = c->bt, hs = c->hs, v = c->v, k = c->k, ldh = hs + c->pad, ldt = k + c->pad;
    const size_t es = kdloss_dtype_size(c->ds);
    double *xs = xmalloc((size_t)(bt * hs) * 8), *ws = xmalloc((size_t)(v * hs) * 8);
    double *bs = xmalloc((size_t)v * 8), *lp = xmalloc((size_t)(bt * k) * 8);
    int64_t *ids = xmalloc((size_t)(bt * k) * 8), *lab = xmalloc((size_t)bt * 8);
    fill_normal(rng, xs, bt * hs, 1.0);
    fill_normal(rng, ws, v * hs, 3.0 / sqrt((double)hs));
    fill_normal(rng, bs, v, 0.5);
    kt_round_to(xs, bt * hs, c->ds);
    kt_round_to(ws, v * hs, c->ds);
    kt_round_to(bs, v, c->ds);
    for (int64_t r = 0; r < bt; r++)
        tk_gen_slots(rng, v, k, c->T, (int)(r % 5), !div_rev_like(&d), c->lpdt, ids + r * k,
                     lp + r * k);
    tk_break_ids(ids, lp, bt, v, k, c->bad_id);
    void *hlab;
    kdloss_labels L = tk_make_labels(rng, c->labels, bt, v, lab, &hlab);
    int *kind = xmalloc((size_t)bt * sizeof(int));
    int64_t nv = 0;
    for (int64_t r = 0; r < bt; r++) {
        kind[r] = tk_row_kind(ids + r * k, k, v, c->labels, lab[r]);
        nv += kind[r] == 0;
    }
    const int32_t want_status = tk_want_status(kind, lab, c->labels, bt, v, 1);
    const double nvd = nv > 0 ? (double)nv : 1.0;

    void *hxs = kt_pack(xs, bt, hs, ldh, c->ds), *hws = kt_pack(ws, v, hs, ldh, c->ds);
    void *hbs = kt_pack(bs, 1, v, v, c->ds), *hid, *did, *hlp, *dlp;
    tk_upload_teacher(ids, lp, bt, k, ldt, KDLOSS_I64, c->lpdt, &hid, &did, &hlp, &dlp);
    void *dxs = dalloc((size_t)(bt * ldh) * es), *dwsm = dalloc((size_t)(v * ldh) * es);
    void *dbs = dalloc((size_t)v * es);
    h2d(dxs, hxs, (size_t)(bt * ldh) * es);
    h2d(dwsm, hws, (size_t)(v * ldh) * es);
    h2d(dbs, hbs, (size_t)v * es);
    void *gdx = dalloc((size_t)(bt * ldh) * es), *gdw = dalloc((size_t)(v * ldh) * es);
    void *gdb = dalloc((size_t)v * es);
    float *gl = dalloc(12), *grows = dalloc((size_t)bt * 12);
    dpoison(gdx, (size_t)(bt * ldh) * es);
    dpoison(gdw, (size_t)(v * ldh) * es);
    dpoison(gdb, (size_t)v * es);
    dpoison(gl, 12);
    dpoison(grows, (size_t)bt * 12);

    fltk_call a;
    memset(&a, 0, sizeof a);
    kdloss_div_params_default(&a.p.div);
    a.p.div = d;
    a.p.tail = (kdloss_topk_tail)c->tail;
    a.p.temperature = c->T;
    a.p.weight_hard_loss = c->w_hard;
    a.p.weight_soft_loss = c->w_soft;
    a.p.t2_scale = c->t2;
    a.p.ignore_index = -100;
    a.p.chunk_size = c->chunk;
    a.p.grad_scale = 0.5;
    a.bt = bt, a.hs = hs, a.v = v;
    a.xs = (kdloss_cmat){dxs, c->ds, ldh};
    a.ws = (kdloss_cmat){dwsm, c->ds, ldh};
    a.bs = c->bias ? dbs : NULL;
    a.t = (kdloss_topk_teacher){k, {did, KDLOSS_I64, ldt}, {dlp, c->lpdt, ldt}};
    a.L = L;
    a.o.loss = gl, a.o.soft_loss = gl + 1, a.o.hard_loss = c->labels ? gl + 2 : NULL;
    a.o.row_soft = grows;
    a.o.row_hard = c->rows && c->labels ? grows + bt : NULL;
    a.o.row_lse = c->rows ? grows + 2 * bt : NULL;
    if (c->fwd_only != 1) a.o.dxs = (kdloss_mat){gdx, c->ds, ldh};
    if (!c->fwd_only) a.o.dws = (kdloss_mat){gdw, c->ds, ldh};
    if (!c->fwd_only && c->bias) a.o.dbs = gdb;
    kdloss_status s = kdloss_cuda_fused_linear_topk_distill_workspace_size(
        &a.p, bt, hs, v, k, c->ds, c->fwd_only != 1, &a.wkb);
    KT_CHECK(s == KDLOSS_OK, "%s: ws size %d", tag, (int)s);
    a.wk = dalloc(a.wkb);
    s = fltk_call_run(&a);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) {
        double *dz = xmalloc((size_t)(bt * v) * 8), *rr = xmalloc((size_t)bt * 24), Lr[3];
        double *rdx = xmalloc((size_t)(bt * hs) * 8), *rdw = xmalloc((size_t)(v * hs) * 8);
        double *rdb = xmalloc((size_t)v * 8);
        const double abs_soft = fltk_ref(c, &d, xs, ws, bs, ids, lp, lab, kind, dz, rr, Lr);
        fltk_ref_grads(c, dz, xs, ws, rdx, rdw, rdb);
        fltk_check(c, tag, &a, want_status, rr, Lr, abs_soft, nvd, rdx, rdw, rdb);
        if (kdloss_fused_linear_topk_distill && want_status == KDLOSS_OK) {
            fltk_call h = a;
            h.xs.data = hxs, h.ws.data = hws, h.bs = c->bias ? hbs : NULL;
            h.t.ids.data = hid, h.t.logprobs.data = hlp, h.L.data = hlab;
            fltk_vs_cpu(c, tag, &a, &h, abs_soft, nvd);
        }
        free(dz), free(rr), free(rdx), free(rdw), free(rdb);
    }
    CK(cudaFree(dxs));
    CK(cudaFree(dwsm));
    CK(cudaFree(dbs));
    CK(cudaFree(did));
    CK(cudaFree(dlp));
    if (L.data) CK(cudaFree((void *)L.data));
    CK(cudaFree(gdx));
    CK(cudaFree(gdw));
    CK(cudaFree(gdb));
    CK(cudaFree(gl));
    CK(cudaFree(grows));
    CK(cudaFree(a.wk));
    free(xs), free(ws), free(bs), free(lp), free(ids), free(lab), free(kind);
    free(hxs), free(hws), free(hbs), free(hid), free(hlp), free(hlab);
}

/* Every divergence case with the bucket (dense) and renorm_both (the sparse path, and dense
 * when row_lse is asked for), renorm_teacher, dtypes, T, t2_scale, weights, chunking, bias,
 * padding, labels (none, ignored, all ignored, out of range), invalid ids, forward only. */
static void test_topk_fused(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16};
    const int64_t chunks[] = {0, 16, 1, 7};
    int n = 0;
    for (int i = 0; i < NDIV; i++)
        for (int tail = 0; tail < 2; tail++, n++) {
            if (kt_quick() && n % 5) continue;
            const int labels = n % 3 == 2 ? 0 : 1; /* no labels: no cross-entropy */
            fltk_case c = {29, 24, 300, 8, dts[n % 2], KDLOSS_F32, i, tail, n % 4 == 1 ? 2.0 : 1.0,
                           labels && tail == 0 ? 0.5 : 0.0, 1.0, (n / 2) % 2, n % 3 != 1,
                           chunks[n % 4], 0, labels, 0, 0, n % 5 == 4};
            test_fltk_case(rng, &c);
        }
    const fltk_case sp[] = {
        /* renorm_teacher; renorm_both dense (row_lse) with CE; renorm_both sparse, bf16 log-probs, padded */
        {29, 24, 300, 8, KDLOSS_F32, KDLOSS_F32, 0, 2, 1.5, 0.5, 0.5, 1, 1, 7, 0, 1, 0, 0, 1},
        {29, 24, 300, 8, KDLOSS_BF16, KDLOSS_BF16, 4, 1, 1.0, 0.5, 0.5, 0, 1, 0, 0, 1, 0, 0, 1},
        {29, 24, 300, 8, KDLOSS_BF16, KDLOSS_BF16, 4, 1, 2.0, 0.0, 1.0, 1, 1, 0, 3, 1, 0, 0, 0},
        /* all ignored; one label out of range; invalid ids (dense, sparse, without labels) */
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 5, 0, 3, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 1, 1, 1.0, 0.0, 1.0, 0, 0, 0, 0, 4, 0, 0, 0},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 5, 0, 1, 1, 0, 1},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 2, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 1, 2, 0, 0},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 14, 0, 1.0, 0.0, 1.0, 0, 1, 3, 0, 0, 3, 0, 0},
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 4, 2, 0, 0},
        /* forward only; dxs only (sparse: no pairs); V across tiles, k 64; S = V (k > v) */
        {12, 16, 100, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 2.0, 0.5, 0.5, 1, 1, 0, 0, 1, 0, 1, 1},
        {12, 16, 100, 8, KDLOSS_BF16, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 0, 0, 1, 0, 2, 0},
        {9, 16, 4100, 64, KDLOSS_BF16, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 4, 3, 1, 0, 0, 1},
        {9, 16, 4100, 64, KDLOSS_F32, KDLOSS_F32, 12, 1, 1.5, 0.0, 1.0, 1, 1, 0, 0, 1, 0, 0, 0},
        {10, 8, 6, 8, KDLOSS_F32, KDLOSS_F32, 0, 0, 1.0, 0.5, 0.5, 0, 1, 0, 0, 1, 0, 0, 1},
        {10, 8, 6, 8, KDLOSS_F32, KDLOSS_F32, 0, 1, 1.0, 0.0, 1.0, 0, 1, 3, 0, 1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) test_fltk_case(rng, &sp[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Vocabulary-parallel entry points on one GPU: ranks as threads                                */
/* ------------------------------------------------------------------------------------------ */

/* kdloss_cuda_fused_linear_distill_vp and kdloss_cuda_fused_linear_topk_distill_vp with 2 and 3
 * ranks that are threads of this process on one device, each with its own stream, context,
 * block of the heads (uneven), outputs and workspace, against the single-process CUDA call on the
 * whole heads: losses and row outputs rtol 1e-6, gradients (dxs, the rank's dws / dbs block)
 * 1e-5 relative + 1e-5 x the largest entry (two bf16 roundings apart with bf16 operands), as
 * tests/mpi/test_vp.c. The communicator is the test's own: it checks that every rank makes the
 * same all-reduce calls (count, dtype, op) and records rank 0's sequence, which must be the
 * documented protocol (the agreement's two collectives, then per chunk MAX 2, SUM 4 (4 + K),
 * SUM 2 (dense), the dxs SUM); it can also tamper with what the ranks read back from one call
 * (tests/test_vp_agree.c's faults). */

#define VP_MAX_RANKS 3
#define VP_MAX_CALLS 64

typedef struct vp_call_rec {
    int64_t n;
    int dt, op;
} vp_call_rec;

/* A fault of the communicator: after call number `call` (0: the agreement, 1: the confirmation)
 * the F64 slot `slot` of what rank `rank` (-1: every rank) reads back becomes `val`. */
typedef struct vp_tamper {
    int on, call, rank;
    int64_t slot;
    double val;
} vp_tamper;

/* The ranks' meeting point: each rank's host copy of its buffer and its call, between two
 * barriers. */
typedef struct vp_world {
    int size;
    pthread_barrier_t bar;
    void *in[VP_MAX_RANKS];
    vp_call_rec call[VP_MAX_RANKS];
    vp_call_rec log[VP_MAX_CALLS]; /* rank 0's calls in order */
    int ncalls;
    vp_tamper tamper;
} vp_world;

typedef struct vp_rank {
    kdloss_comm comm; /* ctx points here */
    vp_world *w;
    cudaStream_t st;
    int ncalls;       /* this rank's calls so far */
} vp_rank;

/* res = every rank's in[] reduced in rank order (fp32 sums in fp32, as NCCL and MPI do). */
static void vp_reduce(void *res, void *const *in, int size, int64_t n, kdloss_dtype dt,
                      kdloss_comm_op op) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == KDLOSS_F64) {
            double a = ((const double *)in[0])[i];
            for (int q = 1; q < size; q++) {
                double x = ((const double *)in[q])[i];
                a = op == KDLOSS_COMM_MAX ? (x > a ? x : a) : a + x;
            }
            ((double *)res)[i] = a;
        } else {
            float a = ((const float *)in[0])[i];
            for (int q = 1; q < size; q++) {
                float x = ((const float *)in[q])[i];
                a = op == KDLOSS_COMM_MAX ? (x > a ? x : a) : a + x;
            }
            ((float *)res)[i] = a;
        }
    }
}

/* kdloss_comm.allreduce of a device buffer: to the host on the rank's stream, reduced with the
 * other ranks, (tampered with when the world says so,) back. A call that another rank does not
 * make the same way fails (returns 1). */
static int vp_allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    vp_rank *me = (vp_rank *)ctx;
    vp_world *w = me->w;
    const int r = me->comm.rank, call = me->ncalls++;
    const size_t bytes = (size_t)(n > 0 ? n : 0) * (dt == KDLOSS_F64 ? 8u : 4u);
    void *mine = xmalloc(bytes), *res = xmalloc(bytes);
    int ok = n >= 0 && (dt == KDLOSS_F64 || dt == KDLOSS_F32) &&
             cudaMemcpyAsync(mine, buf, bytes, cudaMemcpyDeviceToHost, me->st) == cudaSuccess &&
             cudaStreamSynchronize(me->st) == cudaSuccess;
    w->in[r] = mine;
    w->call[r] = (vp_call_rec){ok ? n : -1, (int)dt, (int)op};
    pthread_barrier_wait(&w->bar);
    for (int q = 0; q < w->size; q++)
        ok &= w->call[q].n == n && w->call[q].dt == (int)dt && w->call[q].op == (int)op;
    if (ok) vp_reduce(res, w->in, w->size, n, dt, op);
    const vp_tamper *t = &w->tamper;
    if (ok && t->on && t->call == call && (t->rank < 0 || t->rank == r) && dt == KDLOSS_F64 &&
        t->slot >= 0 && t->slot < n)
        ((double *)res)[t->slot] = t->val;
    if (r == 0 && w->ncalls < VP_MAX_CALLS) w->log[w->ncalls] = w->call[0];
    if (r == 0) w->ncalls++;
    pthread_barrier_wait(&w->bar); /* every rank has read every input */
    ok = ok && cudaMemcpyAsync(buf, res, bytes, cudaMemcpyHostToDevice, me->st) == cudaSuccess &&
         cudaStreamSynchronize(me->st) == cudaSuccess;
    free(mine);
    free(res);
    return !ok;
}

typedef struct vp_case {
    const char *tag;
    int topk;                /* 0: dense teacher, 1: sparse top-k teacher */
    int64_t bt, hs, ht, v, k;
    kdloss_dtype dt;         /* every float operand's */
    int bias;
    int labels;              /* top-k: 0 runs without labels */
    kdloss_fused_linear_distill_params dp;
    kdloss_fused_linear_topk_distill_params tp;
} vp_case;

/* The operands of a case on the device (whole heads) and their host values. */
typedef struct vp_data {
    void *xs, *ws, *bs, *xt, *wt, *bt, *lab, *ids, *lp;
} vp_data;

/* One call's outputs on the device: loss / soft / hard, the three row outputs, the gradients
 * (dws / dbs of `rows` vocabulary rows), and their host copies after the call. */
typedef struct vp_out {
    float *d_sc, *d_rows;
    void *d_dxs, *d_dws, *d_dbs;
    float sc[3], *rows;
    void *dxs, *dws, *dbs;
} vp_out;

static int vp_hard(const vp_case *c) {
    return c->topk ? c->tp.weight_hard_loss > 0.0 : 1;
}

static void vp_out_alloc(vp_out *o, const vp_case *c, int64_t rows) {
    const size_t es = kdloss_dtype_size(c->dt);
    o->d_sc = dalloc(3 * sizeof(float));
    o->d_rows = dalloc((size_t)(3 * c->bt) * sizeof(float));
    o->d_dxs = dalloc((size_t)(c->bt * c->hs) * es);
    o->d_dws = dalloc((size_t)(rows * c->hs) * es);
    o->d_dbs = c->bias ? dalloc((size_t)rows * es) : NULL;
    dpoison(o->d_sc, 3 * sizeof(float));
    dpoison(o->d_rows, (size_t)(3 * c->bt) * sizeof(float));
    dpoison(o->d_dxs, (size_t)(c->bt * c->hs) * es);
    dpoison(o->d_dws, (size_t)(rows * c->hs) * es);
    if (o->d_dbs) dpoison(o->d_dbs, (size_t)rows * es);
    o->rows = xmalloc((size_t)(3 * c->bt) * sizeof(float));
    o->dxs = xmalloc((size_t)(c->bt * c->hs) * es);
    o->dws = xmalloc((size_t)(rows * c->hs) * es);
    o->dbs = xmalloc((size_t)rows * es);
}

static kdloss_fused_linear_distill_out vp_view(const vp_out *o, const vp_case *c) {
    const int hard = vp_hard(c);
    kdloss_fused_linear_distill_out d;
    memset(&d, 0, sizeof d);
    d.loss = o->d_sc;
    d.soft_loss = o->d_sc + 1;
    d.hard_loss = hard ? o->d_sc + 2 : NULL;
    d.dxs = (kdloss_mat){o->d_dxs, c->dt, 0};
    d.dws = (kdloss_mat){o->d_dws, c->dt, 0};
    d.dbs = o->d_dbs;
    d.row_soft = o->d_rows;
    d.row_hard = hard ? o->d_rows + c->bt : NULL;
    d.row_lse = hard ? o->d_rows + 2 * c->bt : NULL;
    return d;
}

static void vp_out_fetch(vp_out *o, const vp_case *c, int64_t rows) {
    const size_t es = kdloss_dtype_size(c->dt);
    d2h(o->sc, o->d_sc, 3 * sizeof(float));
    d2h(o->rows, o->d_rows, (size_t)(3 * c->bt) * sizeof(float));
    d2h(o->dxs, o->d_dxs, (size_t)(c->bt * c->hs) * es);
    d2h(o->dws, o->d_dws, (size_t)(rows * c->hs) * es);
    if (o->d_dbs) d2h(o->dbs, o->d_dbs, (size_t)rows * es);
}

static void vp_out_free(vp_out *o) {
    CK(cudaFree(o->d_sc));
    CK(cudaFree(o->d_rows));
    CK(cudaFree(o->d_dxs));
    CK(cudaFree(o->d_dws));
    if (o->d_dbs) CK(cudaFree(o->d_dbs));
    free(o->rows), free(o->dxs), free(o->dws), free(o->dbs);
}

/* Rank r's block of v rows: uneven, every block non-empty (r+1 shares of 1+2+..+size). */
static void vp_block(int64_t v, int rank, int size, int64_t *lo, int64_t *n) {
    int64_t tot = (int64_t)size * (size + 1) / 2, acc = 0;
    for (int q = 0; q < rank; q++) acc += q + 1;
    *lo = v * acc / tot;
    *n = v * (acc + rank + 1) / tot - *lo;
}

static void *vp_upload(const void *h, size_t bytes) {
    void *d = dalloc(bytes);
    h2d(d, h, bytes);
    return d;
}

/* Operands as tests/mpi/test_vp.c draws them (logits of spread ~3, as this file's fused cases):
 * labels with every fifth row ignored; top-k ids distinct per row over the whole vocabulary (so
 * every rank holds some), two unused slots when 3 < K < V, log-probs decreasing from -1. */
static void vp_data_make(kt_rng *g, const vp_case *c, vp_data *d) {
    const int64_t bt = c->bt, hs = c->hs, ht = c->ht > 0 ? c->ht : 1, v = c->v, k = c->k;
    const size_t es = kdloss_dtype_size(c->dt);
    double *x = xmalloc((size_t)((bt + v) * (hs > ht ? hs : ht) + 2 * v) * sizeof(double));
    void *p;
#define VP_PUT(field, rows, cols, sd)                                                          \
    fill_normal(g, x, (rows) * (cols), (sd));                                                  \
    p = kt_pack(x, (rows), (cols), (cols), c->dt);                                             \
    d->field = vp_upload(p, (size_t)((rows) * (cols)) * es);                                   \
    free(p);
    VP_PUT(xs, bt, hs, 1.0)
    VP_PUT(ws, v, hs, 3.0 / sqrt((double)hs))
    VP_PUT(bs, 1, v, 0.5)
    VP_PUT(xt, bt, ht, 1.0)
    VP_PUT(wt, v, ht, 3.0 / sqrt((double)ht))
    VP_PUT(bt, 1, v, 0.5)
#undef VP_PUT
    free(x);
    int64_t *lab = xmalloc((size_t)bt * sizeof(int64_t));
    for (int64_t r = 0; r < bt; r++) lab[r] = r % 5 == 3 ? -100 : kt_randint(g, v);
    d->lab = vp_upload(lab, (size_t)bt * sizeof(int64_t));
    free(lab);
    int32_t *ids = xmalloc((size_t)(bt * (k > 0 ? k : 1)) * 4);
    float *lp = xmalloc((size_t)(bt * (k > 0 ? k : 1)) * 4);
    memset(ids, 0xFF, (size_t)(bt * (k > 0 ? k : 1)) * 4); /* -1: a dense case never reads them */
    memset(lp, 0, (size_t)(bt * (k > 0 ? k : 1)) * 4);
    for (int64_t r = 0; r < bt; r++) {
        int32_t *row = ids + r * k;
        for (int64_t j = 0; j < k; j++) {
            int dup;
            do { /* rejection: k <= v */
                row[j] = (int32_t)kt_randint(g, v);
                dup = 0;
                for (int64_t i = 0; i < j; i++) dup |= row[i] == row[j];
            } while (dup);
            lp[r * k + j] = (float)(-1.0 - 0.3 * (double)j - 0.1 * kt_uniform(g));
        }
        if (k > 3 && k < v) row[1] = row[k - 1] = -1;
    }
    d->ids = vp_upload(ids, (size_t)(bt * (k > 0 ? k : 1)) * 4);
    d->lp = vp_upload(lp, (size_t)(bt * (k > 0 ? k : 1)) * 4);
    free(ids);
    free(lp);
}

static void vp_data_free(vp_data *d) {
    void *all[] = {d->xs, d->ws, d->bs, d->xt, d->wt, d->bt, d->lab, d->ids, d->lp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) CK(cudaFree(all[i]));
}

static kdloss_topk_teacher vp_teacher(const vp_case *c, const vp_data *d) {
    kdloss_topk_teacher t = {c->k, {d->ids, KDLOSS_I32, 0}, {d->lp, KDLOSS_F32, 0}};
    return t;
}

/* The whole-vocabulary call (single process) on g_st. */
static kdloss_status vp_whole(const vp_case *c, const vp_data *d, vp_out *o) {
    const kdloss_fused_linear_distill_out out = vp_view(o, c);
    kdloss_cmat xs = {d->xs, c->dt, 0}, ws = {d->ws, c->dt, 0};
    kdloss_labels lab = {d->lab, KDLOSS_I64};
    size_t wsb = 0;
    kdloss_status s =
        c->topk ? kdloss_cuda_fused_linear_topk_distill_workspace_size(&c->tp, c->bt, c->hs, c->v,
                                                                       c->k, c->dt, 1, &wsb)
                : kdloss_cuda_fused_linear_distill_workspace_size(&c->dp, c->bt, c->hs, c->ht,
                                                                  c->v, c->dt, 1, &wsb);
    if (s != KDLOSS_OK) return s;
    void *wk = dalloc(wsb);
    kdloss_fused_linear_distill_out o2 = out;
    if (c->topk) {
        if (!c->labels) lab.data = NULL;
        s = kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &c->tp, c->bt, c->hs, c->v, xs, ws,
                                                  c->bias ? d->bs : NULL, vp_teacher(c, d), lab,
                                                  &o2, wk, wsb);
    } else {
        s = kdloss_cuda_fused_linear_distill(g_ctx, g_st, &c->dp, c->bt, c->hs, c->ht, c->v, xs,
                                             ws, c->bias ? d->bs : NULL,
                                             (kdloss_cmat){d->xt, c->dt, 0},
                                             (kdloss_cmat){d->wt, c->dt, 0},
                                             c->bias ? d->bt : NULL, lab, &o2, wk, wsb);
    }
    CK(cudaStreamSynchronize(g_st));
    CK(cudaFree(wk));
    return s;
}

/* One rank of a vocabulary-parallel call. */
typedef struct vp_job {
    const vp_case *c;
    const vp_data *d;
    kdloss_fused_linear_distill_params dp;       /* the case's, or a bad one */
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_vocab_shard shard;
    int64_t lo, n;                               /* its block: shard.v_begin may differ */
    const kdloss_comm *comm;
    cudaStream_t st;                             /* NULL: its own, made and destroyed here */
    kdloss_cuda_context *ctx;                    /* NULL: its own */
    vp_rank *rank;                               /* the test's communicator, or NULL */
    int ws_short;                                /* pass one byte less than the size query's */
    int no_dxs;                                  /* ask for dws / dbs but not dxs */
    vp_out o;
    kdloss_status status;
    int32_t word;                                /* the workspace's status word */
} vp_job;

static kdloss_status vp_job_call(vp_job *j, void *wk, size_t wsb) {
    const vp_case *c = j->c;
    const vp_data *d = j->d;
    const size_t es = kdloss_dtype_size(c->dt);
    kdloss_fused_linear_distill_out out = vp_view(&j->o, c);
    if (j->no_dxs) out.dxs.data = NULL;
    kdloss_cmat xs = {d->xs, c->dt, 0}, ws = {(char *)d->ws + (size_t)(j->lo * c->hs) * es, c->dt, 0};
    const void *bs = c->bias ? (const char *)d->bs + (size_t)j->lo * es : NULL;
    kdloss_labels lab = {c->topk && !c->labels ? NULL : d->lab, KDLOSS_I64};
    if (c->topk)
        return kdloss_cuda_fused_linear_topk_distill_vp(j->ctx, j->st, &j->tp, &j->shard, c->bt,
                                                        c->hs, j->n, xs, ws, bs, vp_teacher(c, d),
                                                        lab, &out, wk, wsb);
    kdloss_cmat xt = {d->xt, c->dt, 0};
    kdloss_cmat wt = {(char *)d->wt + (size_t)(j->lo * c->ht) * es, c->dt, 0};
    const void *btb = c->bias ? (const char *)d->bt + (size_t)j->lo * es : NULL;
    return kdloss_cuda_fused_linear_distill_vp(j->ctx, j->st, &j->dp, &j->shard, c->bt, c->hs,
                                               c->ht, j->n, xs, ws, bs, xt, wt, btb, lab, &out,
                                               wk, wsb);
}

/* A rank's thread: its stream and context (unless given), workspace, the call, the wait. */
static void *vp_job_run(void *arg) {
    vp_job *j = (vp_job *)arg;
    const vp_case *c = j->c;
    int own_st = !j->st, own_ctx = !j->ctx;
    if (own_st) CK(cudaStreamCreateWithFlags(&j->st, cudaStreamNonBlocking));
    if (own_ctx && kdloss_cuda_context_create(0, &j->ctx) != KDLOSS_OK) {
        j->status = KDLOSS_ERR_INTERNAL;
        return NULL;
    }
    if (j->rank) j->rank->st = j->st;
    size_t wsb = 0;
    kdloss_status s =
        c->topk ? kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&c->tp, c->bt, c->hs,
                                                                          j->n, c->k, c->dt, 1, &wsb)
                : kdloss_cuda_fused_linear_distill_vp_workspace_size(&c->dp, c->bt, c->hs, c->ht,
                                                                     j->n, c->dt, 1, &wsb);
    void *wk = dalloc(s == KDLOSS_OK ? wsb : 256);
    j->status = vp_job_call(j, wk, wsb - (j->ws_short ? 1 : 0));
    CK(cudaStreamSynchronize(j->st));
    j->word = j->status == KDLOSS_OK ? read_status(wk) : 0;
    CK(cudaFree(wk));
    if (own_ctx) kdloss_cuda_context_destroy(j->ctx);
    if (own_st) CK(cudaStreamDestroy(j->st));
    return NULL;
}

/* Every rank of `size` on its own thread, with the test's communicator (tampering as tp says,
 * NULL: honest). */
static void vp_run_ranks(vp_job *jobs, int size, vp_world *w, vp_rank *ranks,
                         const vp_tamper *tp) {
    pthread_t th[VP_MAX_RANKS];
    memset(w, 0, sizeof *w);
    w->size = size;
    if (tp) w->tamper = *tp;
    pthread_barrier_init(&w->bar, NULL, (unsigned)size);
    for (int r = 0; r < size; r++) {
        ranks[r].comm = (kdloss_comm){r, size, vp_allreduce, &ranks[r]};
        ranks[r].w = w;
        ranks[r].ncalls = 0;
        jobs[r].comm = &ranks[r].comm;
        jobs[r].shard.comm = jobs[r].comm;
        jobs[r].rank = &ranks[r];
        if (pthread_create(&th[r], NULL, vp_job_run, &jobs[r]) != 0) {
            printf("vp: pthread_create failed\n");
            exit(1);
        }
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w->bar);
}

/* max |a - b| <= tol max |b| + tol |b| element by element (dtype dt, n elements). */
static void vp_close(const char *tag, const char *what, const void *a, const void *b, int64_t n,
                     kdloss_dtype dt) {
    double mx = 0.0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(kt_get(b, dt, 0, 0, i)));
    const double tol = dt == KDLOSS_BF16 ? 2 * kt_eps(dt) : 1e-5; /* bf16: one rounding apart */
    for (int64_t i = 0; i < n; i++)
        if (!kt_close(kt_get(a, dt, 0, 0, i), kt_get(b, dt, 0, 0, i), tol * mx, tol, "%s %s [%lld]",
                      tag, what, (long long)i))
            return;
}

/* A rank's results against the whole call's (its block lo, n of dws / dbs). */
static void vp_compare(const char *tag, const vp_case *c, const vp_out *q, const vp_out *w,
                       int64_t lo, int64_t n) {
    const size_t es = kdloss_dtype_size(c->dt);
    const int hard = vp_hard(c);
    kt_close(q->sc[0], w->sc[0], 1e-30, 1e-6, "%s loss", tag);
    kt_close(q->sc[1], w->sc[1], 1e-30, 1e-6, "%s soft", tag);
    if (hard) kt_close(q->sc[2], w->sc[2], 1e-30, 1e-6, "%s hard", tag);
    for (int64_t r = 0; r < c->bt; r++) {
        kt_close(q->rows[r], w->rows[r], 1e-6, 1e-6, "%s row_soft[%lld]", tag, (long long)r);
        if (!hard) continue;
        kt_close(q->rows[c->bt + r], w->rows[c->bt + r], 1e-6, 1e-6, "%s row_hard", tag);
        kt_close(q->rows[2 * c->bt + r], w->rows[2 * c->bt + r], 1e-6, 1e-6, "%s row_lse", tag);
    }
    vp_close(tag, "dxs", q->dxs, w->dxs, c->bt * c->hs, c->dt);
    vp_close(tag, "dws", q->dws, (const char *)w->dws + (size_t)(lo * c->hs) * es, n * c->hs, c->dt);
    if (c->bias) vp_close(tag, "dbs", q->dbs, (const char *)w->dbs + (size_t)lo * es, n, c->dt);
}

/* Rank 0's all-reduces: the agreement (MAX of 2 size + 12 doubles, then the confirmation's MAX
 * of 3), then per chunk (the case's chunk_size, which every rank shares) MAX 2 rows, SUM (4 or
 * 4 + K) rows, SUM 2 rows (dense), SUM rows x Hs fp32 (dxs). */
static void vp_check_protocol(const char *tag, const vp_case *c, const vp_world *w) {
    vp_call_rec want[VP_MAX_CALLS];
    int n = 0;
    want[n++] = (vp_call_rec){2 * (int64_t)w->size + 12, KDLOSS_F64, KDLOSS_COMM_MAX};
    want[n++] = (vp_call_rec){3, KDLOSS_F64, KDLOSS_COMM_MAX};
    const int64_t chunk = c->topk ? c->tp.chunk_size : c->dp.chunk_size;
    for (int64_t r0 = 0; chunk > 0 && r0 < c->bt && n + 4 <= VP_MAX_CALLS; r0 += chunk) {
        const int64_t m = c->bt - r0 < chunk ? c->bt - r0 : chunk;
        want[n++] = (vp_call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_MAX};
        want[n++] = (vp_call_rec){(4 + (c->topk ? c->k : 0)) * m, KDLOSS_F64, KDLOSS_COMM_SUM};
        if (!c->topk) want[n++] = (vp_call_rec){2 * m, KDLOSS_F64, KDLOSS_COMM_SUM};
        want[n++] = (vp_call_rec){m * c->hs, KDLOSS_F32, KDLOSS_COMM_SUM};
    }
    if (chunk <= 0) { /* automatic chunk: the agreement's two collectives at least */
        KT_CHECK(w->ncalls >= 2 && !memcmp(&w->log[0], &want[0], 2 * sizeof want[0]),
                 "%s: the agreement first", tag);
        return;
    }
    int same = w->ncalls == n;
    for (int i = 0; same && i < n; i++)
        same = w->log[i].n == want[i].n && w->log[i].dt == want[i].dt && w->log[i].op == want[i].op;
    KT_CHECK(same, "%s: %d all-reduces, the protocol has %d (or they differ)", tag, w->ncalls, n);
}

/* The ranks of a case: each its uneven block and shard (its communicator comes with the run),
 * the case's params, fresh poisoned outputs. */
static void vp_jobs_init(vp_job *jobs, int size, const vp_case *c, const vp_data *d) {
    memset(jobs, 0, (size_t)size * sizeof *jobs);
    for (int r = 0; r < size; r++) {
        vp_job *j = &jobs[r];
        j->c = c, j->d = d, j->dp = c->dp, j->tp = c->tp;
        vp_block(c->v, r, size, &j->lo, &j->n);
        j->shard = (kdloss_vocab_shard){NULL, c->v, j->lo};
        vp_out_alloc(&j->o, c, j->n);
    }
}

/* One case with `size` ranks: the whole call, the ranks, the comparisons. */
static void test_vp_case(kt_rng *rng, const vp_case *c, int size) {
    char tag[160];
    snprintf(tag, sizeof tag, "vp %s ranks=%d", c->tag, size);
    vp_data d;
    vp_data_make(rng, c, &d);
    vp_out whole;
    vp_out_alloc(&whole, c, c->v);
    kdloss_status s = vp_whole(c, &d, &whole);
    KT_CHECK(s == KDLOSS_OK, "%s: whole call %s", tag, kdloss_status_string(s));
    vp_out_fetch(&whole, c, c->v);
    vp_job jobs[VP_MAX_RANKS];
    vp_rank ranks[VP_MAX_RANKS];
    vp_world w;
    vp_jobs_init(jobs, size, c, &d);
    vp_run_ranks(jobs, size, &w, ranks, NULL);
    for (int r = 0; r < size; r++) {
        vp_job *j = &jobs[r];
        char rt[190];
        snprintf(rt, sizeof rt, "%s rank %d", tag, r);
        KT_CHECK(j->status == KDLOSS_OK && j->word == KDLOSS_OK, "%s: %s, status word %d", rt,
                 kdloss_status_string(j->status), (int)j->word);
        if (j->status == KDLOSS_OK && s == KDLOSS_OK) {
            vp_out_fetch(&j->o, c, j->n);
            vp_compare(rt, c, &j->o, &whole, j->lo, j->n);
        }
        vp_out_free(&j->o);
    }
    vp_check_protocol(tag, c, &w);
    vp_out_free(&whole);
    vp_data_free(&d);
}

/* 1 if the device bytes are still the 0xFF poison. */
static int vp_untouched(const void *d, size_t n) {
    unsigned char *h = xmalloc(n);
    d2h(h, d, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= h[i] == 0xFF;
    free(h);
    return ok;
}

/* The agreement (vp.h; tests/test_vp_agree.c has the CPU's full set): a bad temperature on the
 * last rank gives it INVALID_PARAM and the others PEER; blocks that leave a gap give every rank
 * SHAPE_MISMATCH; a workspace one byte short on the last rank gives it WORKSPACE_TOO_SMALL and
 * the others PEER; the last rank
 * with another (valid) temperature: INVALID_PARAM on every rank; the last rank without dxs:
 * SHAPE_MISMATCH on every rank; the agreed chunk tampered by the communicator on every rank to
 * 1e6, 0 or NaN: KDLOSS_ERR_COMM on every rank. Every rank makes both of the agreement's
 * collectives and no other, and nothing is written anywhere. Dense teacher, or (topk) the sparse
 * one (bucket, CE, K 6). */
static void test_vp_agreement(kt_rng *rng, int size, int topk) {
    enum { K_BAD_T, K_GAP, K_SHORT_WS, K_OTHER_T, K_NO_DXS, K_CHUNK_1E6, K_CHUNK_0, K_CHUNK_NAN, K_N };
    static const char *kinds[K_N] = {"bad temperature", "gap", "short workspace",
                                     "another temperature", "no dxs", "chunk tampered to 1e6",
                                     "chunk tampered to 0", "chunk tampered to NaN"};
    vp_case c;
    memset(&c, 0, sizeof c);
    c.tag = "agreement";
    c.bt = 8, c.hs = 16, c.ht = 16, c.v = 97, c.dt = KDLOSS_F32, c.bias = 1;
    kdloss_fused_linear_distill_params_default(&c.dp);
    kdloss_fused_linear_topk_distill_params_default(&c.tp);
    if (topk) {
        c.topk = 1, c.k = 6, c.labels = 1;
        c.tp.weight_hard_loss = 0.5;
    }
    const char *teacher = topk ? "topk" : "dense";
    vp_data d;
    vp_data_make(rng, &c, &d);
    for (int kind = 0; kind < K_N; kind++) {
        vp_job jobs[VP_MAX_RANKS];
        vp_rank ranks[VP_MAX_RANKS];
        vp_world w;
        vp_tamper tp = {0, 0, -1, 0, 0.0};
        if (kind >= K_CHUNK_1E6) { /* the agreement's -chunk slot, on every rank */
            const double val = kind == K_CHUNK_1E6 ? 1e6 : kind == K_CHUNK_0 ? 0.0 : NAN;
            tp = (vp_tamper){1, 0, -1, 2 * (int64_t)size + KD_VP_AG_NEG_CHUNK, -val};
        }
        vp_jobs_init(jobs, size, &c, &d);
        for (int r = 0; r < size; r++) {
            vp_job *j = &jobs[r];
            const int last = r == size - 1;
            if (kind == K_BAD_T && last) j->dp.temperature = j->tp.temperature = -1.0;
            if (kind == K_GAP && r > 0) j->shard.v_begin++, j->n--; /* a gap before each block */
            j->ws_short = kind == K_SHORT_WS && last;
            if (kind == K_OTHER_T && last) j->dp.temperature = j->tp.temperature = 1.5;
            j->no_dxs = kind == K_NO_DXS && last;
        }
        vp_run_ranks(jobs, size, &w, ranks, &tp);
        for (int r = 0; r < size; r++) {
            vp_job *j = &jobs[r];
            kdloss_status want;
            switch (kind) {
            case K_BAD_T: want = r == size - 1 ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_PEER; break;
            case K_SHORT_WS:
                want = r == size - 1 ? KDLOSS_ERR_WORKSPACE_TOO_SMALL : KDLOSS_ERR_PEER;
                break;
            case K_GAP: want = size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK; break;
            case K_OTHER_T: want = size > 1 ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_OK; break;
            case K_NO_DXS: want = size > 1 ? KDLOSS_ERR_SHAPE_MISMATCH : KDLOSS_OK; break;
            default: want = KDLOSS_ERR_COMM; break;
            }
            KT_CHECK(j->status == want, "vp agreement %s %s ranks=%d rank %d: got %d want %d",
                     teacher, kinds[kind], size, r, (int)j->status, (int)want);
            if (want != KDLOSS_OK)
                KT_CHECK(vp_untouched(j->o.d_sc, 3 * sizeof(float)) &&
                             vp_untouched(j->o.d_rows, (size_t)(3 * c.bt) * sizeof(float)) &&
                             vp_untouched(j->o.d_dxs, (size_t)(c.bt * c.hs) * 4) &&
                             vp_untouched(j->o.d_dws, (size_t)(j->n * c.hs) * 4) &&
                             vp_untouched(j->o.d_dbs, (size_t)j->n * 4),
                         "vp agreement %s %s ranks=%d rank %d: nothing written", teacher,
                         kinds[kind], size, r);
            KT_CHECK(ranks[r].ncalls == 2, "vp agreement %s %s ranks=%d rank %d: %d collectives, "
                     "want the agreement's 2", teacher, kinds[kind], size, r, ranks[r].ncalls);
            vp_out_free(&j->o);
        }
        KT_CHECK(w.ncalls == 2, "vp agreement %s %s ranks=%d: the agreement's two collectives, "
                 "got %d", teacher, kinds[kind], size, w.ncalls);
    }
    vp_data_free(&d);
}

static void test_vp(kt_rng *rng) {
    vp_case c[6];
    memset(c, 0, sizeof c);
    c[0].tag = "dense jsd bias chunk 8";
    c[0].bt = 37, c[0].hs = 24, c[0].ht = 20, c[0].v = 301, c[0].dt = KDLOSS_F32, c[0].bias = 1;
    kdloss_fused_linear_distill_params_default(&c[0].dp); /* JSD 0.5, w 0.5 / 0.5 */
    c[0].dp.chunk_size = 8; /* five chunks, the last short */
    c[1] = c[0];
    c[1].tag = "dense fwd T2 t2 bf16 auto chunk";
    c[1].bt = 21, c[1].hs = 32, c[1].ht = 16, c[1].v = 250, c[1].dt = KDLOSS_BF16, c[1].bias = 0;
    c[1].dp.div.divergence = KDLOSS_DIV_FORWARD_KL;
    c[1].dp.temperature = 2.0;
    c[1].dp.t2_scale = 1;
    c[1].dp.chunk_size = 0;
    for (int tail = 0; tail < 3; tail++) {
        vp_case *t = &c[2 + tail];
        t->topk = 1;
        t->bt = 29, t->hs = 24, t->v = 307, t->k = 9, t->dt = KDLOSS_F32, t->bias = 1;
        kdloss_fused_linear_topk_distill_params_default(&t->tp);
        t->tp.tail = (kdloss_topk_tail)tail;
        t->tp.div.divergence = tail == 2 ? KDLOSS_DIV_FORWARD_KL : KDLOSS_DIV_JSD;
        t->tp.chunk_size = 7;
        /* bucket with CE and T 1.5; renorm_both soft only, no labels; renorm_teacher with CE */
        t->labels = tail != 1;
        t->tp.weight_hard_loss = tail != 1 ? 0.5 : 0.0;
        t->tp.temperature = tail == 0 ? 1.5 : 1.0;
    }
    c[2].tag = "topk bucket CE T1.5 chunk 7";
    c[3].tag = "topk renorm_both no labels chunk 7";
    c[4].tag = "topk renorm_teacher CE chunk 7";
    c[5] = c[2];
    c[5].tag = "topk bucket K=V tvd";
    c[5].bt = 16, c[5].hs = 32, c[5].v = 64, c[5].k = 64, c[5].tp.chunk_size = 0;
    c[5].tp.div.divergence = KDLOSS_DIV_TVD;
    const int fails = kt_failures;
    for (int size = 2; size <= VP_MAX_RANKS; size++) {
        for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) test_vp_case(rng, &c[i], size);
        test_vp_agreement(rng, size, 0);
        test_vp_agreement(rng, size, 1);
    }
    printf("vp: %d cases x 2..%d ranks as threads, and the agreement: %d failures\n",
           (int)(sizeof c / sizeof c[0]), VP_MAX_RANKS, kt_failures - fails);
}

#ifdef KDLOSS_TEST_NCCL
/* The NCCL adapter (include/kdloss_nccl.h) with one rank on one device: ncclAllReduce on g_st,
 * the vocabulary-parallel call on the whole heads against the single-process one. */
static void test_vp_nccl(kt_rng *rng) {
    ncclComm_t nc;
    int dev = 0;
    ncclResult_t nr = ncclCommInitAll(&nc, 1, &dev);
    if (!KT_CHECK(nr == ncclSuccess, "vp nccl: ncclCommInitAll: %s", ncclGetErrorString(nr)))
        return;
    kdloss_nccl_comm nccl;
    kdloss_status s = kdloss_comm_from_nccl(nc, g_st, &nccl);
    KT_CHECK(s == KDLOSS_OK && nccl.comm.rank == 0 && nccl.comm.size == 1, "vp nccl: comm");
    vp_case c;
    memset(&c, 0, sizeof c);
    c.tag = "nccl one rank dense jsd chunk 8";
    c.bt = 37, c.hs = 24, c.ht = 20, c.v = 301, c.dt = KDLOSS_F32, c.bias = 1;
    kdloss_fused_linear_distill_params_default(&c.dp);
    c.dp.chunk_size = 8;
    vp_data d;
    vp_data_make(rng, &c, &d);
    vp_out whole;
    vp_out_alloc(&whole, &c, c.v);
    KT_CHECK(vp_whole(&c, &d, &whole) == KDLOSS_OK, "vp nccl: whole call");
    vp_out_fetch(&whole, &c, c.v);
    vp_job j;
    memset(&j, 0, sizeof j);
    j.c = &c, j.d = &d, j.dp = c.dp, j.lo = 0, j.n = c.v, j.st = g_st, j.ctx = g_ctx;
    j.shard = (kdloss_vocab_shard){&nccl.comm, c.v, 0};
    vp_out_alloc(&j.o, &c, c.v);
    vp_job_run(&j);
    KT_CHECK(j.status == KDLOSS_OK && j.word == KDLOSS_OK, "vp nccl: %s",
             kdloss_status_string(j.status));
    if (j.status == KDLOSS_OK) {
        vp_out_fetch(&j.o, &c, c.v);
        vp_compare("vp nccl", &c, &j.o, &whole, 0, c.v);
    }
    vp_out_free(&j.o);
    vp_out_free(&whole);
    vp_data_free(&d);
    ncclCommDestroy(nc);
    printf("vp: the NCCL adapter with one rank ran\n");
}
#endif

/* ------------------------------------------------------------------------------------------ */
/* The divergence family on logits (kdloss_cuda_distill_logits)                                */
/* ------------------------------------------------------------------------------------------ */

/* A case: bt x v logits (tk_gen_logits's rows), divergence KT_DIV_CASES[div], temperature T,
 * tk_make_labels's label kinds, pad extra columns on every ld, misaligned (one element past a
 * 16-byte boundary: the scalar path), the gradient in place over the student. */
typedef struct dl_case {
    int64_t bt, v;
    kdloss_dtype ds, dt; /* student (and gradient), teacher */
    int div;
    double T;
    int labels;
    int64_t pad;
    int misalign, in_place;
} dl_case;

/* The float64 reference from the formulas (docs/MATH.md 7.4), not from the kernels' forms: per
 * row X = log_softmax(zs / T), Y = log_softmax(zt / T) (log-sum-exp in double), ref_div_elem,
 * dz = (g - Q sum g) / T times gs / max(1, n_valid). Writes grad (bt x v), row [bt] (0 when
 * ignored, NaN for a bad label), slack (bt x v), what the fp32 chain rule may add to the
 * elementwise tolerance through S = sum g: its summation (64 u times the row's term magnitudes
 * |g| + (P + Q)(2 + |x| + |y| + lw), test_distill_logits's bound: the CPU's scalar path sums S
 * sequentially over the row) reaches element j as Q_j dS; and TVD's subgradient may take either
 * sign where P and Q agree to fp32 rounding (tvd_tie), which moves that element by up to Q_k and
 * S by Q_k. Returns the loss (NaN with a bad label); *abs_tot the counted rows' error scales,
 * *nvd max(1, n_valid). */
static double dl_ref(const dl_case *c, const kdloss_div_params *d, const double *zs,
                     const double *zt, const int64_t *lab, double gs, double *grad, double *row,
                     double *slack, double *abs_tot, double *nvd) {
    const int64_t bt = c->bt, v = c->v;
    int64_t nv = 0;
    int bad = 0;
    for (int64_t r = 0; r < bt; r++) {
        const int kind = c->labels ? (lab[r] == -100 ? 1 : lab[r] >= 0 && lab[r] < v ? 0 : 2) : 0;
        nv += kind == 0, bad |= kind == 2;
        row[r] = kind == 2 ? NAN : 0.0;
    }
    *nvd = nv > 0 ? (double)nv : 1.0;
    const double scale = gs / (c->T * *nvd), lw = mix_log_weights(d);
    double tot = 0.0, *g = xmalloc((size_t)v * 8), *x = xmalloc((size_t)v * 8);
    *abs_tot = 0.0;
    for (int64_t r = 0; r < bt; r++) {
        const double *s = zs + r * v, *t = zt + r * v;
        double *gr = grad + r * v, *sl = slack + r * v;
        for (int64_t k = 0; k < v; k++) gr[k] = sl[k] = 0.0;
        if (c->labels && lab[r] == -100) continue;
        if (c->labels && (lab[r] < 0 || lab[r] >= v)) continue;
        const double ls = logsumexp(s, v, 1.0 / c->T), lt = logsumexp(t, v, 1.0 / c->T);
        double loss = 0.0, sum_g = 0.0, dsum = 0.0;
        for (int64_t k = 0; k < v; k++) {
            double mag;
            const double y = t[k] / c->T - lt;
            x[k] = s[k] / c->T - ls;
            const double l = ref_div_elem(d, x[k], y, &g[k], &mag);
            loss += l;
            sum_g += g[k];
            *abs_tot += fabs(l) > mag ? fabs(l) : mag;
            dsum += 64 * 0x1p-24 * (fabs(g[k]) + ref_wmul(exp(x[k]) + exp(y),
                                                          2 + fabs(x[k]) + fabs(y) + lw));
            if (tvd_tie(d, x[k], y)) sl[k] = exp(x[k]), dsum += exp(x[k]);
        }
        for (int64_t k = 0; k < v; k++) {
            gr[k] = (g[k] - exp(x[k]) * sum_g) * scale;
            sl[k] = (sl[k] + exp(x[k]) * dsum) * scale;
        }
        row[r] = loss;
        tot += loss;
    }
    free(g);
    free(x);
    return bad ? NAN : tot / *nvd;
}

typedef struct dl_call {
    const kdloss_distill_logits_params *p;
    int64_t bt, v;
    kdloss_cmat s, t;
    kdloss_labels L;
    float *loss, *row;
    kdloss_mat g;
    void *ws;
    size_t wsb;
} dl_call;

static kdloss_status dl_call_run(void *arg) {
    const dl_call *a = arg;
    return kdloss_cuda_distill_logits(g_ctx, g_st, a->p, a->bt, a->v, a->s, a->t, a->L, a->loss,
                                      a->row, a->g, a->ws, a->wsb);
}

/* Without the gradient: the same loss and row losses, bitwise (the loss pass does not depend on
 * whether a gradient is wanted). */
static void dl_forward_only(const char *tag, dl_call a) {
    const int64_t bt = a.bt;
    float l1, l2, *r1 = xmalloc((size_t)bt * 4), *r2 = xmalloc((size_t)bt * 4);
    d2h(&l1, a.loss, 4);
    d2h(r1, a.row, (size_t)bt * 4);
    dpoison(a.loss, 4);
    dpoison(a.row, (size_t)bt * 4);
    a.g.data = NULL;
    KT_CHECK(dl_call_run(&a) == KDLOSS_OK, "%s: forward-only call", tag);
    CK(cudaStreamSynchronize(g_st));
    d2h(&l2, a.loss, 4);
    d2h(r2, a.row, (size_t)bt * 4);
    KT_CHECK(!memcmp(&l1, &l2, 4) && !memcmp(r1, r2, (size_t)bt * 4),
             "%s: losses without the gradient differ", tag);
    free(r1);
    free(r2);
}

/* kdloss_distill_logits on the host copies (a case without bad labels), when linked. */
static void dl_vs_cpu(const dl_case *c, const char *tag, const kdloss_distill_logits_params *p,
                      const void *hx, const void *hy, kdloss_labels hL, const void *dg,
                      const float *dloss, const double *slack, double abs_tot, double nvd) {
    const int64_t bt = c->bt, v = c->v, ld = v + c->pad, n = bt * v;
    const size_t es = kdloss_dtype_size(c->ds);
    void *cg = xmalloc((size_t)(bt * ld) * es), *hg = xmalloc((size_t)(bt * ld) * es);
    float cl = 0, hl = 0, *crow = xmalloc((size_t)bt * 4);
    kdloss_cmat cs = {hx, c->ds, ld}, ct = {hy, c->dt, ld};
    kdloss_mat cgm = {cg, c->ds, ld};
    kdloss_status s = kdloss_distill_logits(p, bt, v, cs, ct, hL, &cl, crow, cgm);
    if (KT_CHECK(s == KDLOSS_OK, "%s: CPU status %d", tag, (int)s)) {
        d2h(hg, dg, (size_t)(bt * ld) * es);
        d2h(&hl, dloss, 4);
        double *gg = to_double(hg, c->ds, bt, v, ld), *cgg = to_double(cg, c->ds, bt, v, ld);
        for (int64_t i = 0; i < n; i++) /* either side of a TVD tie */
            if (fabs(gg[i] - cgg[i]) <= 2 * slack[i]) gg[i] = cgg[i];
        char what[300];
        snprintf(what, sizeof what, "%s grad vs CPU", tag);
        cmp_arr(what, gg, cgg, n, 1e-5 * max_abs(cgg, n) + kt_tiny(c->ds), 2 * unit(c->ds) + 1e-5);
        kt_close(hl, cl, 1e-5 * abs_tot / nvd + 1e-30, 1e-4, "%s loss vs CPU", tag);
        free(gg);
        free(cgg);
    }
    free(cg);
    free(hg);
    free(crow);
}

static void test_dl_case(kt_rng *rng, const dl_case *c) {
    const kdloss_div_params d = KT_DIV_CASES[c->div];
    char tag[240];
    snprintf(tag, sizeof tag,
             "dlogits %s beta=%g alpha=%g bt=%lld v=%lld s=%s t=%s T=%g labels=%d pad=%lld "
             "mis=%d ip=%d",
             kdloss_divergence_name(d.divergence), d.beta, d.alpha, (long long)c->bt,
             (long long)c->v, kt_dtype_name(c->ds), kt_dtype_name(c->dt), c->T, c->labels,
             (long long)c->pad, c->misalign, c->in_place);
    const int64_t bt = c->bt, v = c->v, ld = v + c->pad, n = bt * v;
    const size_t es = kdloss_dtype_size(c->ds), et = kdloss_dtype_size(c->dt);
    double *zs = tk_gen_logits(rng, bt, v, c->ds), *zt = tk_gen_logits(rng, bt, v, c->dt);
    int64_t *lab = xmalloc((size_t)bt * 8);
    void *hlab;
    kdloss_labels L = tk_make_labels(rng, c->labels, bt, v, lab, &hlab);
    void *hx = kt_pack(zs, bt, v, ld, c->ds), *hy = kt_pack(zt, bt, v, ld, c->dt);
    const size_t off_s = c->misalign ? es : 0, off_t = c->misalign ? et : 0;
    char *dx0 = dalloc((size_t)(bt * ld) * es + 16), *dy0 = dalloc((size_t)(bt * ld) * et + 16);
    char *dg0 = c->in_place ? NULL : dalloc((size_t)(bt * ld) * es + 16);
    void *dx = dx0 + off_s, *dy = dy0 + off_t, *dg = c->in_place ? dx : dg0 + off_s;
    h2d(dx, hx, (size_t)(bt * ld) * es);
    h2d(dy, hy, (size_t)(bt * ld) * et);
    if (!c->in_place) dpoison(dg, (size_t)(bt * ld) * es);
    float *dloss = dalloc(4), *drow = dalloc((size_t)bt * 4);
    dpoison(dloss, 4);
    dpoison(drow, (size_t)bt * 4);
    size_t wsb = 0;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(bt, v, &wsb) == KDLOSS_OK, "%s: ws size",
             tag);
    void *dws = dalloc(wsb);
    kdloss_distill_logits_params p;
    kdloss_distill_logits_params_default(&p);
    p.div = d;
    p.temperature = c->T;
    p.grad_scale = 1.25;
    dl_call a = {&p, bt, v, {dx, c->ds, ld}, {dy, c->dt, ld}, L, dloss, drow, {dg, c->ds, ld},
                 dws, wsb};
    kdloss_status s = dl_call_run(&a);
    CK(cudaStreamSynchronize(g_st));
    if (KT_CHECK(s == KDLOSS_OK, "%s: status %d", tag, (int)s)) {
        double *rg = xmalloc((size_t)n * 8), *sl = xmalloc((size_t)n * 8);
        double *rrow = xmalloc((size_t)bt * 8), abs_tot, nvd;
        const double want = dl_ref(c, &d, zs, zt, lab, 1.25, rg, rrow, sl, &abs_tot, &nvd);
        const int bad_label = isnan(want);
        const tk_case tc = {bt, v, 0, c->ds, c->dt, KDLOSS_I64, c->div, 0, c->T, c->labels,
                            0, c->pad, c->misalign, c->in_place};
        logits_check(&tc, tag, &d, dg, dloss, drow, dws,
                     bad_label ? KDLOSS_ERR_LABEL_OUT_OF_RANGE : KDLOSS_OK, rg, sl, rrow, want,
                     abs_tot, nvd, dl_call_run, &a);
        if (!c->in_place) { /* inputs are never written; the losses without the gradient */
            void *h2 = xmalloc((size_t)(bt * ld) * (es > et ? es : et));
            d2h(h2, dx, (size_t)(bt * ld) * es);
            KT_CHECK(!memcmp(hx, h2, (size_t)(bt * ld) * es), "%s: student logits written", tag);
            d2h(h2, dy, (size_t)(bt * ld) * et);
            KT_CHECK(!memcmp(hy, h2, (size_t)(bt * ld) * et), "%s: teacher logits written", tag);
            free(h2);
            dl_forward_only(tag, a);
        }
        if (kdloss_distill_logits && !bad_label && !c->misalign && !c->in_place) {
            kdloss_labels hL = {hlab, L.dtype};
            dl_vs_cpu(c, tag, &p, hx, hy, hL, dg, dloss, sl, abs_tot, nvd);
        }
        free(rg);
        free(sl);
        free(rrow);
    }
    CK(cudaFree(dx0));
    CK(cudaFree(dy0));
    if (dg0) CK(cudaFree(dg0));
    if (L.data) CK(cudaFree((void *)L.data));
    CK(cudaFree(dloss));
    CK(cudaFree(drow));
    CK(cudaFree(dws));
    free(zs), free(zt), free(lab), free(hx), free(hy), free(hlab);
}

static void test_distill_logits(kt_rng *rng) {
    const kdloss_dtype dts[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
    const int64_t vs[] = {1, 37, 4099, 9001};
    const double temps[] = {1.0, 2.0, 0.7};
    int n = 0;
    /* every divergence case x 3 (student, teacher) dtype pairs x T x labels none / some ignored
     * (I64, I32) / all ignored */
    for (int i = 0; i < NDIV; i++)
        for (int j = 0; j < 3; j++, n++) {
            if (kt_quick() && n % 5) continue;
            /* n covers every (V, labels) pair in 16 steps, every (V, T) pair in 12 */
            const dl_case c = {13, vs[n % 4], dts[j], dts[(j + i) % 3], i, temps[n % 3],
                               (n / 4) % 4, 0, 0, 0};
            test_dl_case(rng, &c);
        }
    for (int i = 0; i < NDIV; i++) { /* a bad label; padding + misaligned; in place (padded) */
        const dl_case bad = {8, 300, KDLOSS_BF16, KDLOSS_F32, i, temps[i % 3], 4, 0, 0, 0};
        test_dl_case(rng, &bad);
        if (kt_quick() && i % 3) continue;
        const dl_case mis = {7, 4099, dts[i % 3], dts[(i + 1) % 3], i, temps[(i + 1) % 3], 2,
                             5, 1, 0};
        const dl_case ip = {9, 513, dts[(i + 2) % 3], KDLOSS_F32, i, temps[(i + 2) % 3], 1,
                            i % 2 ? 8 : 0, 0, 1};
        test_dl_case(rng, &mis);
        test_dl_case(rng, &ip);
    }
    /* a long row (several tiles of every thread), in place too */
    const dl_case big = {3, 100000, KDLOSS_BF16, KDLOSS_BF16, 4, 0.7, 1, 0, 0, 0};
    const dl_case big_ip = {3, 100000, KDLOSS_F32, KDLOSS_F16, 14, 2.0, 0, 3, 0, 1};
    test_dl_case(rng, &big);
    test_dl_case(rng, &big_ip);
}

/* ------------------------------------------------------------------------------------------ */
/* Argument checks: same codes as the CPU, nothing written                                    */
/* ------------------------------------------------------------------------------------------ */

/* All operands of the error cases live at fixed offsets in one arena: device memory with a GPU,
 * host memory without (the checks return before anything touches it). The CPU twin of each
 * case uses a host arena with the same layout, so the aliasing cases mean the same thing. */
#define AR_BYTES ((size_t)48 << 20)
#define AR_IN 0
#define AR_T 4096
#define AR_G 8192
#define AR_E 12288
#define AR_LOSS 16384
#define AR_ROW 16448
#define AR_LAB 16640
#define AR_W1 32768 /* fused-linear weights */
#define AR_W2 65536
#define AR_WS (1u << 20) /* workspace: up to the end of the arena */

static char *g_ar;  /* the CUDA calls' arena */
static char *g_har; /* the CPU calls' arena */
static kdloss_cuda_context *g_actx;

static void expect_code(const char *what, kdloss_status got, kdloss_status want, int have_cpu,
                        kdloss_status cpu) {
    KT_CHECK(got == want, "%s: CUDA returned %d, expected %d", what, (int)got, (int)want);
    if (have_cpu)
        KT_CHECK(cpu == got, "%s: CPU returned %d, CUDA %d", what, (int)cpu, (int)got);
}

static int arena_untouched(void) {
    if (!g_gpu) return 1;
    unsigned char buf[AR_ROW + 64 - AR_G];
    d2h(buf, g_ar + AR_G, sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != 0xFF) return 0;
    return 1;
}

typedef struct kl_call {
    int null_params, null_ctx;
    kdloss_kl_params p;
    int64_t bt, v;
    kdloss_dtype di, dt, dg, de;
    int64_t ld_in, ld_t, ld_g, ld_e;
    size_t in_off, t_off, g_off, e_off;
    int loss, row, elem, grad;
    size_t ws_bytes;
    int ws_null, ws_off;
} kl_call;

static kdloss_status run_kl(const kl_call *c, int cpu) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat in = {ar + c->in_off, c->di, c->ld_in}, t = {ar + c->t_off, c->dt, c->ld_t};
    kdloss_mat e = {c->elem ? ar + c->e_off : NULL, c->de, c->ld_e};
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, c->ld_g};
    float *loss = c->loss ? (float *)(ar + AR_LOSS) : NULL, *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    const kdloss_kl_params *p = c->null_params ? NULL : &c->p;
    if (cpu) return kdloss_kl_div(p, c->bt, c->v, in, t, loss, row, e, g);
    return kdloss_cuda_kl_div(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->v, in, t, loss, row,
                              e, g, c->ws_null ? NULL : ar + AR_WS + c->ws_off, c->ws_bytes);
}

static void kl_err(const char *what, const kl_call *c, kdloss_status want, int cpu_too) {
    if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
    kdloss_status got = run_kl(c, 0);
    int have_cpu = cpu_too && kdloss_kl_div != NULL;
    expect_code(what, got, want, have_cpu, have_cpu ? run_kl(c, 1) : KDLOSS_OK);
    KT_CHECK(arena_untouched(), "%s: an output was written on error", what);
}

static void test_errors_kl(void) {
    kl_call b;
    memset(&b, 0, sizeof b);
    b.p.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    b.p.eps = 1e-10;
    b.p.grad_scale = 1.0;
    b.bt = 4;
    b.v = 8;
    b.di = b.dt = b.dg = b.de = KDLOSS_F32;
    b.in_off = AR_IN;
    b.t_off = AR_T;
    b.g_off = AR_G;
    b.e_off = AR_E;
    b.loss = b.row = b.grad = 1;
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "kl ws size");
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(0, 8, &b.ws_bytes) == KDLOSS_ERR_INVALID_SIZE,
             "kl ws size bt=0");
    KT_CHECK(kdloss_cuda_kl_div_workspace_size(4, 8, NULL) == KDLOSS_ERR_NULL_POINTER,
             "kl ws size NULL");
    kl_call c;
    c = b; c.null_params = 1; kl_err("kl NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; kl_err("kl NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.reduction = (kdloss_reduction)9; kl_err("kl bad reduction", &c, KDLOSS_ERR_INVALID_REDUCTION, 1);
    c = b; c.p.eps = -1; kl_err("kl eps < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = INFINITY; kl_err("kl grad_scale inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = 0; kl_err("kl bt 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = -3; kl_err("kl v < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.di = KDLOSS_I32; kl_err("kl int input", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dt = (kdloss_dtype)77; kl_err("kl unknown target dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_t = 5; kl_err("kl ld < v", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.loss = c.row = c.grad = 0; kl_err("kl no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.dg = KDLOSS_BF16; kl_err("kl grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.elem = 1; kl_err("kl elem with batchmean", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.reduction = KDLOSS_REDUCTION_NONE; kl_err("kl loss with none", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.log_target = 2; kl_err("kl log_target 2", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.eps = INFINITY; kl_err("kl eps inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = 0; c.p.reduction = (kdloss_reduction)9; kl_err("kl bt 0 and bad reduction", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.loss = c.row = c.grad = 0; c.ld_t = 5; kl_err("kl no output and bad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.p.reduction = KDLOSS_REDUCTION_NONE; c.loss = 0; c.elem = 1; c.de = KDLOSS_BF16;
    kl_err("kl elem not fp32", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.g_off = AR_T + 16; kl_err("kl grad overlaps target", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN + 4; kl_err("kl grad overlaps input, shifted", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN; c.ld_g = 9; c.ld_in = 8; kl_err("kl in place, other ld", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_null = 1; kl_err("kl NULL workspace", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.ws_bytes -= 1; kl_err("kl workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_off = 4; c.ws_bytes += 64; kl_err("kl workspace misaligned", &c, KDLOSS_ERR_INVALID_PARAM, 0);
    c = b; c.in_off = AR_WS + 64; kl_err("kl workspace overlaps input", &c, KDLOSS_ERR_ALIASING, 0);
}

typedef struct jsd_call {
    int null_params, null_ctx;
    kdloss_jsd_params p;
    int64_t bt, v;
    kdloss_dtype ds, dt, dg, dl;
    int64_t ld_g;
    size_t g_off;
    int labels, loss, row, grad;
    size_t ws_bytes;
    int distill;          /* 1: kdloss_cuda_distill / kdloss_distill with divergence d;
                             2: kdloss_cuda_distill_logits / kdloss_distill_logits, with T */
    kdloss_div_params d;  /* (p.beta unused then) */
    double temperature;   /* distill 2 */
    int ld_s, ws_null, ws_off;
    size_t s_off, lab_off, loss_off; /* the student, labels and loss moved by that many bytes */
} jsd_call;

static kdloss_status run_distill_logits(const jsd_call *c, int cpu, kdloss_cmat s, kdloss_cmat t,
                                        kdloss_labels L, float *loss, float *row, kdloss_mat g) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_distill_logits_params pl = {c->d, c->temperature, c->p.ignore_index, c->p.grad_scale};
    const kdloss_distill_logits_params *pp = c->null_params ? NULL : &pl;
    if (cpu) return kdloss_distill_logits(pp, c->bt, c->v, s, t, L, loss, row, g);
    return kdloss_cuda_distill_logits(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt, c->v, s, t,
                                      L, loss, row, g, c->ws_null ? NULL : ar + AR_WS + c->ws_off,
                                      c->ws_bytes);
}

static kdloss_status run_jsd(const jsd_call *c, int cpu) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat s = {ar + AR_IN + c->s_off, c->ds, c->ld_s}, t = {ar + AR_T, c->dt, 0};
    kdloss_labels L = {c->labels ? ar + AR_LAB + c->lab_off : NULL, c->dl};
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, c->ld_g};
    float *loss = c->loss ? (float *)(ar + AR_LOSS + c->loss_off) : NULL;
    float *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    const kdloss_jsd_params *p = c->null_params ? NULL : &c->p;
    if (c->distill == 2) return run_distill_logits(c, cpu, s, t, L, loss, row, g);
    if (c->distill) {
        kdloss_distill_params pd = {c->d, c->p.ignore_index, c->p.grad_scale};
        const kdloss_distill_params *pp = c->null_params ? NULL : &pd;
        if (cpu) return kdloss_distill(pp, c->bt, c->v, s, t, L, loss, row, g);
        return kdloss_cuda_distill(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt, c->v, s, t, L,
                                   loss, row, g, ar + AR_WS, c->ws_bytes);
    }
    if (cpu) return kdloss_jsd(p, c->bt, c->v, s, t, L, loss, row, g);
    return kdloss_cuda_jsd(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->v, s, t, L, loss, row,
                           g, ar + AR_WS, c->ws_bytes);
}

static void jsd_err(const char *what, const jsd_call *c, kdloss_status want, int cpu_too) {
    if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
    kdloss_status got = run_jsd(c, 0);
    int have_cpu = cpu_too && (c->distill == 2   ? kdloss_distill_logits != NULL
                               : c->distill ? kdloss_distill != NULL
                                            : kdloss_jsd != NULL);
    expect_code(what, got, want, have_cpu, have_cpu ? run_jsd(c, 1) : KDLOSS_OK);
    KT_CHECK(arena_untouched(), "%s: an output was written on error", what);
}

/* A valid call of the family `distill` (jsd_call's kinds): 4 x 8 fp32, I64 labels, every output;
 * default divergence (beta 0.5 for kdloss_jsd), T 2 on logits. The workspace size is the case's. */
static jsd_call jsd_base(int distill) {
    jsd_call b;
    memset(&b, 0, sizeof b);
    b.distill = distill;
    kdloss_div_params_default(&b.d);
    b.p.beta = 0.5;
    b.temperature = 2.0;
    b.p.ignore_index = -100;
    b.p.grad_scale = 1.0;
    b.bt = 4;
    b.v = 8;
    b.ds = b.dt = b.dg = KDLOSS_F32;
    b.dl = KDLOSS_I64;
    b.g_off = AR_G;
    b.labels = b.loss = b.row = b.grad = 1;
    return b;
}

static void test_errors_jsd(void) {
    jsd_call b = jsd_base(0);
    KT_CHECK(kdloss_cuda_jsd_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "jsd ws size");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("jsd NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("jsd NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.beta = 1.5; jsd_err("jsd beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.beta = NAN; jsd_err("jsd beta NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = -1; jsd_err("jsd bt < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dt = KDLOSS_I64; jsd_err("jsd int teacher", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("jsd float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("jsd no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.dg = KDLOSS_F16; jsd_err("jsd grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_g = 3; jsd_err("jsd grad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.g_off = AR_LAB - 64; jsd_err("jsd grad overlaps labels", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_T; jsd_err("jsd grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes = 16; jsd_err("jsd workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

typedef struct fl_call {
    int null_params, null_ctx, null_out;
    kdloss_fljsd_params p;
    int64_t bt, hs, ht, v;
    kdloss_dtype dxs, dws, dxt, dwt, dl, ddxs;
    int bias_s, want_dbs, labels, loss, dx;
    size_t dx_off, ws_bytes;
    int distill; /* 1: the kdloss_*fused_linear_distill pair with pd (p unused) */
    kdloss_fused_linear_distill_params pd;
    int row_off; /* distill: row_soft at AR_ROW + row_off (with loss) */
} fl_call;

/* operands: xs @AR_IN, xt @AR_T, ws @AR_W1, wt @AR_W2, student bias just before AR_WS */
static kdloss_status run_fl(const fl_call *c, int cpu) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_cmat xs = {ar + AR_IN, c->dxs, 0}, ws = {ar + AR_W1, c->dws, 0};
    kdloss_cmat xt = {ar + AR_T, c->dxt, 0}, wt = {ar + AR_W2, c->dwt, 0};
    kdloss_labels L = {c->labels ? ar + AR_LAB : NULL, c->dl};
    kdloss_fljsd_out o;
    memset(&o, 0, sizeof o);
    o.loss = c->loss ? (float *)(ar + AR_LOSS) : NULL;
    o.dxs = (kdloss_mat){c->dx ? ar + c->dx_off : NULL, c->ddxs, 0};
    o.dbs = c->want_dbs ? ar + AR_ROW : NULL;
    const void *bs = c->bias_s ? ar + AR_WS - 4096 : NULL;
    const kdloss_fljsd_params *p = c->null_params ? NULL : &c->p;
    kdloss_fljsd_out *op = c->null_out ? NULL : &o;
    if (c->distill) {
        kdloss_fused_linear_distill_out od;
        memset(&od, 0, sizeof od);
        od.loss = o.loss;
        od.dxs = o.dxs;
        od.dbs = o.dbs;
        od.row_soft = c->loss ? (float *)(ar + AR_ROW + c->row_off) : NULL;
        const kdloss_fused_linear_distill_params *pp = c->null_params ? NULL : &c->pd;
        kdloss_fused_linear_distill_out *odp = c->null_out ? NULL : &od;
        if (cpu)
            return kdloss_fused_linear_distill(pp, c->bt, c->hs, c->ht, c->v, xs, ws, bs, xt, wt,
                                               NULL, L, odp, NULL, 0);
        return kdloss_cuda_fused_linear_distill(c->null_ctx ? NULL : g_actx, g_st, pp, c->bt,
                                                c->hs, c->ht, c->v, xs, ws, bs, xt, wt, NULL, L,
                                                odp, ar + AR_WS, c->ws_bytes);
    }
    if (cpu)
        return kdloss_fused_linear_jsd(p, c->bt, c->hs, c->ht, c->v, xs, ws, bs, xt, wt, NULL, L,
                                       op, NULL, 0);
    return kdloss_cuda_fused_linear_jsd(c->null_ctx ? NULL : g_actx, g_st, p, c->bt, c->hs, c->ht,
                                        c->v, xs, ws, bs, xt, wt, NULL, L, op, ar + AR_WS,
                                        c->ws_bytes);
}

static void fl_err(const char *what, const fl_call *c, kdloss_status want, int cpu_too) {
    if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
    kdloss_status got = run_fl(c, 0);
    int have_cpu = cpu_too && (c->distill ? kdloss_fused_linear_distill != NULL
                                          : kdloss_fused_linear_jsd != NULL);
    expect_code(what, got, want, have_cpu, have_cpu ? run_fl(c, 1) : KDLOSS_OK);
    KT_CHECK(arena_untouched(), "%s: an output was written on error", what);
}

static void test_errors_fl(void) {
    fl_call b;
    memset(&b, 0, sizeof b);
    b.p.beta = 0.5;
    b.p.temperature = 1.0;
    b.p.weight_hard_loss = 0.5;
    b.p.weight_soft_loss = 0.5;
    b.p.ignore_index = -100;
    b.p.grad_scale = 1.0;
    b.bt = 4;
    b.hs = 8;
    b.ht = 8;
    b.v = 16;
    b.dxs = b.dws = b.dxt = b.dwt = b.ddxs = KDLOSS_BF16;
    b.dl = KDLOSS_I64;
    b.labels = b.loss = b.dx = 1;
    b.dx_off = AR_G;
    size_t need = 0;
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(&b.p, 4, 8, 8, 16, KDLOSS_BF16, 1, &need) == KDLOSS_OK,
             "fld_jsd ws size");
    KT_CHECK(need <= AR_BYTES - AR_WS, "fld_jsd ws fits the arena");
    b.ws_bytes = need;
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(&b.p, 4, 8, 8, 16, KDLOSS_F16, 1, &need) ==
                 KDLOSS_ERR_INVALID_DTYPE, "fld_jsd ws size f16");
    KT_CHECK(kdloss_cuda_fljsd_workspace_size(NULL, 4, 8, 8, 16, KDLOSS_BF16, 1, &need) ==
                 KDLOSS_ERR_NULL_POINTER, "fld_jsd ws size NULL params");
    fl_call c;
    c = b; c.null_params = 1; fl_err("fld_jsd NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_out = 1; fl_err("fld_jsd NULL out", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; fl_err("fld_jsd NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.p.temperature = 0; fl_err("fld_jsd T = 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.beta = -0.1; fl_err("fld_jsd beta < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.weight_hard_loss = -1; fl_err("fld_jsd weight < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.chunk_size = -2; fl_err("fld_jsd chunk < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.ht = 0; fl_err("fld_jsd ht 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dxs = c.dws = c.ddxs = KDLOSS_F16; fl_err("fld_jsd f16 student", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dwt = KDLOSS_F32; fl_err("fld_jsd xt/wt dtypes differ", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.labels = 0; fl_err("fld_jsd no labels", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.dl = KDLOSS_BF16; fl_err("fld_jsd float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.dx = 0; fl_err("fld_jsd no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.want_dbs = 1; fl_err("fld_jsd dbs without bias", &c, KDLOSS_ERR_SHAPE_MISMATCH, 1);
    c = b; c.ddxs = KDLOSS_F32; fl_err("fld_jsd dxs dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dx_off = AR_T; fl_err("fld_jsd dxs on xt", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.dx_off = AR_LOSS - 32; fl_err("fld_jsd dxs overlaps loss", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes -= 256; fl_err("fld_jsd workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_bytes -= 256; c.dx_off = AR_T;
    fl_err("fld_jsd workspace small and dxs on xt", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.dxs = KDLOSS_F16; c.labels = 0; fl_err("fld_jsd f16 xs and no labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
}

/* The divergence-family entry points: the shared checks (tests/test_errors.c has the CPU side). */
static void test_errors_distill(void) {
    jsd_call b = jsd_base(1);
    KT_CHECK(kdloss_cuda_distill_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "distill ws size");
    KT_CHECK(kdloss_cuda_distill_workspace_size(0, 8, &b.ws_bytes) == KDLOSS_ERR_INVALID_SIZE,
             "distill ws size bt=0");
    KT_CHECK(kdloss_cuda_distill_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK, "distill ws size");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("distill NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("distill NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.d.divergence = (kdloss_divergence)6; jsd_err("distill unknown divergence", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = (kdloss_divergence)-1; jsd_err("distill divergence -1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.beta = 1.5; jsd_err("distill beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.alpha = NAN; jsd_err("distill alpha NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = KDLOSS_DIV_TVD; c.d.alpha = -0.5; jsd_err("distill tvd alpha < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = NAN; jsd_err("distill grad_scale NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.bt = -1; jsd_err("distill bt < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("distill float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("distill no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.g_off = AR_T; jsd_err("distill grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes = 16; jsd_err("distill workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);

    fl_call f;
    memset(&f, 0, sizeof f);
    f.distill = 1;
    kdloss_fused_linear_distill_params_default(&f.pd);
    f.bt = 4;
    f.hs = 8;
    f.ht = 8;
    f.v = 16;
    f.dxs = f.dws = f.dxt = f.dwt = f.ddxs = KDLOSS_BF16;
    f.dl = KDLOSS_I64;
    f.labels = f.loss = f.dx = 1;
    f.dx_off = AR_G;
    size_t need = 0;
    KT_CHECK(kdloss_cuda_fused_linear_distill_workspace_size(&f.pd, 4, 8, 8, 16, KDLOSS_BF16, 1,
                                                             &need) == KDLOSS_OK,
             "fldistill ws size");
    KT_CHECK(need <= AR_BYTES - AR_WS, "fldistill ws fits the arena");
    f.ws_bytes = need;
    KT_CHECK(kdloss_cuda_fused_linear_distill_workspace_size(NULL, 4, 8, 8, 16, KDLOSS_BF16, 1,
                                                             &need) == KDLOSS_ERR_NULL_POINTER,
             "fldistill ws size NULL params");
    fl_call e;
    e = f; e.null_params = 1; fl_err("fldistill NULL params", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.null_out = 1; fl_err("fldistill NULL out", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.null_ctx = 1; fl_err("fldistill NULL ctx", &e, KDLOSS_ERR_NULL_POINTER, 0);
    e = f; e.pd.div.divergence = (kdloss_divergence)9; fl_err("fldistill unknown divergence", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.div.alpha = 1.01; fl_err("fldistill alpha > 1", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.div.beta = NAN; fl_err("fldistill beta NaN", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.t2_scale = 2; fl_err("fldistill t2_scale 2", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.temperature = NAN; fl_err("fldistill T NaN", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.pd.weight_soft_loss = -1; fl_err("fldistill weight < 0", &e, KDLOSS_ERR_INVALID_PARAM, 1);
    e = f; e.row_off = 2; fl_err("fldistill row_soft misaligned", &e, KDLOSS_ERR_MISALIGNED, 1);
    e = f; e.dx_off = AR_ROW - 16; fl_err("fldistill dxs overlaps row_soft", &e, KDLOSS_ERR_ALIASING, 1);
    e = f; e.labels = 0; fl_err("fldistill no labels", &e, KDLOSS_ERR_NULL_POINTER, 1);
    e = f; e.ws_bytes -= 256; fl_err("fldistill workspace small", &e, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

/* kdloss_cuda_distill_logits: the CPU's codes in the CPU's order, nothing written. */
static void test_errors_distill_logits(void) {
    jsd_call b = jsd_base(2);
    size_t need = 0;
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, 8, &b.ws_bytes) == KDLOSS_OK &&
                 b.ws_bytes <= AR_BYTES - AR_WS, "dlogits ws size");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(0, 8, &need) == KDLOSS_ERR_INVALID_SIZE,
             "dlogits ws size bt 0");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, -1, &need) == KDLOSS_ERR_INVALID_SIZE,
             "dlogits ws size v < 0");
    KT_CHECK(kdloss_cuda_distill_logits_workspace_size(4, 8, NULL) == KDLOSS_ERR_NULL_POINTER,
             "dlogits ws size NULL");
    jsd_call c;
    c = b; c.null_params = 1; jsd_err("dlogits NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_params = 1; c.bt = 0; jsd_err("dlogits NULL params and bt 0", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; jsd_err("dlogits NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.bt = 0; jsd_err("dlogits bt 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = -1; jsd_err("dlogits v < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.bt = 0; c.temperature = 0; jsd_err("dlogits bt 0 and T 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.temperature = 0; jsd_err("dlogits T 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = -1; jsd_err("dlogits T < 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = NAN; jsd_err("dlogits T NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = INFINITY; jsd_err("dlogits T inf", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 1e-39; jsd_err("dlogits 1/T beyond fp32", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 1e-30; c.p.grad_scale = 1e10;
    jsd_err("dlogits grad_scale / T beyond fp32", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.grad_scale = NAN; jsd_err("dlogits grad_scale NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.divergence = (kdloss_divergence)6; jsd_err("dlogits unknown divergence", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.alpha = NAN; jsd_err("dlogits alpha NaN", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.d.beta = 1.5; jsd_err("dlogits beta > 1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.temperature = 0; c.ds = KDLOSS_I32; jsd_err("dlogits T 0 and int student", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.ds = KDLOSS_I32; jsd_err("dlogits int student", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dt = (kdloss_dtype)77; jsd_err("dlogits unknown teacher dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.s_off = 2; jsd_err("dlogits student misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.ld_s = 5; jsd_err("dlogits student ld < v", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.dg = KDLOSS_BF16; jsd_err("dlogits grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_g = 3; jsd_err("dlogits grad ld", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.dl = KDLOSS_F32; jsd_err("dlogits float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.lab_off = 4; jsd_err("dlogits labels misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.loss = c.row = c.grad = 0; jsd_err("dlogits no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.loss = c.row = c.grad = 0; c.dl = KDLOSS_F32;
    jsd_err("dlogits no output and float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss_off = 2; jsd_err("dlogits loss misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.g_off = AR_T; jsd_err("dlogits grad on teacher", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_LAB - 64; jsd_err("dlogits grad overlaps labels", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_ROW - 64; jsd_err("dlogits grad overlaps the losses", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN; c.ld_g = 9; jsd_err("dlogits in place, other ld", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_IN + 4; jsd_err("dlogits grad over the student, shifted", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_null = 1; jsd_err("dlogits NULL workspace", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.ws_bytes -= 1; jsd_err("dlogits workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
    c = b; c.ws_off = 4; c.ws_bytes += 64; jsd_err("dlogits workspace misaligned", &c, KDLOSS_ERR_INVALID_PARAM, 0);
    c = b; c.s_off = AR_WS + 64; jsd_err("dlogits workspace overlaps the student", &c, KDLOSS_ERR_ALIASING, 0);
    c = b; c.ws_bytes -= 1; c.g_off = AR_T;
    jsd_err("dlogits grad on teacher and workspace small", &c, KDLOSS_ERR_ALIASING, 0);
}

/* The top-k entry points: host-side checks with the CPU's codes, nothing written. Operands:
 * student / xs @AR_IN, ids @AR_T, log-probs @AR_T + 2048, weights @AR_W1, labels @AR_LAB. */
typedef struct tk_err {
    int null_params, null_ctx, null_out, fused;
    kdloss_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params pf;
    int64_t bt, v, k, hs;
    kdloss_dtype ds, dg, dl, did, dlp;
    int64_t ld_ids;
    size_t g_off, id_off;
    int labels, loss, row, grad, hard;
    size_t ws_bytes;
} tk_err;

static kdloss_status run_tk_err(const tk_err *c, int cpu) {
    char *ar = cpu ? g_har : g_ar;
    kdloss_topk_teacher t = {c->k, {ar + c->id_off, c->did, c->ld_ids}, {ar + AR_T + 2048, c->dlp, 0}};
    kdloss_labels L = {c->labels ? ar + AR_LAB : NULL, c->dl};
    float *loss = c->loss ? (float *)(ar + AR_LOSS) : NULL;
    float *row = c->row ? (float *)(ar + AR_ROW) : NULL;
    kdloss_mat g = {c->grad ? ar + c->g_off : NULL, c->dg, 0};
    kdloss_cuda_context *ctx = c->null_ctx ? NULL : g_actx;
    if (!c->fused) {
        const kdloss_topk_distill_params *p = c->null_params ? NULL : &c->p;
        kdloss_cmat s = {ar + AR_IN, c->ds, 0};
        if (cpu) return kdloss_topk_distill_logits(p, c->bt, c->v, s, t, L, loss, row, g);
        return kdloss_cuda_topk_distill_logits(ctx, g_st, p, c->bt, c->v, s, t, L, loss, row, g,
                                               ar + AR_WS, c->ws_bytes);
    }
    const kdloss_fused_linear_topk_distill_params *p = c->null_params ? NULL : &c->pf;
    kdloss_cmat xs = {ar + AR_IN, c->ds, 0}, ws = {ar + AR_W1, c->ds, 0};
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = loss;
    o.hard_loss = c->hard ? (float *)(ar + AR_LOSS + 4) : NULL;
    o.row_soft = row;
    o.dxs = g;
    kdloss_fused_linear_distill_out *op = c->null_out ? NULL : &o;
    if (cpu)
        return kdloss_fused_linear_topk_distill(p, c->bt, c->hs, c->v, xs, ws, NULL, t, L, op,
                                                NULL, 0);
    return kdloss_cuda_fused_linear_topk_distill(ctx, g_st, p, c->bt, c->hs, c->v, xs, ws, NULL,
                                                 t, L, op, ar + AR_WS, c->ws_bytes);
}

static void tk_err_expect(const char *what, const tk_err *c, kdloss_status want, int cpu_too) {
    if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
    kdloss_status got = run_tk_err(c, 0);
    int have_cpu = cpu_too && (c->fused ? kdloss_fused_linear_topk_distill != NULL
                                        : kdloss_topk_distill_logits != NULL);
    expect_code(what, got, want, have_cpu, have_cpu ? run_tk_err(c, 1) : KDLOSS_OK);
    KT_CHECK(arena_untouched(), "%s: an output was written on error", what);
}

static void test_errors_topk(void) {
    /* the ids every case reads: all -1 (unused, valid), so that the CPU's value check of the
     * ids, which the GPU makes on the device, passes and the other checks decide */
    memset(g_har + AR_T, 0xFF, 256);
    if (g_gpu && g_ar != g_har) h2d(g_ar + AR_T, g_har + AR_T, 256);
    tk_err b;
    memset(&b, 0, sizeof b);
    kdloss_div_params_default(&b.p.div);
    b.p.tail = KDLOSS_TAIL_BUCKET;
    b.p.temperature = 1.0;
    b.p.ignore_index = -100;
    b.p.grad_scale = 1.0;
    b.bt = 4, b.v = 8, b.k = 4, b.hs = 8;
    b.ds = b.dg = KDLOSS_F32;
    b.dl = KDLOSS_I64, b.did = KDLOSS_I64, b.dlp = KDLOSS_F32;
    b.g_off = AR_G, b.id_off = AR_T;
    b.labels = b.loss = b.row = b.grad = 1;
    size_t need = 0;
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 4, &b.ws_bytes) == KDLOSS_OK &&
                 b.ws_bytes <= AR_BYTES - AR_WS, "topk ws size");
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 0, &need) == KDLOSS_ERR_INVALID_SIZE,
             "topk ws size k 0");
    KT_CHECK(kdloss_cuda_topk_distill_logits_workspace_size(4, 8, 4, NULL) == KDLOSS_ERR_NULL_POINTER,
             "topk ws size NULL");
    tk_err c;
    c = b; c.null_params = 1; tk_err_expect("topk NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = b; c.null_ctx = 1; tk_err_expect("topk NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = b; c.k = 0; tk_err_expect("topk k 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.v = 0; tk_err_expect("topk v 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = b; c.p.tail = (kdloss_topk_tail)3; tk_err_expect("topk tail 3", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.tail = KDLOSS_TAIL_RENORM_TEACHER; c.p.div.divergence = KDLOSS_DIV_JSD;
    tk_err_expect("topk renorm_teacher jsd", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.temperature = 0; tk_err_expect("topk T 0", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.p.div.beta = 2; tk_err_expect("topk beta 2", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = b; c.did = KDLOSS_F32; tk_err_expect("topk float ids", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dlp = KDLOSS_I32; tk_err_expect("topk int log-probs", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.ld_ids = 3; tk_err_expect("topk ids ld < k", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = b; c.id_off = AR_T + 4; tk_err_expect("topk ids misaligned", &c, KDLOSS_ERR_MISALIGNED, 1);
    c = b; c.dg = KDLOSS_BF16; tk_err_expect("topk grad dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.dl = KDLOSS_F32; tk_err_expect("topk float labels", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = b; c.loss = c.row = c.grad = 0; tk_err_expect("topk no output", &c, KDLOSS_ERR_NO_OUTPUT, 1);
    c = b; c.g_off = AR_T; tk_err_expect("topk grad on ids", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.g_off = AR_T + 2048 - 64; tk_err_expect("topk grad over log-probs", &c, KDLOSS_ERR_ALIASING, 1);
    c = b; c.ws_bytes -= 256; tk_err_expect("topk workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);

    tk_err f = b;
    f.fused = 1;
    memset(&f.pf, 0, sizeof f.pf);
    kdloss_div_params_default(&f.pf.div);
    f.pf.temperature = 1.0;
    f.pf.weight_soft_loss = 1.0;
    f.pf.ignore_index = -100;
    f.pf.grad_scale = 1.0;
    f.ds = f.dg = KDLOSS_BF16;
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(&f.pf, 4, 8, 8, 4, KDLOSS_BF16,
                                                                  1, &f.ws_bytes) == KDLOSS_OK &&
                 f.ws_bytes <= AR_BYTES - AR_WS, "fltopk ws size");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(&f.pf, 4, 8, 8, 4, KDLOSS_F16,
                                                                  1, &need) == KDLOSS_ERR_INVALID_DTYPE,
             "fltopk ws size f16");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_workspace_size(NULL, 4, 8, 8, 4, KDLOSS_BF16,
                                                                  1, &need) == KDLOSS_ERR_NULL_POINTER,
             "fltopk ws size NULL params");
    c = f; c.null_params = 1; tk_err_expect("fltopk NULL params", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = f; c.null_out = 1; tk_err_expect("fltopk NULL out", &c, KDLOSS_ERR_NULL_POINTER, 1);
    c = f; c.null_ctx = 1; tk_err_expect("fltopk NULL ctx", &c, KDLOSS_ERR_NULL_POINTER, 0);
    c = f; c.pf.tail = (kdloss_topk_tail)-1; tk_err_expect("fltopk tail -1", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.pf.tail = KDLOSS_TAIL_RENORM_TEACHER; c.pf.div.divergence = KDLOSS_DIV_REVERSE_KL;
    tk_err_expect("fltopk renorm_teacher reverse", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.pf.t2_scale = 3; tk_err_expect("fltopk t2_scale 3", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.k = -1; tk_err_expect("fltopk k < 0", &c, KDLOSS_ERR_INVALID_SIZE, 1);
    c = f; c.labels = 0; c.pf.weight_hard_loss = 0.5;
    tk_err_expect("fltopk CE weight without labels", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.labels = 0; c.hard = 1; tk_err_expect("fltopk hard_loss without labels", &c, KDLOSS_ERR_INVALID_PARAM, 1);
    c = f; c.did = KDLOSS_I32; c.ld_ids = 2; tk_err_expect("fltopk i32 ids ld < k", &c, KDLOSS_ERR_INVALID_STRIDE, 1);
    c = f; c.dg = KDLOSS_F32; tk_err_expect("fltopk dxs dtype", &c, KDLOSS_ERR_INVALID_DTYPE, 1);
    c = f; c.g_off = AR_T + 2048; tk_err_expect("fltopk dxs on log-probs", &c, KDLOSS_ERR_ALIASING, 1);
    c = f; c.ws_bytes -= 256; tk_err_expect("fltopk workspace small", &c, KDLOSS_ERR_WORKSPACE_TOO_SMALL, 0);
}

/* A callback the at-once faults must never reach. */
static int vp_never(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    ++*(int *)ctx;
    return 1;
}

/* The vocabulary-parallel entries' faults that return at once, before any collective and any
 * CUDA call (every other fault meets the other ranks in the agreement: test_vp_agreement): no
 * shard, communicator or callback, a rank outside [0, size), no context, more ranks than the
 * context's agreement buffer serves; and the size queries. Nothing written, no collective. */
static void test_errors_vp(void) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    kdloss_fused_linear_topk_distill_params tp;
    kdloss_fused_linear_topk_distill_params_default(&tp);
    int calls = 0;
    kdloss_comm comm = {0, 2, vp_never, &calls};
    kdloss_vocab_shard sh = {&comm, 16, 0};
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = (float *)(g_ar + AR_LOSS);
    o.dxs = (kdloss_mat){g_ar + AR_G, KDLOSS_F32, 0};
    const kdloss_cmat x = {g_ar + AR_IN, KDLOSS_F32, 0}, w = {g_ar + AR_W1, KDLOSS_F32, 0};
    const kdloss_labels lab = {g_ar + AR_LAB, KDLOSS_I64};
    const kdloss_topk_teacher t = {4, {g_ar + AR_T, KDLOSS_I64, 0}, {g_ar + AR_E, KDLOSS_F32, 0}};
    void *wk = g_ar + AR_WS;
    const size_t wsb = AR_BYTES - AR_WS;
    struct { const char *what; int rank, size, null_cb, null_shard, null_ctx; kdloss_status want; } e[] = {
        {"no shard", 0, 2, 0, 1, 0, KDLOSS_ERR_NULL_POINTER},
        {"no callback", 0, 2, 1, 0, 0, KDLOSS_ERR_NULL_POINTER},
        {"rank -1", -1, 2, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"rank = size", 2, 2, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"size 0", 0, 0, 0, 0, 0, KDLOSS_ERR_INVALID_PARAM},
        {"no context", 0, 2, 0, 0, 1, KDLOSS_ERR_NULL_POINTER},
        {"5000 ranks", 0, 5000, 0, 0, 0, KDLOSS_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        comm.rank = e[i].rank, comm.size = e[i].size;
        comm.allreduce = e[i].null_cb ? NULL : vp_never;
        const kdloss_vocab_shard *shp = e[i].null_shard ? NULL : &sh;
        kdloss_cuda_context *ctx = e[i].null_ctx ? NULL : g_actx;
        if (g_gpu) dpoison(g_ar + AR_G, AR_ROW + 64 - AR_G);
        kdloss_status sd = kdloss_cuda_fused_linear_distill_vp(
            ctx, g_st, &p, shp, 4, 8, 8, 8, x, w, NULL, x, w, NULL, lab, &o, wk, wsb);
        kdloss_status sk = kdloss_cuda_fused_linear_topk_distill_vp(
            ctx, g_st, &tp, shp, 4, 8, 8, x, w, NULL, t, lab, &o, wk, wsb);
        KT_CHECK(sd == e[i].want && sk == e[i].want, "vp %s: got %d / %d want %d", e[i].what,
                 (int)sd, (int)sk, (int)e[i].want);
        KT_CHECK(arena_untouched(), "vp %s: an output was written", e[i].what);
    }
    KT_CHECK(calls == 0, "vp at-once faults: %d collectives", calls);
    size_t b = 0;
    KT_CHECK(kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 8, 8, 8, KDLOSS_F32, 1, &b) ==
                 KDLOSS_OK && b > 0, "vp dense ws size");
    KT_CHECK(kdloss_cuda_fused_linear_distill_vp_workspace_size(NULL, 4, 8, 8, 8, KDLOSS_F32, 1,
                                                                &b) == KDLOSS_ERR_NULL_POINTER &&
                 kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 8, 8, 8, KDLOSS_F16, 1,
                                                                    &b) == KDLOSS_ERR_INVALID_DTYPE &&
                 kdloss_cuda_fused_linear_distill_vp_workspace_size(&p, 4, 0, 8, 8, KDLOSS_F32, 1,
                                                                    &b) == KDLOSS_ERR_INVALID_SIZE,
             "vp dense ws size errors");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 4, KDLOSS_BF16, 1,
                                                                     &b) == KDLOSS_OK && b > 0,
             "vp topk ws size");
    KT_CHECK(kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 0, KDLOSS_F32, 1,
                                                                     &b) == KDLOSS_ERR_INVALID_SIZE &&
                 kdloss_cuda_fused_linear_topk_distill_vp_workspace_size(&tp, 4, 8, 8, 4, KDLOSS_F32,
                                                                         1, NULL) ==
                     KDLOSS_ERR_NULL_POINTER,
             "vp topk ws size errors");
}

static void test_errors(void) {
    g_har = xmalloc(AR_BYTES);
    memset(g_har, 0, AR_BYTES);
    g_ar = g_gpu ? dalloc(AR_BYTES) : g_har;
    if (g_gpu) {
        CK(cudaMemset(g_ar, 0, AR_BYTES));
        CK(cudaDeviceSynchronize());
    }
    /* without a GPU: a zeroed stand-in for the context, never used on the error paths */
    static char fake_ctx[4096];
    g_actx = g_gpu ? g_ctx : (kdloss_cuda_context *)(void *)fake_ctx;
    test_errors_kl();
    test_errors_jsd();
    test_errors_fl();
    test_errors_distill();
    test_errors_distill_logits();
    test_errors_topk();
    test_errors_vp();
    if (g_gpu) CK(cudaFree(g_ar));
    free(g_har);

    kdloss_cuda_context *c = NULL;
    KT_CHECK(kdloss_cuda_context_create(0, NULL) == KDLOSS_ERR_NULL_POINTER, "context NULL out");
    kdloss_status s = kdloss_cuda_context_create(-1, &c);
    KT_CHECK(s == (g_gpu ? KDLOSS_ERR_INVALID_PARAM : KDLOSS_ERR_UNSUPPORTED) && c == NULL,
             "context bad device: %d", (int)s);
    kdloss_cuda_context_destroy(NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* The NaN policy and wide rows (issue 25, D6 and D4; tag "nan")                                */
/* ------------------------------------------------------------------------------------------ */

/* tests/test_nan_policy.c's cases on the CUDA entry points. D6: calls of 3 rows whose middle row
 * holds one NaN (or a +inf logit, or a +inf log-prob): the middle row's loss, the total loss and
 * every element of the middle row's gradient NaN, rows 0 and 2 (row loss and gradient) bitwise
 * those of the same call with a clean middle row; an ignored poisoned row is not read; grad_scale
 * 0 writes zeros. kdloss_cuda_distill (six divergences, four poisons, fp32 / bf16, V 37 and
 * 4099: two tiles a row, so the flag of one tile must reach the other), kdloss_cuda_jsd,
 * kdloss_cuda_kl_div (probability and log targets; elem_loss too; the gradient-only call does not
 * read the input), kdloss_cuda_distill_logits (six divergences, T 1 and 2, fp32 / bf16, V 37
 * and 1100), kdloss_cuda_topk_distill_logits (three tails: NaN / +inf used log-prob, NaN student
 * at S and outside S; an unused slot's NaN, and renorm_both's outside S, not read),
 * kdloss_cuda_fused_linear_distill (a NaN in one row of xs or xt: row_soft, loss and that dxs row
 * NaN, the others as the clean call's; grad_scale 0: dxs zeros), kdloss_cuda_fused_linear_topk_
 * distill (a NaN used log-prob, bucket and renorm_both), kdloss_cuda_fused_linear_distill_vp (2
 * ranks: a NaN in one row of xs). Where a gradient is 0 (nan_zero_grad), the fused losses against
 * the CPU functions element by element: renorm_both's dxs from S alone without the
 * cross-entropy's gradient (a NaN weight row outside S), zero-gradient rows with NaN xs out of
 * dws, both gradient factors 0 (zeros, no GEMM), the sparse path's NaN dws / dbs.
 * D4: logits spanning more than FLT_MAX ([3e38, -3e38, 0] and the teacher swapped, and [1e38,
 * -2.5e38, 3e38]) at T 4, 1e3, 1e30 (and 1 for the fused losses): kdloss_cuda_distill_logits
 * (forward / reverse KL, JSD), the fused dense loss (Hs = Ht = 1, the heads hold the logits) and
 * its vocabulary-parallel form (2 ranks), and the top-k bucket with K = V, against the CPU
 * functions (loss to 1e-5 relative, gradients to 1e-5 of their largest element), and the
 * documented 7.5e37 (forward KL, uniform teacher, T 4). */

#define NB 3 /* rows of a NaN-policy call; row 1 is poisoned */

static void *nan_up(const void *h, size_t n) {
    void *d = dalloc(n);
    h2d(d, h, n);
    return d;
}

/* After the stream: n bytes of device d into h, then frees d. */
static void nan_down(void *h, void *d, size_t n) {
    CK(cudaStreamSynchronize(g_st));
    d2h(h, d, n);
    CK(cudaFree(d));
}

static int nan_row_all(const void *g, kdloss_dtype dt, int64_t v, int64_t r) {
    for (int64_t c = 0; c < v; c++)
        if (!isnan(kt_get(g, dt, v, r, c))) return 0;
    return 1;
}

static int nan_row_zero(const void *g, kdloss_dtype dt, int64_t v, int64_t r) {
    for (int64_t c = 0; c < v; c++)
        if (kt_get(g, dt, v, r, c) != 0.0) return 0;
    return 1;
}

/* A poisoned call (loss, rl [NB], g: NB x v of dt, host) against the clean one (rl0, g0): row 1
 * NaN, rows 0 and 2 bitwise the clean call's. g NULL: no gradient to check. */
static void nan_check(const char *what, int64_t v, kdloss_dtype dt, float loss, const float *rl,
                      const void *g, const float *rl0, const void *g0) {
    KT_CHECK(isnan(loss), "nan %s: loss %g, want NaN", what, loss);
    KT_CHECK(isnan(rl[1]), "nan %s: row loss %g, want NaN", what, rl[1]);
    KT_CHECK(!memcmp(rl, rl0, 4) && !memcmp(rl + 2, rl0 + 2, 4),
             "nan %s: clean rows' losses changed (%g %g vs %g %g)", what, rl[0], rl[2], rl0[0],
             rl0[2]);
    if (!g) return;
    const size_t row = (size_t)v * kdloss_dtype_size(dt);
    KT_CHECK(nan_row_all(g, dt, v, 1), "nan %s: the poisoned row's gradient is not all NaN", what);
    KT_CHECK(!memcmp(g, g0, row) && !memcmp((const char *)g + 2 * row, (const char *)g0 + 2 * row, row),
             "nan %s: clean rows' gradients changed", what);
}

/* NB x v logits in [-4, 4), or (logp) their log_softmax */
static void nan_fill(kt_rng *r, double *x, int64_t v, int logp) {
    for (int64_t i = 0; i < NB; i++) {
        double *row = x + i * v, m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++) row[j] = 8 * kt_uniform(r) - 4;
        if (!logp) continue;
        for (int64_t j = 0; j < v; j++) m = fmax(m, row[j]);
        for (int64_t j = 0; j < v; j++) s += exp(row[j] - m);
        for (int64_t j = 0; j < v; j++) row[j] -= m + log(s);
    }
}

typedef struct nan_poison {
    const char *name;
    int who;              /* 0 student, 1 teacher */
    double val;
    double teacher_there; /* NAN: leave the teacher's value; else set it there too */
} nan_poison;

/* kdloss_cuda_distill (jsd: kdloss_cuda_jsd, beta 0.5) on host operands (NB x v of dt); lab NULL:
 * no labels; g NULL: no gradient. */
static kdloss_status nan_distill(const kdloss_distill_params *p, int jsd, int64_t v,
                                 kdloss_dtype dt, const void *s, const void *t, const int64_t *lab,
                                 float *loss, float *rl, void *g) {
    const size_t n = (size_t)(NB * v) * kdloss_dtype_size(dt);
    void *ds = nan_up(s, n), *dt_ = nan_up(t, n), *dg = g ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + NB));
    int64_t *dlab = lab ? nan_up(lab, NB * sizeof(int64_t)) : NULL;
    size_t wsb = 0;
    kdloss_cuda_distill_workspace_size(NB, v, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_cmat cs = {ds, dt, 0}, ct = {dt_, dt, 0};
    const kdloss_labels L = {dlab, KDLOSS_I64};
    const kdloss_mat gm = {dg, dt, 0};
    kdloss_status st;
    if (jsd) {
        kdloss_jsd_params jp;
        kdloss_jsd_params_default(&jp);
        jp.grad_scale = p->grad_scale;
        st = kdloss_cuda_jsd(g_ctx, g_st, &jp, NB, v, cs, ct, L, dl, dl + 1, gm, wk, wsb);
    } else {
        st = kdloss_cuda_distill(g_ctx, g_st, p, NB, v, cs, ct, L, dl, dl + 1, gm, wk, wsb);
    }
    float h[1 + NB];
    nan_down(h, dl, sizeof h);
    *loss = h[0];
    memcpy(rl, h + 1, sizeof(float) * NB);
    if (g) nan_down(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
    if (dlab) CK(cudaFree(dlab));
    return st;
}

static void nan_logprobs(kt_rng *rng) {
    const nan_poison ps[] = {{"NaN student", 0, NAN, NAN},
                             {"NaN teacher", 1, NAN, NAN},
                             {"NaN student where P = 0", 0, NAN, -INFINITY},
                             {"+inf teacher", 1, INFINITY, NAN}};
    const int64_t vs[] = {37, 4099};
    for (int vi = 0; vi < 2; vi++) {
        const int64_t v = vs[vi], col = vi ? 5 : v - 3; /* V 4099: the NaN in the first tile */
        double *x = xmalloc(sizeof(double) * NB * v), *y = xmalloc(sizeof(double) * NB * v);
        double *x1 = xmalloc(sizeof(double) * NB * v), *y1 = xmalloc(sizeof(double) * NB * v);
        nan_fill(rng, x, v, 1);
        nan_fill(rng, y, v, 1);
        void *g0 = xmalloc(4 * NB * v), *g1 = xmalloc(4 * NB * v);
        for (int dti = 0; dti < 2; dti++) {
            const kdloss_dtype dt = dti ? KDLOSS_BF16 : KDLOSS_F32;
            void *s0 = kt_pack(x, NB, v, v, dt), *t0 = kt_pack(y, NB, v, v, dt);
            for (int dv = 0; dv <= 5; dv++) {
                if (vi && dv % 2) continue; /* V 4099: three divergences */
                kdloss_distill_params p;
                kdloss_distill_params_default(&p);
                p.div.divergence = (kdloss_divergence)dv;
                float l0, rl0[NB];
                KT_CHECK(nan_distill(&p, 0, v, dt, s0, t0, NULL, &l0, rl0, g0) == KDLOSS_OK,
                         "nan distill clean");
                for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
                    if (vi && pi % 2) continue;
                    memcpy(x1, x, sizeof(double) * NB * v);
                    memcpy(y1, y, sizeof(double) * NB * v);
                    (ps[pi].who ? y1 : x1)[v + col] = ps[pi].val;
                    if (!isnan(ps[pi].teacher_there)) y1[v + col] = ps[pi].teacher_there;
                    void *s1 = kt_pack(x1, NB, v, v, dt), *t1 = kt_pack(y1, NB, v, v, dt);
                    float l1, rl1[NB];
                    char what[160];
                    snprintf(what, sizeof what, "distill %s div %d V %lld %s", ps[pi].name, dv,
                             (long long)v, kt_dtype_name(dt));
                    KT_CHECK(nan_distill(&p, 0, v, dt, s1, t1, NULL, &l1, rl1, g1) == KDLOSS_OK,
                             "nan %s: status", what);
                    nan_check(what, v, dt, l1, rl1, g1, rl0, g0);
                    if (dv == KDLOSS_DIV_JSD) { /* the wrapper */
                        nan_distill(&p, 1, v, dt, s1, t1, NULL, &l1, rl1, g1);
                        snprintf(what, sizeof what, "jsd %s V %lld %s", ps[pi].name, (long long)v,
                                 kt_dtype_name(dt));
                        nan_check(what, v, dt, l1, rl1, g1, rl0, g0);
                    }
                    if (dti == 0 && (pi == 0 || pi == 3)) {
                        /* an ignored poisoned row is never read */
                        const int64_t lab[NB] = {0, -100, 1};
                        nan_distill(&p, 0, v, dt, s1, t1, lab, &l1, rl1, g1);
                        KT_CHECK(isfinite(l1) && rl1[1] == 0.0f && nan_row_zero(g1, dt, v, 1),
                                 "nan %s: ignored row read (loss %g)", what, l1);
                        /* grad_scale 0: zeros */
                        kdloss_distill_params p0 = p;
                        p0.grad_scale = 0.0;
                        nan_distill(&p0, 0, v, dt, s1, t1, NULL, &l1, rl1, g1);
                        KT_CHECK(isnan(l1) && nan_row_zero(g1, dt, v, 1),
                                 "nan %s: grad_scale 0 must write zeros", what);
                    }
                    free(s1), free(t1);
                }
            }
            free(s0), free(t0);
        }
        free(x), free(y), free(x1), free(y1), free(g0), free(g1);
    }
}

/* kdloss_cuda_kl_div on fp32 host operands (NB x v): mode 1 reduction SUM (loss, row_loss),
 * 2 reduction NONE (row_loss, elem_loss e), 0 the gradient alone; g NULL: no gradient. */
static void nan_kl_call(const kdloss_kl_params *kp0, int64_t v, const float *s, const float *t,
                        int mode, float *loss, float *rl, float *e, float *g) {
    kdloss_kl_params kp = *kp0;
    kp.reduction = mode == 2 ? KDLOSS_REDUCTION_NONE : KDLOSS_REDUCTION_SUM;
    const size_t n = (size_t)(NB * v) * 4;
    void *ds = nan_up(s, n), *dt_ = nan_up(t, n), *dg = g ? dalloc(n) : NULL;
    void *de = mode == 2 ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + NB));
    size_t wsb = 0;
    kdloss_cuda_kl_div_workspace_size(NB, v, &wsb);
    void *wk = dalloc(wsb);
    kdloss_status st = kdloss_cuda_kl_div(
        g_ctx, g_st, &kp, NB, v, (kdloss_cmat){ds, KDLOSS_F32, 0}, (kdloss_cmat){dt_, KDLOSS_F32, 0},
        mode == 1 ? dl : NULL, mode ? dl + 1 : NULL, (kdloss_mat){de, KDLOSS_F32, 0},
        (kdloss_mat){dg, KDLOSS_F32, 0}, wk, wsb);
    KT_CHECK(st == KDLOSS_OK, "nan kl_div: status %d", (int)st);
    float h[1 + NB];
    nan_down(h, dl, sizeof h);
    if (loss) *loss = mode == 1 ? h[0] : __builtin_nanf("");
    if (rl) memcpy(rl, h + 1, sizeof(float) * NB);
    if (g) nan_down(g, dg, n);
    if (de) nan_down(e, de, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
}

static void nan_kl(kt_rng *rng) {
    enum { V = 37 };
    double x[NB * V], y[NB * V];
    nan_fill(rng, x, V, 1);
    nan_fill(rng, y, V, 1);
    for (int lt = 0; lt < 2; lt++)
        for (int pi = 0; pi < 3; pi++) {
            float s[NB * V], t[NB * V], g0[NB * V], g1[NB * V], e0[NB * V], e1[NB * V];
            float l0, l1, rl0[NB], rl1[NB];
            for (int64_t i = 0; i < NB * V; i++) {
                s[i] = (float)x[i];
                t[i] = lt ? (float)y[i] : (float)exp(y[i]);
            }
            kdloss_kl_params kp;
            kdloss_kl_params_default(&kp);
            kp.log_target = lt;
            /* 0: a NaN input; 1: a NaN target; 2: a NaN input where t = 0 (the clean call: 0
             * there, with that target) */
            if (pi == 2) t[V + 3] = lt ? -INFINITY : 0.0f;
            nan_kl_call(&kp, V, s, t, 1, &l0, rl0, NULL, g0);
            nan_kl_call(&kp, V, s, t, 2, NULL, NULL, e0, NULL);
            if (pi == 1) t[V + 3] = NAN;
            else s[V + 3] = NAN;
            nan_kl_call(&kp, V, s, t, 1, &l1, rl1, NULL, g1);
            char what[96];
            snprintf(what, sizeof what, "kl_div log_target %d case %d", lt, pi);
            nan_check(what, V, KDLOSS_F32, l1, rl1, g1, rl0, g0);
            nan_kl_call(&kp, V, s, t, 2, NULL, rl1, e1, NULL); /* reduction none */
            KT_CHECK(isnan(rl1[1]) && nan_row_all(e1, KDLOSS_F32, V, 1) && !memcmp(e1, e0, 4 * V) &&
                         !memcmp(e1 + 2 * V, e0 + 2 * V, 4 * V),
                     "nan %s: elem_loss", what);
            if (pi != 1) { /* the gradient alone: the input is not read (kdloss.h) */
                float g2[NB * V];
                nan_kl_call(&kp, V, s, t, 0, NULL, NULL, NULL, g2);
                KT_CHECK(!memcmp(g2, g0, sizeof g2), "nan %s: the gradient-only call read the input",
                         what);
            }
            kp.grad_scale = 0.0; /* zeros */
            nan_kl_call(&kp, V, s, t, 1, &l1, rl1, NULL, g1);
            KT_CHECK(isnan(l1) && nan_row_zero(g1, KDLOSS_F32, V, 1),
                     "nan %s: grad_scale 0 must write zeros", what);
        }
}

/* kdloss_cuda_distill_logits on host operands (NB x v of dt); g NULL: forward only. */
static kdloss_status nan_dl_call(const kdloss_distill_logits_params *p, int64_t bt, int64_t v,
                                 kdloss_dtype dt, const void *s, const void *t, float *loss,
                                 float *rl, void *g) {
    const size_t n = (size_t)(bt * v) * kdloss_dtype_size(dt);
    void *ds = nan_up(s, n), *dt_ = nan_up(t, n), *dg = g ? dalloc(n) : NULL;
    float *dl = dalloc(4 * (1 + bt));
    size_t wsb = 0;
    kdloss_cuda_distill_logits_workspace_size(bt, v, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_labels L = {NULL, KDLOSS_I64};
    kdloss_status st = kdloss_cuda_distill_logits(g_ctx, g_st, p, bt, v, (kdloss_cmat){ds, dt, 0},
                                                  (kdloss_cmat){dt_, dt, 0}, L, dl, rl ? dl + 1 : NULL,
                                                  (kdloss_mat){dg, dt, 0}, wk, wsb);
    float *h = xmalloc(4 * (1 + bt));
    nan_down(h, dl, 4 * (1 + bt));
    *loss = h[0];
    if (rl) memcpy(rl, h + 1, sizeof(float) * bt);
    free(h);
    if (g) nan_down(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(dt_));
    CK(cudaFree(wk));
    return st;
}

static void nan_logits(kt_rng *rng) {
    const nan_poison ps[] = {{"NaN student", 0, NAN, NAN},
                             {"NaN teacher", 1, NAN, NAN},
                             {"+inf student", 0, INFINITY, NAN},
                             {"+inf teacher", 1, INFINITY, NAN}};
    const int64_t vs[] = {37, 1100};
    for (int vi = 0; vi < 2; vi++) {
        const int64_t v = vs[vi];
        double *x = xmalloc(sizeof(double) * NB * v), *y = xmalloc(sizeof(double) * NB * v);
        double *x1 = xmalloc(sizeof(double) * NB * v), *y1 = xmalloc(sizeof(double) * NB * v);
        nan_fill(rng, x, v, 0);
        nan_fill(rng, y, v, 0);
        void *g0 = xmalloc(4 * NB * v), *g1 = xmalloc(4 * NB * v);
        for (int dti = 0; dti < 2; dti++) {
            const kdloss_dtype dt = dti ? KDLOSS_BF16 : KDLOSS_F32;
            void *s0 = kt_pack(x, NB, v, v, dt), *t0 = kt_pack(y, NB, v, v, dt);
            for (int dv = 0; dv <= 5; dv++)
                for (int ti = 0; ti < 2; ti++) {
                    /* V 1100, and bf16 at T 2: a subset (the time the simulator takes) */
                    if ((vi && (dv % 2 || ti != 1 || dti)) || (ti && dti)) continue;
                    kdloss_distill_logits_params p;
                    kdloss_distill_logits_params_default(&p);
                    p.div.divergence = (kdloss_divergence)dv;
                    p.temperature = ti ? 2.0 : 1.0;
                    float l0, rl0[NB];
                    nan_dl_call(&p, NB, v, dt, s0, t0, &l0, rl0, g0);
                    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
                        memcpy(x1, x, sizeof(double) * NB * v);
                        memcpy(y1, y, sizeof(double) * NB * v);
                        (ps[pi].who ? y1 : x1)[v + v - 3] = ps[pi].val;
                        void *s1 = kt_pack(x1, NB, v, v, dt), *t1 = kt_pack(y1, NB, v, v, dt);
                        float l1, rl1[NB];
                        char what[160];
                        snprintf(what, sizeof what, "distill_logits %s div %d T %g V %lld %s",
                                 ps[pi].name, dv, p.temperature, (long long)v, kt_dtype_name(dt));
                        KT_CHECK(nan_dl_call(&p, NB, v, dt, s1, t1, &l1, rl1, g1) == KDLOSS_OK,
                                 "nan %s: status", what);
                        nan_check(what, v, dt, l1, rl1, g1, rl0, g0);
                        if (dti == 0 && (pi == 0 || pi == 3)) {
                            float l2, rl2[NB];
                            nan_dl_call(&p, NB, v, dt, s1, t1, &l2, rl2, NULL); /* forward only */
                            KT_CHECK(isnan(l2) && isnan(rl2[1]) && !memcmp(rl2, rl0, 4),
                                     "nan %s: forward only", what);
                            kdloss_distill_logits_params p0 = p;
                            p0.grad_scale = 0.0;
                            nan_dl_call(&p0, NB, v, dt, s1, t1, &l2, rl2, g1);
                            KT_CHECK(isnan(l2) && nan_row_zero(g1, dt, v, 1),
                                     "nan %s: grad_scale 0 must write zeros", what);
                        }
                        free(s1), free(t1);
                    }
                }
            free(s0), free(t0);
        }
        free(x), free(y), free(x1), free(y1), free(g0), free(g1);
    }
}

/* kdloss_cuda_topk_distill_logits on host fp32 operands (NB x v logits, NB x k ids / log-probs). */
static kdloss_status nan_tk_call(const kdloss_topk_distill_params *p, int64_t bt, int64_t v,
                                 int64_t k, const float *s, const int32_t *ids, const float *lp,
                                 float *loss, float *rl, float *g) {
    const size_t n = (size_t)(bt * v) * 4, nk = (size_t)(bt * k) * 4;
    void *ds = nan_up(s, n), *di = nan_up(ids, nk), *dp = nan_up(lp, nk), *dg = dalloc(n);
    float *dl = dalloc(4 * (1 + bt));
    size_t wsb = 0;
    kdloss_cuda_topk_distill_logits_workspace_size(bt, v, k, &wsb);
    void *wk = dalloc(wsb);
    const kdloss_topk_teacher t = {k, {di, KDLOSS_I32, 0}, {dp, KDLOSS_F32, 0}};
    kdloss_status st = kdloss_cuda_topk_distill_logits(
        g_ctx, g_st, p, bt, v, (kdloss_cmat){ds, KDLOSS_F32, 0}, t, (kdloss_labels){NULL, KDLOSS_I64},
        dl, dl + 1, (kdloss_mat){dg, KDLOSS_F32, 0}, wk, wsb);
    float *h = xmalloc(4 * (1 + bt));
    nan_down(h, dl, 4 * (1 + bt));
    *loss = h[0];
    if (rl) memcpy(rl, h + 1, sizeof(float) * bt);
    free(h);
    nan_down(g, dg, n);
    CK(cudaFree(ds));
    CK(cudaFree(di));
    CK(cudaFree(dp));
    CK(cudaFree(wk));
    return st;
}

static void nan_topk(kt_rng *rng) {
    enum { V = 40, K = 6 };
    double x[NB * V];
    nan_fill(rng, x, V, 0);
    float s0[NB * V], s1[NB * V], g0[NB * V], g1[NB * V], lp0[NB * K], lp1[NB * K];
    int32_t ids[NB * K];
    for (int64_t i = 0; i < NB * V; i++) s0[i] = (float)x[i];
    for (int64_t r = 0; r < NB; r++)
        for (int64_t j = 0; j < K; j++) {
            ids[r * K + j] = (int32_t)(3 * j + r);
            lp0[r * K + j] = (float)(-1.0 - 0.5 * (double)j);
        }
    ids[1 * K + 5] = -1; /* an unused slot in the poisoned row */
    lp0[1 * K + 5] = NAN;
    enum { LP_NAN, LP_INF, S_NAN_IN, S_NAN_OUT, UNUSED, NCASE };
    const char *names[] = {"NaN log-prob", "+inf log-prob", "NaN student at S",
                           "NaN student outside S", "NaN unused slot only"};
    for (int tail = 0; tail < 3; tail++)
        for (int dv = 0; dv <= 5; dv++) {
            if (tail == 2 && dv != 0) continue;
            kdloss_topk_distill_params p;
            kdloss_topk_distill_params_default(&p);
            p.div.divergence = (kdloss_divergence)dv;
            p.tail = (kdloss_topk_tail)tail;
            p.temperature = 1.5;
            float l0, l1, rl0[NB], rl1[NB];
            KT_CHECK(nan_tk_call(&p, NB, V, K, s0, ids, lp0, &l0, rl0, g0) == KDLOSS_OK,
                     "nan topk clean");
            for (int c = 0; c < NCASE; c++) {
                memcpy(s1, s0, sizeof s1);
                memcpy(lp1, lp0, sizeof lp1);
                if (c == LP_NAN) lp1[1 * K + 2] = NAN;
                if (c == LP_INF) lp1[1 * K + 2] = INFINITY;
                if (c == S_NAN_IN) s1[1 * V + ids[1 * K + 1]] = NAN;
                if (c == S_NAN_OUT) s1[1 * V + 39] = NAN;
                nan_tk_call(&p, NB, V, K, s1, ids, lp1, &l1, rl1, g1);
                char what[128];
                snprintf(what, sizeof what, "topk %s tail %d div %d", names[c], tail, dv);
                if (c == UNUSED || (c == S_NAN_OUT && tail == 1)) { /* not read */
                    KT_CHECK(isfinite(l1) && !memcmp(rl1, rl0, sizeof rl0),
                             "nan %s: an unread NaN changed the losses (%g)", what, l1);
                    int fin = 1;
                    for (int64_t j = 0; j < V; j++)
                        fin &= c == UNUSED ? g1[V + j] == g0[V + j] : j == 39 || isfinite(g1[V + j]);
                    KT_CHECK(fin, "nan %s: gradient", what);
                } else {
                    nan_check(what, V, KDLOSS_F32, l1, rl1, g1, rl0, g0);
                }
            }
        }
}

/* The fused losses' outputs of a NaN-policy call, on the host. */
typedef struct nan_fout {
    float loss, soft, rs[NB], *dxs;
} nan_fout;

/* kdloss_cuda_fused_linear_distill (ids NULL) or _topk_distill (ids / lp: NB x k) on host fp32
 * operands; lab NULL: no labels. dxs: bt x hs. */
static kdloss_status nan_fused_call(const void *params, int topk, int64_t bt, int64_t hs,
                                    int64_t ht, int64_t v, int64_t k, const float *xs,
                                    const float *ws, const float *xt, const float *wt,
                                    const int32_t *ids, const float *lp, const int64_t *lab,
                                    nan_fout *o) {
    void *dxs_in = nan_up(xs, (size_t)(bt * hs) * 4), *dws = nan_up(ws, (size_t)(v * hs) * 4);
    void *dxt = xt ? nan_up(xt, (size_t)(bt * ht) * 4) : NULL;
    void *dwt = wt ? nan_up(wt, (size_t)(v * ht) * 4) : NULL;
    void *di = ids ? nan_up(ids, (size_t)(bt * k) * 4) : NULL;
    void *dlp = lp ? nan_up(lp, (size_t)(bt * k) * 4) : NULL;
    void *dlab = lab ? nan_up(lab, (size_t)bt * 8) : NULL;
    float *dsc = dalloc(4 * (2 + bt));
    void *ddx = dalloc((size_t)(bt * hs) * 4);
    kdloss_fused_linear_distill_out out;
    memset(&out, 0, sizeof out);
    out.loss = dsc;
    out.soft_loss = dsc + 1;
    out.row_soft = dsc + 2;
    out.dxs = (kdloss_mat){ddx, KDLOSS_F32, 0};
    size_t wsb = 0;
    kdloss_status st;
    void *wk;
    const kdloss_labels L = {dlab, KDLOSS_I64};
    const kdloss_cmat cxs = {dxs_in, KDLOSS_F32, 0}, cws = {dws, KDLOSS_F32, 0};
    if (topk) {
        const kdloss_fused_linear_topk_distill_params *p = params;
        kdloss_cuda_fused_linear_topk_distill_workspace_size(p, bt, hs, v, k, KDLOSS_F32, 1, &wsb);
        wk = dalloc(wsb);
        const kdloss_topk_teacher t = {k, {di, KDLOSS_I32, 0}, {dlp, KDLOSS_F32, 0}};
        st = kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, p, bt, hs, v, cxs, cws, NULL, t, L,
                                                   &out, wk, wsb);
    } else {
        const kdloss_fused_linear_distill_params *p = params;
        kdloss_cuda_fused_linear_distill_workspace_size(p, bt, hs, ht, v, KDLOSS_F32, 1, &wsb);
        wk = dalloc(wsb);
        st = kdloss_cuda_fused_linear_distill(g_ctx, g_st, p, bt, hs, ht, v, cxs, cws, NULL,
                                              (kdloss_cmat){dxt, KDLOSS_F32, 0},
                                              (kdloss_cmat){dwt, KDLOSS_F32, 0}, NULL, L, &out, wk,
                                              wsb);
    }
    float *h = xmalloc(4 * (2 + bt));
    nan_down(h, dsc, 4 * (2 + bt));
    o->loss = h[0];
    o->soft = h[1];
    memcpy(o->rs, h + 2, sizeof(float) * (bt < NB ? bt : NB));
    free(h);
    nan_down(o->dxs, ddx, (size_t)(bt * hs) * 4);
    void *all[] = {dxs_in, dws, dxt, dwt, di, dlp, dlab, wk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) CK(cudaFree(all[i]));
    return st;
}

static void nan_fused(kt_rng *rng) {
    enum { V = 300, HS = 4, HT = 3 };
    float xs[NB * HS], ws[V * HS], xt[NB * HT], wt[V * HT];
    for (int64_t i = 0; i < NB * HS; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HS; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < NB * HT; i++) xt[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HT; i++) wt[i] = (float)(2 * kt_uniform(rng) - 1);
    const int64_t lab[NB] = {3, 7, 11};
    float dx[2][NB * HS];
    for (int who = 0; who < 2; who++)
        for (int dv = 0; dv <= 5; dv++) {
            kdloss_fused_linear_distill_params p;
            kdloss_fused_linear_distill_params_default(&p);
            p.div.divergence = (kdloss_divergence)dv;
            p.temperature = 2.0;
            nan_fout o[2];
            for (int run = 0; run < 2; run++) {
                float xs1[NB * HS], xt1[NB * HT];
                memcpy(xs1, xs, sizeof xs1);
                memcpy(xt1, xt, sizeof xt1);
                if (run) (who ? xt1 : xs1)[1 * (who ? HT : HS) + 1] = NAN;
                o[run].dxs = dx[run];
                kdloss_status st = nan_fused_call(&p, 0, NB, HS, HT, V, 0, xs1, ws, xt1, wt, NULL,
                                                  NULL, lab, &o[run]);
                KT_CHECK(st == KDLOSS_OK, "nan fused: status %d", (int)st);
                if (run && dv == 0) { /* grad_scale 0: zeros */
                    nan_fout z;
                    float dz[NB * HS];
                    z.dxs = dz;
                    kdloss_fused_linear_distill_params p0 = p;
                    p0.grad_scale = 0.0;
                    nan_fused_call(&p0, 0, NB, HS, HT, V, 0, xs1, ws, xt1, wt, NULL, NULL, lab, &z);
                    int zero = 1;
                    for (int64_t i = 0; i < HS; i++) zero &= dz[HS + i] == 0.0f;
                    KT_CHECK(isnan(z.loss) && zero, "nan fused NaN in %s: grad_scale 0 must write "
                             "zeros", who ? "xt" : "xs");
                }
            }
            char what[96];
            snprintf(what, sizeof what, "fused dense NaN in %s div %d", who ? "xt" : "xs", dv);
            KT_CHECK(isnan(o[1].loss) && isnan(o[1].rs[1]), "nan %s: loss %g row %g, want NaN",
                     what, o[1].loss, o[1].rs[1]);
            int all = 1;
            for (int64_t i = 0; i < HS; i++) all &= isnan(dx[1][HS + i]);
            KT_CHECK(all, "nan %s: dxs row not NaN", what);
            KT_CHECK(!memcmp(o[1].rs, o[0].rs, 4) && !memcmp(o[1].rs + 2, o[0].rs + 2, 4),
                     "nan %s: clean rows' losses changed", what);
            int ok = 1;
            for (int64_t i = 0; i < HS; i++)
                ok &= fabsf(dx[1][i] - dx[0][i]) <= 1e-6f * (1 + fabsf(dx[0][i])) &&
                      fabsf(dx[1][2 * HS + i] - dx[0][2 * HS + i]) <=
                          1e-6f * (1 + fabsf(dx[0][2 * HS + i]));
            KT_CHECK(ok, "nan %s: clean rows' dxs changed", what);
        }
    /* fused top-k: a NaN used log-prob in row 1, bucket and renorm_both (the sparse path) */
    int32_t ids[NB * 4];
    float lp[NB * 4];
    for (int64_t i = 0; i < NB * 4; i++) ids[i] = (int32_t)(5 * i), lp[i] = -1.0f - (float)(i % 4);
    lp[4 + 2] = NAN;
    for (int tail = 0; tail < 2; tail++) {
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        p.tail = (kdloss_topk_tail)tail;
        nan_fout o;
        o.dxs = dx[0];
        KT_CHECK(nan_fused_call(&p, 1, NB, HS, 0, V, 4, xs, ws, NULL, NULL, ids, lp, NULL, &o) ==
                     KDLOSS_OK,
                 "nan fused topk status");
        int all = 1;
        for (int64_t i = 0; i < HS; i++) all &= isnan(dx[0][HS + i]);
        KT_CHECK(isnan(o.loss) && isnan(o.rs[1]) && all && isfinite(o.rs[0]) && isfinite(o.rs[2]) &&
                     isfinite(dx[0][0]) && isfinite(dx[0][2 * HS]),
                 "nan fused topk tail %d: NaN log-prob not propagated", tail);
    }
}

static double whole_dx(const vp_out *o, int64_t i) { return ((const float *)o->dxs)[i]; }

/* The vocabulary-parallel dense loss with 2 ranks on operands (host fp32: xs NB x hs, ws v x hs,
 * xt NB x ht, wt v x ht, labels) against the single-process call: each rank's row_soft and dxs
 * element by element (NaN where the whole call's is; to 1e-5 of the largest otherwise). */
static void nan_vp(const char *tag, const kdloss_fused_linear_distill_params *p, int64_t bt,
                   int64_t hs, int64_t ht, int64_t v, const float *xs, const float *ws,
                   const float *xt, const float *wt, const int64_t *lab, float *rs_whole,
                   float *dxs_whole) {
    vp_case c;
    memset(&c, 0, sizeof c);
    c.tag = tag;
    c.bt = bt, c.hs = hs, c.ht = ht, c.v = v, c.dt = KDLOSS_F32;
    c.dp = *p;
    vp_data d;
    memset(&d, 0, sizeof d);
    d.xs = nan_up(xs, (size_t)(bt * hs) * 4);
    d.ws = nan_up(ws, (size_t)(v * hs) * 4);
    d.xt = nan_up(xt, (size_t)(bt * ht) * 4);
    d.wt = nan_up(wt, (size_t)(v * ht) * 4);
    d.lab = nan_up(lab, (size_t)bt * 8);
    d.bs = dalloc(4), d.bt = dalloc(4), d.ids = dalloc(4), d.lp = dalloc(4);
    vp_out whole;
    vp_out_alloc(&whole, &c, v);
    KT_CHECK(vp_whole(&c, &d, &whole) == KDLOSS_OK, "nan %s: whole call", tag);
    vp_out_fetch(&whole, &c, v);
    memcpy(rs_whole, whole.rows, sizeof(float) * bt);
    memcpy(dxs_whole, whole.dxs, sizeof(float) * bt * hs);
    vp_job jobs[VP_MAX_RANKS];
    vp_rank ranks[VP_MAX_RANKS];
    vp_world w;
    vp_jobs_init(jobs, 2, &c, &d);
    vp_run_ranks(jobs, 2, &w, ranks, NULL);
    for (int r = 0; r < 2; r++) {
        vp_job *j = &jobs[r];
        KT_CHECK(j->status == KDLOSS_OK, "nan %s rank %d: %s", tag, r,
                 kdloss_status_string(j->status));
        vp_out_fetch(&j->o, &c, j->n);
        double mx = 0.0;
        for (int64_t i = 0; i < bt * hs; i++)
            if (isfinite(whole_dx(&whole, i))) mx = fmax(mx, fabs(whole_dx(&whole, i)));
        int bad = !close1(j->o.sc[0], whole.sc[0], 1e-30, 1e-5);
        for (int64_t i = 0; i < bt; i++)
            bad |= !close1(j->o.rows[i], whole.rows[i], 1e-6, 1e-5);
        for (int64_t i = 0; i < bt * hs; i++)
            bad |= !close1(((float *)j->o.dxs)[i], whole_dx(&whole, i), 1e-5 * mx, 1e-5);
        if (bad)
            for (int64_t i = 0; i < bt * hs; i++)
                if (!close1(((float *)j->o.dxs)[i], whole_dx(&whole, i), 1e-5 * mx, 1e-5))
                    printf("  dxs[%lld]: %g vs %g\n", (long long)i, ((float *)j->o.dxs)[i],
                           whole_dx(&whole, i));
        KT_CHECK(!bad, "nan %s rank %d: differs from the whole call (loss %g vs %g, row_soft %g %g "
                 "%g vs %g %g %g)", tag, r, j->o.sc[0], whole.sc[0], j->o.rows[0],
                 j->o.rows[bt > 1], j->o.rows[bt - 1], whole.rows[0], whole.rows[bt > 1],
                 whole.rows[bt - 1]);
        vp_out_free(&j->o);
    }
    vp_out_free(&whole);
    vp_data_free(&d);
}

static void nan_vp_cases(kt_rng *rng) {
    enum { V = 300, HS = 4, HT = 3 };
    float xs[NB * HS], ws[V * HS], xt[NB * HT], wt[V * HT], rs[NB], dx[NB * HS];
    for (int64_t i = 0; i < NB * HS; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HS; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < NB * HT; i++) xt[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HT; i++) wt[i] = (float)(2 * kt_uniform(rng) - 1);
    const int64_t lab[NB] = {3, 7, 11};
    for (int who = 0; who < 2; who++) {
        kdloss_fused_linear_distill_params p;
        kdloss_fused_linear_distill_params_default(&p);
        p.div.divergence = who ? KDLOSS_DIV_REVERSE_KL : KDLOSS_DIV_JSD;
        p.temperature = who ? 2.0 : 1.0;
        float xs1[NB * HS], xt1[NB * HT];
        memcpy(xs1, xs, sizeof xs1);
        memcpy(xt1, xt, sizeof xt1);
        (who ? xt1 : xs1)[1 * (who ? HT : HS) + 2] = who ? INFINITY : NAN;
        char tag[64];
        snprintf(tag, sizeof tag, "vp fused %s in %s", who ? "+inf" : "NaN", who ? "xt" : "xs");
        nan_vp(tag, &p, NB, HS, HT, V, xs1, ws, xt1, wt, lab, rs, dx);
        int all = 1;
        for (int64_t i = 0; i < HS; i++) all &= isnan(dx[HS + i]);
        KT_CHECK(isnan(rs[1]) && all && isfinite(rs[0]) && isfinite(rs[2]) && isfinite(dx[0]),
                 "nan %s: the whole call's row 1 not NaN", tag);
    }
}

/* The vocabulary-parallel top-k loss, 2 ranks, a NaN in row 1's xs (every logit of the row NaN)
 * and row 1 without a used slot, weight_hard_loss 0.5 (row_lse, cross-entropy): row_lse and
 * row_hard NaN on every rank, as the single-process call's and the CPU's. The ranks' maxima
 * outside S were fmaxf's, which drop NaN: -inf, the row's sums skipped, row_lse -inf. */
static void nan_vp_topk(kt_rng *rng) {
    enum { V = 300, HS = 4, K = 3 };
    float xs[NB * HS], ws[V * HS], lp[NB * K];
    const int32_t ids[NB * K] = {5, 40, 250, -1, -1, -1, 7, 180, 299};
    const int64_t lab[NB] = {3, 7, 11};
    for (int64_t i = 0; i < NB * HS; i++) xs[i] = (float)(kt_uniform(rng) - 0.5);
    for (int64_t i = 0; i < V * HS; i++) ws[i] = (float)(2 * kt_uniform(rng) - 1);
    for (int64_t i = 0; i < NB * K; i++) lp[i] = (float)(-0.5 - 2 * kt_uniform(rng));
    xs[1 * HS + 2] = NAN;
    for (int tail = 0; tail < 3; tail++) {
        vp_case c;
        memset(&c, 0, sizeof c);
        c.tag = "nan vp top-k";
        c.topk = 1, c.bt = NB, c.hs = HS, c.v = V, c.k = K, c.dt = KDLOSS_F32, c.labels = 1;
        kdloss_fused_linear_topk_distill_params_default(&c.tp);
        c.tp.tail = (kdloss_topk_tail)tail;
        c.tp.weight_hard_loss = 0.5;
        vp_data d;
        memset(&d, 0, sizeof d);
        d.xs = nan_up(xs, sizeof xs), d.ws = nan_up(ws, sizeof ws), d.lab = nan_up(lab, sizeof lab);
        d.ids = nan_up(ids, sizeof ids), d.lp = nan_up(lp, sizeof lp);
        d.bs = dalloc(4), d.xt = dalloc(4), d.wt = dalloc(4), d.bt = dalloc(4);
        vp_out whole;
        vp_out_alloc(&whole, &c, V);
        KT_CHECK(vp_whole(&c, &d, &whole) == KDLOSS_OK, "nan vp top-k tail %d: whole call", tail);
        vp_out_fetch(&whole, &c, V);
        KT_CHECK(isnan(whole.rows[2 * NB + 1]) && isnan(whole.rows[NB + 1]) && isfinite(whole.rows[2 * NB]),
                 "nan vp top-k tail %d: the whole call's row_lse %g (want NaN)", tail, whole.rows[2 * NB + 1]);
        vp_job jobs[VP_MAX_RANKS];
        vp_rank ranks[VP_MAX_RANKS];
        vp_world w;
        vp_jobs_init(jobs, 2, &c, &d);
        vp_run_ranks(jobs, 2, &w, ranks, NULL);
        for (int r = 0; r < 2; r++) {
            vp_job *j = &jobs[r];
            KT_CHECK(j->status == KDLOSS_OK, "nan vp top-k tail %d rank %d: %s", tail, r,
                     kdloss_status_string(j->status));
            vp_out_fetch(&j->o, &c, j->n);
            int bad = 0;
            for (int64_t i = 0; i < 3 * NB; i++) bad |= !close1(j->o.rows[i], whole.rows[i], 1e-6, 1e-5);
            KT_CHECK(!bad, "nan vp top-k tail %d rank %d: row outputs differ from the whole call "
                     "(row_lse[1] %g vs %g, row_hard[1] %g vs %g)", tail, r, j->o.rows[2 * NB + 1],
                     whole.rows[2 * NB + 1], j->o.rows[NB + 1], whole.rows[NB + 1]);
            vp_out_free(&j->o);
        }
        vp_out_free(&whole);
        vp_data_free(&d);
    }
}

/* A gradient factor of 0 writes zeros on rows nothing flags (kdloss.h), also where the unscaled
 * element is infinite: kdloss_cuda_distill reverse KL at a teacher's -inf log-prob (e^x (x - y +
 * 1) = inf), kdloss_cuda_jsd at beta 1 there, kdloss_cuda_kl_div with a log target of 100
 * (-e^100 overflows), loss and gradient or the gradient alone. The kernels formed inf x 0 = NaN. */
static void nan_grad_scale_zero(void) {
    enum { V = 37 };
    float x[NB * V], y[NB * V], g[NB * V], l, rl[NB];
    for (int64_t i = 0; i < NB * V; i++) x[i] = -0.5f - 0.5f * (float)(i % 3), y[i] = i % 2 ? -0.1f : -INFINITY;
    for (int jsd = 0; jsd < 2; jsd++) {
        kdloss_distill_params p;
        kdloss_distill_params_default(&p);
        p.div.divergence = KDLOSS_DIV_REVERSE_KL;
        p.grad_scale = 0.0;
        kdloss_status st;
        if (jsd) { /* kdloss_cuda_jsd: beta 0.5 in nan_distill; here beta 1 by hand */
            const size_t n = sizeof x;
            void *ds = nan_up(x, n), *dt_ = nan_up(y, n), *dg = dalloc(n);
            float *dl = dalloc(4 * (1 + NB));
            size_t wsb = 0;
            kdloss_cuda_distill_workspace_size(NB, V, &wsb);
            void *wk = dalloc(wsb);
            kdloss_jsd_params jp;
            kdloss_jsd_params_default(&jp);
            jp.beta = 1.0, jp.grad_scale = 0.0;
            st = kdloss_cuda_jsd(g_ctx, g_st, &jp, NB, V, (kdloss_cmat){ds, KDLOSS_F32, 0},
                                 (kdloss_cmat){dt_, KDLOSS_F32, 0}, (kdloss_labels){NULL, KDLOSS_I64},
                                 dl, dl + 1, (kdloss_mat){dg, KDLOSS_F32, 0}, wk, wsb);
            nan_down(g, dg, n);
            CK(cudaFree(ds));
            CK(cudaFree(dt_));
            CK(cudaFree(dl));
            CK(cudaFree(wk));
        } else {
            st = nan_distill(&p, 0, V, KDLOSS_F32, x, y, NULL, &l, rl, g);
        }
        int zero = 1;
        for (int64_t r = 0; r < NB; r++) zero &= nan_row_zero(g, KDLOSS_F32, V, r);
        KT_CHECK(st == KDLOSS_OK && zero, "nan %s reverse KL at a -inf teacher, grad_scale 0: "
                 "gradient %g %g, want zeros", jsd ? "jsd beta 1" : "distill", g[0], g[1]);
    }
    for (int mode = 0; mode < 2; mode++) { /* 1: loss and gradient, 0: the gradient alone */
        for (int64_t i = 0; i < NB * V; i++) x[i] = -1.0f, y[i] = i % 5 ? -2.0f : 100.0f;
        kdloss_kl_params kp;
        kdloss_kl_params_default(&kp);
        kp.log_target = 1;
        kp.grad_scale = 0.0;
        nan_kl_call(&kp, V, x, y, mode, mode ? &l : NULL, mode ? rl : NULL, NULL, g);
        int zero = 1;
        for (int64_t r = 0; r < NB; r++) zero &= nan_row_zero(g, KDLOSS_F32, V, r);
        KT_CHECK(zero, "nan kl_div log target 100, grad_scale 0 (mode %d): gradient %g, want zeros",
                 mode, g[0]);
    }
}

static void nan_wide(void) {
    if (!kdloss_distill_logits || !kdloss_fused_linear_distill || !kdloss_topk_distill_logits) {
        printf("nan wide: skipped (this build has no CPU functions)\n");
        return;
    }
    const double a[3] = {3e38, -3e38, 0}, b[3] = {0, 0, 0}, c[3] = {1e38, -2.5e38, 3e38};
    const double *rows[3][2] = {{a, b}, {b, a}, {c, a}};
    const double ts[4] = {4, 1e3, 1e30, 1};
    const int divs[3] = {KDLOSS_DIV_FORWARD_KL, KDLOSS_DIV_REVERSE_KL, KDLOSS_DIV_JSD};
    for (int ri = 0; ri < 3; ri++)
        for (int ti = 0; ti < 4; ti++)
            for (int di = 0; di < 3; di++) {
                const double *zs = rows[ri][0], *zt = rows[ri][1];
                float s[3], t[3], g[3], cg[3], loss, closs;
                for (int j = 0; j < 3; j++) s[j] = (float)zs[j], t[j] = (float)zt[j];
                char what[96];
                snprintf(what, sizeof what, "wide row %d T %g div %d", ri, ts[ti], divs[di]);
                kdloss_distill_logits_params p;
                kdloss_distill_logits_params_default(&p);
                p.div.divergence = (kdloss_divergence)divs[di];
                p.temperature = ts[ti];
                KT_CHECK(nan_dl_call(&p, 1, 3, KDLOSS_F32, s, t, &loss, NULL, g) == KDLOSS_OK &&
                             kdloss_distill_logits(&p, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0},
                                                   (kdloss_cmat){t, KDLOSS_F32, 0},
                                                   (kdloss_labels){NULL, KDLOSS_I64}, &closs, NULL,
                                                   (kdloss_mat){cg, KDLOSS_F32, 0}) == KDLOSS_OK,
                         "nan %s: status", what);
                double gmax = 0;
                for (int j = 0; j < 3; j++) gmax = fmax(gmax, fabs(cg[j]));
                kt_close(loss, closs, 0, 1e-5, "nan %s: loss vs CPU", what);
                for (int j = 0; j < 3; j++)
                    kt_close(g[j], cg[j], 1e-5 * gmax, 0, "nan %s: dz[%d] vs CPU", what, j);
                if (ri == 0 && ti == 0 && di == 0) /* docs/MATH.md 10 */
                    kt_close(loss, 7.5e37, 0, 1e-6, "nan %s: the documented 7.5e37", what);
                /* the fused loss: Hs = Ht = 1, xs = xt = 1, the heads hold the logits */
                const float one[1] = {1.0f};
                const int64_t lab[1] = {0};
                kdloss_fused_linear_distill_params fp;
                kdloss_fused_linear_distill_params_default(&fp);
                fp.div.divergence = (kdloss_divergence)divs[di];
                fp.temperature = ts[ti];
                fp.weight_hard_loss = 0.0;
                fp.weight_soft_loss = 1.0;
                float dxs, cdxs, csoft;
                nan_fout o;
                o.dxs = &dxs;
                KT_CHECK(nan_fused_call(&fp, 0, 1, 1, 1, 3, 0, one, s, one, t, NULL, NULL, lab, &o) ==
                             KDLOSS_OK,
                         "nan %s: fused status", what);
                kdloss_fused_linear_distill_out co;
                memset(&co, 0, sizeof co);
                co.soft_loss = &csoft;
                co.dxs = (kdloss_mat){&cdxs, KDLOSS_F32, 0};
                KT_CHECK(kdloss_fused_linear_distill(&fp, 1, 1, 1, 3, (kdloss_cmat){one, KDLOSS_F32, 0},
                                                     (kdloss_cmat){s, KDLOSS_F32, 0}, NULL,
                                                     (kdloss_cmat){one, KDLOSS_F32, 0},
                                                     (kdloss_cmat){t, KDLOSS_F32, 0}, NULL,
                                                     (kdloss_labels){lab, KDLOSS_I64}, &co, NULL,
                                                     0) == KDLOSS_OK,
                         "nan %s: CPU fused status", what);
                kt_close(o.soft, csoft, 0, 1e-5, "nan %s: fused soft vs CPU", what);
                kt_close(dxs, cdxs, 1e-5 * gmax * 3e38, 1e-5, "nan %s: fused dxs vs CPU", what);
                /* its vocabulary-parallel form (2 ranks) against the single-process call (at
                 * T 4, every divergence on the last row: the time the simulator takes) */
                if (ti == 0 && (di == 0 || ri == 2)) {
                    float rs[1], dx[1];
                    char tag[120];
                    snprintf(tag, sizeof tag, "vp %s", what);
                    nan_vp(tag, &fp, 1, 1, 1, 3, one, s, one, t, lab, rs, dx);
                }
                /* top-k bucket with K = V: the dense loss on log_softmax(zt / T) */
                if (divs[di] == KDLOSS_DIV_FORWARD_KL) {
                    int32_t ids[3] = {0, 1, 2};
                    float lp[3], tl, ctl, tg[3], ctg[3];
                    double mt = -INFINITY, st = 0;
                    for (int j = 0; j < 3; j++) mt = fmax(mt, zt[j]);
                    for (int j = 0; j < 3; j++) st += exp((zt[j] - mt) / ts[ti]);
                    for (int j = 0; j < 3; j++) lp[j] = (float)((zt[j] - mt) / ts[ti] - log(st));
                    kdloss_topk_distill_params tp;
                    kdloss_topk_distill_params_default(&tp);
                    tp.temperature = ts[ti];
                    const kdloss_topk_teacher tk = {3, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
                    KT_CHECK(nan_tk_call(&tp, 1, 3, 3, s, ids, lp, &tl, NULL, tg) == KDLOSS_OK &&
                                 kdloss_topk_distill_logits(&tp, 1, 3, (kdloss_cmat){s, KDLOSS_F32, 0},
                                                            tk, (kdloss_labels){NULL, KDLOSS_I64},
                                                            &ctl, NULL,
                                                            (kdloss_mat){ctg, KDLOSS_F32, 0}) ==
                                     KDLOSS_OK,
                             "nan %s: topk status", what);
                    kt_close(tl, ctl, 0, 1e-5, "nan %s: topk loss vs CPU", what);
                    if (ti < 3) kt_close(tl, loss, 0, 1e-5, "nan %s: topk K = V vs dense", what);
                    double tm = 0;
                    for (int j = 0; j < 3; j++) tm = fmax(tm, fabs(ctg[j]));
                    for (int j = 0; j < 3; j++)
                        kt_close(tg[j], ctg[j], 1e-5 * tm, 0, "nan %s: topk dz[%d] vs CPU", what, j);
                }
            }
}

/* Issue 25's last CUDA items, the fused losses against the CPU functions where a gradient is 0
 * (docs/MATH.md 10; src/cpu/fld.c):
 *  (1) renorm_both without the cross-entropy's gradient on the full-vocabulary path (weight_hard_loss
 *      0 with labels and a hard_loss output, or without labels and a row_lse output; the
 *      vocabulary-parallel call always): dxs from the columns in S alone, so a NaN weight row outside
 *      every S is not read (the dxs GEMM's 0 x NaN made every dxs NaN);
 *  (2) a row whose gradient is 0 by the rules (an ignored row; a top-k row without a used slot and
 *      without the cross-entropy's gradient) and whose xs holds a NaN stays out of the dws GEMM
 *      (0 x NaN made dws NaN);
 *  (3) both gradient factors 0 (grad_scale 0, or both weights 0 with the losses asked for): zero
 *      dxs / dws / dbs without the GEMMs (a NaN weight row or xs row made them NaN), the sparse
 *      renorm_both path too.
 * Single-process calls and the vocabulary-parallel ones (2 ranks) on NB rows of fixed fp32
 * operands, against the CPU function on the same operands: every output element by element, NaN
 * where the CPU's is, within 1e-4 relative + 1e-4 of the largest finite element otherwise. */
typedef struct par_case {
    const char *tag;
    int topk, tail;          /* top-k teacher (tail: kdloss_topk_tail) or dense */
    int64_t hs, ht, v, k;    /* NB rows */
    const float *xs, *ws, *bs, *xt, *wt, *btb;
    const int32_t *ids;      /* NB x k */
    const float *lp;
    const int64_t *lab;      /* NULL: no labels (top-k) */
    double w_hard, w_soft, grad_scale, temperature;
    int want_hard, want_lse; /* hard_loss and row_hard; row_lse */
} par_case;

/* One call's outputs on the host: loss, soft, hard; row_soft, row_hard, row_lse; gradients. */
typedef struct par_res {
    float sc[3], rows[3 * NB];
    float *dxs, *dws, *dbs;
} par_res;

static kdloss_fused_linear_distill_params par_dp(const par_case *c) {
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    p.div.divergence = KDLOSS_DIV_FORWARD_KL;
    p.weight_hard_loss = c->w_hard, p.weight_soft_loss = c->w_soft;
    p.grad_scale = c->grad_scale, p.temperature = c->temperature;
    return p;
}

static kdloss_fused_linear_topk_distill_params par_tp(const par_case *c) {
    kdloss_fused_linear_topk_distill_params p;
    kdloss_fused_linear_topk_distill_params_default(&p);
    p.tail = (kdloss_topk_tail)c->tail;
    p.weight_hard_loss = c->w_hard, p.weight_soft_loss = c->w_soft;
    p.grad_scale = c->grad_scale, p.temperature = c->temperature;
    return p;
}

/* The case's outputs at sc, rows and the gradients (host or device). */
static kdloss_fused_linear_distill_out par_view(const par_case *c, float *sc, float *rows,
                                                void *dxs, void *dws, void *dbs) {
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = sc, o.soft_loss = sc + 1, o.hard_loss = c->want_hard ? sc + 2 : NULL;
    o.row_soft = rows, o.row_hard = c->want_hard ? rows + NB : NULL;
    o.row_lse = c->want_lse ? rows + 2 * NB : NULL;
    o.dxs = (kdloss_mat){dxs, KDLOSS_F32, 0};
    o.dws = (kdloss_mat){dws, KDLOSS_F32, 0};
    o.dbs = dbs;
    return o;
}

static void par_res_alloc(const par_case *c, par_res *o) {
    memset(o, 0, sizeof *o);
    o->dxs = xmalloc((size_t)(NB * c->hs) * 4);
    o->dws = xmalloc((size_t)(c->v * c->hs) * 4);
    o->dbs = xmalloc((size_t)c->v * 4);
}

static void par_res_free(par_res *o) { free(o->dxs), free(o->dws), free(o->dbs); }

static kdloss_status par_cpu(const par_case *c, par_res *o) {
    kdloss_fused_linear_distill_out out = par_view(c, o->sc, o->rows, o->dxs, o->dws, o->dbs);
    const kdloss_cmat xs = {c->xs, KDLOSS_F32, 0}, ws = {c->ws, KDLOSS_F32, 0};
    const kdloss_labels lab = {c->lab, KDLOSS_I64};
    if (c->topk) {
        const kdloss_fused_linear_topk_distill_params p = par_tp(c);
        const kdloss_topk_teacher t = {c->k, {c->ids, KDLOSS_I32, 0}, {c->lp, KDLOSS_F32, 0}};
        return kdloss_fused_linear_topk_distill(&p, NB, c->hs, c->v, xs, ws, c->bs, t, lab, &out,
                                                NULL, 0);
    }
    const kdloss_fused_linear_distill_params p = par_dp(c);
    return kdloss_fused_linear_distill(&p, NB, c->hs, c->ht, c->v, xs, ws, c->bs,
                                       (kdloss_cmat){c->xt, KDLOSS_F32, 0},
                                       (kdloss_cmat){c->wt, KDLOSS_F32, 0}, c->btb, lab, &out,
                                       NULL, 0);
}

/* The case's operands on the device, as the vocabulary-parallel harness keeps them (every
 * pointer an allocation). */
static void par_upload(const par_case *c, vp_data *d) {
    memset(d, 0, sizeof *d);
    d->xs = nan_up(c->xs, (size_t)(NB * c->hs) * 4);
    d->ws = nan_up(c->ws, (size_t)(c->v * c->hs) * 4);
    d->bs = nan_up(c->bs, (size_t)c->v * 4);
    d->xt = c->topk ? dalloc(4) : nan_up(c->xt, (size_t)(NB * c->ht) * 4);
    d->wt = c->topk ? dalloc(4) : nan_up(c->wt, (size_t)(c->v * c->ht) * 4);
    d->bt = c->topk ? dalloc(4) : nan_up(c->btb, (size_t)c->v * 4);
    d->lab = c->lab ? nan_up(c->lab, NB * 8) : dalloc(4);
    d->ids = c->topk ? nan_up(c->ids, (size_t)(NB * c->k) * 4) : dalloc(4);
    d->lp = c->topk ? nan_up(c->lp, (size_t)(NB * c->k) * 4) : dalloc(4);
}

/* The single-process CUDA call. */
static kdloss_status par_cuda(const par_case *c, par_res *o) {
    vp_data d;
    par_upload(c, &d);
    float *dsc = dalloc(3 * 4), *drows = dalloc(3 * NB * 4);
    void *ddx = dalloc((size_t)(NB * c->hs) * 4), *ddw = dalloc((size_t)(c->v * c->hs) * 4);
    void *ddb = dalloc((size_t)c->v * 4);
    dpoison(ddx, (size_t)(NB * c->hs) * 4);
    dpoison(ddw, (size_t)(c->v * c->hs) * 4);
    dpoison(ddb, (size_t)c->v * 4);
    kdloss_fused_linear_distill_out out = par_view(c, dsc, drows, ddx, ddw, ddb);
    const kdloss_cmat xs = {d.xs, KDLOSS_F32, 0}, ws = {d.ws, KDLOSS_F32, 0};
    const kdloss_labels lab = {c->lab ? d.lab : NULL, KDLOSS_I64};
    size_t wsb = 0;
    void *wk;
    kdloss_status st;
    if (c->topk) {
        const kdloss_fused_linear_topk_distill_params p = par_tp(c);
        kdloss_cuda_fused_linear_topk_distill_workspace_size(&p, NB, c->hs, c->v, c->k, KDLOSS_F32,
                                                             1, &wsb);
        wk = dalloc(wsb);
        const kdloss_topk_teacher t = {c->k, {d.ids, KDLOSS_I32, 0}, {d.lp, KDLOSS_F32, 0}};
        st = kdloss_cuda_fused_linear_topk_distill(g_ctx, g_st, &p, NB, c->hs, c->v, xs, ws, d.bs,
                                                   t, lab, &out, wk, wsb);
    } else {
        const kdloss_fused_linear_distill_params p = par_dp(c);
        kdloss_cuda_fused_linear_distill_workspace_size(&p, NB, c->hs, c->ht, c->v, KDLOSS_F32, 1,
                                                        &wsb);
        wk = dalloc(wsb);
        st = kdloss_cuda_fused_linear_distill(g_ctx, g_st, &p, NB, c->hs, c->ht, c->v, xs, ws,
                                              d.bs, (kdloss_cmat){d.xt, KDLOSS_F32, 0},
                                              (kdloss_cmat){d.wt, KDLOSS_F32, 0}, d.bt, lab, &out,
                                              wk, wsb);
    }
    nan_down(o->sc, dsc, sizeof o->sc);
    nan_down(o->rows, drows, sizeof o->rows);
    nan_down(o->dxs, ddx, (size_t)(NB * c->hs) * 4);
    nan_down(o->dws, ddw, (size_t)(c->v * c->hs) * 4);
    nan_down(o->dbs, ddb, (size_t)c->v * 4);
    CK(cudaFree(wk));
    vp_data_free(&d);
    return st;
}

/* n floats of got against want (the CPU's): NaN where want is, else within 1e-4. */
static void par_cmp1(const char *tag, const char *what, const float *got, const float *want,
                     int64_t n) {
    double *g = xmalloc((size_t)n * sizeof(double)), *w = xmalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) g[i] = got[i], w[i] = want[i];
    char name[200];
    snprintf(name, sizeof name, "nan %s: %s vs CPU", tag, what);
    cmp_arr(name, g, w, n, 1e-4 * max_abs(w, n) + 1e-30, 1e-4);
    free(g), free(w);
}

/* A call's outputs against the CPU's; dws and dbs of vocabulary rows [lo, lo + n). The loss is
 * left out without labels: there the CPU's row_hard is the row's lse (a NaN one when row_lse is
 * asked for), which its total loss adds times weight_hard_loss 0, and CUDA's is 0. */
static void par_cmp(const char *tag, const par_case *c, const par_res *got, const par_res *cpu,
                    int64_t lo, int64_t n) {
    if (c->lab) par_cmp1(tag, "loss", got->sc, cpu->sc, 1);
    par_cmp1(tag, "soft_loss", got->sc + 1, cpu->sc + 1, 1);
    par_cmp1(tag, "row_soft", got->rows, cpu->rows, NB);
    if (c->want_hard) {
        par_cmp1(tag, "hard_loss", got->sc + 2, cpu->sc + 2, 1);
        par_cmp1(tag, "row_hard", got->rows + NB, cpu->rows + NB, NB);
    }
    if (c->want_lse) par_cmp1(tag, "row_lse", got->rows + 2 * NB, cpu->rows + 2 * NB, NB);
    par_cmp1(tag, "dxs", got->dxs, cpu->dxs, NB * c->hs);
    par_cmp1(tag, "dws", got->dws, cpu->dws + lo * c->hs, n * c->hs);
    par_cmp1(tag, "dbs", got->dbs, cpu->dbs + lo, n);
}

/* The case single-process (vp 0) or on 2 ranks (vp 1; the vocabulary-parallel outputs: hard ones
 * with a dense teacher or a cross-entropy weight, as the harness's vp_view) against the CPU. */
static void par_run(const par_case *c0, int vp) {
    if (!kdloss_fused_linear_distill || !kdloss_fused_linear_topk_distill) {
        printf("nan %s: skipped (this build has no CPU functions)\n", c0->tag);
        return;
    }
    par_case c = *c0;
    if (vp) c.want_hard = c.want_lse = !c.topk || c.w_hard > 0.0;
    char tag[160];
    snprintf(tag, sizeof tag, "%s%s", c.tag, vp ? " (vp, 2 ranks)" : "");
    par_res cpu, got;
    par_res_alloc(&c, &cpu);
    par_res_alloc(&c, &got);
    KT_CHECK(par_cpu(&c, &cpu) == KDLOSS_OK, "nan %s: CPU status", tag);
    if (!vp) {
        const kdloss_status st = par_cuda(&c, &got);
        KT_CHECK(st == KDLOSS_OK, "nan %s: status %s", tag, kdloss_status_string(st));
        par_cmp(tag, &c, &got, &cpu, 0, c.v);
    } else {
        vp_case vc;
        memset(&vc, 0, sizeof vc);
        vc.tag = tag;
        vc.topk = c.topk, vc.bt = NB, vc.hs = c.hs, vc.ht = c.ht, vc.v = c.v, vc.k = c.k;
        vc.dt = KDLOSS_F32, vc.bias = 1, vc.labels = c.lab != NULL;
        vc.dp = par_dp(&c);
        vc.tp = par_tp(&c);
        vp_data d;
        par_upload(&c, &d);
        vp_job jobs[VP_MAX_RANKS];
        vp_rank ranks[VP_MAX_RANKS];
        vp_world w;
        vp_jobs_init(jobs, 2, &vc, &d);
        vp_run_ranks(jobs, 2, &w, ranks, NULL);
        for (int r = 0; r < 2; r++) {
            vp_job *j = &jobs[r];
            char rt[190];
            snprintf(rt, sizeof rt, "%s rank %d", tag, r);
            KT_CHECK(j->status == KDLOSS_OK && j->word == KDLOSS_OK, "nan %s: %s, status word %d",
                     rt, kdloss_status_string(j->status), (int)j->word);
            if (j->status == KDLOSS_OK) {
                vp_out_fetch(&j->o, &vc, j->n);
                memcpy(got.sc, j->o.sc, sizeof got.sc);
                memcpy(got.rows, j->o.rows, sizeof got.rows);
                memcpy(got.dxs, j->o.dxs, (size_t)(NB * c.hs) * 4);
                memcpy(got.dws, j->o.dws, (size_t)(j->n * c.hs) * 4);
                memcpy(got.dbs, j->o.dbs, (size_t)j->n * 4);
                par_cmp(rt, &c, &got, &cpu, j->lo, j->n);
            }
            vp_out_free(&j->o);
        }
        vp_data_free(&d);
    }
    par_res_free(&cpu);
    par_res_free(&got);
}

static void nan_zero_grad(void) {
    enum { V = 300, HS = 4, HT = 3, K = 4 };
    static float xs[NB * HS], ws[V * HS], bs[V], xt[NB * HT], wt[V * HT], btb[V], lp[NB * K];
    for (int64_t i = 0; i < NB * HS; i++) xs[i] = (float)(0.5 * sin(1.3 * (double)i + 0.2));
    for (int64_t i = 0; i < V * HS; i++) ws[i] = (float)sin(0.7 * (double)i + 1.1);
    for (int64_t i = 0; i < NB * HT; i++) xt[i] = (float)(0.5 * cos(0.9 * (double)i + 0.4));
    for (int64_t i = 0; i < V * HT; i++) wt[i] = (float)cos(0.3 * (double)i + 0.5);
    for (int64_t i = 0; i < V; i++) bs[i] = (float)(0.1 * cos((double)i)), btb[i] = (float)(0.1 * sin((double)i));
    for (int64_t i = 0; i < NB * K; i++) lp[i] = -1.0f - 0.5f * (float)(i % K);
    /* every row's S has ids on both ranks of vp_block (rank 0: columns [0, 100)); no S holds 210 */
    const int32_t ids[NB * K] = {5, 40, 150, 280, 7, 120, 199, 260, 3, 90, 230, 299};
    const int32_t ids_empty[NB * K] = {5, 40, 150, 280, -1, -1, -1, -1, 3, 90, 230, 299};
    const int64_t lab[NB] = {3, 7, 11}, lab_ign[NB] = {3, -100, 11};
    float ws_nan[V * HS], ws_nan_s[V * HS], xs_nan[NB * HS];
    memcpy(ws_nan, ws, sizeof ws);
    memcpy(ws_nan_s, ws, sizeof ws);
    memcpy(xs_nan, xs, sizeof xs);
    ws_nan[210 * HS + 1] = NAN;  /* a weight row outside every S */
    ws_nan_s[40 * HS + 2] = NAN; /* a weight row in row 0's S */
    xs_nan[1 * HS + 3] = NAN;    /* row 1's hidden state */
    const par_case base = {"", 1, KDLOSS_TAIL_RENORM_BOTH, HS, HT, V, K, xs, ws, bs, xt, wt, btb,
                           ids, lp, lab, 0.0, 1.0, 1.0, 1.5, 0, 0};
    par_case c;
    /* (1) renorm_both without the cross-entropy's gradient, a NaN weight row outside every S */
    c = base, c.tag = "(1) top-k renorm_both w_hard 0, hard_loss asked, NaN ws outside S";
    c.ws = ws_nan, c.want_hard = 1;
    par_run(&c, 0);
    c = base, c.tag = "(1) top-k renorm_both without labels, row_lse asked, NaN ws outside S";
    c.ws = ws_nan, c.lab = NULL, c.want_lse = 1;
    par_run(&c, 0);
    c = base, c.tag = "(1) top-k renorm_both w_hard 0, NaN ws outside S", c.ws = ws_nan;
    par_run(&c, 1);
    c = base, c.tag = "(1) top-k renorm_both without labels, NaN ws outside S";
    c.ws = ws_nan, c.lab = NULL;
    par_run(&c, 1);
    /* (2) a row whose gradient is 0 by the rules holds a NaN in xs */
    c = base, c.tag = "(2) dense, ignored row with NaN xs";
    c.topk = 0, c.w_hard = 0.5, c.w_soft = 0.5, c.xs = xs_nan, c.lab = lab_ign, c.want_hard = 1;
    c.want_lse = 1;
    par_run(&c, 0);
    par_run(&c, 1);
    c = base, c.tag = "(2) top-k bucket w_hard 0.5, ignored row with NaN xs";
    c.tail = KDLOSS_TAIL_BUCKET, c.w_hard = 0.5, c.xs = xs_nan, c.lab = lab_ign, c.want_hard = 1;
    par_run(&c, 0);
    par_run(&c, 1);
    c = base, c.tag = "(2) top-k bucket w_hard 0, a row without a used slot with NaN xs";
    c.tail = KDLOSS_TAIL_BUCKET, c.xs = xs_nan, c.ids = ids_empty;
    par_run(&c, 0);
    par_run(&c, 1);
    c = base, c.tag = "(2) top-k renorm_both w_hard 0, row_lse asked, a row without a used slot with "
                      "NaN xs";
    c.xs = xs_nan, c.ids = ids_empty, c.want_lse = 1;
    par_run(&c, 0);
    /* (3) both gradient factors 0: zeros, whatever the weights and hidden states hold */
    for (int gz = 0; gz < 2; gz++) {
        char t[4][120];
        const char *why = gz ? "both weights 0" : "grad_scale 0";
        c = base, c.xs = xs_nan, c.ws = ws_nan, c.topk = 0, c.lab = lab_ign, c.want_hard = 1;
        c.w_hard = gz ? 0.0 : 0.5, c.w_soft = gz ? 0.0 : 0.5, c.grad_scale = gz ? 1.0 : 0.0;
        xs_nan[0 * HS + 1] = gz ? NAN : xs[0 * HS + 1]; /* a kept row too */
        snprintf(t[0], sizeof t[0], "(3) dense, %s, NaN ws and xs", why);
        c.tag = t[0];
        par_run(&c, 0);
        par_run(&c, 1);
        c.topk = 1, c.tail = KDLOSS_TAIL_BUCKET, c.lab = lab, c.w_soft = gz ? 0.0 : 1.0;
        c.w_hard = 0.0, c.want_hard = 1;
        snprintf(t[1], sizeof t[1], "(3) top-k bucket, %s, NaN ws and xs", why);
        c.tag = t[1];
        par_run(&c, 0);
        par_run(&c, 1);
        c.tail = KDLOSS_TAIL_RENORM_BOTH, c.ws = ws_nan_s, c.want_hard = 0;
        snprintf(t[2], sizeof t[2], "(3) top-k renorm_both sparse path, %s, NaN ws in S and xs", why);
        c.tag = t[2];
        par_run(&c, 0);
        c.want_lse = 1;
        snprintf(t[3], sizeof t[3], "(3) top-k renorm_both full path, %s, NaN ws in S and xs", why);
        c.tag = t[3];
        par_run(&c, 0);
        par_run(&c, 1);
    }
    /* the NaN policy on renorm_both's sparse path: a NaN used log-prob in row 1 makes its
     * gradient NaN outside S too, so dws and dbs are NaN everywhere (the CPU's run_sparse fills
     * them; the CUDA sparse path had NaN in row 1's ids' rows only); the full path and the
     * vocabulary-parallel call as cross-checks */
    float lp_nan[NB * K];
    memcpy(lp_nan, lp, sizeof lp_nan);
    lp_nan[1 * K + 2] = NAN;
    c = base, c.tag = "top-k renorm_both sparse path, NaN log-prob in row 1", c.lp = lp_nan;
    par_run(&c, 0);
    par_run(&c, 1);
    c.tag = "top-k renorm_both full path, NaN log-prob in row 1", c.want_lse = 1;
    par_run(&c, 0);
}

static void test_nan(kt_rng *rng) {
    const int fails = kt_failures, checks = kt_checks;
    nan_logprobs(rng);
    nan_kl(rng);
    nan_logits(rng);
    nan_topk(rng);
    nan_fused(rng);
    nan_vp_cases(rng);
    nan_vp_topk(rng);
    nan_grad_scale_zero();
    nan_zero_grad();
    nan_wide();
    printf("nan: the NaN policy and wide rows, %d checks: %d failures\n", kt_checks - checks,
           kt_failures - fails);
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    g_gpu = kdloss_cuda_available();
    if (g_gpu) {
        kdloss_status s = kdloss_cuda_context_create(0, &g_ctx);
        if (s != KDLOSS_OK) {
            printf("FAIL: context create: %s\n", kdloss_status_string(s));
            return 1;
        }
        CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    }
    printf("CPU functions linked: kl %s, jsd %s, fld_jsd %s\n", kdloss_kl_div ? "yes" : "no",
           kdloss_jsd ? "yes" : "no", kdloss_fused_linear_jsd ? "yes" : "no");
    test_errors();
    if (!g_gpu) {
        printf("skipped: no CUDA device (argument checks ran)\n");
        return kt_finish("test_cuda");
    }
    /* KDLOSS_TEST_ONLY=nan: the NaN-policy section alone (a quick run while working on it) */
    const char *only = getenv("KDLOSS_TEST_ONLY");
    if (only && !strcmp(only, "nan")) {
        test_nan(&rng);
        goto end;
    }
    test_kl(&rng);
    test_jsd(&rng);
    test_fl(&rng);
    test_distill(&rng);
    test_distill_logits(&rng);
    test_fld(&rng);
    test_topk_logits(&rng);
    test_topk_fused(&rng);
    test_vp(&rng);
    test_nan(&rng);
#ifdef KDLOSS_TEST_NCCL
    test_vp_nccl(&rng);
#endif
end:
    CK(cudaStreamDestroy(g_st));
    kdloss_cuda_context_destroy(g_ctx);
#ifdef KD_SIM_CUDA
    /* on the simulator every checker report is a failure of this test (kernel, block and thread
     * were printed when it was made); the summary says which kernels and sites ran */
    KT_CHECK(kd_sim_summary() == 0, "cuda-sim: no checker report");
    {
        /* KD_SIM_NO_LT_HEURISTIC=1 (ctest test_cuda_gemmex): cuBLASLt offers no algorithm, so
         * every GEMM must have gone through gemm.cu's cublasGemmEx fallback */
        long lt = 0, ex = 0;
        const char *no_lt = getenv("KD_SIM_NO_LT_HEURISTIC");
        kd_sim_gemm_counts(&lt, &ex);
        printf("cuda-sim: %ld GEMMs through cuBLASLt, %ld through cublasGemmEx\n", lt, ex);
        if (no_lt && !strcmp(no_lt, "1")) KT_CHECK(lt == 0 && ex > 0, "cuda-sim: the fallback ran");
        else KT_CHECK(lt > 0, "cuda-sim: cuBLASLt ran");
    }
#endif
    return kt_finish("test_cuda");
}
