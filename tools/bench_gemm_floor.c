#define _POSIX_C_SOURCE 200809L /* fork, waitpid under strict -std=c11 */

#include "bench_gemm_floor.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "half.h"

const char *kb_gemm_name(int which) {
    static const char *const names[KB_GEMM_COUNT] = {"student logits", "teacher logits", "dXs",
                                                     "dWs"};
    return which >= 0 && which < KB_GEMM_COUNT ? names[which] : "?";
}

/* An fp32 (rows x cols) copy of m: m itself for fp32, else widened into a new buffer. */
static float *as_f32(const void *m, kdloss_dtype dt, int64_t rows, int64_t cols) {
    if (dt == KDLOSS_F32) return (float *)m;
    size_t n = (size_t)rows * (size_t)cols;
    float *f = malloc(n * sizeof(float));
    if (!f) return NULL;
    const uint16_t *h = m;
    for (size_t i = 0; i < n; i++) f[i] = kd_bf16_to_f32(h[i]);
    return f;
}

/* A buffer of n floats with every page touched, so no round sees page faults. */
static float *touched(size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p) memset(p, 0, n * sizeof(float));
    return p;
}

/* The child's operands (it exits without freeing them). */
typedef struct floor_bufs {
    int64_t bt, hs, ht, v;
    float *xs, *ws, *xt, *wt, *zs, *zt, *dxs, *dws;
} floor_bufs;

static void one_round(const floor_bufs *b, double ns[KB_GEMM_COUNT]) {
    int bt = (int)b->bt, hs = (int)b->hs, ht = (int)b->ht, v = (int)b->v;
    double t0 = kb_now_ns();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bt, v, hs, 1.0f, b->xs, hs, b->ws, hs,
                0.0f, b->zs, v);
    double t1 = kb_now_ns();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bt, v, ht, 1.0f, b->xt, ht, b->wt, ht,
                0.0f, b->zt, v);
    double t2 = kb_now_ns();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bt, hs, v, 1.0f, b->zs, v, b->ws, hs,
                0.0f, b->dxs, hs);
    double t3 = kb_now_ns();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v, hs, bt, 1.0f, b->zs, v, b->xs, hs,
                0.0f, b->dws, hs);
    double t4 = kb_now_ns();
    ns[KB_GEMM_ZS] = t1 - t0;
    ns[KB_GEMM_ZT] = t2 - t1;
    ns[KB_GEMM_DXS] = t3 - t2;
    ns[KB_GEMM_DWS] = t4 - t3;
}

/* The child: set up, report readiness (1) or lack of memory (0), then a round per request
 * byte until the pipe closes. */
static void child_main(int in, int out, floor_bufs *b, kdloss_dtype dt, const void *xs,
                       const void *ws, const void *xt, const void *wt) {
    b->xs = as_f32(xs, dt, b->bt, b->hs);
    b->ws = as_f32(ws, dt, b->v, b->hs);
    b->xt = as_f32(xt, dt, b->bt, b->ht);
    b->wt = as_f32(wt, dt, b->v, b->ht);
    b->zs = touched((size_t)b->bt * (size_t)b->v);
    b->zt = touched((size_t)b->bt * (size_t)b->v);
    b->dxs = touched((size_t)b->bt * (size_t)b->hs);
    b->dws = touched((size_t)b->v * (size_t)b->hs);
    char ok = b->xs && b->ws && b->xt && b->wt && b->zs && b->zt && b->dxs && b->dws;
    double ns[KB_GEMM_COUNT];
    /* A warm-up round (OpenBLAS's threads and buffers) unless a round is over a TFLOP: then
     * those one-off costs are lost in it, and the round alone takes minutes on a small CPU. */
    double flop = 2.0 * (double)b->bt * (double)b->v * (double)(3 * b->hs + b->ht);
    if (ok && flop < 1e12) one_round(b, ns);
    if (write(out, &ok, 1) != 1 || !ok) _exit(1);
    char req;
    while (read(in, &req, 1) == 1) {
        one_round(b, ns);
        if (write(out, ns, sizeof ns) != (ssize_t)sizeof ns) _exit(1);
    }
    _exit(0);
}

int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v, kdloss_dtype dt,
                   const void *xs, const void *ws, const void *xt, const void *wt) {
    int down[2], up[2];
    memset(f, 0, sizeof *f);
    if (pipe(down) != 0 || pipe(up) != 0) {
        perror("kdloss bench: gemm floor: pipe");
        return -1;
    }
    fflush(NULL); /* the child must not flush the parent's buffered output a second time */
    pid_t pid = fork();
    if (pid < 0) {
        perror("kdloss bench: gemm floor: fork");
        return -1;
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        floor_bufs b = {bt, hs, ht, v, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        child_main(down[0], up[1], &b, dt, xs, ws, xt, wt);
    }
    close(down[0]);
    close(up[1]);
    f->pid = (int)pid;
    f->to_child = down[1];
    f->from_child = up[0];
    char ok = 0;
    if (read(f->from_child, &ok, 1) != 1 || !ok) {
        fprintf(stderr, "kdloss bench: gemm floor: the child could not allocate its buffers\n");
        kb_floor_stop(f);
        return -1;
    }
    return 0;
}

int kb_floor_round(kb_floor *f, double ns[KB_GEMM_COUNT]) {
    char req = 1;
    if (!f->pid || write(f->to_child, &req, 1) != 1 ||
        read(f->from_child, ns, sizeof(double) * KB_GEMM_COUNT) !=
            (ssize_t)(sizeof(double) * KB_GEMM_COUNT)) {
        fprintf(stderr, "kdloss bench: gemm floor: the child stopped answering\n");
        return -1;
    }
    return 0;
}

void kb_floor_stop(kb_floor *f) {
    if (!f->pid) return;
    close(f->to_child); /* the child's read sees end-of-file and it exits */
    close(f->from_child);
    int status;
    waitpid((pid_t)f->pid, &status, 0);
    f->pid = 0;
}
