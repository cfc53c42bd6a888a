/* Tiles of a row in any float dtype as fp32 and back, on vectors (the SIMD layer's bf16 / fp16
 * conversions, scalar ones for the tail); for the generic vector sources, after simd.h. */
#ifndef KDLOSS_SIMD_TILE_H
#define KDLOSS_SIMD_TILE_H

#include "half.h"
#include "simd.h"

/* Row segment of n elements of dt as fp32: the data itself for F32, else converted into buf. */
KD_INLINE const float *load_tile(const char *src, kdloss_dtype dt, int64_t n, float *buf) {
    if (dt == KDLOSS_F32) return (const float *)src;
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    if (dt == KDLOSS_BF16) {
        for (; i + VL <= n; i += VL) vf_store(buf + i, vf_load_bf16(h + i));
        for (; i < n; i++) buf[i] = kd_bf16_to_f32(h[i]);
    } else {
        for (; i + VL <= n; i += VL) vf_store(buf + i, vf_load_f16(h + i));
        for (; i < n; i++) buf[i] = kd_f16_to_f32(h[i]);
    }
    return buf;
}

/* n fp32 values of buf into dst of dt (BF16 or F16), rounded to nearest even. */
KD_INLINE void store_tile(char *dst, kdloss_dtype dt, const float *buf, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    int64_t i = 0;
    if (dt == KDLOSS_BF16) {
        for (; i + VL <= n; i += VL) vf_store_bf16(h + i, vf_load(buf + i));
        for (; i < n; i++) h[i] = kd_f32_to_bf16(buf[i]);
    } else {
        for (; i + VL <= n; i += VL) vf_store_f16(h + i, vf_load(buf + i));
        for (; i < n; i++) h[i] = kd_f32_to_f16(buf[i]);
    }
}

#endif
