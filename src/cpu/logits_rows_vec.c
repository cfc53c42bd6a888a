/* Generic vector source of the dense logits row kernel (logits_rows.h), compiled once per ISA
 * with a vector layer (isa.h).
 * Every pass runs a row's last partial vector through the same arithmetic as its body
 * (vf_load_n / vf_store_n) and masks the lanes past the end out of every sum. */
#include <math.h>
#include <string.h>

#include "div_simd.h"
#include "fld_rows.h" /* KD_FLD_TILE */
#include "half.h"
#include "logits_rows.h"
#include "row_special.h"
#include "simd_tile.h"

/* 1: a step runs pass 1 and the last pass column by column (the tile's reads and writes mixed
 * finest, best with AVX-512's 32 registers); 0: per tile, pass 1 stream by stream, then the last
 * pass. AVX2 interleaves only at T = 1 (lr_tile): with its 16 registers the interleaved loop
 * spills once 1/T takes one, and T = 1 frees it (BENCHMARKS.md has both). */
#ifdef KD_LAYER_AVX512
#define KD_LR_INTERLEAVE 1
#else
#define KD_LR_INTERLEAVE 0
#endif

/* The vector of p at column c: n live lanes (full: n = VL), the rest 0. */
KD_INLINE vf KD_SFX(lr_ld)(const float *p, int64_t c, int64_t n, int full) {
    return full ? vf_load(p + c) : vf_load_n(p + c, n);
}

/* v times 1/T, the multiply left out when unit (T = 1; a constant once inlined): a multiply by 1
 * is exact, so the specialisation gives the same bits with two to four fewer operations an
 * element (pass 1's two exponents, the last passes' X and Y). */
KD_INLINE vf KD_SFX(lr_mul_it)(vf v, vf it, int unit) { return unit ? v : vf_mul(v, it); }

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

/* Pass 1's max of tile [t0, t1) of row x (dtype dt, es bytes a column): fp32 read in place,
 * narrower widened into w (the row's fp32 view) first, so that the rest of pass 1 and pass 3
 * read fp32 (the widened tile is in L1 for pass 1). */
KD_INLINE float KD_SFX(lr_tile_max)(const char *x, kdloss_dtype dt, int64_t es, float *w,
                                    int64_t t0, int64_t t1) {
    return KD_SFX(lr_max)(load_tile(x + t0 * es, dt, t1 - t0, w + t0), t1 - t0);
}

/* Pass 1, one vector at column c of a tile whose max is base: e = exp((z - base) it) stored,
 * returned with the lanes past the row's end (n live; full: n = VL) as 0. */
KD_INLINE vf KD_SFX(lr_e)(const float *z, float *e, int64_t c, int64_t n, int full, vf base,
                          vf it, int unit) {
    vf x = vf_exp_nonpos(KD_SFX(lr_mul_it)(vf_sub(KD_SFX(lr_ld)(z, c, n, full), base), it, unit));
    if (full) {
        vf_store(e + c, x);
        return x;
    }
    vf_store_n(e + c, x, n);
    return vf_keep(vm_first_n(n), x);
}

/* Fetches what pass 1 reads pf_off columns after column c of one of row a's logits (x, es
 * bytes a column; nxt: the same logits of the next row): in x while that lies inside the row,
 * in nxt past its end. */
KD_INLINE void KD_SFX(lr_prefetch)(const kd_lrow *a, const char *x, const char *nxt, int64_t es,
                                   int64_t c) {
    int64_t f = c + a->pf_off;
    if (f < a->v) _mm_prefetch(x + f * es, _MM_HINT_T0);
    else if (nxt) _mm_prefetch(nxt + (f - a->v) * es, _MM_HINT_T0);
}

/* Pass 1 over tile [t0, t1) of the student's (who 0) or the teacher's (who 1) logits of row a,
 * its max base: the exps stored, their sum returned (as lanes). */
KD_INLINE vf KD_SFX(lr_pass1)(const kd_lrow *a, int who, int64_t t0, int64_t t1, vf base,
                              vf it, int unit) {
    const float *z = who ? a->zt : a->zs;
    float *e = who ? a->et : a->es;
    const char *x = who ? a->xt : a->xs, *nxt = who ? a->next_t : a->next_s;
    int64_t es = who ? a->tes : a->xes, c = t0;
    vf acc = vf_zero();
    for (; c + VL <= t1; c += VL) {
        KD_SFX(lr_prefetch)(a, x, nxt, es, c);
        acc = vf_add(acc, KD_SFX(lr_e)(z, e, c, VL, 1, base, it, unit));
    }
    if (c < t1) acc = vf_add(acc, KD_SFX(lr_e)(z, e, c, t1 - c, 0, base, it, unit));
    return acc;
}

/* Writes d, a vector of the gradient at column c (n live; full: n = VL), in the gradient's
 * dtype (fp32 streamed when a->nt); over es when no gradient is wanted (lr_fused_vec). */
KD_INLINE void KD_SFX(lr_put)(const kd_lrow *a, vf d, int64_t c, int64_t n, int full) {
    if (!a->dz || a->xdt == KDLOSS_F32) {
        float *p = a->dz ? (float *)a->dz + c : a->es + c;
        if (!full) vf_store_n(p, d, n);
        else if (a->dz && a->nt) vf_stream(p, d);
        else vf_store(p, d);
        return;
    }
    uint16_t *h = (uint16_t *)a->dz + c, b[VL];
    if (a->xdt == KDLOSS_BF16) vf_store_bf16(full ? h : b, d);
    else vf_store_f16(full ? h : b, d);
    if (!full) memcpy(h, b, (size_t)n * sizeof *b);
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

/* One vector of pass 3 at element operation `op` (op, unit and ent: constants once inlined);
 * when ent, the student's entropy elements -Q X into *h (div_elem.h's KDE(entropy), 0 where
 * Q = es rs is: es is 0 there, rs > 0). */
KD_INLINE vf KD_SFX(lr_elem)(const kd_vdiv *k, int op, int unit, int ent,
                             const KD_SFX(lr_c) *r, vf zs, vf zt, vf es, vf et, vf *g, vf *h) {
    vf x = vf_sub(KD_SFX(lr_mul_it)(vf_sub(zs, r->ms), r->it, unit), r->lss);
    vf y = vf_sub(KD_SFX(lr_mul_it)(vf_sub(zt, r->mt), r->it, unit), r->lst);
    vf q = vf_mul(es, r->rs), p = vf_mul(et, r->rt);
    /* -Q X as -es (rs X): q's product keeps only the divergence's uses, so that the compiler
     * contracts the loss's multiply-adds as it does without the entropy (the same loss bits) */
    if (ent) *h = kd_v_entropy(vf_mul(r->rs, x), es);
    switch (op) {
#define KD_AT(E, nm) case KD_OP_##E: return kd_vpq_##nm(k, x, y, p, q, g);
        KD_DIV_OPS(KD_AT)
#undef KD_AT
    }
    *g = vf_zero();
    return vf_zero();
}

/* Pass 3, one vector at column c (n live lanes; full: n = VL): returns the terms and g into *g
 * (both 0 past the row's end); g stored over et. */
KD_INLINE vf KD_SFX(lr_div_vec)(const kd_vdiv *k, int op, int unit, int ent,
                                const KD_SFX(lr_c) *r, const kd_lrow *a, int64_t c, int64_t n,
                                int full, vf *g, vf *h) {
    vf l = KD_SFX(lr_elem)(k, op, unit, ent, r, KD_SFX(lr_ld)(a->zs, c, n, full),
                           KD_SFX(lr_ld)(a->zt, c, n, full), KD_SFX(lr_ld)(a->es, c, n, full),
                           KD_SFX(lr_ld)(a->et, c, n, full), g, h);
    if (full) {
        vf_store(a->et + c, *g);
        return l;
    }
    vf_store_n(a->et + c, *g, n);
    vm live = vm_first_n(n);
    *g = vf_keep(live, *g);
    if (ent) *h = vf_keep(live, *h);
    return vf_keep(live, l);
}

/* Pass 3 for one operation: returns the row's divergence; g over et and its sum into *sum_g.
 * g is stored also when no gradient is wanted: one instantiation per operation, so the losses
 * of a call with and without the gradient are the same bits (the compiler may contract a
 * multiply and an add into an FMA differently in two specialisations). */
KD_INLINE double KD_SFX(lr_div)(const kd_vdiv *k, int op, int unit, int ent,
                                const KD_SFX(lr_c) *r0, const kd_lrow *a, double *sum_g,
                                double *ent_sum) {
    double loss = 0.0, gsum = 0.0, hsum = 0.0;
    KD_SFX(lr_c) r = *r0;
    for (int64_t t0 = 0, t = 0; t0 < a->v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = a->v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : a->v, c = t0;
        vf lacc = vf_zero(), gacc = vf_zero(), hacc = vf_zero(), g, h = vf_zero();
        r.rs = KD_SFX(lr_scale)(a, 0, t);
        r.rt = KD_SFX(lr_scale)(a, 1, t);
        for (; c + VL <= t1; c += VL) {
            lacc = vf_add(lacc, KD_SFX(lr_div_vec)(k, op, unit, ent, &r, a, c, VL, 1, &g, &h));
            gacc = vf_add(gacc, g);
            if (ent) hacc = vf_add(hacc, h);
        }
        if (c < t1) {
            lacc = vf_add(lacc,
                          KD_SFX(lr_div_vec)(k, op, unit, ent, &r, a, c, t1 - c, 0, &g, &h));
            gacc = vf_add(gacc, g);
            if (ent) hacc = vf_add(hacc, h);
        }
        loss += (double)vf_hsum(lacc);
        gsum += (double)vf_hsum(gacc);
        if (ent) hsum += (double)vf_hsum(hacc);
    }
    *sum_g = gsum;
    *ent_sum = hsum;
    return loss;
}

/* Forward KL's last pass, whose S = sum g = -sum P is -1 by construction (docs/MATH.md 7.4),
 * one vector at column c (n live lanes; full: n = VL): passes 3 and 4 in one, dz = gs (g - Q S)
 * = gs (g + Q). Returns the terms (0 past the row's end). dz goes to a->dz or, when no gradient
 * is wanted, over es, so that the loss has one instantiation (lr_div says why). */
KD_INLINE vf KD_SFX(lr_fused_vec)(const kd_vdiv *k, int op, int unit, int ent,
                                  const KD_SFX(lr_c) *r, const kd_lrow *a, vf gs, int64_t c,
                                  int64_t n, int full, vf *h) {
    vf e = KD_SFX(lr_ld)(a->es, c, n, full), g;
    vf l = KD_SFX(lr_elem)(k, op, unit, ent, r, KD_SFX(lr_ld)(a->zs, c, n, full),
                           KD_SFX(lr_ld)(a->zt, c, n, full), e, KD_SFX(lr_ld)(a->et, c, n, full),
                           &g, h);
    vf d = a->gs == 0.0f ? vf_zero() : vf_mul(gs, vf_add(g, vf_mul(e, r->rs)));
    KD_SFX(lr_put)(a, d, c, n, full);
    if (full) return l;
    if (ent) *h = vf_keep(vm_first_n(n), *h);
    return vf_keep(vm_first_n(n), l);
}

/* Pass 4 of the other operations, one vector at column c: dz = gs (g - Q S), g in et (pass
 * 3's), S = sg. gs 0 writes zeros, also where a logit is NaN. */
KD_INLINE void KD_SFX(lr_grad_vec)(const kd_lrow *a, vf rs, vf gs, vf sg, int64_t c, int64_t n,
                                   int full) {
    vf g = KD_SFX(lr_ld)(a->et, c, n, full), e = KD_SFX(lr_ld)(a->es, c, n, full);
    KD_SFX(lr_put)(a, a->gs == 0.0f ? vf_zero()
                                    : vf_mul(gs, vf_sub(g, vf_mul(vf_mul(e, rs), sg))),
                   c, n, full);
}

/* One column vector of a step's tile (lr_tile): pass 1 of row nx and the last pass of row d. */
typedef struct KD_SFX(lr_acc) {
    vf as, at, lacc, hacc; /* nx's exp sums; d's terms and (forward KL, ent) entropy terms */
} KD_SFX(lr_acc);

KD_INLINE void KD_SFX(lr_col)(const kd_vdiv *k, int op, int unit, int ent, int fused,
                              const kd_lrow *d,
                              const KD_SFX(lr_c) *rc, vf gs, vf sg, const kd_lrow *nx, vf bs,
                              vf bt, vf it, int64_t c, int64_t n, int full, KD_SFX(lr_acc) *s) {
    if (nx) {
        KD_SFX(lr_prefetch)(nx, nx->xs, nx->next_s, nx->xes, c);
        KD_SFX(lr_prefetch)(nx, nx->xt, nx->next_t, nx->tes, c);
        s->as = vf_add(s->as, KD_SFX(lr_e)(nx->zs, nx->es, c, n, full, bs, it, unit));
        s->at = vf_add(s->at, KD_SFX(lr_e)(nx->zt, nx->et, c, n, full, bt, it, unit));
    }
    if (fused) {
        vf h = vf_zero();
        s->lacc = vf_add(s->lacc,
                         KD_SFX(lr_fused_vec)(k, op, unit, ent, rc, d, gs, c, n, full, &h));
        if (ent) s->hacc = vf_add(s->hacc, h);
    } else if (d && d->dz) KD_SFX(lr_grad_vec)(d, rc->rs, gs, sg, c, n, full);
}

/* Tile t = [t0, t1) of one step at operation op (a constant once inlined): pass 1 of row nx
 * (may be NULL) interleaved with the last pass of row d (may be NULL; rc its constants, sg its
 * S), so that one row's gradient writes and the next row's reads share the memory system, as in
 * a STREAM add, where one row after the other would leave it idle in turns. Stores nx's exps and
 * the tile's max and sum (at the max). Returns d's terms of the tile for forward KL (pass 3 gave
 * the others'). */
KD_INLINE double KD_SFX(lr_tile)(const kd_vdiv *k, int op, int unit, int ent, const kd_lrow *d,
                                 KD_SFX(lr_c) *rc, double sg, kd_lrow *nx, int64_t t, int64_t t0,
                                 int64_t t1, double *ent_sum) {
    int fused = d && op == KD_OP_FWD;
    vf it = vf_set1((nx ? nx : d)->inv_t), bs = vf_zero(), bt = vf_zero();
    vf gs = vf_set1(d ? d->gs : 0.0f), vsg = vf_set1((float)sg);
    KD_SFX(lr_acc) acc = {vf_zero(), vf_zero(), vf_zero(), vf_zero()};
    float ms = 0.0f, mt = 0.0f;
    if (nx) {
        ms = KD_SFX(lr_tile_max)(nx->xs, nx->xdt, nx->xes, (float *)nx->zs, t0, t1);
        mt = KD_SFX(lr_tile_max)(nx->xt, nx->tdt, nx->tes, (float *)nx->zt, t0, t1);
        bs = vf_set1(ms == -INFINITY ? 0.0f : ms); /* a tile of -inf logits: e = 0 */
        bt = vf_set1(mt == -INFINITY ? 0.0f : mt);
    }
    if (d) {
        rc->rs = KD_SFX(lr_scale)(d, 0, t);
        rc->rt = KD_SFX(lr_scale)(d, 1, t);
    }
    int il = KD_LR_INTERLEAVE || unit; /* a constant once inlined */
    const kd_lrow *cn = il ? nx : NULL; /* nx's part of the column loop */
    if (!il && nx) { /* pass 1 stream by stream, then d's columns */
        acc.as = KD_SFX(lr_pass1)(nx, 0, t0, t1, bs, it, unit);
        acc.at = KD_SFX(lr_pass1)(nx, 1, t0, t1, bt, it, unit);
    }
    int64_t c = t0;
    for (; c + VL <= t1; c += VL)
        KD_SFX(lr_col)(k, op, unit, ent, fused, d, rc, gs, vsg, cn, bs, bt, it, c, VL, 1, &acc);
    if (c < t1)
        KD_SFX(lr_col)(k, op, unit, ent, fused, d, rc, gs, vsg, cn, bs, bt, it, c, t1 - c, 0,
                       &acc);
    if (nx) {
        int64_t nt = nx->ntiles;
        nx->tiles[t] = ms;
        nx->tiles[nt + t] = (double)vf_hsum(acc.as);
        nx->tiles[2 * nt + t] = mt;
        nx->tiles[3 * nt + t] = (double)vf_hsum(acc.at);
        nx->ms = ms > nx->ms ? ms : nx->ms;
        nx->mt = mt > nx->mt ? mt : nx->mt;
    }
    if (fused && ent) *ent_sum += (double)vf_hsum(acc.hacc);
    return fused ? (double)vf_hsum(acc.lacc) : 0.0;
}

/* Row a's constants from its pass 1 (a->ms, mt, lss, lst; the tile scales per tile). */
static KD_SFX(lr_c) KD_SFX(lr_consts)(const kd_lrow *a) {
    KD_SFX(lr_c) r;
    r.ms = vf_set1(a->ms);
    r.mt = vf_set1(a->mt);
    r.it = vf_set1(a->inv_t);
    r.lss = vf_set1(a->lss);
    r.lst = vf_set1(a->lst);
    r.rs = r.rt = vf_zero(); /* per tile, in the passes */
    return r;
}

/* One step at operation op (op, unit, ent: constants once inlined): d's pass 3 (but for
 * forward KL), then the tiles, then nx's norms; d's entropy into d->h when ent. */
KD_INLINE double KD_SFX(lr_step)(const kd_vdiv *k, int op, int unit, int ent, kd_lrow *d,
                                 kd_lrow *nx) {
    const kd_lrow *a = d ? d : nx;
    KD_SFX(lr_c) rc;
    memset(&rc, 0, sizeof rc);
    double loss = 0.0, sg = 0.0, h = 0.0;
    if (d) {
        rc = KD_SFX(lr_consts)(d);
        if (op != KD_OP_FWD) /* fwd KL: S = -1 */
            loss = KD_SFX(lr_div)(k, op, unit, ent, &rc, d, &sg, &h);
    }
    if (nx) nx->ms = nx->mt = -INFINITY;
    for (int64_t t0 = 0, t = 0; t0 < a->v; t0 += KD_FLD_TILE, t++) {
        int64_t t1 = a->v - t0 > KD_FLD_TILE ? t0 + KD_FLD_TILE : a->v;
        loss += KD_SFX(lr_tile)(k, op, unit, ent, d, &rc, sg, nx, t, t0, t1, &h);
    }
    if (d && ent) d->h = h;
    if (d && d->dz && d->nt) _mm_sfence(); /* order the streamed stores before the caller reads */
    if (nx) {
        int64_t n = nx->ntiles;
        nx->lss = (float)KD_SFX(lr_norm)(nx->tiles, nx->tiles + n, n, nx->ms, nx->inv_t);
        nx->lst = (float)KD_SFX(lr_norm)(nx->tiles + 2 * n, nx->tiles + 3 * n, n, nx->mt,
                                         nx->inv_t);
    }
    return loss;
}

/* A row the fast passes cannot serve (row_special.h), after its pass 1: logits spanning more
 * than FLT_MAX (a maximum >= KD_ROW_WIDE), or a NaN normalizer (a NaN or +inf logit: the NaN
 * policy). One compare a row. */
static int KD_SFX(lr_special)(const kd_lrow *a) {
    return kd_row_wide(a->ms) || kd_row_wide(a->mt) || isnan(a->lss) || isnan(a->lst);
}

/* The student's entropy of a row in the careful form (docs/MATH.md sections 10, 12): -sum Q X
 * over X = kd_wide_lp (the log-probs kd_wide_div uses), div_math.h's element; NaN with lss. */
static double KD_SFX(lr_special_entropy)(const float *zs, int64_t v, double ms, double it,
                                         double lss) {
    double h = 0.0;
    for (int64_t c = 0; c < v; c++) {
        float x = kd_wide_lp(zs[c], ms, it, lss);
        h += (double)kd_s_entropy(x, expf(x));
    }
    return isnan(lss) ? NAN : h;
}

/* Row a's last passes in the careful form (row_special.h), on its fp32 views zs, zt (pass 1
 * widened narrower logits into them): normalizers, divergence and g (over et) in double-formed
 * log-probs, then dz (through es when narrower, then narrowed). Returns the row's divergence,
 * NaN (and an all-NaN gradient) when a normalizer is. */
static double KD_SFX(lr_special_row)(kd_lrow *a) {
    double it = (double)a->inv_t, ms = a->ms, mt = a->mt, sg;
    double lss = log(kd_wide_sum_exp(a->zs, a->v, ms, it));
    double lst = log(kd_wide_sum_exp(a->zt, a->v, mt, it));
    double loss = kd_wide_div(&a->coef, a->zs, a->zt, a->et, a->v, ms, mt, it, lss, lst, &sg);
    if (isnan(lss) || isnan(lst)) loss = sg = NAN;
    if (a->ent) a->h = KD_SFX(lr_special_entropy)(a->zs, a->v, ms, it, lss);
    if (!a->dz) return loss;
    float *f = a->xdt == KDLOSS_F32 ? (float *)a->dz : a->es;
    for (int64_t c = 0; c < a->v; c++) /* in place: zs[c] is read before f[c] is written */
        f[c] = kd_wide_dz(a->zs[c], a->et[c], ms, it, lss, sg, a->gs, 0.0f, 0.0, 0);
    if (a->xdt == KDLOSS_BF16)
        for (int64_t c = 0; c < a->v; c++) ((uint16_t *)a->dz)[c] = kd_f32_to_bf16(f[c]);
    else if (a->xdt == KDLOSS_F16)
        for (int64_t c = 0; c < a->v; c++) ((uint16_t *)a->dz)[c] = kd_f32_to_f16(f[c]);
    return loss;
}

/* The fast passes of kd_logits_step (a, d or nx, not NULL). A function of its own, not the
 * step calling itself: unoptimized builds (the fuzzer's -O0 + ASan) give the switch's inlined
 * lr_step instances one stack frame of several MiB, and two nested would overflow the stack. */
static double KD_SFX(lr_fast)(const kd_lrow *a, kd_lrow *d, kd_lrow *nx) {
    kd_vdiv k = kd_vdiv_make(a->coef);
    int unit = a->inv_t == 1.0f; /* T = 1: its own instantiation (lr_mul_it) */
    /* the entropy: its own instantiation, so that a call without it runs the code it always did */
    int ent = d && d->ent;
    switch (k.op) {
#define KD_STEP(E, nm)                                                                         \
    case KD_OP_##E:                                                                            \
        if (ent)                                                                               \
            return unit ? KD_SFX(lr_step)(&k, KD_OP_##E, 1, 1, d, nx)                          \
                        : KD_SFX(lr_step)(&k, KD_OP_##E, 0, 1, d, nx);                         \
        return unit ? KD_SFX(lr_step)(&k, KD_OP_##E, 1, 0, d, nx)                              \
                    : KD_SFX(lr_step)(&k, KD_OP_##E, 0, 0, d, nx);
        KD_DIV_OPS(KD_STEP)
#undef KD_STEP
    default: return 0.0;
    }
}

double KD_SFX(kd_logits_step)(kd_lrow *d, kd_lrow *nx) {
    const kd_lrow *a = d ? d : nx;
    if (!a) return 0.0;
    if (d && KD_SFX(lr_special)(d)) { /* d alone, then nx's pass 1 alone */
        double l = KD_SFX(lr_special_row)(d);
        if (nx) KD_SFX(lr_fast)(nx, NULL, nx);
        return l;
    }
    return KD_SFX(lr_fast)(a, d, nx);
}
