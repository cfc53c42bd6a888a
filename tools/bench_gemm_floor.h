/* The GEMM floor of the fused-linear distillation loss (docs/MATH.md section 6): the time of
 * its four GEMMs at full size, fp32 on fp32 operands, through each GEMM provider kdloss loads,
 * and for bf16 workloads also bf16 x bf16 -> fp32 (kdloss_gemm_bf16 with each provider, and
 * oneDNN's own threaded matmul): the fastest is the floor (three GEMMs with no teacher model,
 * ht = 0: a sparse top-k teacher has no teacher GEMM). */
#ifndef KB_GEMM_FLOOR_H
#define KB_GEMM_FLOOR_H

#include <stdint.h>

#include "bench.h"
#include "kdloss.h"

enum { KB_GEMM_ZS = 0, KB_GEMM_ZT, KB_GEMM_DXS, KB_GEMM_DWS, KB_GEMM_COUNT };

/* What a floor round multiplies with: fp32 operands (kdloss_gemm_f32), bf16 operands
 * (kdloss_gemm_bf16: native bf16 products, fp32 sums; dZ rounded to bf16 for dXs and dWs, as
 * the native backward does), or bf16 operands through oneDNN's matmul on its own threads. */
typedef enum kb_floor_kind {
    KB_FLOOR_F32 = 0,
    KB_FLOOR_BF16 = 1,
    KB_FLOOR_BF16_DNNL = 2
} kb_floor_kind;

/* "student logits", "teacher logits", "dXs", "dWs" */
const char *kb_gemm_name(int which);

/*
 * A GEMM-floor timer running in a child process (fork + exec of this same program with the
 * hidden command `__gemm-floor`, so the child starts with fresh OpenMP and BLAS thread pools
 * whatever the parent has run). It builds its own fp32 operands xs (bt x hs), ws (v x hs),
 * xt (bt x ht), wt (v x ht) with the benchmark's value ranges; each round times, once each,
 *   zs = xs ws^T (bt x v), zt = xt wt^T (bt x v), dxs = zs ws (bt x hs), dws = zs^T xs (v x hs)
 * through kdloss_gemm_f32 with the provider the parent names. Rounds run when the parent asks,
 * so the benchmark can alternate them with its own timed calls (both then see the same load);
 * the child's buffers (two full bt x v fp32 matrices) never count in the parent's peak RSS, and
 * it waits blocked on a pipe, using no CPU, between rounds. ht = 0: no teacher model (no xt, wt,
 * zt; its time is reported as 0).
 */
typedef struct kb_floor {
    int pid; /* the child, 0 when not running */
    int to_child, from_child;
} kb_floor;

/* Starts the child and waits until its buffers are ready (bf16: with bf16 copies of the
 * operands too). Returns 0, or -1 after printing why. */
int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v, int bf16);
/* One timed round with `provider` and `kind`: ns[i] = time of GEMM i. Returns 0; 1 when the
 * provider failed or cannot load in the child; -1 after printing why when the child stopped
 * answering. */
int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, kb_floor_kind kind,
                   double ns[KB_GEMM_COUNT]);
/* Ends the child. */
void kb_floor_stop(kb_floor *f);
/* The child's side: `kdloss __gemm-floor IN_FD OUT_FD BT HS HT V BF16`. Returns an exit status. */
int kb_floor_child_main(int argc, char **argv);

/*
 * The floor beside a benchmark's timed calls (`bench distill_jsd`, `bench topk_distill`):
 *  1. kb_floor_bench_start: starts the child and runs one survey round per candidate (provider
 *     and kind; an untimed one first below a TFLOP); the fastest is the floor;
 *  2. kb_floor_bench_time: `reps` rounds, each the benchmark's n_calls calls (one timed call of
 *     each, after `warmup` untimed ones the first time) then one floor round with the fastest
 *     provider, so the calls and the floor see the same machine load; stats[c] gets call c's
 *     quantiles; the pair (call 0, floor) of each round gives a paired ratio;
 *  3. kb_floor_bench_print_survey (a line per candidate, "gemm floor, onednn ...") and
 *     kb_floor_bench_report (per-GEMM medians, "kdloss / gemm floor = ..."; records the
 *     measures gemm_floor_latency, gemm_*, gemm_floor_ratio[_paired]); report returns -1 when
 *     no complete floor was measured;
 *  4. kb_floor_bench_end.
 * A round's sum counts the logits GEMMs in forward mode, all of them otherwise.
 */
typedef enum kb_floor_providers {
    KB_FLOOR_ALL = 0,    /* every provider kdloss can load */
    KB_FLOOR_ONEDNN = 1, /* oneDNN alone (an OpenBLAS round with a generic kernel takes minutes) */
    KB_FLOOR_NONE = 2    /* no floor: kb_floor_bench_time only times the calls */
} kb_floor_providers;

/* One way of running the floor's GEMMs. */
typedef struct kb_floor_cand {
    kdloss_gemm_info info; /* its provider */
    kb_floor_kind kind;
    char what[64];         /* "fp32 operands", "bf16 x bf16 -> fp32 (kdloss tiles)", ... */
    char tag[32];          /* short name: "onednn", "onednn-bf16", "onednn-bf16-mt", ... */
    double sum;            /* survey round, seconds of the GEMMs that count; < 0: failed */
} kb_floor_cand;
#define KB_FLOOR_MAX 5

typedef struct kb_floor_bench {
    kb_floor fl;
    int64_t bt, hs, ht, v, reps;
    int forward, n_calls, bf16;
    kb_floor_providers providers;
    int n, best;              /* survey: candidates that loaded; the fastest, -1 when none ran */
    kb_floor_cand cand[KB_FLOOR_MAX];
    double *kd;               /* [c * reps + r]: call c's time in round r (sorted after timing) */
    double *floor_sum;        /* [r]: the floor round's sum, -1 when not measured */
    double *paired;           /* [r]: call 0 / floor, back to back */
    double *gemm_ns;          /* [g * reps + r]: each GEMM of each round */
    double deadline;          /* epoch s (kb_options.deadline), 0: none; set before timing */
    const char *what;         /* the benchmark, for its SMALLER line ("distill_jsd") */
} kb_floor_bench;

/* Returns 0 when a floor will be measured, -1 when not (KB_FLOOR_NONE, or the child or every
 * provider failed; the calls are still timed). kb_floor_bench_time stops after fewer than
 * `reps` rounds (at least one) when the next round, as long as the last, would end after
 * b->deadline: b->reps is then the rounds done, and a line "SMALLER <what>: N of M timed
 * rounds ..." says so (bench/run_main.sh's summary lists it). */
int kb_floor_bench_start(kb_floor_bench *b, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                         int forward, int bf16, kb_floor_providers providers, int64_t reps,
                         int n_calls);
kdloss_status kb_floor_bench_time(kb_floor_bench *b, const kb_call_fn *fns, void *const *ctxs,
                                  int64_t warmup, size_t working_set, kb_stats *stats);
void kb_floor_bench_print_survey(const kb_floor_bench *b, kb_result *res);
int kb_floor_bench_report(kb_floor_bench *b, kb_result *res, double kd_median_ns,
                          double *floor_ns, double *ratio);
const char *kb_floor_bench_provider(const kb_floor_bench *b); /* the fastest's tag; "none" */
/* The median over the rounds of GEMM g's time (after kb_floor_bench_report succeeded). */
double kb_floor_bench_gemm_median(kb_floor_bench *b, int g);
/* The median of the rounds' kdloss / floor ratios (after kb_floor_bench_report succeeded). */
double kb_floor_bench_paired(kb_floor_bench *b);
void kb_floor_bench_end(kb_floor_bench *b);

#endif
