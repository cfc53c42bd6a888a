/* The machine's streaming bandwidth, measured in the benchmark's own process and thread count
 * so that "fraction of streaming bandwidth" compares like with like. STREAM's "add" kernel
 * (two reads, one write) matches the read/read/write mix of a fused loss + gradient call. */
#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>

#include "bench.h"

#define KB_STREAM_MIN_TOTAL ((size_t)256 << 20)

/* c = a + b over [0, n) with plain stores: the compiler's vector code. The write-allocate read
 * of c is real traffic but, as in STREAM, not counted. */
static void add_plain(const float *a, const float *b, float *c, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
}

/* One thread's share with non-temporal stores: the lines of c go straight to memory without
 * being read first. p, q, r are 32-byte aligned and len a multiple of 8. Compiled for AVX2
 * alone so the rest of the tool stays baseline x86-64; only called after a CPU check. */
__attribute__((target("avx2"))) static void add_nt_span(const float *a, const float *b, float *c,
                                                       size_t len) {
    for (size_t i = 0; i < len; i += 8)
        _mm256_stream_ps(c + i, _mm256_add_ps(_mm256_load_ps(a + i), _mm256_load_ps(b + i)));
    _mm_sfence(); /* make the streamed lines globally visible before the thread leaves */
}

/* Splits [0, n) into per-thread spans of whole 8-float vectors (n is a multiple of 8). */
static void add_nt(const float *a, const float *b, float *c, size_t n) {
#pragma omp parallel
    {
        size_t vecs = n / 8, nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = vecs * t / nt * 8, hi = vecs * (t + 1) / nt * 8;
        if (hi > lo) add_nt_span(a + lo, b + lo, c + lo, hi - lo);
    }
}

typedef void (*add_fn)(const float *, const float *, float *, size_t);

/* GB/s of one run of fn over the arrays, counting 3 x array bytes. */
static double run_gbs(add_fn fn, kb_stream_arrays *s) {
    double t0 = kb_now_ns();
    fn(s->a, s->b, s->c, s->n);
    return 3.0 * (double)s->n * sizeof(float) / (kb_now_ns() - t0);
}

/* Median GB/s of reps runs (one warm-up first). */
static double median_gbs(add_fn fn, kb_stream_arrays *s, int reps) {
    double *g = malloc((size_t)reps * sizeof *g);
    if (!g) return 0;
    run_gbs(fn, s);
    for (int k = 0; k < reps; k++) g[k] = run_gbs(fn, s);
    double med = kb_quantile(g, reps, 0.5);
    free(g);
    return med;
}

void kb_stream_measure(size_t total_bytes, int reps, kb_stream *out) {
    kb_stream_arrays s;
    kb_stream_open(total_bytes, &s);
    out->array_bytes = s.n * sizeof(float);
    out->threads = omp_get_max_threads();
    out->plain_gbs = median_gbs(add_plain, &s, reps);
    out->nt_used = s.nt;
    out->nt_gbs = s.nt ? median_gbs(add_nt, &s, reps) : 0.0;
    out->gbs = out->nt_gbs > out->plain_gbs ? out->nt_gbs : out->plain_gbs;
    kb_stream_close(&s);
}

void kb_stream_open(size_t total_bytes, kb_stream_arrays *s) {
    if (total_bytes < KB_STREAM_MIN_TOTAL) total_bytes = KB_STREAM_MIN_TOTAL;
    s->n = total_bytes / 3 / sizeof(float) / 16 * 16; /* whole vectors, 64-byte multiples */
    s->a = kb_alloc(s->n * sizeof(float), "stream array a");
    s->b = kb_alloc(s->n * sizeof(float), "stream array b");
    s->c = kb_alloc(s->n * sizeof(float), "stream array c");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < s->n; i++) {
        s->a[i] = 1.0f;
        s->b[i] = 2.0f;
        s->c[i] = 0.0f; /* first touch here, not in the first timed run */
    }
    __builtin_cpu_init();
    s->nt = __builtin_cpu_supports("avx2");
}

double kb_stream_once(kb_stream_arrays *s) { return run_gbs(s->nt ? add_nt : add_plain, s); }

void kb_stream_close(kb_stream_arrays *s) {
    kb_free(s->a);
    kb_free(s->b);
    kb_free(s->c);
}
