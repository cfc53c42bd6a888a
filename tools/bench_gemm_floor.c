#define _POSIX_C_SOURCE 200809L /* fork, waitpid, readlink under strict -std=c11 */

#include "bench_gemm_floor.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

const char *kb_gemm_name(int which) {
    static const char *const names[KB_GEMM_COUNT] = {"student logits", "teacher logits", "dXs",
                                                     "dWs"};
    return which >= 0 && which < KB_GEMM_COUNT ? names[which] : "?";
}

/* n floats in [lo, hi) from a fixed sequence, every page touched. */
static float *filled(size_t n, float lo, float hi, uint64_t seed) {
    float *p = malloc(n * sizeof(float));
    if (!p) return NULL;
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        p[i] = lo + (hi - lo) * (float)(z >> 40) * 0x1p-24f;
    }
    return p;
}

typedef struct floor_bufs {
    int64_t bt, hs, ht, v;
    float *xs, *ws, *xt, *wt, *zs, *zt, *dxs, *dws;
} floor_bufs;

/* The four GEMMs, timed; 0, or -1 when the provider failed. */
static int one_round(const floor_bufs *b, kdloss_gemm_provider p, double ns[KB_GEMM_COUNT]) {
    int64_t bt = b->bt, hs = b->hs, ht = b->ht, v = b->v;
    kdloss_status st[KB_GEMM_COUNT];
    double t0 = kb_now_ns();
    st[0] = kdloss_gemm_f32(p, 0, 1, bt, v, hs, 1.0f, b->xs, hs, b->ws, hs, 0.0f, b->zs, v);
    double t1 = kb_now_ns();
    st[1] = kdloss_gemm_f32(p, 0, 1, bt, v, ht, 1.0f, b->xt, ht, b->wt, ht, 0.0f, b->zt, v);
    double t2 = kb_now_ns();
    st[2] = kdloss_gemm_f32(p, 0, 0, bt, hs, v, 1.0f, b->zs, v, b->ws, hs, 0.0f, b->dxs, hs);
    double t3 = kb_now_ns();
    st[3] = kdloss_gemm_f32(p, 1, 0, v, hs, bt, 1.0f, b->zs, v, b->xs, hs, 0.0f, b->dws, hs);
    double t4 = kb_now_ns();
    ns[KB_GEMM_ZS] = t1 - t0;
    ns[KB_GEMM_ZT] = t2 - t1;
    ns[KB_GEMM_DXS] = t3 - t2;
    ns[KB_GEMM_DWS] = t4 - t3;
    for (int g = 0; g < KB_GEMM_COUNT; g++)
        if (st[g] != KDLOSS_OK) return -1;
    return 0;
}

int kb_floor_child_main(int argc, char **argv) {
    if (argc != 8) return 2;
    int in = atoi(argv[2]), out = atoi(argv[3]);
    floor_bufs b = {atoll(argv[4]), atoll(argv[5]), atoll(argv[6]), atoll(argv[7]),
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t bt = (size_t)b.bt, v = (size_t)b.v;
    float as = 1.0f / sqrtf((float)b.hs), at = 1.0f / sqrtf((float)b.ht);
    b.xs = filled(bt * (size_t)b.hs, 0.0f, 1.0f, 1);
    b.xt = filled(bt * (size_t)b.ht, 0.0f, 1.0f, 2);
    b.ws = filled(v * (size_t)b.hs, -as, as, 3);
    b.wt = filled(v * (size_t)b.ht, -at, at, 4);
    b.zs = filled(bt * v, 0.0f, 0.0f, 5);
    b.zt = filled(bt * v, 0.0f, 0.0f, 6);
    b.dxs = filled(bt * (size_t)b.hs, 0.0f, 0.0f, 7);
    b.dws = filled(v * (size_t)b.hs, 0.0f, 0.0f, 8);
    char ok = b.xs && b.ws && b.xt && b.wt && b.zs && b.zt && b.dxs && b.dws;
    if (write(out, &ok, 1) != 1 || !ok) return 1;
    char req;
    while (read(in, &req, 1) == 1) {
        double ns[KB_GEMM_COUNT + 1];
        ns[KB_GEMM_COUNT] = one_round(&b, (kdloss_gemm_provider)req, ns);
        if (write(out, ns, sizeof ns) != (ssize_t)sizeof ns) return 1;
    }
    return 0;
}

int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v) {
    int down[2], up[2];
    char exe[PATH_MAX];
    memset(f, 0, sizeof *f);
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0 || pipe(down) != 0 || pipe(up) != 0) {
        perror("kdloss bench: gemm floor: readlink /proc/self/exe or pipe");
        return -1;
    }
    exe[len] = 0;
    fflush(NULL); /* the child must not flush the parent's buffered output a second time */
    pid_t pid = fork();
    if (pid < 0) {
        perror("kdloss bench: gemm floor: fork");
        return -1;
    }
    if (pid == 0) {
        close(down[1]);
        close(up[0]);
        char a[6][32];
        snprintf(a[0], 32, "%d", down[0]);
        snprintf(a[1], 32, "%d", up[1]);
        snprintf(a[2], 32, "%lld", (long long)bt);
        snprintf(a[3], 32, "%lld", (long long)hs);
        snprintf(a[4], 32, "%lld", (long long)ht);
        snprintf(a[5], 32, "%lld", (long long)v);
        execl(exe, exe, "__gemm-floor", a[0], a[1], a[2], a[3], a[4], a[5], (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    f->pid = (int)pid;
    f->to_child = down[1];
    f->from_child = up[0];
    char ok = 0;
    if (read(f->from_child, &ok, 1) != 1 || !ok) {
        fprintf(stderr, "kdloss bench: gemm floor: the child could not start or allocate\n");
        kb_floor_stop(f);
        return -1;
    }
    return 0;
}

int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, double ns[KB_GEMM_COUNT]) {
    char req = (char)provider;
    double r[KB_GEMM_COUNT + 1];
    if (!f->pid || write(f->to_child, &req, 1) != 1 ||
        read(f->from_child, r, sizeof r) != (ssize_t)sizeof r) {
        fprintf(stderr, "kdloss bench: gemm floor: the child stopped answering\n");
        return -1;
    }
    memcpy(ns, r, sizeof(double) * KB_GEMM_COUNT);
    return r[KB_GEMM_COUNT] != 0.0;
}

void kb_floor_stop(kb_floor *f) {
    if (!f->pid) return;
    close(f->to_child); /* the child's read sees end-of-file and it exits */
    close(f->from_child);
    int status;
    waitpid((pid_t)f->pid, &status, 0);
    f->pid = 0;
}
