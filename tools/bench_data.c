/* Benchmark inputs: aligned buffers and the reference's random rows (log_softmax(randn) for the
 * student, softmax(randn) for a KL target), generated with OpenMP because one default-shape
 * tensor is 268 MB. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "half.h"
#include "testutil.h"

void *kb_alloc(size_t bytes, const char *what) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = n ? aligned_alloc(64, n) : NULL;
    if (!p) {
        fprintf(stderr, "kdloss bench: out of memory (%.1f MB for %s)\n", (double)bytes / 1e6,
                what);
        exit(1);
    }
    /* First touch from the threads (static schedule, as the kernels use), so the pages are
     * mapped before timing and, on NUMA machines, near the threads that use them. */
    unsigned char *b = p;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += 4096) memset(b + i, 0, n - i < 4096 ? n - i : 4096);
    return p;
}

void kb_free(void *p) { free(p); }

size_t kb_matrix_bytes(int64_t bt, int64_t v, kdloss_dtype dt) {
    size_t es = kdloss_dtype_size(dt);
    if (bt <= 0 || v <= 0 || es == 0) return 0;
    if ((uint64_t)bt > SIZE_MAX / (uint64_t)v) return 0;
    size_t n = (size_t)bt * (size_t)v;
    if (n > SIZE_MAX / es) return 0;
    return n * es;
}

/* A uniform [0, 1) from (seed, i) alone, so any thread count fills the same tensor. */
float kb_uniform_at(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1p-24f;
}

/* n elements of dt: lo + (hi - lo) * uniform, rounded to dt. */
void kb_fill_uniform(void *dst, kdloss_dtype dt, size_t n, float lo, float hi, uint64_t seed) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = lo + (hi - lo) * kb_uniform_at(seed, i);
        if (dt == KDLOSS_F32) ((float *)dst)[i] = x;
        else ((uint16_t *)dst)[i] = kd_f32_to_bf16(x);
    }
}

/* A fresh generator for row r: rows are independent of the thread that draws them. */
/* One thread's row of v floats for the generators (exits when out of memory, as kb_alloc). */
static float *row_buffer(int64_t v) {
    float *z = malloc((size_t)v * sizeof *z);
    if (!z) {
        fprintf(stderr, "kdloss bench: out of memory (row buffer)\n");
        exit(1);
    }
    return z;
}

static void row_rng(kt_rng *g, uint64_t seed, int64_t r) {
    kt_rng_seed(g, seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)r * 0xd1b54a32d192ed03ull);
}

/* v standard normals, two per Box-Muller draw. */
static void randn_row(kt_rng *g, float *z, int64_t v) {
    for (int64_t c = 0; c < v; c += 2) {
        double u1 = kt_uniform(g), u2 = kt_uniform(g);
        if (u1 < 1e-300) u1 = 1e-300;
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
        z[c] = (float)(rad * cos(ang));
        if (c + 1 < v) z[c + 1] = (float)(rad * sin(ang));
    }
}

/* In place: z -> log_softmax(z) (as_probs = 0) or softmax(z) (as_probs = 1), sums in double. */
static void normalize_row(float *z, int64_t v, int as_probs) {
    float m = z[0];
    for (int64_t c = 1; c < v; c++) m = z[c] > m ? z[c] : m;
    double s = 0;
    for (int64_t c = 0; c < v; c++) s += exp((double)z[c] - m);
    double lse = (double)m + log(s);
    for (int64_t c = 0; c < v; c++) {
        double lp = (double)z[c] - lse;
        z[c] = (float)(as_probs ? exp(lp) : lp);
    }
}

/* Stores an fp32 row as dt, rounding to nearest even for the 16-bit formats. */
static void store_row(void *dst, kdloss_dtype dt, int64_t r, int64_t v, const float *z) {
    if (dt == KDLOSS_F32) {
        memcpy((float *)dst + r * v, z, (size_t)v * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)dst + r * v;
    for (int64_t c = 0; c < v; c++) h[c] = dt == KDLOSS_BF16 ? kd_f32_to_bf16(z[c]) : kd_f32_to_f16(z[c]);
}

static void fill_rows(void *dst, kdloss_dtype dt, int64_t bt, int64_t v, uint64_t seed,
                      int as_probs) {
#pragma omp parallel
    {
        float *z = row_buffer(v);
        kt_rng g;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < bt; r++) {
            row_rng(&g, seed, r);
            randn_row(&g, z, v);
            normalize_row(z, v, as_probs);
            store_row(dst, dt, r, v, z);
        }
        free(z);
    }
}

void kb_fill_logprobs(void *dst, kdloss_dtype dt, int64_t bt, int64_t v, uint64_t seed) {
    fill_rows(dst, dt, bt, v, seed, 0);
}

void kb_fill_probs(void *dst, kdloss_dtype dt, int64_t bt, int64_t v, uint64_t seed) {
    fill_rows(dst, dt, bt, v, seed, 1);
}

/* Indices of the k largest of z[0..v) into ids[0..k), largest first (ties: lower index first).
 * One pass keeping the current k best, replacing the smallest when a larger value comes: the
 * replacements are few (about k log(v / k) on random rows), each a scan of k. */
static void topk_row(const float *z, int64_t v, int64_t k, int32_t *ids) {
    int64_t n = 0, lo = 0; /* lo: the slot holding the smallest of the kept values */
    for (int64_t c = 0; c < v; c++) {
        if (n < k) {
            ids[n++] = (int32_t)c;
            if (n == k)
                for (int64_t j = 0; j < k; j++)
                    if (z[ids[j]] < z[ids[lo]]) lo = j;
            continue;
        }
        if (!(z[c] > z[ids[lo]])) continue;
        ids[lo] = (int32_t)c;
        for (int64_t j = 0; j < k; j++)
            if (z[ids[j]] < z[ids[lo]] || (z[ids[j]] == z[ids[lo]] && ids[j] > ids[lo])) lo = j;
    }
    for (int64_t a = 1; a < k; a++) { /* insertion sort, largest first */
        int32_t id = ids[a];
        int64_t b = a;
        for (; b > 0 && (z[ids[b - 1]] < z[id] || (z[ids[b - 1]] == z[id] && ids[b - 1] > id)); b--)
            ids[b] = ids[b - 1];
        ids[b] = id;
    }
}

void kb_fill_topk_teacher(int32_t *ids, float *logprobs, int64_t bt, int64_t v, int64_t k,
                          double scale, uint64_t seed) {
#pragma omp parallel
    {
        float *z = row_buffer(v);
        kt_rng g;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < bt; r++) {
            row_rng(&g, seed, r);
            randn_row(&g, z, v);
            for (int64_t c = 0; c < v; c++) z[c] = (float)(scale * z[c]);
            normalize_row(z, v, 0);
            int32_t *id = ids + r * k;
            topk_row(z, v, k, id);
            for (int64_t j = 0; j < k; j++) logprobs[r * k + j] = z[id[j]];
        }
        free(z);
    }
}
