/* Host emulation of the CUDA entry points for tests/cuda/test_cuda.c (target test_cuda_emu):
 * each kdloss_cuda_* call first runs the real library function, whose argument checks are pure
 * host code; when they pass, the real function fails at its first CUDA call (no device here) with
 * KDLOSS_ERR_CUDA, and the call is then computed by the CPU function of the same library, with
 * the GPU's documented semantics for out-of-range labels (treated as ignored, NaN losses, status
 * word in the workspace). What this checks: the test's own float64 references, tolerances,
 * packing, padding and error-code expectations, against the CPU backend, on a machine without a
 * GPU. What it cannot check: the CUDA kernels themselves. With a real GPU it skips itself (the
 * real functions would then launch on host pointers). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kdloss.h"

static char fake_ctx[4096]; /* the real functions only read ctx->device, after their checks */

__attribute__((constructor)) static void emu_skip_on_gpu(void) {
    int (*real)(void) = (int (*)(void))dlsym(RTLD_NEXT, "kdloss_cuda_available");
    if (real && real()) {
        printf("skipped: a CUDA device is present (run test_cuda instead)\n");
        fflush(stdout);
        _exit(0);
    }
}

int kdloss_cuda_available(void) { return 1; }

kdloss_status kdloss_cuda_context_create(int device, kdloss_cuda_context **ctx) {
    if (!ctx) return KDLOSS_ERR_NULL_POINTER;
    *ctx = NULL;
    if (device != 0) return KDLOSS_ERR_INVALID_PARAM;
    *ctx = (kdloss_cuda_context *)(void *)fake_ctx;
    return KDLOSS_OK;
}

void kdloss_cuda_context_destroy(kdloss_cuda_context *ctx) { (void)ctx; }

static void *real_fn(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        printf("emu: %s not found in libkdloss\n", name);
        exit(2);
    }
    return f;
}

static int64_t label_at(kdloss_labels l, int64_t r) {
    return l.dtype == KDLOSS_I64 ? ((const int64_t *)l.data)[r] : ((const int32_t *)l.data)[r];
}

/* A copy of the labels with out-of-range ones replaced by ignore_index; *bad = 1 if any. */
static kdloss_labels clean_labels(kdloss_labels l, int64_t bt, int64_t v, int64_t ignore, int *bad) {
    kdloss_labels c = l;
    *bad = 0;
    if (!l.data) return c;
    size_t es = kdloss_dtype_size(l.dtype);
    void *p = malloc((size_t)bt * es);
    memcpy(p, l.data, (size_t)bt * es);
    for (int64_t r = 0; r < bt; r++) {
        int64_t y = label_at(l, r);
        if (y == ignore || (y >= 0 && y < v)) continue;
        *bad = 1;
        if (l.dtype == KDLOSS_I64) ((int64_t *)p)[r] = ignore;
        else ((int32_t *)p)[r] = (int32_t)ignore;
    }
    c.data = p;
    return c;
}

/* The GPU's outputs for out-of-range labels (kdloss.h): NaN loss, NaN row loss of those rows. */
static void emu_bad_rows(kdloss_labels l, int64_t bt, int64_t v, int64_t ignore, int bad,
                         float *loss, float *row) {
    if (!bad) return;
    if (loss) *loss = NAN;
    for (int64_t r = 0; row && r < bt; r++) {
        int64_t y = label_at(l, r);
        if (y != ignore && (y < 0 || y >= v)) row[r] = NAN;
    }
}

typedef kdloss_status (*kl_fn)(kdloss_cuda_context *, void *, const kdloss_kl_params *, int64_t,
                               int64_t, kdloss_cmat, kdloss_cmat, float *, float *, kdloss_mat,
                               kdloss_mat, void *, size_t);
kdloss_status kdloss_cuda_kl_div(kdloss_cuda_context *ctx, void *st, const kdloss_kl_params *p,
                                 int64_t bt, int64_t v, kdloss_cmat in, kdloss_cmat t,
                                 float *loss, float *row, kdloss_mat el, kdloss_mat g, void *ws,
                                 size_t wsb) {
    kdloss_status s = ((kl_fn)real_fn("kdloss_cuda_kl_div"))(ctx, st, p, bt, v, in, t, loss, row,
                                                              el, g, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    s = kdloss_kl_div(p, bt, v, in, t, loss, row, el, g);
    *(int32_t *)ws = (int32_t)s;
    return s;
}

typedef kdloss_status (*jsd_fn)(kdloss_cuda_context *, void *, const kdloss_jsd_params *, int64_t,
                                int64_t, kdloss_cmat, kdloss_cmat, kdloss_labels, float *, float *,
                                kdloss_mat, void *, size_t);
kdloss_status kdloss_cuda_jsd(kdloss_cuda_context *ctx, void *st, const kdloss_jsd_params *p,
                              int64_t bt, int64_t v, kdloss_cmat x, kdloss_cmat t, kdloss_labels l,
                              float *loss, float *row, kdloss_mat g, void *ws, size_t wsb) {
    kdloss_status s = ((jsd_fn)real_fn("kdloss_cuda_jsd"))(ctx, st, p, bt, v, x, t, l, loss, row,
                                                            g, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    int bad;
    kdloss_labels c = clean_labels(l, bt, v, p->ignore_index, &bad);
    s = kdloss_jsd(p, bt, v, x, t, c, loss, row, g);
    emu_bad_rows(l, bt, v, p->ignore_index, bad, loss, row);
    if (c.data != l.data) free((void *)c.data);
    *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

typedef kdloss_status (*fl_fn)(kdloss_cuda_context *, void *, const kdloss_fljsd_params *, int64_t,
                               int64_t, int64_t, int64_t, kdloss_cmat, kdloss_cmat, const void *,
                               kdloss_cmat, kdloss_cmat, const void *, kdloss_labels,
                               kdloss_fljsd_out *, void *, size_t);
kdloss_status kdloss_cuda_fused_linear_jsd(kdloss_cuda_context *ctx, void *st,
                                           const kdloss_fljsd_params *p, int64_t bt, int64_t hs,
                                           int64_t ht, int64_t v, kdloss_cmat xs, kdloss_cmat wsm,
                                           const void *bs, kdloss_cmat xt, kdloss_cmat wt,
                                           const void *btb, kdloss_labels l, kdloss_fljsd_out *o,
                                           void *ws, size_t wsb) {
    kdloss_status s = ((fl_fn)real_fn("kdloss_cuda_fused_linear_jsd"))(
        ctx, st, p, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, l, o, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    int bad;
    kdloss_labels c = clean_labels(l, bt, v, p->ignore_index, &bad);
    s = kdloss_fused_linear_jsd(p, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, c, o, NULL, 0);
    if (bad) {
        if (o->loss) *o->loss = NAN;
        if (o->soft_loss) *o->soft_loss = NAN;
        if (o->hard_loss) *o->hard_loss = NAN;
    }
    if (c.data != l.data) free((void *)c.data);
    *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

typedef kdloss_status (*distill_fn)(kdloss_cuda_context *, void *, const kdloss_distill_params *,
                                    int64_t, int64_t, kdloss_cmat, kdloss_cmat, kdloss_labels,
                                    float *, float *, kdloss_mat, void *, size_t);
kdloss_status kdloss_cuda_distill(kdloss_cuda_context *ctx, void *st, const kdloss_distill_params *p,
                                  int64_t bt, int64_t v, kdloss_cmat x, kdloss_cmat t,
                                  kdloss_labels l, float *loss, float *row, kdloss_mat g, void *ws,
                                  size_t wsb) {
    kdloss_status s = ((distill_fn)real_fn("kdloss_cuda_distill"))(ctx, st, p, bt, v, x, t, l, loss,
                                                                    row, g, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    int bad;
    kdloss_labels c = clean_labels(l, bt, v, p->ignore_index, &bad);
    s = kdloss_distill(p, bt, v, x, t, c, loss, row, g);
    emu_bad_rows(l, bt, v, p->ignore_index, bad, loss, row);
    if (c.data != l.data) free((void *)c.data);
    *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

typedef kdloss_status (*dl_fn)(kdloss_cuda_context *, void *,
                              const kdloss_distill_logits_params *, int64_t, int64_t, kdloss_cmat,
                              kdloss_cmat, kdloss_labels, float *, float *, kdloss_mat, void *,
                              size_t);
kdloss_status kdloss_cuda_distill_logits(kdloss_cuda_context *ctx, void *st,
                                         const kdloss_distill_logits_params *p, int64_t bt,
                                         int64_t v, kdloss_cmat x, kdloss_cmat t, kdloss_labels l,
                                         float *loss, float *row, kdloss_mat g, void *ws,
                                         size_t wsb) {
    kdloss_status s = ((dl_fn)real_fn("kdloss_cuda_distill_logits"))(ctx, st, p, bt, v, x, t, l,
                                                                      loss, row, g, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    int bad;
    kdloss_labels c = clean_labels(l, bt, v, p->ignore_index, &bad);
    s = kdloss_distill_logits(p, bt, v, x, t, c, loss, row, g);
    emu_bad_rows(l, bt, v, p->ignore_index, bad, loss, row);
    if (c.data != l.data) free((void *)c.data);
    *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

typedef kdloss_status (*fld_fn)(kdloss_cuda_context *, void *,
                                const kdloss_fused_linear_distill_params *, int64_t, int64_t,
                                int64_t, int64_t, kdloss_cmat, kdloss_cmat, const void *,
                                kdloss_cmat, kdloss_cmat, const void *, kdloss_labels,
                                kdloss_fused_linear_distill_out *, void *, size_t);
kdloss_status kdloss_cuda_fused_linear_distill(kdloss_cuda_context *ctx, void *st,
                                               const kdloss_fused_linear_distill_params *p,
                                               int64_t bt, int64_t hs, int64_t ht, int64_t v,
                                               kdloss_cmat xs, kdloss_cmat wsm, const void *bs,
                                               kdloss_cmat xt, kdloss_cmat wt, const void *btb,
                                               kdloss_labels l,
                                               kdloss_fused_linear_distill_out *o, void *ws,
                                               size_t wsb) {
    kdloss_status s = ((fld_fn)real_fn("kdloss_cuda_fused_linear_distill"))(
        ctx, st, p, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, l, o, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    int bad;
    kdloss_labels c = clean_labels(l, bt, v, p->ignore_index, &bad);
    s = kdloss_fused_linear_distill(p, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, c, o, NULL, 0);
    if (bad) {
        if (o->loss) *o->loss = NAN;
        if (o->soft_loss) *o->soft_loss = NAN;
        if (o->hard_loss) *o->hard_loss = NAN;
    }
    if (c.data != l.data) free((void *)c.data);
    *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

/* ---- the sparse top-k teacher ----
 * The GPU reports invalid ids (and labels) through the status word instead of rejecting the call
 * (kdloss.h): such a row is treated as ignored, its row outputs are NaN, its gradient zero, and
 * the scalar losses NaN. The emulation gives the CPU function copies of the labels and ids in
 * which every such row is ignored and has no used slot, then writes the NaNs. The CPU functions
 * are weak: a build without them answers KDLOSS_ERR_UNSUPPORTED (test_cuda.c then skips). */
#pragma weak kdloss_topk_distill_logits
#pragma weak kdloss_fused_linear_topk_distill

int kdloss_test_emu = 1; /* tests/cuda/test_cuda.c: this is the emulation */

typedef struct emu_topk {
    kdloss_labels l;
    kdloss_topk_teacher t;
    char *fault; /* [bt]: bit 1 label out of range, bit 2 invalid ids (either: row ignored) */
    int bad_id, bad_label;
} emu_topk;

static int64_t emu_id(kdloss_topk_teacher t, int64_t r, int64_t j) {
    const int64_t ld = t.ids.ld ? t.ids.ld : t.k;
    return t.ids.dtype == KDLOSS_I64 ? ((const int64_t *)t.ids.data)[r * ld + j]
                                     : ((const int32_t *)t.ids.data)[r * ld + j];
}

static int emu_row_fault(kdloss_topk_teacher t, kdloss_labels l, int64_t r, int64_t v,
                         int64_t ignore) {
    int f = 0;
    for (int64_t j = 0; j < t.k && !f; j++) {
        const int64_t id = emu_id(t, r, j);
        if (id == -1) continue;
        if (id < 0 || id >= v) f = 4;
        for (int64_t i = 0; i < j && !f; i++)
            if (emu_id(t, r, i) == id) f = 4;
    }
    if (!l.data) return f;
    const int64_t y = label_at(l, r);
    return f | (y != ignore && (y < 0 || y >= v) ? 2 : 0);
}

static emu_topk emu_topk_clean(kdloss_topk_teacher t, kdloss_labels l, int64_t bt, int64_t v,
                               int64_t ignore) {
    emu_topk e = {l, t, calloc((size_t)bt, 1), 0, 0};
    for (int64_t r = 0; r < bt; r++) {
        e.fault[r] = (char)emu_row_fault(t, l, r, v, ignore);
        e.bad_id |= (e.fault[r] & 4) != 0;
        e.bad_label |= (e.fault[r] & 2) != 0;
    }
    if (!e.bad_id && !e.bad_label) return e;
    const int64_t ld = t.ids.ld ? t.ids.ld : t.k;
    const size_t ie = kdloss_dtype_size(t.ids.dtype);
    char *ids = malloc((size_t)(bt * ld) * ie);
    int64_t *lab = malloc((size_t)bt * sizeof(int64_t));
    memcpy(ids, t.ids.data, (size_t)((bt - 1) * ld + t.k) * ie);
    for (int64_t r = 0; r < bt; r++) {
        lab[r] = e.fault[r] ? ignore : l.data ? label_at(l, r) : 0;
        for (int64_t j = 0; e.fault[r] && j < t.k; j++) {
            if (t.ids.dtype == KDLOSS_I64) ((int64_t *)ids)[r * ld + j] = -1;
            else ((int32_t *)ids)[r * ld + j] = -1;
        }
    }
    e.t.ids.data = ids;
    e.l.data = lab;
    e.l.dtype = KDLOSS_I64;
    return e;
}

static void emu_topk_free(emu_topk *e, kdloss_topk_teacher t, kdloss_labels l) {
    if (e->t.ids.data != t.ids.data) free((void *)e->t.ids.data);
    if (e->l.data != l.data) free((void *)e->l.data);
    free(e->fault);
}

/* With both faults, the code the CPU function returns: the fused loss checks the ids first,
 * the logits loss the labels. */
static int32_t emu_topk_status(const emu_topk *e, kdloss_status s, int ids_first) {
    if (e->bad_id && (ids_first || !e->bad_label)) return (int32_t)KDLOSS_ERR_INVALID_ID;
    return e->bad_label ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
}

typedef kdloss_status (*tkl_fn)(kdloss_cuda_context *, void *, const kdloss_topk_distill_params *,
                                int64_t, int64_t, kdloss_cmat, kdloss_topk_teacher, kdloss_labels,
                                float *, float *, kdloss_mat, void *, size_t);
kdloss_status kdloss_cuda_topk_distill_logits(kdloss_cuda_context *ctx, void *st,
                                              const kdloss_topk_distill_params *p, int64_t bt,
                                              int64_t v, kdloss_cmat x, kdloss_topk_teacher t,
                                              kdloss_labels l, float *loss, float *row,
                                              kdloss_mat g, void *ws, size_t wsb) {
    kdloss_status s = ((tkl_fn)real_fn("kdloss_cuda_topk_distill_logits"))(
        ctx, st, p, bt, v, x, t, l, loss, row, g, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    if (!kdloss_topk_distill_logits) return KDLOSS_ERR_UNSUPPORTED;
    emu_topk e = emu_topk_clean(t, l, bt, v, p->ignore_index);
    s = kdloss_topk_distill_logits(p, bt, v, x, e.t, e.l, loss, row, g);
    if (loss && (e.bad_id || e.bad_label)) *loss = NAN;
    for (int64_t r = 0; row && r < bt; r++)
        if (e.fault[r]) row[r] = NAN;
    *(int32_t *)ws = emu_topk_status(&e, s, 0);
    emu_topk_free(&e, t, l);
    return s;
}

typedef kdloss_status (*fltk_fn)(kdloss_cuda_context *, void *,
                                 const kdloss_fused_linear_topk_distill_params *, int64_t, int64_t,
                                 int64_t, kdloss_cmat, kdloss_cmat, const void *,
                                 kdloss_topk_teacher, kdloss_labels,
                                 kdloss_fused_linear_distill_out *, void *, size_t);
kdloss_status kdloss_cuda_fused_linear_topk_distill(
    kdloss_cuda_context *ctx, void *st, const kdloss_fused_linear_topk_distill_params *p,
    int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs, kdloss_cmat wsm, const void *bs,
    kdloss_topk_teacher t, kdloss_labels l, kdloss_fused_linear_distill_out *o, void *ws,
    size_t wsb) {
    kdloss_status s = ((fltk_fn)real_fn("kdloss_cuda_fused_linear_topk_distill"))(
        ctx, st, p, bt, hs, v, xs, wsm, bs, t, l, o, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    if (!kdloss_fused_linear_topk_distill) return KDLOSS_ERR_UNSUPPORTED;
    emu_topk e = emu_topk_clean(t, l, bt, v, p->ignore_index);
    s = kdloss_fused_linear_topk_distill(p, bt, hs, v, xs, wsm, bs, e.t, e.l, o, NULL, 0);
    if (e.bad_id || e.bad_label) {
        if (o->loss) *o->loss = NAN;
        if (o->soft_loss) *o->soft_loss = NAN;
        if (o->hard_loss) *o->hard_loss = NAN;
    }
    for (int64_t r = 0; r < bt; r++) {
        if (!e.fault[r]) continue;
        if (o->row_soft) o->row_soft[r] = NAN;
        if (o->row_hard) o->row_hard[r] = NAN;
        if (o->row_lse) o->row_lse[r] = NAN;
    }
    *(int32_t *)ws = emu_topk_status(&e, s, 1);
    emu_topk_free(&e, t, l);
    return s;
}

/* ---- the vocabulary-parallel entries ----
 * The real function runs first: its host checks, and without a device it fails at its first CUDA
 * call (KDLOSS_ERR_CUDA) on every rank, before the agreement's collective; only the faults that
 * return at once (no communicator, a rank outside it, no context) answer for themselves. The CPU
 * _vp function then makes the call, collectives included, with the same communicator (whose
 * "device" buffers are host memory here), labels and ids cleaned against v_total as above. The
 * CUDA-only faults (a workspace that is NULL, misaligned or too small) are not emulated: the CPU
 * function accepts those. */
#pragma weak kdloss_fused_linear_distill_vp
#pragma weak kdloss_fused_linear_topk_distill_vp

static void emu_nan_losses(kdloss_fused_linear_distill_out *o) {
    if (o->loss) *o->loss = NAN;
    if (o->soft_loss) *o->soft_loss = NAN;
    if (o->hard_loss) *o->hard_loss = NAN;
}

typedef kdloss_status (*fldvp_fn)(kdloss_cuda_context *, void *,
                                  const kdloss_fused_linear_distill_params *,
                                  const kdloss_vocab_shard *, int64_t, int64_t, int64_t, int64_t,
                                  kdloss_cmat, kdloss_cmat, const void *, kdloss_cmat, kdloss_cmat,
                                  const void *, kdloss_labels, kdloss_fused_linear_distill_out *,
                                  void *, size_t);
kdloss_status kdloss_cuda_fused_linear_distill_vp(
    kdloss_cuda_context *ctx, void *st, const kdloss_fused_linear_distill_params *p,
    const kdloss_vocab_shard *sh, int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_cmat xs,
    kdloss_cmat wsm, const void *bs, kdloss_cmat xt, kdloss_cmat wt, const void *btb,
    kdloss_labels l, kdloss_fused_linear_distill_out *o, void *ws, size_t wsb) {
    kdloss_status s = ((fldvp_fn)real_fn("kdloss_cuda_fused_linear_distill_vp"))(
        ctx, st, p, sh, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, l, o, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    if (!kdloss_fused_linear_distill_vp) return KDLOSS_ERR_UNSUPPORTED;
    int bad = 0;
    kdloss_labels c = p && l.data ? clean_labels(l, bt, sh->v_total, p->ignore_index, &bad) : l;
    s = kdloss_fused_linear_distill_vp(p, sh, bt, hs, ht, v, xs, wsm, bs, xt, wt, btb, c, o, NULL,
                                       0);
    if (c.data != l.data) free((void *)c.data);
    if (s != KDLOSS_OK) return s;
    if (bad) emu_nan_losses(o);
    if (ws) *(int32_t *)ws = bad ? (int32_t)KDLOSS_ERR_LABEL_OUT_OF_RANGE : (int32_t)s;
    return s;
}

typedef kdloss_status (*fltkvp_fn)(kdloss_cuda_context *, void *,
                                   const kdloss_fused_linear_topk_distill_params *,
                                   const kdloss_vocab_shard *, int64_t, int64_t, int64_t,
                                   kdloss_cmat, kdloss_cmat, const void *, kdloss_topk_teacher,
                                   kdloss_labels, kdloss_fused_linear_distill_out *, void *,
                                   size_t);
kdloss_status kdloss_cuda_fused_linear_topk_distill_vp(
    kdloss_cuda_context *ctx, void *st, const kdloss_fused_linear_topk_distill_params *p,
    const kdloss_vocab_shard *sh, int64_t bt, int64_t hs, int64_t v, kdloss_cmat xs,
    kdloss_cmat wsm, const void *bs, kdloss_topk_teacher t, kdloss_labels l,
    kdloss_fused_linear_distill_out *o, void *ws, size_t wsb) {
    kdloss_status s = ((fltkvp_fn)real_fn("kdloss_cuda_fused_linear_topk_distill_vp"))(
        ctx, st, p, sh, bt, hs, v, xs, wsm, bs, t, l, o, ws, wsb);
    if (s != KDLOSS_ERR_CUDA) return s;
    if (!kdloss_fused_linear_topk_distill_vp) return KDLOSS_ERR_UNSUPPORTED;
    if (!p || !t.ids.data || t.k < 1) /* the CPU function reports these itself */
        return kdloss_fused_linear_topk_distill_vp(p, sh, bt, hs, v, xs, wsm, bs, t, l, o, NULL, 0);
    emu_topk e = emu_topk_clean(t, l, bt, sh->v_total, p->ignore_index);
    s = kdloss_fused_linear_topk_distill_vp(p, sh, bt, hs, v, xs, wsm, bs, e.t, e.l, o, NULL, 0);
    if (s == KDLOSS_OK) {
        if (e.bad_id || e.bad_label) emu_nan_losses(o);
        for (int64_t r = 0; r < bt; r++) {
            if (!e.fault[r]) continue;
            if (o->row_soft) o->row_soft[r] = NAN;
            if (o->row_hard) o->row_hard[r] = NAN;
            if (o->row_lse) o->row_lse[r] = NAN;
        }
        if (ws) *(int32_t *)ws = emu_topk_status(&e, s, 1);
    }
    emu_topk_free(&e, t, l);
    return s;
}
