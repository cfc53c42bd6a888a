/* Generic vector source of the KL and divergence-family row kernels, compiled once per ISA with
 * a vector layer (isa.h; the build defines KD_ISA_NAME and the layer). The arithmetic is
 * div_simd.h's; this file only walks a row in tiles:
 *   load tile (fp32 in place, or bf16/fp16 converted into a stack buffer)
 *   -> elementwise loss + gradient, lane sums in fp32 -> tile sum into a double
 *   -> gradient stored scaled (fp32 in place, or through a buffer converted with RNE).
 * In-place use (grad == input) is safe: every element is read before it is written. */
#include <string.h>

#include "div_simd.h"
#include "elementwise.h"
#include "simd_tile.h"

/* One tile of n elements: a = x tile, b = t tile, gd = gradient tile or NULL, ed = elementwise
 * loss tile or NULL. ELEM(k, a, b, &g) yields the loss vector and the raw gradient. Tail lanes
 * run the same arithmetic on zeros and are masked out of the sum. ck sums (a + b) 2^-100 per lane
 * (two FMAs a vector; the scale keeps finite inputs from overflowing it): NaN or +inf there flags
 * an input NaN or +inf (the NaN policy, kd_poisoned), which the element functions' weight masks
 * may otherwise drop. */
#define KD_CKS vf_set1(0x1p-100f)
#define KD_TILE_LOOP(ELEM, PF)                                                                 \
    do {                                                                                       \
        int64_t i = 0;                                                                         \
        for (; i + VL <= n; i += VL) {                                                         \
            PF;                                                                                \
            vf va = vf_load(a + i), vb = vf_load(b + i), gr;                                   \
            ck = vf_fmadd(vb, KD_CKS, vf_fmadd(va, KD_CKS, ck));                        \
            vf l = ELEM(k, va, vb, &gr);                                                       \
            acc = vf_add(acc, l);                                                              \
            if (ed) vf_store(ed + i, l);                                                       \
            if (gd) {                                                                          \
                if (nt) vf_stream(gd + i, vf_mul(gr, sc));                                      \
                else vf_store(gd + i, vf_mul(gr, sc));                                          \
            }                                                                                  \
        }                                                                                      \
        if (i < n) {                                                                           \
            int64_t rem = n - i;                                                               \
            vf va = vf_load_n(a + i, rem), vb = vf_load_n(b + i, rem), gr;                     \
            ck = vf_fmadd(vb, KD_CKS, vf_fmadd(va, KD_CKS, ck));                        \
            vf l = ELEM(k, va, vb, &gr);                                                       \
            acc = vf_add(acc, vf_keep(vm_first_n(rem), l));                                    \
            if (ed) vf_store_n(ed + i, l, rem);                                                \
            if (gd) vf_store_n(gd + i, vf_mul(gr, sc), rem);                                   \
        }                                                                                      \
    } while (0)

/* The KL tiles (elementwise loss output, eps) prefetch the next tile like the family's below. */
#define KD_TILE_FN(name, ELEM)                                                                 \
    static vf name(const float *a, const float *b, float *gd, float *ed, int64_t n, vf sc,    \
                   const kd_vdiv *k, vf eps, int nt, const char *pfa, const char *pfb,        \
                   int64_t es_a, int64_t es_b, vf *ckp) {                                      \
        vf acc = vf_zero(), ck = *ckp;                                                         \
        (void)k;                                                                               \
        (void)eps;                                                                             \
        KD_TILE_LOOP(ELEM, (_mm_prefetch(pfa + i * es_a, _MM_HINT_T0),                         \
                            _mm_prefetch(pfb + i * es_b, _MM_HINT_T0)));                       \
        *ckp = ck;                                                                             \
        return acc;                                                                            \
    }

/* The JSD's per-element math is heavy enough that the core stops requesting the next lines in
 * time when it waits for the hardware prefetcher alone: the loads of the next tile are issued
 * while this one computes (pfa / pfb: the next tile's source bytes, es_a / es_b bytes per
 * element; for bf16 / fp16 sources that is the only overlap, since load_tile converts a tile at
 * once). Prefetches never fault, also past the end of the data. */
#define KD_TILE_FN_PF(name, ELEM)                                                              \
    static vf name(const float *a, const float *b, float *gd, int64_t n, vf sc,               \
                   const kd_vdiv *k, int nt, const char *pfa, const char *pfb, int64_t es_a,  \
                   int64_t es_b, vf *ckp) {                                                    \
        vf acc = vf_zero(), ck = *ckp;                                                         \
        float *ed = NULL;                                                                      \
        (void)k;                                                                               \
        KD_TILE_LOOP(ELEM, (_mm_prefetch(pfa + i * es_a, _MM_HINT_T0),                         \
                            _mm_prefetch(pfb + i * es_b, _MM_HINT_T0)));                       \
        *ckp = ck;                                                                             \
        return acc;                                                                            \
    }

#define KL_PROB(k, y, t, g) kd_vkl_prob(y, t, eps, g)
#define KL_PROB_NORMAL(k, y, t, g) kd_vkl_prob_normal(y, t, eps, g)
#define KL_LOG kd_v_fwd /* KL to a log target is the family's forward KL element */
/* one tile function per element operation of the family (div_coef.h): tile_fwd, tile_rev, ... */
#define KD_DIV_TILE(E, nm) KD_TILE_FN_PF(tile_##nm, kd_v_##nm)
KD_DIV_OPS(KD_DIV_TILE)
#undef KD_DIV_TILE
KD_TILE_FN(tile_kl_prob, KL_PROB)
KD_TILE_FN(tile_kl_prob_normal, KL_PROB_NORMAL)
KD_TILE_FN(tile_kl_log, KL_LOG)

/* KL gradient alone (-t or -e^t, scaled): the input is not needed, so it is not read. */
static void tile_kl_grad_only(const float *b, float *gd, int64_t n, vf sc, int log_target, int nt) {
    vf nsc = vf_neg(sc);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf t = vf_load(b + i);
        vf g = vf_mul(log_target ? vf_exp(t) : t, nsc);
        if (nt) vf_stream(gd + i, g);
        else vf_store(gd + i, g);
    }
    if (i < n) {
        vf t = vf_load_n(b + i, n - i);
        vf_store_n(gd + i, vf_mul(log_target ? vf_exp(t) : t, nsc), n - i);
    }
}

/* Non-temporal stores for an fp32 gradient the caller asked to stream, when the row is aligned:
 * they skip reading the gradient's lines before writing them (a third less traffic). */
KD_INLINE int use_nt(const kd_ew_job *j, const char *grow) {
    return grow && j->stream_grad && j->xdt == KDLOSS_F32 && ((uintptr_t)grow % KD_VBYTES) == 0;
}

double KD_SFX(kd_kl_row)(const kd_ew_job *j, int64_t r) {
    size_t xes = kdloss_dtype_size(j->xdt), tes = kdloss_dtype_size(j->tdt);
    const char *xrow = j->x + (size_t)(r * j->ldx) * xes;
    const char *trow = j->t + (size_t)(r * j->ldt) * tes;
    char *grow = j->g ? j->g + (size_t)(r * j->ldg) * xes : NULL;
    float *erow = j->elem ? j->elem + r * j->lde : NULL;
    float bx[KD_TILE], bt[KD_TILE], bg[KD_TILE];
    vf sc = vf_set1(j->gscale), eps = vf_set1(j->eps);
    char *gz = grow && j->gscale == 0.0f ? grow : NULL; /* kd_zero_grad_row */
    if (gz) {
        grow = NULL;
        if (!j->want_loss && !erow) return kd_zero_grad_row(j, gz, 0.0);
    }
    int grad_only = !j->want_loss && !erow, nt = use_nt(j, grow);
    int normal_log = j->eps >= 1.17549435e-38f; /* log(max(t, eps)) never sees a subnormal */
    double sum = 0.0;
    vf ck = vf_zero();
    for (int64_t c0 = 0; c0 < j->v; c0 += KD_TILE) {
        int64_t n = j->v - c0 < KD_TILE ? j->v - c0 : KD_TILE;
        const float *b = load_tile(trow + c0 * tes, j->tdt, n, bt);
        float *gd = !grow ? NULL : j->xdt == KDLOSS_F32 ? (float *)grow + c0 : bg;
        if (grad_only) {
            tile_kl_grad_only(b, gd, n, sc, j->log_target, nt);
        } else {
            const float *a = load_tile(xrow + c0 * xes, j->xdt, n, bx);
            float *ed = erow ? erow + c0 : NULL;
            const char *pfa = xrow + (c0 + KD_TILE) * xes, *pfb = trow + (c0 + KD_TILE) * tes;
            vf acc = j->log_target
                         ? tile_kl_log(a, b, gd, ed, n, sc, NULL, eps, nt, pfa, pfb, xes, tes, &ck)
                     : normal_log
                         ? tile_kl_prob_normal(a, b, gd, ed, n, sc, NULL, eps, nt, pfa, pfb, xes, tes, &ck)
                         : tile_kl_prob(a, b, gd, ed, n, sc, NULL, eps, nt, pfa, pfb, xes, tes, &ck);
            sum += vf_hsum(acc);
        }
        if (gd == bg) store_tile(grow + c0 * xes, j->xdt, bg, n);
    }
    if (nt) _mm_sfence(); /* order the streamed stores before the caller reads them */
    if (!grad_only && kd_poisoned(vf_hsum(ck))) return kd_zero_grad_row(j, gz, kd_poison_row(j, grow, erow));
    return kd_zero_grad_row(j, gz, sum);
}

double KD_SFX(kd_div_row)(const kd_ew_job *j, int64_t r) {
    size_t xes = kdloss_dtype_size(j->xdt), tes = kdloss_dtype_size(j->tdt);
    char *grow = j->g ? j->g + (size_t)(r * j->ldg) * xes : NULL;
    if (kd_row_ignored(j, r)) {
        if (grow) memset(grow, 0, (size_t)j->v * xes);
        return 0.0;
    }
    const char *xrow = j->x + (size_t)(r * j->ldx) * xes;
    const char *trow = j->t + (size_t)(r * j->ldt) * tes;
    float bx[KD_TILE], bt[KD_TILE], bg[KD_TILE];
    char *gz = grow && j->gscale == 0.0f ? grow : NULL; /* kd_zero_grad_row */
    if (gz) grow = NULL;
    kd_vdiv k = kd_vdiv_make(j->coef);
    vf sc = vf_set1(j->gscale);
    int nt = use_nt(j, grow);
    double sum = 0.0;
    vf ck = vf_zero();
    for (int64_t c0 = 0; c0 < j->v; c0 += KD_TILE) {
        int64_t n = j->v - c0 < KD_TILE ? j->v - c0 : KD_TILE;
        const float *a = load_tile(xrow + c0 * xes, j->xdt, n, bx);
        const float *b = load_tile(trow + c0 * tes, j->tdt, n, bt);
        float *gd = !grow ? NULL : j->xdt == KDLOSS_F32 ? (float *)grow + c0 : bg;
        const char *pfa = xrow + (c0 + KD_TILE) * xes, *pfb = trow + (c0 + KD_TILE) * tes;
        vf acc;
        switch (k.op) {
#define KD_DIV_CASE(E, nm)                                                                      \
    case KD_OP_##E: acc = tile_##nm(a, b, gd, n, sc, &k, nt, pfa, pfb, xes, tes, &ck); break;
            KD_DIV_OPS(KD_DIV_CASE)
#undef KD_DIV_CASE
        default: acc = vf_zero(); break;
        }
        sum += vf_hsum(acc);
        if (gd == bg) store_tile(grow + c0 * xes, j->xdt, bg, n);
    }
    if (nt) _mm_sfence();
    if (kd_poisoned(vf_hsum(ck))) return kd_zero_grad_row(j, gz, kd_poison_row(j, grow, NULL));
    return kd_zero_grad_row(j, gz, sum);
}
