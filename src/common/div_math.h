/* Per-element divergence math on scalars, shared by the scalar CPU path and the CUDA kernels
 * (host and device), so the CPU tests exercise the exact formulas the GPU runs. The divergence
 * family's formulas are div_elem.h's (written once, also compiled for the SIMD layer by
 * div_simd.h); this file gives them their scalar operations and adds the KLDivLoss element. */
#ifndef KDLOSS_DIV_MATH_H
#define KDLOSS_DIV_MATH_H

#include <math.h>

#include "div_coef.h"

#ifdef __CUDACC__
#define KD_HDM static __host__ __device__ __forceinline__
#else
#define KD_HDM static inline
#endif

/* ---- the family on scalars: div_elem.h with float operations ---- */
#define KDE_T float
#define KDE_M int
#define KDE_K kd_div_coef
#define KDE(name) kd_s_##name
#define KDE_FN KD_HDM
#define KE_ADD(a, b) ((a) + (b))
#define KE_SUB(a, b) ((a) - (b))
#define KE_MUL(a, b) ((a) * (b))
#define KE_DIV(a, b) ((a) / (b))
#define KE_MIN(a, b) fminf(a, b)
#define KE_MAX(a, b) fmaxf(a, b)
#define KE_ABS(a) fabsf(a)
#define KE_NEG(a) (-(a))
#define KE_EXP(a) expf(a)
#define KE_EXP_NONPOS(a) expf(a)
#define KE_EXP_NONNAN(a) expf(a)
#define KE_EXP_IN(a) expf(a)
#define KE_NABS_MIN(a, c) (-fminf(fabsf(a), c))
#define KE_LOG1P_UNIT(a) log1pf(a)
#define KE_C(c) (c)
#define KE_GT(a, b) ((a) > (b))
#define KE_GE(a, b) ((a) >= (b))
#define KE_LT(a, b) ((a) < (b))
#define KE_SEL(m, a, b) ((m) ? (a) : (b))
#define KE_KEEP(m, a) ((m) ? (a) : 0.0f)
#include "div_elem.h"
#include "div_elem_end.h"

/* One element of the call's divergence: returns the loss term, writes dloss/dx to *grad. */
KD_HDM float kd_div_elem(const kd_div_coef *c, float x, float y, float *grad) {
    switch (c->op) {
#define KD_ELEM(E, nm) case KD_OP_##E: return kd_s_##nm(c, x, y, grad);
        KD_DIV_OPS(KD_ELEM)
#undef KD_ELEM
    }
    *grad = 0.0f;
    return 0.0f;
}

/* One element of KLDivLoss: returns the loss term, writes dloss/dy to *grad. With a log target
 * it is the family's forward KL element (t the teacher's log-prob, y the student's). */
KD_HDM float kd_kl_elem(int log_target, float eps, float y, float t, float *grad) {
    if (log_target) return kd_s_fwd(NULL, y, t, grad);
    *grad = -t;
    return t != 0.0f ? t * (logf(fmaxf(t, eps)) - y) : 0.0f;
}

#endif /* KDLOSS_DIV_MATH_H */
