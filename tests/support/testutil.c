#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "half.h"

int kt_failures = 0;
int kt_checks = 0;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void kt_rng_seed(kt_rng *r, uint64_t seed) {
    /* splitmix64 to spread the seed over the state */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        r->s[i] = z ^ (z >> 31);
    }
}

uint64_t kt_next(kt_rng *r) {
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double kt_uniform(kt_rng *r) { return (double)(kt_next(r) >> 11) * 0x1.0p-53; }

double kt_normal(kt_rng *r) {
    double u1 = kt_uniform(r), u2 = kt_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t kt_randint(kt_rng *r, int64_t n) { return (int64_t)(kt_next(r) % (uint64_t)n); }

uint64_t kt_base_seed(void) {
    static uint64_t seed = 0;
    static int done = 0;
    if (!done) {
        const char *e = getenv("KDLOSS_TEST_SEED");
        seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
        printf("seed %llu (rerun with KDLOSS_TEST_SEED=%llu)\n", (unsigned long long)seed,
               (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

int kt_quick(void) { return getenv("KDLOSS_TEST_QUICK") != NULL; }

void kt_uniform_rows(kt_rng *r, double *x, int64_t rows, int64_t v, int logp) {
    for (int64_t i = 0; i < rows; i++) {
        double *row = x + i * v, m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++) row[j] = 8 * kt_uniform(r) - 4;
        if (!logp) continue;
        for (int64_t j = 0; j < v; j++) m = fmax(m, row[j]);
        for (int64_t j = 0; j < v; j++) s += exp(row[j] - m);
        for (int64_t j = 0; j < v; j++) row[j] -= m + log(s);
    }
}

void kt_gen_logprobs(kt_rng *rng, double *logp, int64_t bt, int64_t v, int allow_ninf, int shift) {
    int kinds = allow_ninf ? KT_ROW_KINDS : KT_ROW_KINDS - 1;
    for (int64_t r = 0; r < bt; r++) {
        double *z = logp + r * v;
        int kind = (int)((r + shift) % kinds);
        for (int64_t c = 0; c < v; c++) {
            switch (kind) {
            case KT_ROW_NORMAL: z[c] = 2.0 * kt_normal(rng); break;
            case KT_ROW_PEAKED: z[c] = kt_normal(rng); break;
            case KT_ROW_VERYNEG: z[c] = -1e4 * kt_uniform(rng); break;
            case KT_ROW_FLAT: z[c] = 0.01 * kt_normal(rng); break;
            default: z[c] = 3.0 * kt_normal(rng); break;
            }
        }
        if (kind == KT_ROW_PEAKED) z[kt_randint(rng, v)] += 30.0;
        if (kind == KT_ROW_VERYNEG) z[kt_randint(rng, v)] = 0.0; /* keeps the row normalisable */
        double m = -INFINITY;
        for (int64_t c = 0; c < v; c++) m = z[c] > m ? z[c] : m;
        double s = 0;
        for (int64_t c = 0; c < v; c++) s += exp(z[c] - m);
        double lse = m + log(s);
        for (int64_t c = 0; c < v; c++) z[c] -= lse;
        if (kind == KT_ROW_NINF && v > 1) {
            /* about a third of the entries become -inf; the row is renormalised */
            int64_t keep = kt_randint(rng, v);
            for (int64_t c = 0; c < v; c++)
                if (c != keep && kt_uniform(rng) < 0.33) z[c] = -INFINITY;
            m = -INFINITY;
            for (int64_t c = 0; c < v; c++) m = z[c] > m ? z[c] : m;
            s = 0;
            for (int64_t c = 0; c < v; c++) s += exp(z[c] - m);
            lse = m + log(s);
            for (int64_t c = 0; c < v; c++) z[c] -= lse;
        }
    }
}

static double round_dt(double x, kdloss_dtype dt) {
    switch (dt) {
    case KDLOSS_BF16: return kd_bf16_to_f32(kd_f32_to_bf16((float)x));
    case KDLOSS_F16: return kd_f16_to_f32(kd_f32_to_f16((float)x));
    case KDLOSS_F32: return (float)x;
    default: return x;
    }
}

void kt_round_to(double *x, int64_t n, kdloss_dtype dt) {
    for (int64_t i = 0; i < n; i++) x[i] = round_dt(x[i], dt);
}

static void put(void *p, kdloss_dtype dt, int64_t i, double x) {
    switch (dt) {
    case KDLOSS_F32: ((float *)p)[i] = (float)x; break;
    case KDLOSS_BF16: ((uint16_t *)p)[i] = kd_f32_to_bf16((float)x); break;
    case KDLOSS_F16: ((uint16_t *)p)[i] = kd_f32_to_f16((float)x); break;
    default: break;
    }
}

void *kt_pack(const double *src, int64_t bt, int64_t v, int64_t ld, kdloss_dtype dt) {
    size_t es = kdloss_dtype_size(dt);
    void *p = malloc((size_t)(bt * ld) * es + 64);
    if (!p) {
        fprintf(stderr, "kt_pack: out of memory\n");
        exit(2);
    }
    kt_poison(p, bt * ld, dt);
    for (int64_t r = 0; r < bt; r++)
        for (int64_t c = 0; c < v; c++) put(p, dt, r * ld + c, src[r * v + c]);
    return p;
}

double kt_get(const void *p, kdloss_dtype dt, int64_t ld, int64_t r, int64_t c) {
    int64_t i = r * ld + c;
    switch (dt) {
    case KDLOSS_F32: return ((const float *)p)[i];
    case KDLOSS_BF16: return kd_bf16_to_f32(((const uint16_t *)p)[i]);
    case KDLOSS_F16: return kd_f16_to_f32(((const uint16_t *)p)[i]);
    default: return NAN;
    }
}

void kt_poison(void *p, int64_t n, kdloss_dtype dt) {
    size_t es = kdloss_dtype_size(dt);
    unsigned char *b = p;
    for (size_t i = 0; i < (size_t)n * es; i++) b[i] = (unsigned char)(0xA5 ^ (i % es));
}

int kt_is_poison(const void *p, int64_t n, kdloss_dtype dt) {
    size_t es = kdloss_dtype_size(dt);
    const unsigned char *b = p;
    for (size_t i = 0; i < (size_t)n * es; i++)
        if (b[i] != (unsigned char)(0xA5 ^ (i % es))) return 0;
    return 1;
}

double kt_eps(kdloss_dtype dt) {
    return dt == KDLOSS_BF16 ? 0x1p-8 : dt == KDLOSS_F16 ? 0x1p-11 : 0x1p-24;
}

double kt_tiny(kdloss_dtype dt) {
    return dt == KDLOSS_BF16 ? 0x1p-132 : dt == KDLOSS_F16 ? 0x1p-23 : 0x1p-148;
}

const char *kt_dtype_name(kdloss_dtype dt) {
    return kdloss_dtype_size(dt) ? kdloss_dtype_name(dt) : "?";
}

int kt_close(double got, double want, double atol, double rtol, const char *what, ...) {
    kt_checks++;
    int ok;
    if (isnan(want) || isinf(want)) ok = (isnan(want) && isnan(got)) || got == want;
    else ok = isfinite(got) && fabs(got - want) <= atol + rtol * fabs(want);
    if (!ok) {
        kt_failures++;
        if (kt_failures <= 50) {
            va_list ap;
            va_start(ap, what);
            printf("FAIL ");
            vprintf(what, ap);
            va_end(ap);
            printf(": got %.9g want %.9g (|diff| %.3g > atol %.3g + rtol %.3g * |want|)\n", got,
                   want, fabs(got - want), atol, rtol);
        }
    }
    return ok;
}

int kt_check_(int cond, const char *file, int line, const char *fmt, ...) {
    kt_checks++;
    if (!cond) {
        kt_failures++;
        if (kt_failures <= 50) {
            va_list ap;
            va_start(ap, fmt);
            printf("FAIL %s:%d: ", file, line);
            vprintf(fmt, ap);
            printf("\n");
            va_end(ap);
        }
    }
    return cond;
}

int kt_finish(const char *suite) {
    printf("%s: %d checks\n", suite, kt_checks);
    printf("%d passed, %d failed\n", kt_checks - kt_failures, kt_failures);
    return kt_failures ? 1 : 0;
}

kt_isa_iter kt_isa_begin(const char *report) {
    kt_isa_iter it = {KDLOSS_ISA_SCALAR, report, NULL, 0};
    return it;
}

int kt_isa_next(kt_isa_iter *it) {
    if (it->name && it->report)
        printf("%spath %s: %d checks\n", it->report, it->name, kt_checks - it->before);
    it->name = NULL;
    while (it->next < KDLOSS_ISA_COUNT) {
        kdloss_cpu_isa isa = (kdloss_cpu_isa)it->next++;
        if (!kdloss_cpu_isa_supported(isa)) {
            if (it->report)
                printf("path %s: not supported by this CPU, skipped\n", kdloss_cpu_isa_name(isa));
            continue;
        }
        kdloss_cpu_set_isa(isa);
        it->name = kdloss_cpu_isa_name(isa);
        it->before = kt_checks;
        return 1;
    }
    kdloss_cpu_set_isa(KDLOSS_ISA_AUTO);
    return 0;
}
