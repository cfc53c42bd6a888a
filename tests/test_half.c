/* The scalar fp16 / bf16 conversions (used by the scalar path, the CUDA host code and the tail
 * of every vector row) against exact references: all 65536 fp16 values round-trip, and fp32 ->
 * fp16 / bf16 rounding matches a double-precision round-to-nearest-even (and, where the CPU has
 * F16C, the hardware conversion) on edge cases and random bit patterns. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "half.h"
#include "testutil.h"

/* Nearest-even rounding of f to a binary format with `mant` mantissa bits, exponent range
 * [emin, emax], by exact arithmetic in double. Returns the rounded value. */
static double round_ref(double f, int mant, int emin, int emax) {
    if (isnan(f) || isinf(f) || f == 0) return f;
    double a = fabs(f);
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin; /* subnormal: fixed quantum */
    double q = ldexp(1.0, e - mant);
    double r = nearbyint(a / q) * q; /* default rounding mode: ties to even */
    if (r >= ldexp(2.0 - ldexp(1.0, -mant - 1), emax)) r = INFINITY;
    return copysign(r, f);
}

static void check_value(float f) {
    uint16_t h = kd_f32_to_f16(f), b = kd_f32_to_bf16(f);
    double wh = round_ref(f, 10, -14, 15), wb = round_ref(f, 7, -126, 127);
    double gh = kd_f16_to_f32(h), gb = kd_bf16_to_f32(b);
    if (isnan(f)) {
        KT_CHECK(isnan(gh) && isnan(gb), "NaN %a must stay NaN", f);
        return;
    }
    KT_CHECK(gh == wh && signbit(gh) == signbit(wh), "f32->f16 %a: got %a want %a", f, gh, wh);
    KT_CHECK(gb == wb && signbit(gb) == signbit(wb), "f32->bf16 %a: got %a want %a", f, gb, wb);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("f16c")) {
        /* hardware conversion, without needing -mf16c for this file */
        uint16_t hw;
        float in = f;
        __asm__("vcvtps2ph $0, %1, %%xmm0\n\tvmovd %%xmm0, %%eax\n\tmovw %%ax, %0"
                : "=m"(hw)
                : "x"(in)
                : "xmm0", "eax");
        KT_CHECK(hw == h, "f32->f16 %a: 0x%04x but F16C gives 0x%04x", f, h, hw);
    }
#endif
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    /* every fp16 value converts to fp32 exactly and back to the same bits */
    for (uint32_t i = 0; i < 65536; i++) {
        float f = kd_f16_to_f32((uint16_t)i);
        int exp = (i >> 10) & 31, man = i & 1023;
        if (exp == 31 && man) {
            KT_CHECK(isnan(f), "f16 0x%04x must be NaN", i);
            continue;
        }
        double want = exp == 0 ? ldexp(man, -24) : exp == 31 ? INFINITY : ldexp(1024 + man, exp - 25);
        if (i & 0x8000) want = -want;
        KT_CHECK(f == want, "f16 0x%04x -> %a, want %a", i, f, want);
        KT_CHECK(kd_f32_to_f16(f) == i, "f16 0x%04x does not round-trip", i);
        uint16_t b = (uint16_t)i; /* every bf16 value round-trips too */
        float fb = kd_bf16_to_f32(b);
        if (!isnan(fb)) KT_CHECK(kd_f32_to_bf16(fb) == b, "bf16 0x%04x does not round-trip", i);
    }
    const float edges[] = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.9802322e-08f,
                           2.9802326e-08f, 5.9604645e-08f, 6.1035156e-05f, 6.1e-05f, 1e38f, 3.4e38f,
                           1.17549435e-38f, 1e-45f, INFINITY, -INFINITY, NAN, 1.00390625f,
                           1.01171875f, 1.0009765625f, 3.3895314e38f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) check_value(edges[i]), check_value(-edges[i]);
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)kt_next(&rng);
        float f;
        memcpy(&f, &u, 4);
        check_value(f);
    }
    return kt_finish("test_half");
}
