/* Scalar conversions between fp32 and the 16-bit float formats, host and device.
 * Round-to-nearest-even, NaN stays NaN, overflow goes to infinity: the same results as the
 * hardware conversions (F16C, AVX-512, CUDA __float2half_rn / __float2bfloat16_rn). */
#ifndef KDLOSS_HALF_H
#define KDLOSS_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KD_HD static __host__ __device__ __forceinline__
#else
#define KD_HD static inline
#endif

KD_HD uint32_t kd_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

KD_HD float kd_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

KD_HD float kd_bf16_to_f32(uint16_t h) { return kd_bits_f32((uint32_t)h << 16); }

KD_HD uint16_t kd_f32_to_bf16(float f) {
    uint32_t u = kd_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

KD_HD float kd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) return kd_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / NaN */
    if (exp == 0) {
        if (man == 0) return kd_bits_f32(sign);
        /* subnormal: man * 2^-24, exact in fp32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return kd_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

KD_HD uint16_t kd_f32_to_f16(float f) {
    uint32_t u = kd_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: value / 2^-24, rounded to nearest even by the FPU */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal: +-0 */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent, round mantissa 23 -> 10 bits to nearest even */
    uint32_t r = a - 0x38000000u; /* exponent - 112 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

#endif /* KDLOSS_HALF_H */
