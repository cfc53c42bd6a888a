/* Test helpers: a seeded RNG that draws fresh inputs each run (seed printed, overridable with
 * KDLOSS_TEST_SEED), the row generators the tests share, dtype packing, comparisons with stated
 * tolerances, and failure counting. Every test binary ends with kt_finish(), whose exit code is
 * non-zero on any failure. */
#ifndef KDLOSS_TESTUTIL_H
#define KDLOSS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kdloss.h"

/* ---- RNG (xoshiro256**-style, own implementation) ---- */
typedef struct kt_rng {
    uint64_t s[4];
} kt_rng;
void kt_rng_seed(kt_rng *r, uint64_t seed);
uint64_t kt_next(kt_rng *r);
double kt_uniform(kt_rng *r);                /* [0, 1) */
double kt_normal(kt_rng *r);                 /* N(0, 1) */
int64_t kt_randint(kt_rng *r, int64_t n);    /* [0, n) */
/* The run's base seed: KDLOSS_TEST_SEED if set, else time-based; printed once. */
uint64_t kt_base_seed(void);
/* 1 when KDLOSS_TEST_QUICK is set (sanitizer runs use smaller grids). */
int kt_quick(void);

/* ---- row generators (double, row-major, ld = v) ---- */
/* Kinds of rows, cycled by row index so every batch holds all of them. */
enum {
    KT_ROW_NORMAL = 0, /* log_softmax(randn * 2) */
    KT_ROW_PEAKED,     /* one token holds almost all mass */
    KT_ROW_VERYNEG,    /* log-probs down to about -1e4 (exp underflows) */
    KT_ROW_FLAT,       /* uniform-ish */
    KT_ROW_NINF,       /* some entries exactly -inf (only when allow_ninf) */
    KT_ROW_KINDS
};
/* Fills x (rows x v) with logits uniform in [-4, 4), or (logp) their log_softmax in double: the
 * NaN-policy tests' plain rows (test_nan_policy.c, tests/cuda/test_cuda_nan.c). */
void kt_uniform_rows(kt_rng *r, double *x, int64_t rows, int64_t v, int logp);
/* Fills logp (bt x v) with log-probs (log_softmax of generated logits), row kind = (r + shift) % kinds. */
void kt_gen_logprobs(kt_rng *rng, double *logp, int64_t bt, int64_t v, int allow_ninf, int shift);
/* Rounds each value to what `dt` can hold (bf16/f16 rounding), in place. */
void kt_round_to(double *x, int64_t n, kdloss_dtype dt);

/* ---- packing to library dtypes with a row stride ---- */
/* Allocates (bt x ld) elements of dt (zero-filled padding holds a poison pattern) and packs src (bt x v). */
void *kt_pack(const double *src, int64_t bt, int64_t v, int64_t ld, kdloss_dtype dt);
/* Reads element (r, c) of a packed matrix as double. */
double kt_get(const void *p, kdloss_dtype dt, int64_t ld, int64_t r, int64_t c);
/* Fills n elements of dt with a recognisable poison value (a NaN payload for floats). */
void kt_poison(void *p, int64_t n, kdloss_dtype dt);
/* 1 if the n elements of dt still hold the poison pattern. */
int kt_is_poison(const void *p, int64_t n, kdloss_dtype dt);
double kt_eps(kdloss_dtype dt); /* unit roundoff: 2^-24, 2^-8, 2^-11 */
/* Absolute resolution near zero: two subnormal steps of dt (fp32 2^-148, bf16 2^-132, fp16 2^-23),
 * the error of a result that underflows there. */
double kt_tiny(kdloss_dtype dt);
const char *kt_dtype_name(kdloss_dtype dt);

/* ---- checks ---- */
extern int kt_failures;
extern int kt_checks;
/* Passes when |got - want| <= atol + rtol * |want| (NaN/inf must match exactly). Prints on failure. */
int kt_close(double got, double want, double atol, double rtol, const char *what, ...);
#define KT_CHECK(cond, ...) kt_check_((cond), __FILE__, __LINE__, __VA_ARGS__)
int kt_check_(int cond, const char *file, int line, const char *fmt, ...);
/* Prints "N passed, N failed" and returns the process exit code. */
int kt_finish(const char *suite);

/* ---- CPU paths ---- */
/* KT_FOR_EACH_ISA(it, report) { body } runs body once per CPU path (the registry's, in enum
 * order: [KDLOSS_ISA_SCALAR, KDLOSS_ISA_COUNT)), that
 * path forced with kdloss_cpu_set_isa and named by it.name, then sets KDLOSS_ISA_AUTO again, so
 * each test states only what it checks on one path. Paths this CPU lacks are skipped. report
 * NULL prints nothing; otherwise each skip prints "path NAME: not supported by this CPU, skipped"
 * and each path run "<report>path NAME: N checks" (report "" for no prefix). The body may
 * `continue` but not `break` or `return`: the forced path would outlive the loop. */
typedef struct kt_isa_iter {
    int next;           /* the next kdloss_cpu_isa to try */
    const char *report; /* NULL: silent; else the prefix of the per-path count line */
    const char *name;   /* the path the body runs on; NULL before the first and after the last */
    int before;         /* kt_checks when that path started */
} kt_isa_iter;
kt_isa_iter kt_isa_begin(const char *report);
/* Ends the current path (its count line), forces the next supported one and returns 1; after the
 * last, restores KDLOSS_ISA_AUTO and returns 0. */
int kt_isa_next(kt_isa_iter *it);
#define KT_FOR_EACH_ISA(it, report) for (kt_isa_iter it = kt_isa_begin(report); kt_isa_next(&it);)

#endif
