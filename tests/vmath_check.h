/* Generic accuracy test of the vector exp / log / log1p / tanh (src/cpu/vmath.h), included by
 * test_vmath_vec.c (compiled once per vector ISA, its layer defined). Dense sweeps of each
 * domain (every k-th float bit pattern plus edge values) against double-precision libm; the
 * error is measured in ULPs of the correctly rounded result (or in subnormal steps below
 * FLT_MIN) and must stay within the bounds stated in vmath.h. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "simd.h"
#include "testutil.h"

/* |got - want| in units of the last place of the float nearest to want. */
static double ulp_err(float got, double want) {
    if (isnan(want)) return isnan(got) ? 0 : INFINITY;
    if (isinf(want)) return (double)got == want ? 0 : INFINITY;
    float wf = (float)want;
    if (isinf(wf)) return isinf(got) && (got > 0) == (wf > 0) ? 0 : INFINITY;
    int e;
    frexp(fabs(wf) > FLT_MIN ? wf : FLT_MIN, &e);
    double ulp = ldexp(1.0, e - 24);
    return fabs((double)got - want) / ulp;
}

typedef vf (*vfn)(vf);
typedef double (*dfn)(double);

static vf call_exp(vf x) { return vf_exp(x); }
static vf call_log(vf x) { return vf_log(x); }
static vf call_log1p(vf x) { return vf_log1p_unit(x); }
static double d_log1p(double x) { return log1p(x); }
static vf call_tanh(vf x) { return vf_tanh(x); }

/* Sweeps bit patterns [lo, hi] with stride `step` (and the edges), returns the max error. */
static double sweep(vfn f, dfn ref, uint32_t lo, uint32_t hi, uint32_t step, int sign, float *worst) {
    float in[VL], out[VL];
    double maxe = 0;
    if (kt_quick()) step *= 16; /* sanitizer builds run unoptimized */
    int k = 0;
    for (uint64_t b = lo;; b += step) {
        if (b > hi) b = hi;
        uint32_t u = (uint32_t)b | (sign ? 0x80000000u : 0);
        memcpy(&in[k++], &u, 4);
        if (k == VL || b == hi) {
            vf_store(out, f(vf_load_n(in, k)));
            for (int i = 0; i < k; i++) {
                double e = ulp_err(out[i], ref(in[i]));
                if (e > maxe) maxe = e, *worst = in[i];
            }
            k = 0;
        }
        if (b == hi) break;
    }
    return maxe;
}

static int run_vmath_checks(const char *isa) {
    float w = 0, o_th[VL];
    double e;
    /* exp: [-87.3, 88.7] normal results; (-104, -87.3) subnormal results (error in steps of 2^-149) */
    e = sweep(call_exp, exp, 0, 0x42b17217u, 37, 0, &w); /* [0, 88.72] */
    kt_close(e, 0, 2.0, 0, "%s exp max ULP on [0, 88.72] (worst at %a)", isa, w);
    e = sweep(call_exp, exp, 0, 0x42ae0000u, 37, 1, &w); /* [-87, 0] */
    kt_close(e, 0, 2.0, 0, "%s exp max ULP on [-87, 0] (worst at %a)", isa, w);
    e = sweep(call_exp, exp, 0x42ae0000u, 0x42d00000u, 1, 1, &w); /* [-104, -87]: subnormal */
    kt_close(e, 0, 1.5, 0, "%s exp max subnormal steps on [-104, -87] (worst at %a)", isa, w);
    printf("%s exp: ok\n", isa);
    /* log: every positive float class, subnormals included */
    e = sweep(call_log, log, 1, 0x7f7fffffu, 41, 0, &w);
    kt_close(e, 0, 2.0, 0, "%s log max ULP on (0, FLT_MAX] (worst at %a)", isa, w);
    e = sweep(call_log, log, 0x3f000000u, 0x40000000u, 1, 0, &w); /* dense around 1 */
    kt_close(e, 0, 2.0, 0, "%s log max ULP on [0.5, 2] (worst at %a)", isa, w);
    e = sweep(call_log1p, d_log1p, 0, 0x3f800000u, 7, 0, &w);
    kt_close(e, 0, 2.0, 0, "%s log1p_unit max ULP on [0, 1] (worst at %a)", isa, w);
    /* tanh (the softcap, logit_map.h): both signs, from 2^-40 through saturation at ~9.01 */
    for (int sg = 0; sg < 2; sg++) {
        e = sweep(call_tanh, tanh, 0x2b800000u, 0x41200000u, 3, sg, &w); /* [2^-40, 10] */
        kt_close(e, 0, 4.0, 0, "%s tanh max ULP on %s[2^-40, 10] (worst at %a)", isa,
                 sg ? "-" : "", w);
        e = sweep(call_tanh, tanh, 0x3e800000u, 0x3ec00000u, 1, sg, &w); /* [0.25, 0.375]: the seam */
        kt_close(e, 0, 4.0, 0, "%s tanh max ULP around the seam 0.3125 (worst at %a)", isa, w);
    }
    float th[6] = {INFINITY, -INFINITY, NAN, 0.0f, 1e30f, -1e30f};
    vf_store(o_th, vf_tanh(vf_load_n(th, 6)));
    KT_CHECK(o_th[0] == 1.0f && o_th[1] == -1.0f && isnan(o_th[2]) && o_th[3] == 0.0f &&
                 o_th[4] == 1.0f && o_th[5] == -1.0f,
             "%s tanh specials: %g %g %g %g %g %g", isa, o_th[0], o_th[1], o_th[2], o_th[3],
             o_th[4], o_th[5]);
    printf("%s tanh: ok\n", isa);
    /* special values */
    float sp[8] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, 1.0f, 100.0f}, o[VL];
    vf_store(o, vf_log(vf_load_n(sp, 8)));
    KT_CHECK(o[0] == -INFINITY && o[1] == -INFINITY && isnan(o[2]) && o[3] == INFINITY &&
                 isnan(o[4]) && isnan(o[5]) && o[6] == 0.0f,
             "%s log specials: %g %g %g %g %g %g %g", isa, o[0], o[1], o[2], o[3], o[4], o[5], o[6]);
    vf_store(o, vf_exp(vf_load_n(sp, 8)));
    KT_CHECK(o[0] == 1.0f && o[1] == 1.0f && o[3] == INFINITY && o[4] == 0.0f && isnan(o[5]) &&
                 o[7] == INFINITY,
             "%s exp specials: %g %g %g %g %g %g", isa, o[0], o[1], o[3], o[4], o[5], o[7]);
    /* the clamp variants the JSD uses: the same bits as vf_exp on their domains */
    int diff = 0;
    for (uint64_t b = 0; b <= 0xffffffffu && !diff; b += 4099) {
        uint32_t u = (uint32_t)b;
        float xs[VL], a[VL], r1[VL], r2[VL], r3[VL], r4[VL];
        for (int i = 0; i < VL; i++) {
            uint32_t ui = u + (uint32_t)i * 257u;
            memcpy(&xs[i], &ui, 4);
            if (isnan(xs[i])) xs[i] = 0.5f;
        }
        vf x = vf_load(xs);
        vf_store(a, vf_exp(x));
        vf_store(r1, vf_exp_nonnan(x));
        vf_store(r2, vf_exp_nonpos(vf_neg(vf_abs(x))));
        vf nm = vf_nabs_min(x, vf_set1(110.0f));
        vf_store(r3, nm);
        vf_store(r4, vf_exp_in(nm));
        for (int i = 0; i < VL; i++) {
            float an = a[i], want_nm = -fminf(fabsf(xs[i]), 110.0f), e_nm[VL];
            vf_store(o, vf_exp(vf_set1(-fabsf(xs[i]))));
            vf_store(e_nm, vf_exp(vf_set1(want_nm)));
            if (memcmp(&r1[i], &an, 4) || memcmp(&r2[i], &o[0], 4)) diff = 1, w = xs[i];
            if (memcmp(&r3[i], &want_nm, 4) || memcmp(&r4[i], &e_nm[0], 4)) diff = 2, w = xs[i];
        }
    }
    KT_CHECK(!diff, "%s vf_exp_nonnan / vf_exp_nonpos / vf_nabs_min / vf_exp_in differ from the "
             "scalar definition / vf_exp at %a (%d)", isa, w, diff);
    float nspec[4] = {NAN, -INFINITY, INFINITY, -0.0f};
    vf_store(o, vf_nabs_min(vf_load_n(nspec, 4), vf_set1(110.0f)));
    KT_CHECK(o[0] == -110.0f && o[1] == -110.0f && o[2] == -110.0f && o[3] == 0.0f,
             "%s nabs_min specials: %g %g %g %g", isa, o[0], o[1], o[2], o[3]);
    float big[6] = {INFINITY, -INFINITY, 1e38f, -1e38f, 200.0f, -200.0f};
    vf_store(o, vf_exp_nonnan(vf_load_n(big, 6)));
    KT_CHECK(o[0] == INFINITY && o[1] == 0.0f && o[2] == INFINITY && o[3] == 0.0f &&
                 o[4] == INFINITY && o[5] == 0.0f,
             "%s exp_nonnan specials: %g %g %g %g %g %g", isa, o[0], o[1], o[2], o[3], o[4], o[5]);
    vf_store(o, vf_exp_nonpos(vf_load_n(big + 1, 1)));
    KT_CHECK(o[0] == 0.0f, "%s exp_nonpos(-inf) = %g", isa, o[0]);
    float ln[2] = {NAN, 0.0f};
    vf_store(o, vf_log1p_unit(vf_load_n(ln, 2)));
    KT_CHECK(isnan(o[0]) && o[1] == 0.0f, "%s log1p_unit specials", isa);
    return kt_finish(isa);
}
