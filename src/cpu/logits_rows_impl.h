/* Generic vector source of the dense logits row kernel (logits_rows.h), compiled per
 * instruction set by logits_rows_avx2.c and logits_rows_avx512.c after simd.h and div_simd.h.
 * Every pass runs a row's last partial vector through the same arithmetic as its body
 * (vf_load_n / vf_store_n) and masks the lanes past the end out of every sum. */
#include <math.h>

#include "fld_rows.h" /* KD_FLD_TILE */
#include "logits_rows.h"

/* max of z[0..v): four accumulators, since one max's latency a vector would bound the pass. */
static float KD_SFX(lr_max)(const float *z, int64_t v) {
    vf m0 = vf_set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t c = 0;
    for (; c + 4 * VL <= v; c += 4 * VL) {
        m0 = vf_max(m0, vf_load(z + c));
        m1 = vf_max(m1, vf_load(z + c + VL));
        m2 = vf_max(m2, vf_load(z + c + 2 * VL));
        m3 = vf_max(m3, vf_load(z + c + 3 * VL));
    }
    for (; c + VL <= v; c += VL) m0 = vf_max(m0, vf_load(z + c));
    if (c < v) m1 = vf_max(m1, vf_select(vm_first_n(v - c), vf_load_n(z + c, v - c), m1));
    return vf_hmax(vf_max(vf_max(m0, m1), vf_max(m2, m3)));
}

/* Pass 1, the row's only read from memory: per tile of KD_FLD_TILE columns, the tile's max m_t,
 * e = exp((z - m_t) it) stored and s_t = sum e (fp32 in the tile, then double) into tmax[t],
 * tsum[t]; returns the row max. Taking the exps at the tile's own max lets one pass both read
 * the row and do its exps (the reads overlap the arithmetic), where a max pass first would
 * wait on memory with nothing to overlap; lr_norm rescales the tiles. A tile of -inf logits
 * has e = 0 (its max taken as 0). pf: the next row's bytes (pf_es a column), fetched into L2
 * meanwhile so that its own pass 1 finds them there; NULL for none. */
static float KD_SFX(lr_exps)(const float *z, float *e, int64_t v, float it, double *tmax,
                             double *tsum, const char *pf, int64_t pf_es) {
    vf vit = vf_set1(it);
    float m = -INFINITY;
    for (int64_t t0 = 0, t = 0; t0 < v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : v, c = t0;
        float mt = KD_SFX(lr_max)(z + t0, t1 - t0);
        vf base = vf_set1(mt == -INFINITY ? 0.0f : mt), acc = vf_zero();
        for (; c + VL <= t1; c += VL) {
            if (pf) _mm_prefetch(pf + c * pf_es, _MM_HINT_T1);
            vf x = vf_exp_nonpos(vf_mul(vf_sub(vf_load(z + c), base), vit));
            vf_store(e + c, x);
            acc = vf_add(acc, x);
        }
        if (c < t1) {
            vf x = vf_exp_nonpos(vf_mul(vf_sub(vf_load_n(z + c, t1 - c), base), vit));
            vf_store_n(e + c, x, t1 - c);
            acc = vf_add(acc, vf_keep(vm_first_n(t1 - c), x));
        }
        tmax[t] = mt;
        tsum[t] = (double)vf_hsum(acc);
        m = mt > m ? mt : m;
    }
    return m;
}

/* The row's normalizer from its tiles: S = sum_t s_t e^((m_t - m) it); each tile's scale
 * e^((m_t - m) it) / S replaces tsum[t] (0 for a tile of -inf logits), so a probability is
 * its stored e times its tile's scale. Returns log S. */
static double KD_SFX(lr_norm)(const double *tmax, double *tsum, int64_t ntiles, float m,
                              float it) {
    double sum = 0.0;
    for (int64_t t = 0; t < ntiles; t++) {
        double f = tmax[t] == -INFINITY ? 0.0 : exp(((double)tmax[t] - m) * it);
        tsum[t] *= f;
        sum += tsum[t];
        tsum[t] = f;
    }
    for (int64_t t = 0; t < ntiles; t++) tsum[t] /= sum;
    return log(sum);
}

/* The row's constants: X = (zs - ms) it - lss, Y = (zt - mt) it - lst; and the current tile's
 * Q = es rs, P = et rt. */
typedef struct KD_SFX(lr_c) {
    vf ms, mt, it, lss, lst, rs, rt;
} KD_SFX(lr_c);

/* Tile t's scale of the student's (who 0) or the teacher's (who 1) exps: es times it is Q. */
KD_INLINE vf KD_SFX(lr_scale)(const kd_lrow *a, int who, int64_t t) {
    return vf_set1((float)a->tiles[(2 * who + 1) * a->ntiles + t]);
}

/* One vector of pass 3 at element operation `op` (a constant once inlined). */
KD_INLINE vf KD_SFX(lr_elem)(const kd_vdiv *k, int op, const KD_SFX(lr_c) *r, vf zs, vf zt,
                             vf es, vf et, vf *g) {
    vf x = vf_sub(vf_mul(vf_sub(zs, r->ms), r->it), r->lss);
    vf y = vf_sub(vf_mul(vf_sub(zt, r->mt), r->it), r->lst);
    vf q = vf_mul(es, r->rs), p = vf_mul(et, r->rt);
    switch (op) {
#define KD_AT(E, nm) case KD_OP_##E: return kd_vpq_##nm(k, x, y, p, q, g);
        KD_DIV_OPS(KD_AT)
#undef KD_AT
    }
    *g = vf_zero();
    return vf_zero();
}

/* Pass 3 for one operation: returns the row's divergence; g over et and its sum into *sum_g.
 * g is stored also when no gradient is wanted: one instantiation per operation, so the losses
 * of a call with and without the gradient are the same bits (the compiler may contract a
 * multiply and an add into an FMA differently in two specialisations). */
KD_INLINE double KD_SFX(lr_div)(const kd_vdiv *k, int op, const KD_SFX(lr_c) *r0,
                                const kd_lrow *a, double *sum_g) {
    const float *zs = a->zs, *zt = a->zt, *es = a->es;
    float *et = a->et;
    double loss = 0.0, gsum = 0.0;
    KD_SFX(lr_c) rr = *r0, *r = &rr;
    for (int64_t t0 = 0, t = 0; t0 < a->v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = a->v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : a->v, c = t0;
        vf lacc = vf_zero(), gacc = vf_zero(), g;
        rr.rs = KD_SFX(lr_scale)(a, 0, t);
        rr.rt = KD_SFX(lr_scale)(a, 1, t);
        for (; c + VL <= t1; c += VL) {
            lacc = vf_add(lacc, KD_SFX(lr_elem)(k, op, r, vf_load(zs + c), vf_load(zt + c),
                                                vf_load(es + c), vf_load(et + c), &g));
            vf_store(et + c, g);
            gacc = vf_add(gacc, g);
        }
        if (c < t1) {
            int64_t n = t1 - c;
            vm live = vm_first_n(n);
            vf l = KD_SFX(lr_elem)(k, op, r, vf_load_n(zs + c, n), vf_load_n(zt + c, n),
                                   vf_load_n(es + c, n), vf_load_n(et + c, n), &g);
            lacc = vf_add(lacc, vf_keep(live, l));
            vf_store_n(et + c, g, n);
            gacc = vf_add(gacc, vf_keep(live, g));
        }
        loss += (double)vf_hsum(lacc);
        gsum += (double)vf_hsum(gacc);
    }
    *sum_g = gsum;
    return loss;
}

/* Pass 4: dz = gs (g - Q sum_g), Q = es times its tile's scale, g in et. */
static void KD_SFX(lr_grad)(const kd_lrow *a, double sum_g) {
    vf gs = vf_set1(a->gs), sg = vf_set1((float)sum_g);
    const float *es = a->es, *g = a->et;
    float *dz = a->dz;
    for (int64_t t0 = 0, t = 0; t0 < a->v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = a->v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : a->v, c = t0;
        vf rs = KD_SFX(lr_scale)(a, 0, t);
        for (; c + VL <= t1; c += VL) {
            vf d = vf_mul(gs, vf_sub(vf_load(g + c), vf_mul(vf_mul(vf_load(es + c), rs), sg)));
            if (a->gs == 0.0f) d = vf_zero(); /* grad_scale 0: zeros, also where a logit is NaN */
            if (a->nt) vf_stream(dz + c, d);
            else vf_store(dz + c, d);
        }
        if (c < t1) {
            int64_t n = t1 - c;
            vf d = vf_mul(gs, vf_sub(vf_load_n(g + c, n),
                                     vf_mul(vf_mul(vf_load_n(es + c, n), rs), sg)));
            if (a->gs == 0.0f) d = vf_zero();
            vf_store_n(dz + c, d, n);
        }
    }
    if (a->nt) _mm_sfence(); /* order the streamed stores before the caller reads them */
}

/* Forward KL, whose sum g = -sum P is -1 by construction (docs/MATH.md 7.4): passes 3 and 4 in
 * one, dz = gs (Q - P) = gs (g + Q). Returns the row's divergence. dz goes to a->dz, or to es
 * when no gradient is wanted, so that the loss has one instantiation (lr_div says why). */
static double KD_SFX(lr_fwd)(const kd_vdiv *k, const KD_SFX(lr_c) *r0, const kd_lrow *a) {
    const float *zs = a->zs, *zt = a->zt, *es = a->es, *et = a->et;
    float *dz = a->dz ? a->dz : a->es;
    int nt = a->dz && a->nt;
    vf gs = vf_set1(a->gs);
    double loss = 0.0;
    KD_SFX(lr_c) rr = *r0;
    for (int64_t t0 = 0, t = 0; t0 < a->v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = a->v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : a->v, c = t0;
        vf lacc = vf_zero(), g, q;
        rr.rs = KD_SFX(lr_scale)(a, 0, t);
        rr.rt = KD_SFX(lr_scale)(a, 1, t);
        for (; c + VL <= t1; c += VL) {
            vf e = vf_load(es + c);
            q = vf_mul(e, rr.rs);
            lacc = vf_add(lacc, KD_SFX(lr_elem)(k, KD_OP_FWD, &rr, vf_load(zs + c),
                                                vf_load(zt + c), e, vf_load(et + c), &g));
            vf d = a->gs == 0.0f ? vf_zero() : vf_mul(gs, vf_add(g, q));
            if (nt) vf_stream(dz + c, d);
            else vf_store(dz + c, d);
        }
        if (c < t1) {
            int64_t n = t1 - c;
            vf e = vf_load_n(es + c, n);
            q = vf_mul(e, rr.rs);
            vf l = KD_SFX(lr_elem)(k, KD_OP_FWD, &rr, vf_load_n(zs + c, n), vf_load_n(zt + c, n),
                                   e, vf_load_n(et + c, n), &g);
            lacc = vf_add(lacc, vf_keep(vm_first_n(n), l));
            vf_store_n(dz + c, a->gs == 0.0f ? vf_zero() : vf_mul(gs, vf_add(g, q)), n);
        }
        loss += (double)vf_hsum(lacc);
    }
    if (nt) _mm_sfence();
    return loss;
}

double KD_SFX(kd_logits_row)(const kd_lrow *a) {
    kd_vdiv k = kd_vdiv_make(a->coef);
    int64_t n = a->ntiles;
    double *tw = a->tiles; /* per tile: max and scale of the student, then of the teacher */
    float ms = KD_SFX(lr_exps)(a->zs, a->es, a->v, a->inv_t, tw, tw + n, a->next_s, a->next_es);
    float mt = KD_SFX(lr_exps)(a->zt, a->et, a->v, a->inv_t, tw + 2 * n, tw + 3 * n, a->next_t,
                               a->next_et);
    KD_SFX(lr_c) r;
    r.ms = vf_set1(ms);
    r.mt = vf_set1(mt);
    r.it = vf_set1(a->inv_t);
    r.lss = vf_set1((float)KD_SFX(lr_norm)(tw, tw + n, n, ms, a->inv_t));
    r.lst = vf_set1((float)KD_SFX(lr_norm)(tw + 2 * n, tw + 3 * n, n, mt, a->inv_t));
    r.rs = r.rt = vf_zero(); /* per tile, in the passes */
    double sum_g = 0.0, loss = 0.0;
    switch (k.op) { /* forward KL: its own fused pass (the constant test folds away) */
#define KD_PASS(E, nm)                                                                         \
    case KD_OP_##E:                                                                            \
        if (KD_OP_##E == KD_OP_FWD) return KD_SFX(lr_fwd)(&k, &r, a);                          \
        loss = KD_SFX(lr_div)(&k, KD_OP_##E, &r, a, &sum_g);                                   \
        break;
        KD_DIV_OPS(KD_PASS)
#undef KD_PASS
    default: break;
    }
    if (a->dz) KD_SFX(lr_grad)(a, sum_g);
    return loss;
}
