/* Generic vector row kernel of the fused-linear distillation loss (see fld_rows.h for the
 * four passes), compiled once per ISA with a vector layer (isa.h); KD_SFX names the entry
 * points per ISA.
 *
 * A row of V fp32 logits (128 KiB at V = 32768) stays in L2 between passes, so each pass is
 * bound by its exp/log count, not by memory: pass 2 costs 2 exps an element (3 with a separate
 * cross-entropy normaliser when T != 1), pass 3 1 to 3 transcendentals and a division (div_elem.h), pass 4 one
 * exp for softmax(zs/T) and one more for softmax(zs) only when T != 1.
 *
 * Every pass runs the row's last partial vector through the same arithmetic as its body
 * (vf_load_n / vf_store_n) and masks the lanes past the end out of every sum. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "div_simd.h"
#include "fld_rows.h"
#include "simd.h"

/* Adds the bias (when given) to z[0..v) in place and returns the row max. */
static float KD_SFX(fold_max)(float *z, const float *b, int64_t v) {
    vf m = vf_set1(-INFINITY);
    int64_t c = 0;
    for (; c + VL <= v; c += VL) {
        vf x = vf_load(z + c);
        if (b) {
            x = vf_add(x, vf_load(b + c));
            vf_store(z + c, x);
        }
        m = vf_max(m, x);
    }
    if (c < v) {
        int64_t k = v - c;
        vf x = vf_load_n(z + c, k);
        if (b) {
            x = vf_add(x, vf_load_n(b + c, k));
            vf_store_n(z + c, x, k);
        }
        m = vf_max(m, vf_select(vm_first_n(k), x, vf_set1(-INFINITY)));
    }
    return vf_hmax(m);
}

/* z = map(z + b) in place (logit_map.h; b may be NULL): the vector form of kd_map_z. */
KD_INLINE vf KD_SFX(map_at)(const kd_logit_map *m, vf u) {
    if (m->cap > 0.0f) return vf_mul(vf_set1(m->cap), vf_tanh(vf_mul(u, vf_set1(m->s_cap))));
    return vf_mul(vf_set1(m->scale), u);
}

static void KD_SFX(map_row)(float *z, const float *b, int64_t v, const kd_logit_map *m) {
    int64_t c = 0;
    for (; c + VL <= v; c += VL) {
        vf u = vf_load(z + c);
        if (b) u = vf_add(u, vf_load(b + c));
        vf_store(z + c, KD_SFX(map_at)(m, u));
    }
    if (c < v) {
        vf u = vf_load_n(z + c, v - c);
        if (b) u = vf_add(u, vf_load_n(b + c, v - c));
        vf_store_n(z + c, KD_SFX(map_at)(m, u), v - c);
    }
}

/* sum over the row of exp((z - m) s): fp32 vectors within a tile, double across tiles. */
static double KD_SFX(sum_exp)(const float *z, int64_t v, float m, float s) {
    vf vmax = vf_set1(m), vs = vf_set1(s);
    double sum = 0.0;
    for (int64_t t0 = 0; t0 < v; t0 += KD_FLD_TILE) {
        int64_t t1 = v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : v;
        vf acc = vf_zero();
        int64_t c = t0;
        for (; c + VL <= t1; c += VL)
            acc = vf_add(acc, vf_exp(vf_mul(vf_sub(vf_load(z + c), vmax), vs)));
        if (c < t1) {
            vf e = vf_exp(vf_mul(vf_sub(vf_load_n(z + c, t1 - c), vmax), vs));
            acc = vf_add(acc, vf_keep(vm_first_n(t1 - c), e));
        }
        sum += (double)vf_hsum(acc);
    }
    return sum;
}

/* sum_exp (the same sums in the same order, so the same bits), and into *ent the row's sum of the
 * entropy elements -e^u u at u = (z - m) s (div_simd.h's kd_v_entropy, from the same exps),
 * accumulated as the sum is: fp32 vectors within a tile, double across tiles. */
static double KD_SFX(sum_exp_ent)(const float *z, int64_t v, float m, float s, double *ent) {
    vf vmax = vf_set1(m), vs = vf_set1(s);
    double sum = 0.0, h = 0.0;
    for (int64_t t0 = 0; t0 < v; t0 += KD_FLD_TILE) {
        int64_t t1 = v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : v;
        vf acc = vf_zero(), hacc = vf_zero();
        int64_t c = t0;
        for (; c + VL <= t1; c += VL) {
            vf u = vf_mul(vf_sub(vf_load(z + c), vmax), vs), e = vf_exp(u);
            acc = vf_add(acc, e);
            hacc = vf_add(hacc, kd_v_entropy(u, e));
        }
        if (c < t1) {
            vm live = vm_first_n(t1 - c);
            vf u = vf_mul(vf_sub(vf_load_n(z + c, t1 - c), vmax), vs), e = vf_exp(u);
            acc = vf_add(acc, vf_keep(live, e));
            hacc = vf_add(hacc, vf_keep(live, kd_v_entropy(u, e)));
        }
        sum += (double)vf_hsum(acc);
        h += (double)vf_hsum(hacc);
    }
    *ent = h;
    return sum;
}

/* Row constants of the log-softmaxes: X = (zs - ms) it - lss, Y = (zt - mt) it - lst. */
typedef struct KD_SFX(rowc) {
    vf ms, mt, it, lss, lst;
} KD_SFX(rowc);

/* One vector of divergence terms at columns [c, c + VL); g is dD/dX. `op` is a constant once
 * inlined, so the switch folds away. */
KD_INLINE vf KD_SFX(div_at)(const kd_vdiv *k, int op, const KD_SFX(rowc) *r, vf zs, vf zt,
                            vf *g) {
    vf x = vf_sub(vf_mul(vf_sub(zs, r->ms), r->it), r->lss);
    vf y = vf_sub(vf_mul(vf_sub(zt, r->mt), r->it), r->lst);
    switch (op) {
#define KD_AT(E, nm) case KD_OP_##E: return kd_v_##nm(k, x, y, g);
        KD_DIV_OPS(KD_AT)
#undef KD_AT
    }
    *g = vf_zero();
    return vf_zero();
}

/* Pass 3 for one element operation (a constant once inlined): returns the row's divergence;
 * when store_g, writes g over zt and its row sum to *sum_g. */
KD_INLINE double KD_SFX(div_pass)(const kd_vdiv *k, int op, const KD_SFX(rowc) *r,
                                  const float *zs, float *zt, int64_t v, int store_g,
                                  double *sum_g) {
    double loss = 0.0, gsum = 0.0;
    for (int64_t t0 = 0; t0 < v; t0 += KD_FLD_TILE) {
        int64_t t1 = v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : v;
        vf lacc = vf_zero(), gacc = vf_zero(), g;
        int64_t c = t0;
        for (; c + VL <= t1; c += VL) {
            lacc = vf_add(lacc, KD_SFX(div_at)(k, op, r, vf_load(zs + c), vf_load(zt + c), &g));
            if (store_g) {
                vf_store(zt + c, g);
                gacc = vf_add(gacc, g);
            }
        }
        if (c < t1) {
            int64_t n = t1 - c;
            vm live = vm_first_n(n);
            vf l = KD_SFX(div_at)(k, op, r, vf_load_n(zs + c, n), vf_load_n(zt + c, n), &g);
            lacc = vf_add(lacc, vf_keep(live, l));
            if (store_g) {
                vf_store_n(zt + c, g, n);
                gacc = vf_add(gacc, vf_keep(live, g));
            }
        }
        loss += (double)vf_hsum(lacc);
        gsum += (double)vf_hsum(gacc);
    }
    *sum_g = gsum;
    return loss;
}

/* One vector of dzs: gs (g - q sum_g) + gh p with q = softmax(zs/T), p = softmax(zs). */
KD_INLINE vf KD_SFX(dz_at)(const kd_fld_rows *a, const KD_SFX(rowc) *r, vf z, vf g, vf sg,
                           vf gs, vf gh, vf lsh, int share) {
    vf d = vf_zero(), q = vf_zero();
    if (a->gs != 0.0f) {
        q = vf_exp(vf_sub(vf_mul(vf_sub(z, r->ms), r->it), r->lss));
        d = vf_mul(gs, vf_sub(g, vf_mul(q, sg)));
    }
    if (a->gh != 0.0f) {
        vf p = share ? q : vf_exp(vf_sub(vf_sub(z, r->ms), lsh));
        d = vf_add(d, vf_mul(gh, p));
    }
    return d;
}

/* Pass 4 over v columns: dzs over zs. share: softmax(zs) equals softmax(zs/T) (T = 1, q
 * computed). */
static void KD_SFX(grad_pass)(const kd_fld_rows *a, const KD_SFX(rowc) *r, float *zs,
                              const float *zt, int64_t v, double sum_g, float lsh, int share) {
    vf sg = vf_set1((float)sum_g), gs = vf_set1(a->gs), gh = vf_set1(a->gh);
    vf vlsh = vf_set1(lsh), g = vf_zero();
    int64_t c = 0;
    for (; c + VL <= v; c += VL) {
        if (a->gs != 0.0f) g = vf_load(zt + c);
        vf_store(zs + c, KD_SFX(dz_at)(a, r, vf_load(zs + c), g, sg, gs, gh, vlsh, share));
    }
    if (c < v) {
        int64_t n = v - c;
        if (a->gs != 0.0f) g = vf_load_n(zt + c, n);
        vf_store_n(zs + c, KD_SFX(dz_at)(a, r, vf_load_n(zs + c, n), g, sg, gs, gh, vlsh, share), n);
    }
}

/* One vector of the sparse teacher's gradient pass (see rest_grad). */
KD_INLINE vf KD_SFX(rest_grad_at)(vf z, float c1, vf vc1, vf m1, vf s1, vf l1, float c2, vf vc2,
                                  vf m2, vf l2) {
    vf d = vf_zero();
    if (c1 != 0.0f) d = vf_mul(vc1, vf_exp(vf_sub(vf_mul(vf_sub(z, m1), s1), l1)));
    if (c2 != 0.0f) d = vf_fmadd(vc2, vf_exp(vf_sub(vf_sub(z, m2), l2)), d);
    return d;
}

/* z = c1 exp((z - m1) s1 - l1) + c2 exp(z - m2 - l2) in place. */
static void KD_SFX(rest_grad)(float *z, int64_t v, float c1, float m1, float s1, float l1,
                              float c2, float m2, float l2) {
    vf vc1 = vf_set1(c1), vm1 = vf_set1(m1), vs1 = vf_set1(s1), vl1 = vf_set1(l1);
    vf vc2 = vf_set1(c2), vm2 = vf_set1(m2), vl2 = vf_set1(l2);
    int64_t c = 0;
    for (; c + VL <= v; c += VL)
        vf_store(z + c, KD_SFX(rest_grad_at)(vf_load(z + c), c1, vc1, vm1, vs1, vl1, c2, vc2,
                                             vm2, vl2));
    if (c < v)
        vf_store_n(z + c, KD_SFX(rest_grad_at)(vf_load_n(z + c, v - c), c1, vc1, vm1, vs1, vl1,
                                               c2, vc2, vm2, vl2), v - c);
}

/* Pass 3 of a dense row for the call's operation (one specialised loop per operation). */
static double KD_SFX(div_any)(const kd_fld_rows *a, const kd_vdiv *k, const float *zs, float *zt,
                              float ms, float mt, float lss, float lst, int store_g,
                              double *sum_g) {
    KD_SFX(rowc) r;
    r.ms = vf_set1(ms);
    r.mt = vf_set1(mt);
    r.it = vf_set1(a->inv_t);
    r.lss = vf_set1(lss);
    r.lst = vf_set1(lst);
    switch (k->op) {
#define KD_PASS(E, nm)                                                                         \
    case KD_OP_##E: return KD_SFX(div_pass)(k, KD_OP_##E, &r, zs, zt, a->v, store_g, sum_g);
        KD_DIV_OPS(KD_PASS)
#undef KD_PASS
    }
    *sum_g = 0.0;
    return 0.0;
}

/* Pass 4 of a dense row's v columns (see grad_pass). */
static void KD_SFX(grad_any)(const kd_fld_rows *a, float *zs, const float *zt, int64_t v,
                             float ms, float lss, double sum_g, float lsh, int share) {
    KD_SFX(rowc) r;
    r.ms = vf_set1(ms);
    r.it = vf_set1(a->inv_t);
    r.lss = vf_set1(lss);
    KD_SFX(grad_pass)(a, &r, zs, zt, v, sum_g, lsh, share);
}

#define PH(name) KD_SFX(ph_##name)
#define PH_CTX kd_vdiv
#define PH_FOLD_MAX KD_SFX(fold_max)
#define PH_MAP KD_SFX(map_row)
#define PH_SUM_EXP KD_SFX(sum_exp)
#define PH_SUM_EXP_ENT KD_SFX(sum_exp_ent)
#define PH_DIV KD_SFX(div_any)
#define PH_GRAD KD_SFX(grad_any)
#define PH_REST_GRAD KD_SFX(rest_grad)
#include "fld_row_phases.h"

void KD_SFX(kd_fld_rows)(const kd_fld_rows *a) {
    kd_vdiv k = kd_vdiv_make(a->coef);
    /* no parallel region at all when serial: libgomp mallocs a team for an if(0) region */
    if (ph_parallel(a)) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++)
            for (int ph = 1; ph <= 4; ph++) PH(phase)(a, &k, ph, i);
    } else {
        for (int64_t i = 0; i < a->n; i++)
            for (int ph = 1; ph <= 4; ph++) PH(phase)(a, &k, ph, i);
    }
}

void KD_SFX(kd_fld_rows_phase)(const kd_fld_rows *a, int ph) {
    kd_vdiv k = kd_vdiv_make(a->coef);
    if (ph_parallel(a)) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < a->n; i++) PH(phase)(a, &k, ph, i);
    } else {
        for (int64_t i = 0; i < a->n; i++) PH(phase)(a, &k, ph, i);
    }
}
