/* The fused losses' logit map (kdloss_logit_map, docs/MATH.md section 4): a model's last step
 * from its LM head's output u to its logits, z = softcap tanh(scale u / softcap) or scale u.
 * One definition for the scalar CPU path and the CUDA kernels (host and device); the vector
 * paths evaluate the same formula with vf_tanh (vmath.h).
 * The gradient factor dz/du = scale (1 - (z / softcap)^2) is split in two: the scale, constant,
 * is folded into the row pass's gradient factors (gs, gh); the cap's factor is taken per element
 * from z before the gradient replaces it (kd_map_dcap). */
#ifndef KDLOSS_LOGIT_MAP_H
#define KDLOSS_LOGIT_MAP_H

#include <math.h>

#include "kdloss.h"

#ifdef __CUDACC__
#define KD_HDL static __host__ __device__ __forceinline__
#else
#define KD_HDL static inline
#endif

typedef struct kd_logit_map {
    float scale;   /* s (1 when the public scale is 0) */
    float cap;     /* the softcap; 0: none */
    float s_cap;   /* s / cap: u's factor inside the tanh (0 without a cap) */
    float inv_cap; /* 1 / cap (0 without a cap) */
    int on;        /* not the identity: the row pass applies it */
} kd_logit_map;

/* The public map's scale as it is meant: 0 (a zeroed map) reads as 1. */
KD_HDL double kd_logit_map_scale(kdloss_logit_map m) { return m.scale == 0.0 ? 1.0 : m.scale; }

/* From a checked public map (kd_fld_check_params). */
KD_HDL kd_logit_map kd_logit_map_make(kdloss_logit_map m) {
    kd_logit_map r;
    double s = kd_logit_map_scale(m);
    r.scale = (float)s;
    r.cap = (float)m.softcap;
    r.s_cap = m.softcap > 0.0 ? (float)(s / m.softcap) : 0.0f;
    r.inv_cap = m.softcap > 0.0 ? (float)(1.0 / m.softcap) : 0.0f;
    r.on = r.scale != 1.0f || r.cap > 0.0f;
    return r;
}

/* z from u. A NaN stays NaN; with a cap, +-inf gives +-cap (tanh's limits, as the model). */
KD_HDL float kd_map_z(const kd_logit_map *m, float u) {
    return m->cap > 0.0f ? m->cap * tanhf(u * m->s_cap) : m->scale * u;
}

/* The cap's factor of dz/du at z: 1 - (z / cap)^2; 1 without a cap. */
KD_HDL float kd_map_dcap(const kd_logit_map *m, float z) {
    float t = z * m->inv_cap;
    return 1.0f - t * t;
}

#endif /* KDLOSS_LOGIT_MAP_H */
