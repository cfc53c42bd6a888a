/* The GEMM layer (gemm.h, and kdloss_gemm_* in kdloss.h): the providers, the thread-count
 * independent tile grid, the allocation-free fallback, and native bf16 products.
 *
 * Providers:
 *  - oneDNN (linked): dnnl_sgemm, whose JIT kernels follow the CPU's feature flags rather than a
 *    table of known CPU models, so a CPU newer than the library still runs its AVX-512 or AVX2
 *    kernel; errors come back as statuses (it does not exit on a failed allocation).
 *  - OpenBLAS (dlopen of libopenblas.so.0 when asked for): picks its kernels from a table of CPU
 *    models, and may fall back to generic kernels on models it does not know. Kept for
 *    comparison and for the benchmark floors; never chosen automatically (BENCHMARKS.md).
 *  - builtin (a build without oneDNN, CMake -DKDLOSS_GEMM=builtin): every tile of the grid below
 *    is kdloss's own packed GEMM (gemm_fb.h) in a per-thread scratch; where that scratch cannot
 *    be allocated the tile reports out of memory with C untouched, as dnnl_sgemm does, and the
 *    reserved fallback scratch redoes it. Either oneDNN or builtin is compiled in (KD_TILED). */
#include "gemm.h"

#include "bf16_rows.h"
#include "check.h"
#include "dispatch.h"
#include "gemm_fb.h"

#include <dlfcn.h>
#if KD_HAVE_ONEDNN
#include <dnnl.h>
#endif
#include <limits.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#if KD_HAVE_ONEDNN
/* oneDNN's bf16 x bf16 -> fp32 gemm, row-major as dnnl_sgemm: a DNNL_API symbol of libdnnl
 * (oneDNN's own src/cpu/gemm/gemm.cpp) that its public header does not declare. */
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t m, dnnl_dim_t n,
                                    dnnl_dim_t k, float alpha, const uint16_t *a, dnnl_dim_t lda,
                                    const uint16_t *b, dnnl_dim_t ldb, float beta, float *c,
                                    dnnl_dim_t ldc);
#endif

/* A tile smaller than this many flops is not worth a thread of its own (~0.1 ms on one core). */
#define KD_TILE_MIN_FLOPS 16.0e6
/* Tiles per processor: 2 lets a thread that was slowed by another process hand over work. */
#define KD_TILES_PER_PROC 2

/* ---- provider selection ---------------------------------------------------------------- */

#if KD_HAVE_ONEDNN
#define KD_TILED KDLOSS_GEMM_ONEDNN /* the provider that runs the tile grid */
#else
#define KD_TILED KDLOSS_GEMM_BUILTIN
/* Without oneDNN the tile grid keeps the status names it uses (these values are kdloss's own). */
typedef enum { dnnl_success = 0, dnnl_out_of_memory = 1, dnnl_unimplemented = 3 } dnnl_status_t;
typedef void *dnnl_engine_t;
#endif

/* 0 = not decided yet; otherwise a kdloss_gemm_provider. Single aligned int reads/writes. */
static volatile int g_provider = 0;
/* A kdloss_bf16_gemm. */
static volatile int g_bf16_mode = KDLOSS_BF16_GEMM_AUTO;
/* A kdloss_bf16_grad. */
static volatile int g_bf16_grad = KDLOSS_BF16_GRAD_AUTO;

/* ---- OpenBLAS, loaded on demand ------------------------------------------------------- */

typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
/* cblas_sbgemm (bf16 x bf16 -> fp32), exported only by OpenBLAS builds with BUILD_BFLOAT16. */
typedef void (*cblas_sbgemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int,
                                const uint16_t *, int, float, float *, int);
static struct {
    pthread_once_t once;
    void *handle;
    cblas_sgemm_fn sgemm;
    cblas_sbgemm_fn sbgemm;
    char *(*corename)(void);
    char *(*config)(void);
} g_ob = {PTHREAD_ONCE_INIT, NULL, NULL, NULL, NULL, NULL};

static void openblas_load(void) {
    void *h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    cblas_sgemm_fn f = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    if (!f) {
        dlclose(h);
        return;
    }
    g_ob.corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
    g_ob.config = (char *(*)(void))dlsym(h, "openblas_get_config");
    g_ob.sbgemm = (cblas_sbgemm_fn)dlsym(h, "cblas_sbgemm");
    g_ob.sgemm = f;
    g_ob.handle = h;
}

static int openblas_available(void) {
    pthread_once(&g_ob.once, openblas_load);
    return g_ob.sgemm != NULL;
}

static int cpu_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* An OpenBLAS core whose kernels use AVX2 or AVX-512; any other core on a CPU that has AVX2 is
 * a generic fallback (OpenBLAS did not recognise the CPU). */
static int openblas_core_generic(const char *core) {
    static const char *const modern[] = {"haswell", "zen", "skylakex", "cooperlake",
                                         "sapphirerapids"};
    if (!cpu_has_avx2()) return 0;
    for (size_t i = 0; i < sizeof modern / sizeof modern[0]; i++)
        if (core && strcasecmp(core, modern[i]) == 0) return 0;
    return 1;
}

static kdloss_status openblas_sgemm(const kd_gemm *g) {
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        return KDLOSS_ERR_UNSUPPORTED; /* libopenblas.so.0 takes 32-bit sizes */
    enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
    g_ob.sgemm(ROW_MAJOR, g->ta ? TRANS : NO_TRANS, g->tb ? TRANS : NO_TRANS, (int)g->m,
               (int)g->n, (int)g->k, g->alpha, g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, g->c,
               (int)g->ldc);
    return KDLOSS_OK;
}

/* ---- oneDNN -------------------------------------------------------------------------- */

static kdloss_status from_dnnl(dnnl_status_t s) {
    if (s == dnnl_success) return KDLOSS_OK;
    return s == dnnl_out_of_memory ? KDLOSS_ERR_OUT_OF_MEMORY : KDLOSS_ERR_BLAS;
}

#if KD_HAVE_ONEDNN
static const char *dnnl_isa_name(dnnl_cpu_isa_t isa) {
    /* Highest first: each ISA's bits contain those of the ones it extends. */
    static const struct {
        dnnl_cpu_isa_t isa;
        const char *name;
    } known[] = {{dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
                 {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
                 {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
                 {dnnl_cpu_isa_avx512_core, "avx512_core"},
                 {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
                 {dnnl_cpu_isa_avx2, "avx2"},
                 {dnnl_cpu_isa_avx, "avx"},
                 {dnnl_cpu_isa_sse41, "sse41"}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (((unsigned)isa & (unsigned)known[i].isa) == (unsigned)known[i].isa) return known[i].name;
    return "generic";
}

static int dnnl_has(dnnl_cpu_isa_t want) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)want) == (unsigned)want;
}
#endif

/* ---- tiling ---------------------------------------------------------------------------- */

/* ---- the tile grid ----------------------------------------------------------------------
 * With oneDNN, C is cut into a grid of tiles that depends on (m, n, k) and the processor
 * count, never on the thread count; each tile is one single-threaded dnnl_sgemm over the whole
 * K, run from an OpenMP loop over tiles. Every element of C is thus produced by the same
 * instruction sequence whatever the number of threads, which makes the fused losses bitwise
 * independent of it. The grid splits the dimension whose operand is cheaper to read again: a
 * split of N re-reads (packs) A once per column of tiles, a split of M re-reads B once per row.
 */

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t q) { return cdiv(a, q) * q; }

/* The pm x pn >= want tiles of an m x n C with the least re-read traffic pn * m + pm * n (times
 * k); tiles are at least 16 rows and 64 columns (whole kernel blocks, 256-byte rows). */
static void grid_cuts(int64_t m, int64_t n, int64_t want, int64_t *pm_out, int64_t *pn_out) {
    int64_t best_pm = 1, best_pn = 1;
    double best = -1.0;
    for (int64_t pm = 1; pm <= want; pm++) {
        int64_t pn = cdiv(want, pm);
        if (pm > cdiv(m, 16) || pn > cdiv(n, 64)) continue;
        double cost = (double)pn * (double)m + (double)pm * (double)n;
        if (best < 0 || cost < best) {
            best = cost;
            best_pm = pm;
            best_pn = pn;
        }
    }
    *pm_out = best_pm;
    *pn_out = best_pn;
}

void kd_gemm_grid(int64_t m, int64_t n, int64_t k, int procs, int64_t *tm, int64_t *tn) {
    double flops = 2.0 * (double)m * (double)n * (double)k;
    int64_t want = (int64_t)procs * KD_TILES_PER_PROC, pm, pn;
    if (flops / KD_TILE_MIN_FLOPS < (double)want) want = (int64_t)(flops / KD_TILE_MIN_FLOPS);
    if (want < 1) want = 1;
    grid_cuts(m, n, want, &pm, &pn);
    /* A grid that cuts both dimensions (the fused losses' dX = dZ W, n x Hs over k = V, is the
     * one such product) ran 1.6x slower than one tile per processor on the AVX2 path and no
     * faster on AVX-512 (BENCHMARKS.md, "The AVX2 overhead: the dX product's tiles"). */
    if (pm > 1 && pn > 1 && want > procs) grid_cuts(m, n, procs, &pm, &pn);
    *tm = m > 16 ? round_up(cdiv(m, pm), 16) : m;
    *tn = n > 64 ? round_up(cdiv(n, pn), 64) : n;
    if (*tm > m) *tm = m;
    if (*tn > n) *tn = n;
}

static int procs(void) {
    static volatile int cached = 0;
    int p = cached;
    if (!p) cached = p = omp_get_num_procs() > 0 ? omp_get_num_procs() : 1;
    return p;
}

/* Runs tile(ctx, i0, j0, mi, nj) over a grid of tiles of at most tm x tn of an m x n C, each
 * tile on one thread, on at most nthr threads: inside an active parallel region oneDNN runs
 * sequentially, and a single tile (or a single thread) runs the tiles in order with this
 * thread's team limited to one. Returns the first failing status seen, if any. */
typedef dnnl_status_t (*tile_fn)(const void *ctx, int64_t i0, int64_t j0, int64_t mi, int64_t nj);

static dnnl_status_t run_grid(int64_t m, int64_t n, int64_t tm, int64_t tn, int nthr,
                              tile_fn tile, const void *ctx) {
    int64_t pn = cdiv(n, tn), tiles = cdiv(m, tm) * pn;
    int err = dnnl_success;
    if (tiles == 1 || nthr <= 1) {
        int save = omp_get_max_threads();
        omp_set_num_threads(1);
        for (int64_t t = 0; t < tiles && err == dnnl_success; t++) {
            int64_t i0 = t / pn * tm, j0 = t % pn * tn;
            err = (int)tile(ctx, i0, j0, m - i0 < tm ? m - i0 : tm, n - j0 < tn ? n - j0 : tn);
        }
        omp_set_num_threads(save);
        return (dnnl_status_t)err;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthr)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t i0 = t / pn * tm, j0 = t % pn * tn;
        dnnl_status_t s = tile(ctx, i0, j0, m - i0 < tm ? m - i0 : tm, n - j0 < tn ? n - j0 : tn);
        if (s != dnnl_success) {
#pragma omp atomic write
            err = (int)s;
        }
    }
    return (dnnl_status_t)err;
}

/* run_grid over kd_gemm_grid's tiles of an m x n x k product, on every thread of the team. */
static dnnl_status_t for_tiles(int64_t m, int64_t n, int64_t k, tile_fn tile, const void *ctx) {
    int64_t tm, tn;
    kd_gemm_grid(m, n, k, procs(), &tm, &tn);
    return run_grid(m, n, tm, tn, omp_get_max_threads(), tile, ctx);
}

/* ---- the allocation-free fallback and its reserved scratch -----------------------------
 * Memory: dnnl_sgemm allocates its packing buffers inside every call (one
 * malloc a single-threaded call; when it fails the call returns dnnl_out_of_memory before it has
 * written any of C: tests/fault/test_fault_gemm.c checks both). A loss that has already written
 * outputs must not fail then, so a tile whose dnnl_sgemm ran out of memory is computed again by
 * kdloss's own allocation-free GEMM (gemm_fb.h) from a scratch that kd_gemm_prepare reserved
 * earlier, before the loss wrote anything: one scratch per calling thread (the workers of its
 * OpenMP team take turns on it), kept for the thread's life and grown only by kd_gemm_prepare.
 * The fallback's results are as accurate as oneDNN's but not bitwise the same (another
 * summation order); it is deterministic and thread-count independent too. Why not the fallback
 * all the time: BENCHMARKS.md, "GEMM
 * memory". */


/* A calling thread's fallback scratch: one allocation (this header, then the 64-byte aligned
 * floats), owned through a pthread key so it is freed when the thread ends. */
typedef struct kd_fb_arena {
    pthread_mutex_t lock; /* one tile at a time: the workers of the thread's team share it */
    size_t floats;
    float *scratch;
} kd_fb_arena;

#define KD_FB_HEAD ((sizeof(kd_fb_arena) + 63) / 64 * 64)

static struct {
    pthread_once_t once;
    pthread_key_t key;
    int ok;
} g_fb = {PTHREAD_ONCE_INIT, 0, 0};

static void arena_free(void *p) {
    kd_fb_arena *a = p;
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static void arena_key_create(void) { g_fb.ok = pthread_key_create(&g_fb.key, arena_free) == 0; }

static kd_fb_arena *arena_of_this_thread(void) {
    pthread_once(&g_fb.once, arena_key_create);
    return g_fb.ok ? (kd_fb_arena *)pthread_getspecific(g_fb.key) : NULL;
}

/* Makes this thread's scratch hold the fallback of every product of these shapes (bf16: also
 * that of native bf16 tiles, b16_fb_floats). */
static size_t b16_fb_floats(int64_t m, int64_t n, int64_t k);
static int b16_possible(void);
static kdloss_status fb_reserve(const kd_gemm_shape *shapes, int n, int bf16) {
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        const kd_gemm_shape *s = &shapes[i];
        if (s->m <= 0 || s->n <= 0 || s->k <= 0) continue; /* no product: nothing to reserve */
        size_t f = bf16 ? b16_fb_floats(s->m, s->n, s->k) : kd_gemm_fb_floats(s->m, s->n, s->k);
        if (f > need) need = f;
    }
    if (need == 0) return KDLOSS_OK;
    kd_fb_arena *old = arena_of_this_thread();
    if (!g_fb.ok) return KDLOSS_ERR_OUT_OF_MEMORY; /* pthread_key_create: EAGAIN / ENOMEM */
    if (old && old->floats >= need) return KDLOSS_OK;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, KD_FB_HEAD + need * sizeof(float)) != 0)
        return KDLOSS_ERR_OUT_OF_MEMORY; /* the old scratch stays */
    kd_fb_arena *a = mem;
    if (pthread_mutex_init(&a->lock, NULL) != 0) {
        free(mem);
        return KDLOSS_ERR_OUT_OF_MEMORY;
    }
    a->floats = need;
    a->scratch = (float *)((char *)mem + KD_FB_HEAD);
    if (pthread_setspecific(g_fb.key, a) != 0) { /* may allocate the key's slot: ENOMEM */
        arena_free(a);
        return KDLOSS_ERR_OUT_OF_MEMORY;
    }
    if (old) arena_free(old);
    return KDLOSS_OK;
}

kdloss_status kd_gemm_prepare(const kd_gemm_shape *shapes, int n) {
    /* OpenBLAS exits inside a failed allocation: nothing to reserve for it (gemm.h) */
    if (kd_gemm_provider_in_use() != KD_TILED) return KDLOSS_OK;
    return fb_reserve(shapes, n, b16_possible());
}

static void fallback_run(const kd_gemm *g, float *scratch) { kd_cpu_kernels()->gemm_fb(g, scratch); }

/* KDLOSS_GEMM_FALLBACK=always: every oneDNN tile goes to the fallback as if dnnl_sgemm had run
 * out of memory (for the tests; read at each product so a test can switch it). */
static int fallback_forced(void) {
    const char *e = getenv("KDLOSS_GEMM_FALLBACK");
    return e && strcmp(e, "always") == 0;
}

typedef struct sgemm_ctx {
    const kd_gemm *g;
    kd_fb_arena *arena; /* the calling thread's, or NULL */
    int force;
} sgemm_ctx;

#if KD_HAVE_ONEDNN
/* One tile, single-threaded, of the provider that runs the grid. */
static dnnl_status_t tile_sgemm(const kd_gemm *t) {
    return dnnl_sgemm(t->ta ? 'T' : 'N', t->tb ? 'T' : 'N', t->m, t->n, t->k, t->alpha, t->a,
                      t->lda, t->b, t->ldb, t->beta, t->c, t->ldc);
}
#else
/* The builtin provider's per-thread scratch: one block (its float count in the first 64 bytes,
 * then the floats), grown on demand, freed when the thread ends. */
static struct {
    pthread_once_t once;
    pthread_key_t key;
    int ok;
} g_bi = {PTHREAD_ONCE_INIT, 0, 0};

static void bi_key_create(void) { g_bi.ok = pthread_key_create(&g_bi.key, free) == 0; }

static dnnl_status_t tile_sgemm(const kd_gemm *t) {
    size_t need = kd_gemm_fb_floats(t->m, t->n, t->k);
    pthread_once(&g_bi.once, bi_key_create);
    if (!g_bi.ok) return dnnl_out_of_memory;
    size_t *blk = pthread_getspecific(g_bi.key);
    if (!blk || blk[0] < need) { /* out of memory: C untouched, as dnnl_sgemm leaves it */
        size_t *grown = NULL;
        if (posix_memalign((void **)&grown, 64, 64 + need * sizeof(float)) != 0)
            return dnnl_out_of_memory;
        grown[0] = need;
        if (pthread_setspecific(g_bi.key, grown) != 0) {
            free(grown);
            return dnnl_out_of_memory;
        }
        free(blk);
        blk = grown;
    }
    fallback_run(t, (float *)((char *)blk + 64));
    return dnnl_success;
}
#endif

static dnnl_status_t sgemm_tile(const void *ctx, int64_t i0, int64_t j0, int64_t mi, int64_t nj) {
    const sgemm_ctx *x = ctx;
    const kd_gemm *g = x->g;
    const float *a = g->ta ? g->a + i0 : g->a + i0 * g->lda;
    const float *b = g->tb ? g->b + j0 * g->ldb : g->b + j0;
    float *c = g->c + i0 * g->ldc + j0;
    kd_gemm t = {g->ta, g->tb, mi, nj, g->k, g->alpha, a, g->lda, b, g->ldb, g->beta, c, g->ldc};
    dnnl_status_t s = x->force ? dnnl_out_of_memory : tile_sgemm(&t);
    /* out of memory: C is untouched (see the top of this file); redo the tile without allocating
     * when the scratch reserved by kd_gemm_prepare holds it, else report it */
    kd_fb_arena *ar = x->arena;
    if (s != dnnl_out_of_memory || !ar || ar->floats < kd_gemm_fb_floats(mi, nj, g->k)) return s;
    pthread_mutex_lock(&ar->lock);
    fallback_run(&t, ar->scratch);
    pthread_mutex_unlock(&ar->lock);
    return dnnl_success;
}

static kdloss_status tiled_sgemm(const kd_gemm *g) {
    sgemm_ctx x = {g, arena_of_this_thread(), fallback_forced()};
    return from_dnnl(for_tiles(g->m, g->n, g->k, sgemm_tile, &x));
}

/* ---- fp32 x bf16 widened inside the tiles (gemm.h) -------------------------------------- */

/* A slot (one tile's rows of B in fp32) of at most this many bytes: at the default shape its
 * tiles are as wide as the panel loop's were (512 rows at k 2048), so A is packed as often. */
#define KD_B16_SLOT_BYTES ((size_t)4 << 20)

/* Rows of B a tile widens: at most KD_B16_SLOT_BYTES of fp32 and at least two slots in
 * `floats`, a multiple of 16; 0 when the scratch is too small. */
static int64_t b16_rows(int64_t k, size_t floats) {
    if (k <= 0) return 0;
    int64_t rows = (int64_t)(KD_B16_SLOT_BYTES / sizeof(float) / (size_t)k);
    int64_t fit = (int64_t)(floats / 2 / (size_t)k); /* two slots at least */
    if (fit < rows) rows = fit;
    rows = rows / 16 * 16;
    return rows >= 16 ? rows : 0;
}

typedef struct b16_ctx {
    int64_t k, lda, ldb, ldc;
    const float *a;
    const uint16_t *b;
    float *c, *scratch;
    size_t slot_floats;
    kd_fb_arena *arena;
    int force;
} b16_ctx;

/* Column tile [j0, j0 + nj) of all mi = m rows (run_grid's tile_fn): those rows of B widened
 * into this thread's slot, then one single-threaded product over the whole k (sgemm_tile, with
 * its out-of-memory fallback). */
static dnnl_status_t b16_tile(const void *ctx, int64_t i0, int64_t j0, int64_t mi, int64_t nj) {
    const b16_ctx *x = ctx;
    float *bp = x->scratch + (size_t)omp_get_thread_num() * x->slot_floats; /* < nthr slots */
    kd_bf16_rows_to_f32(x->b + j0 * x->ldb, x->ldb, nj, x->k, bp, 0);
    kd_gemm g = {0, 1, mi, nj, x->k, 1.0f, x->a, x->lda, bp, x->k, 0.0f, x->c + j0, x->ldc};
    sgemm_ctx sx = {&g, x->arena, x->force};
    return sgemm_tile(&sx, i0, 0, mi, nj);
}

kdloss_status kd_sgemm_nt_b16(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                              const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                              float *scratch, size_t floats) {
    int64_t rows = b16_rows(k, floats);
    if (kd_gemm_provider_in_use() != KD_TILED || rows == 0)
        return KDLOSS_ERR_UNSUPPORTED;
    if (m <= 0 || n <= 0) return KDLOSS_OK;
    size_t slot = (size_t)(rows * k);
    b16_ctx x = {k, lda, ldb, ldc, a, b, c, scratch, slot, arena_of_this_thread(),
                 fallback_forced()};
    int64_t slots = (int64_t)(floats / slot);
    int nthr = omp_get_max_threads() < slots ? omp_get_max_threads() : (int)slots;
    return from_dnnl(run_grid(m, n, m, rows, nthr, b16_tile, &x));
}

/* ---- bf16 x bf16 -> fp32 (oneDNN's bf16 gemm) ----------------------------------------------
 * Native or widened, chosen by measurement, not by CPU feature: the first time a
 * bf16 product needs the choice (kd_gemm_bf16_native with mode AUTO), the process times
 * oneDNN's bf16 x bf16 -> fp32 gemm against dnnl_sgemm on the same product widened to fp32,
 * on one thread (every tile of kd_gemm_bf16_run and kd_sgemm runs on one thread, so the
 * per-core rates are the ones that count, and the choice does not depend on the thread count),
 * M 256, N 1024, K 1024 (a chunk's logits GEMM; B stored N x K), one warm-up and
 * KD_B16_REPS timed runs of each, alternated, best of each. Native wins when it is at least
 * KD_B16_MARGIN times faster. The widening itself is not timed (its cost is spread over a call's
 * chunks), which leans towards widen: native is chosen only where it clearly wins.
 * Where oneDNN has no bf16 gemm for the CPU (oneDNN 2.6 needs AVX-512), the choice is widen
 * without timing anything. What each machine measured and
 * chose is in BENCHMARKS.md. The result is cached for the process (pthread_once: several
 * threads asking at once wait for one timing). */

#define KD_B16_M 256
#define KD_B16_N 1024
#define KD_B16_K 1024
#define KD_B16_REPS 3
#define KD_B16_MARGIN 1.15

static struct {
    pthread_once_t probe_once, measure_once, decide_once;
    int available;      /* oneDNN's bf16 gemm runs on this CPU */
    int reference;      /* ... but only as a reference implementation (never, with the gemm) */
    char impl[64];      /* its kernel */
    int measurements;   /* timings run (0 or 1) */
    double native_gf, widen_gf;
    int native;         /* AUTO's choice */
} g_b16 = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, 0, 0, "none", 0, 0.0, 0.0, 0};

#if KD_HAVE_ONEDNN
/* Whether oneDNN's bf16 gemm runs here, and on which kernel: a 16 x 64 x 32 product (oneDNN
 * 2.6 returns dnnl_unimplemented without AVX-512; with AVX-512 but no AVX512_BF16 its kernel
 * emulates the bf16 dot products, which the timing then weighs). */
static void bf16_probe(void) {
    enum { PM = 16, PN = 64, PK = 32 };
    static uint16_t a[PM * PK], b[PN * PK];
    static float c[PM * PN];
    for (int i = 0; i < PM * PK; i++) a[i] = 0x3f80u; /* 1.0 */
    for (int i = 0; i < PN * PK; i++) b[i] = 0x3f80u;
    int save = omp_get_max_threads();
    omp_set_num_threads(1);
    dnnl_status_t s = dnnl_gemm_bf16bf16f32('N', 'T', PM, PN, PK, 1.0f, a, PK, b, PK, 0.0f, c, PN);
    omp_set_num_threads(save);
    if (s != dnnl_success || c[0] != (float)PK) return;
    snprintf(g_b16.impl, sizeof g_b16.impl, "gemm:jit:%s",
             dnnl_has(dnnl_cpu_isa_avx512_core_bf16) ? "avx512_core_bf16" : "avx512_core (bf16 emulated)");
    g_b16.available = 1;
}
#else
static void bf16_probe(void) { snprintf(g_b16.impl, sizeof g_b16.impl, "none (no oneDNN)"); }
#endif

static int b16_available(void) {
    pthread_once(&g_b16.probe_once, bf16_probe);
    return g_b16.available;
}

/* KDLOSS_GEMM_BF16_EMULATE=1 (for the tests): where oneDNN has no bf16 gemm, NATIVE may still
 * be forced, and each of its tiles is computed by widening the tile's operands to fp32 and one
 * single-threaded dnnl_sgemm: the products are exact in fp32 as in the native kernels, only the
 * summation order differs. Lets the machines without native bf16 run the native paths of the
 * fused losses (dZ rounded to bf16, strided and transposed operands, C accumulated). Read at
 * every use, so a test can switch it. Never chosen by AUTO. */
static int b16_emulate(void) {
    const char *e = getenv("KDLOSS_GEMM_BF16_EMULATE");
    return e && strcmp(e, "1") == 0;
}

/* Whether a bf16 product may run natively in this process (so kd_gemm_prepare reserves its
 * fallback too): not when WIDEN is forced, nor where oneDNN has no bf16 gemm (unless emulated). */
static int b16_possible(void) {
    return g_bf16_mode != KDLOSS_BF16_GEMM_WIDEN && (b16_available() || b16_emulate());
}

/* Rows x cols of bf16 (ld) into contiguous fp32. */
static void b16_widen(const uint16_t *src, int64_t ld, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            uint32_t u = (uint32_t)src[r * ld + c] << 16;
            memcpy(&dst[r * cols + c], &u, sizeof u);
        }
}

static dnnl_status_t bf16_tile_emulated(const kd_gemm_bf16 *g, const uint16_t *a,
                                        const uint16_t *b, float *c, int64_t mi, int64_t nj) {
    /* op(A) tile: stored k x mi (ta) or mi x k; op(B) tile: stored nj x k (tb) or k x nj */
    int64_t ar = g->ta ? g->k : mi, ac = g->ta ? mi : g->k;
    int64_t br = g->tb ? nj : g->k, bc = g->tb ? g->k : nj;
    float *af = malloc(sizeof(float) * (size_t)(ar * ac));
    float *bf = malloc(sizeof(float) * (size_t)(br * bc));
    dnnl_status_t s = dnnl_out_of_memory;
    if (af && bf) {
        b16_widen(a, g->lda, ar, ac, af);
        b16_widen(b, g->ldb, br, bc, bf);
        kd_gemm t = {g->ta, g->tb, mi, nj, g->k, 1.0f, af, ac, bf, bc, g->beta, c, g->ldc};
        s = tile_sgemm(&t);
    }
    free(af);
    free(bf);
    return s;
}

/* Floats of scratch the fallback of a native bf16 tile of at most m x n x k needs: gemm_fb's
 * own, then one block of op(A) (<= KD_FB_MC x KD_FB_KC) and one of op(B) (<= KD_FB_KC x
 * KD_FB_NC) widened to fp32. Monotone in each dimension, as kd_gemm_fb_floats. */
static size_t b16_fb_floats(int64_t m, int64_t n, int64_t k) {
    size_t mc = (size_t)(m < KD_FB_MC ? m : KD_FB_MC), nc = (size_t)(n < KD_FB_NC ? n : KD_FB_NC);
    size_t kc = (size_t)(k < KD_FB_KC ? k : KD_FB_KC);
    return (kd_gemm_fb_floats(m, n, k) + 15) / 16 * 16 + (mc + nc) * kc;
}

/* C (mi x nj, ldc) = op(A) op(B) + beta C of one tile without allocating, from `scratch`
 * (b16_fb_floats of the tile): for each block of KD_FB_MC rows, KD_FB_NC columns and KD_FB_KC of
 * the inner dimension, the two operand blocks are widened to fp32 (exactly) and multiplied into
 * C by the allocation-free GEMM (beta on the first K block, 1 on the later ones). */
static void bf16_tile_fallback(const kd_gemm_bf16 *g, const uint16_t *a, const uint16_t *b,
                               float *c, int64_t mi, int64_t nj, float *scratch) {
    const int64_t k = g->k;
    float *fb = scratch;
    float *aw = fb + (kd_gemm_fb_floats(mi, nj, k) + 15) / 16 * 16;
    float *bw = aw + (size_t)(mi < KD_FB_MC ? mi : KD_FB_MC) * (size_t)(k < KD_FB_KC ? k : KD_FB_KC);
    for (int64_t r0 = 0; r0 < mi; r0 += KD_FB_MC)
        for (int64_t c0 = 0; c0 < nj; c0 += KD_FB_NC)
            for (int64_t k0 = 0; k0 < k; k0 += KD_FB_KC) {
                int64_t mb = mi - r0 < KD_FB_MC ? mi - r0 : KD_FB_MC;
                int64_t nb = nj - c0 < KD_FB_NC ? nj - c0 : KD_FB_NC;
                int64_t kb = k - k0 < KD_FB_KC ? k - k0 : KD_FB_KC;
                /* op(A) block: stored kb x mb (ta) or mb x kb; op(B): nb x kb (tb) or kb x nb */
                if (g->ta) b16_widen(a + k0 * g->lda + r0, g->lda, kb, mb, aw);
                else b16_widen(a + r0 * g->lda + k0, g->lda, mb, kb, aw);
                if (g->tb) b16_widen(b + c0 * g->ldb + k0, g->ldb, nb, kb, bw);
                else b16_widen(b + k0 * g->ldb + c0, g->ldb, kb, nb, bw);
                kd_gemm t = {g->ta, g->tb, mb, nb, kb, 1.0f, aw, g->ta ? mb : kb, bw,
                             g->tb ? kb : nb, k0 == 0 ? g->beta : 1.0f,
                             c + r0 * g->ldc + c0, g->ldc};
                fallback_run(&t, fb);
            }
}

typedef struct b16n_ctx {
    const kd_gemm_bf16 *g;
    kd_fb_arena *arena; /* the calling thread's, or NULL */
    int force;
} b16n_ctx;

/* One tile of a bf16 product through oneDNN's bf16 gemm (dnnl_gemm_bf16bf16f32, exported by
 * libdnnl beside dnnl_sgemm though not in its header): like dnnl_sgemm it allocates its packing
 * buffers inside the call and returns dnnl_out_of_memory with C untouched when that fails
 * (tests/fault), which oneDNN 2.6's matmul primitives do not (they end in SIGSEGV or
 * std::terminate). Out of memory: the tile is redone without allocating when the scratch
 * kd_gemm_prepare reserved holds it, as sgemm_tile does. */
static dnnl_status_t bf16_tile(const void *ctx, int64_t i0, int64_t j0, int64_t mi, int64_t nj) {
    const b16n_ctx *x = ctx;
    const kd_gemm_bf16 *g = x->g;
    const uint16_t *a = g->ta ? g->a + i0 : g->a + i0 * g->lda;
    const uint16_t *b = g->tb ? g->b + j0 * g->ldb : g->b + j0;
    float *c = g->c + i0 * g->ldc + j0;
    dnnl_status_t s;
    if (x->force) s = dnnl_out_of_memory;
    else if (!b16_available() && b16_emulate()) s = bf16_tile_emulated(g, a, b, c, mi, nj);
    else
#if KD_HAVE_ONEDNN
        s = dnnl_gemm_bf16bf16f32(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', mi, nj, g->k, 1.0f, a,
                                  g->lda, b, g->ldb, g->beta, c, g->ldc);
#else
        s = dnnl_unimplemented; /* no oneDNN: no native bf16 kernel (b16_available is 0) */
#endif
    kd_fb_arena *ar = x->arena;
    if (s != dnnl_out_of_memory || !ar || ar->floats < b16_fb_floats(mi, nj, g->k)) return s;
    pthread_mutex_lock(&ar->lock);
    bf16_tile_fallback(g, a, b, c, mi, nj, ar->scratch);
    pthread_mutex_unlock(&ar->lock);
    return dnnl_success;
}

kdloss_status kd_gemm_bf16_run(const kd_gemm_bf16 *g) {
    if (g->m == 0 || g->n == 0) return KDLOSS_OK;
    b16n_ctx x = {g, arena_of_this_thread(), fallback_forced()};
    return from_dnnl(for_tiles(g->m, g->n, g->k, bf16_tile, &x));
}

static double b16_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The timing (see the top of this section); both rates stay 0 if it cannot run. */
static void bf16_measure(void) {
    const int64_t m = KD_B16_M, n = KD_B16_N, k = KD_B16_K;
    int native = b16_available() && !g_b16.reference;
    uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)(m * k));
    uint16_t *b16 = malloc(sizeof(uint16_t) * (size_t)(n * k));
    float *af = malloc(sizeof(float) * (size_t)(m * k)), *bf = malloc(sizeof(float) * (size_t)(n * k));
    float *c = malloc(sizeof(float) * (size_t)(m * n));
    g_b16.measurements++;
    if (a16 && b16 && af && bf && c) {
        uint32_t x = 12345u; /* values in about [-1, 1), exact in bf16 */
        for (int64_t i = 0; i < m * k + n * k; i++) {
            x = x * 1664525u + 1013904223u;
            uint16_t h = (uint16_t)(((x >> 9) & 0x7fu) | 0x3f80u | (x & 0x8000u));
            if (i < m * k) a16[i] = h;
            else b16[i - m * k] = h;
        }
        b16_widen(a16, k, m, k, af);
        b16_widen(b16, k, n, k, bf);
        kd_gemm_bf16 g = {0, 1, m, n, k, a16, k, b16, k, c, n, 0.0f};
        b16n_ctx gx = {&g, NULL, 0};
        double best_w = 1e30, best_n = 1e30;
        int ok = 1, save = omp_get_max_threads();
        omp_set_num_threads(1); /* one thread, as a tile runs */
        for (int r = 0; r <= KD_B16_REPS && ok; r++) { /* r = 0 warms up (JIT, caches) */
            for (int which = 0; which < 2 && ok; which++) {
                int nat = (which + r) & 1; /* alternated, the order swapped every run */
                if (nat && !native) continue;
                double t0 = b16_now();
                kd_gemm w = {0, 1, m, n, k, 1.0f, af, k, bf, k, 0.0f, c, n};
                dnnl_status_t s = nat ? bf16_tile(&gx, 0, 0, m, n) : tile_sgemm(&w);
                double t = b16_now() - t0;
                if (s != dnnl_success) {
                    if (nat) native = 0;
                    else ok = 0;
                    continue;
                }
                if (r == 0) continue;
                if (nat && t < best_n) best_n = t;
                if (!nat && t < best_w) best_w = t;
            }
        }
        omp_set_num_threads(save);
        double flop = 2.0 * (double)m * (double)n * (double)k;
        if (ok) g_b16.widen_gf = flop / best_w * 1e-9;
        if (ok && native && best_n < 1e30) g_b16.native_gf = flop / best_n * 1e-9;
    }
    free(a16);
    free(b16);
    free(af);
    free(bf);
    free(c);
}

static void bf16_decide(void) {
    if (!b16_available() || g_b16.reference) return; /* widen, nothing to time */
    pthread_once(&g_b16.measure_once, bf16_measure);
    g_b16.native = g_b16.native_gf > 0.0 && g_b16.widen_gf > 0.0 &&
                   g_b16.native_gf >= KD_B16_MARGIN * g_b16.widen_gf;
}

static int bf16_auto_native(void) {
    if (kd_gemm_provider_in_use() != KD_TILED) return 0;
    pthread_once(&g_b16.decide_once, bf16_decide);
    return g_b16.native;
}

int kd_gemm_bf16_native(void) {
    int mode = g_bf16_mode;
    if (mode != KDLOSS_BF16_GEMM_AUTO) return mode == KDLOSS_BF16_GEMM_NATIVE;
    return bf16_auto_native();
}

int kd_gemm_bf16_grad_native(void) {
    return g_bf16_grad == KDLOSS_BF16_GRAD_AUTO && kd_gemm_bf16_native();
}

kdloss_status kdloss_gemm_set_bf16(kdloss_bf16_gemm mode) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (mode < KDLOSS_BF16_GEMM_AUTO || mode > KDLOSS_BF16_GEMM_NATIVE)
        return KDLOSS_ERR_INVALID_PARAM;
    if (mode == KDLOSS_BF16_GEMM_NATIVE && !b16_available() && !b16_emulate())
        return KDLOSS_ERR_UNSUPPORTED;
    g_bf16_mode = (int)mode;
    return KDLOSS_OK;
}

kdloss_status kdloss_gemm_set_bf16_grad(kdloss_bf16_grad mode) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (mode != KDLOSS_BF16_GRAD_AUTO && mode != KDLOSS_BF16_GRAD_EXACT)
        return KDLOSS_ERR_INVALID_PARAM;
    g_bf16_grad = (int)mode;
    return KDLOSS_OK;
}

kdloss_status kdloss_gemm_bf16_query(kdloss_bf16_gemm_info *info) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!info) return KDLOSS_ERR_NULL_POINTER;
    b16_available();
    pthread_once(&g_b16.measure_once, bf16_measure);
    pthread_once(&g_b16.decide_once, bf16_decide);
    kdloss_bf16_gemm_info r;
    memset(&r, 0, sizeof r);
    r.mode = (kdloss_bf16_gemm)g_bf16_mode;
    r.grad = (kdloss_bf16_grad)g_bf16_grad;
    r.native = kd_gemm_bf16_native();
    r.grad_native = kd_gemm_bf16_grad_native();
    r.auto_native = g_b16.native;
    r.available = g_b16.available;
    r.reference = g_b16.reference;
    r.measurements = g_b16.measurements;
    r.native_gflops = g_b16.native_gf;
    r.widen_gflops = g_b16.widen_gf;
    r.margin = KD_B16_MARGIN;
    r.m = KD_B16_M;
    r.n = KD_B16_N;
    r.k = KD_B16_K;
    snprintf(r.kernel, sizeof r.kernel, "%s", g_b16.impl);
    *info = r;
    return KDLOSS_OK;
}

/* ---- dispatch and the public side ------------------------------------------------------- */

static int provider_available(kdloss_gemm_provider p) {
    return p == KD_TILED || (p == KDLOSS_GEMM_OPENBLAS && openblas_available());
}

kdloss_gemm_provider kd_gemm_provider_in_use(void) {
    int p = g_provider;
    if (p) return (kdloss_gemm_provider)p;
    kdloss_gemm_provider chosen = KD_TILED;
    const char *env = getenv("KDLOSS_GEMM");
    if (env && strcmp(env, "openblas") == 0 && openblas_available()) chosen = KDLOSS_GEMM_OPENBLAS;
    g_provider = (int)chosen;
    return chosen;
}

/* C = beta C without reading C when beta is 0 (a product with k = 0; providers differ there). */
static void scale_c(const kd_gemm *g) {
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++)
            g->c[i * g->ldc + j] = g->beta == 0.0f ? 0.0f : g->beta * g->c[i * g->ldc + j];
}

static kdloss_status run_with(kdloss_gemm_provider p, const kd_gemm *g) {
    if (g->m == 0 || g->n == 0) return KDLOSS_OK;
    if (g->k == 0) {
        scale_c(g);
        return KDLOSS_OK;
    }
    return p == KDLOSS_GEMM_OPENBLAS ? openblas_sgemm(g) : tiled_sgemm(g);
}

kdloss_status kd_sgemm(const kd_gemm *g) { return run_with(kd_gemm_provider_in_use(), g); }

kdloss_status kdloss_gemm_set_provider(kdloss_gemm_provider provider) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (provider < KDLOSS_GEMM_AUTO || provider > KDLOSS_GEMM_BUILTIN)
        return KDLOSS_ERR_INVALID_PARAM;
    if (provider == KDLOSS_GEMM_AUTO) {
        g_provider = 0;
        return KDLOSS_OK;
    }
    if (!provider_available(provider)) return KDLOSS_ERR_UNSUPPORTED;
    g_provider = (int)provider;
    return KDLOSS_OK;
}

kdloss_status kdloss_gemm_query(kdloss_gemm_provider provider, kdloss_gemm_info *info) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    if (!info) return KDLOSS_ERR_NULL_POINTER;
    if (provider < KDLOSS_GEMM_AUTO || provider > KDLOSS_GEMM_BUILTIN)
        return KDLOSS_ERR_INVALID_PARAM;
    if (provider == KDLOSS_GEMM_AUTO) provider = kd_gemm_provider_in_use();
    if (!provider_available(provider)) return KDLOSS_ERR_UNSUPPORTED;
    kdloss_gemm_info r;
    memset(&r, 0, sizeof r);
    r.provider = provider;
    if (provider == KDLOSS_GEMM_BUILTIN) { /* gemm_fb's kernel of the dispatched ISA */
        snprintf(r.name, sizeof r.name, "builtin");
        snprintf(r.version, sizeof r.version, "%s", kdloss_version());
        snprintf(r.kernel, sizeof r.kernel, "gemm_fb %s", kdloss_cpu_isa_name(kdloss_cpu_get_isa()));
        r.thread_independent = 1;
        r.bf16_native = 0;
    } else if (provider == KDLOSS_GEMM_ONEDNN) {
#if KD_HAVE_ONEDNN
        const dnnl_version_t *v = dnnl_version();
        snprintf(r.name, sizeof r.name, "onednn");
        snprintf(r.version, sizeof r.version, "%d.%d.%d", v->major, v->minor, v->patch);
        snprintf(r.kernel, sizeof r.kernel, "%s", dnnl_isa_name(dnnl_get_effective_cpu_isa()));
        r.generic = cpu_has_avx2() && !dnnl_has(dnnl_cpu_isa_avx2);
        r.thread_independent = 1;
        r.bf16_native = kd_gemm_bf16_native();
#endif
    } else {
        const char *core = g_ob.corename ? g_ob.corename() : "unknown";
        const char *cfg = g_ob.config ? g_ob.config() : "";
        const char *ver = strstr(cfg, "OpenBLAS ");
        snprintf(r.name, sizeof r.name, "openblas");
        if (ver) snprintf(r.version, sizeof r.version, "%.*s", (int)strcspn(ver + 9, " "), ver + 9);
        else snprintf(r.version, sizeof r.version, "unknown");
        snprintf(r.kernel, sizeof r.kernel, "%s", core);
        r.generic = openblas_core_generic(core);
    }
    *info = r;
    return KDLOSS_OK;
}

/* The public GEMMs' argument checks (kdloss.h: kdloss_gemm_f32, kdloss_gemm_bf16); operands
 * of dtype dt, C fp32. */
static kdloss_status check_gemm(kdloss_gemm_provider provider, int trans_a, int trans_b,
                                int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                                const void *b, int64_t ldb, const float *c, int64_t ldc,
                                kdloss_dtype dt) {
    if (provider < KDLOSS_GEMM_AUTO || provider > KDLOSS_GEMM_BUILTIN)
        return KDLOSS_ERR_INVALID_PARAM;
    if ((trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return KDLOSS_ERR_INVALID_PARAM;
    if (m < 0 || n < 0 || k < 0) return KDLOSS_ERR_INVALID_SIZE;
    if (!c || (k > 0 && (!a || !b))) return KDLOSS_ERR_NULL_POINTER;
    int64_t a_cols = trans_a ? m : k, b_cols = trans_b ? k : n;
    if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return KDLOSS_ERR_INVALID_STRIDE;
    if (m > 0 && n > 0) { /* C must not overlap the operands (every span also size-checked) */
        int64_t ld;
        kd_span sa = {0}, sb = {0}, sc;
        kdloss_status st = kd_check_fmat(m, n, c, KDLOSS_F32, ldc, &ld, &sc);
        if (st == KDLOSS_OK && k > 0)
            st = kd_check_fmat(trans_a ? k : m, a_cols, a, dt, lda, &ld, &sa);
        if (st == KDLOSS_OK && k > 0)
            st = kd_check_fmat(trans_b ? n : k, b_cols, b, dt, ldb, &ld, &sb);
        if (st != KDLOSS_OK) return st;
        if (kd_spans_overlap(sc, sa) || kd_spans_overlap(sc, sb)) return KDLOSS_ERR_ALIASING;
    }
    return KDLOSS_OK;
}

kdloss_status kdloss_gemm_f32(kdloss_gemm_provider provider, int trans_a, int trans_b, int64_t m,
                              int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kdloss_status st = check_gemm(provider, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                                  KDLOSS_F32);
    if (st != KDLOSS_OK) return st;
    if (provider == KDLOSS_GEMM_AUTO) provider = kd_gemm_provider_in_use();
    if (!provider_available(provider)) return KDLOSS_ERR_UNSUPPORTED;
    if (provider == KD_TILED) { /* running out of memory cannot leave C half done */
        kd_gemm_shape shape = {m, n, k};
        st = fb_reserve(&shape, 1, 0);
        if (st != KDLOSS_OK) return st;
    }
    kd_gemm g = {trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
    return run_with(provider, &g);
}

/* cblas_sbgemm of the loaded OpenBLAS (32-bit sizes), when it exports one. */
static kdloss_status openblas_sbgemm(const kd_gemm_bf16 *g) {
    if (!openblas_available() || !g_ob.sbgemm) return KDLOSS_ERR_UNSUPPORTED;
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->lda > INT_MAX ||
        g->ldb > INT_MAX || g->ldc > INT_MAX)
        return KDLOSS_ERR_UNSUPPORTED;
    enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
    g_ob.sbgemm(ROW_MAJOR, g->ta ? TRANS : NO_TRANS, g->tb ? TRANS : NO_TRANS, (int)g->m,
                (int)g->n, (int)g->k, 1.0f, g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, g->c,
                (int)g->ldc);
    return KDLOSS_OK;
}

kdloss_status kdloss_gemm_bf16(kdloss_gemm_provider provider, int trans_a, int trans_b, int64_t m,
                               int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                               const uint16_t *b, int64_t ldb, float beta, float *c,
                               int64_t ldc) {
    kd_detail_clear(); /* this call's own detail or none (kdloss.h) */
    kdloss_status st = check_gemm(provider, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc,
                                  KDLOSS_BF16);
    if (st != KDLOSS_OK) return st;
    if (beta != 0.0f && beta != 1.0f) return KDLOSS_ERR_INVALID_PARAM;
    kd_gemm_bf16 g = {trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, beta};
    if (provider == KDLOSS_GEMM_OPENBLAS) return m && n ? openblas_sbgemm(&g) : KDLOSS_OK;
    if (provider != KDLOSS_GEMM_AUTO && !provider_available(provider)) return KDLOSS_ERR_UNSUPPORTED;
    if ((!b16_available() || g_b16.reference) && !b16_emulate()) return KDLOSS_ERR_UNSUPPORTED;
    if (m == 0 || n == 0) return KDLOSS_OK;
    if (k == 0) { /* C = beta C without reading C at beta 0 */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : c[i * ldc + j];
        return KDLOSS_OK;
    }
    kd_gemm_shape shape = {m, n, k}; /* running out of memory cannot leave C half done */
    st = fb_reserve(&shape, 1, 1);
    return st == KDLOSS_OK ? kd_gemm_bf16_run(&g) : st;
}
