/* cuda_bf16.h of the CUDA simulator: the bfloat16 type and the conversions kdloss uses, with
 * CUDA's documented results (round to nearest even; NaN stays NaN). */
#ifndef KD_SIM_CUDA_BF16_H
#define KD_SIM_CUDA_BF16_H

#include "cuda_fp16.h"

typedef struct __nv_bfloat16 {
    unsigned short x;
} __nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = kd_sim_f2u(f);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.x = 0x7fffu; /* CUDA's canonical NaN */
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        b.x = (unsigned short)(u >> 16);
    }
    return b;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return kd_sim_u2f((uint32_t)b.x << 16); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
    __nv_bfloat16 b;
    b.x = u;
    return b;
}

#endif
