/* cuda_fp16.h of the CUDA simulator: the half type and the conversions kdloss uses, with CUDA's
 * documented results (round to nearest even; overflow to infinity; subnormals kept). */
#ifndef KD_SIM_CUDA_FP16_H
#define KD_SIM_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

typedef struct __half {
    unsigned short x;
} __half;

static inline uint32_t kd_sim_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float kd_sim_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* fp32 -> fp16 bits, round to nearest even. NaN gives CUDA's canonical 0x7fff. */
static inline unsigned short kd_sim_f2h_bits(float f) {
    uint32_t u = kd_sim_f2u(f), sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7fffu;
    if (u >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* >= 65520: rounds to inf */
    if (u < 0x33000000u) return (unsigned short)sign;                /* <= 2^-25: rounds to 0 */
    if (u < 0x38800000u) {                                           /* a subnormal half */
        uint32_t m = (u & 0x7fffffu) | 0x800000u, shift = 126u - (u >> 23);
        uint32_t k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (k & 1u))) k++;
        return (unsigned short)(sign | k);
    }
    uint32_t h = (u - 0x38000000u) >> 13, rem = u & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}

static inline float kd_sim_h2f_bits(unsigned short h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return kd_sim_u2f(sign | 0x7f800000u | (m << 13));
    if (e != 0) return kd_sim_u2f(sign | ((e + 112u) << 23) | (m << 13));
    float v = (float)m * 5.9604644775390625e-08f; /* m x 2^-24, exact */
    return sign ? -v : v;
}

static inline __half __float2half_rn(float f) {
    __half h;
    h.x = kd_sim_f2h_bits(f);
    return h;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) { return kd_sim_h2f_bits(h.x); }
static inline __half __ushort_as_half(unsigned short u) {
    __half h;
    h.x = u;
    return h;
}
static inline unsigned short __half_as_ushort(__half h) { return h.x; }

#endif
