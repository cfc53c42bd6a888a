/* The GEMM floor of the fused-linear distillation loss (docs/MATH.md section 6): the time of
 * its four GEMMs at full size, fp32 on fp32 operands, through each GEMM provider kdloss loads
 * (three with no teacher model, ht = 0: a sparse top-k teacher has no teacher GEMM). */
#ifndef KB_GEMM_FLOOR_H
#define KB_GEMM_FLOOR_H

#include <stdint.h>

#include "bench.h"
#include "kdloss.h"

enum { KB_GEMM_ZS = 0, KB_GEMM_ZT, KB_GEMM_DXS, KB_GEMM_DWS, KB_GEMM_COUNT };

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

/* Starts the child and waits until its buffers are ready. Returns 0, or -1 after printing why. */
int kb_floor_start(kb_floor *f, int64_t bt, int64_t hs, int64_t ht, int64_t v);
/* One timed round with `provider`: ns[i] = time of GEMM i. Returns 0; 1 when the provider
 * failed or cannot load in the child; -1 after printing why when the child stopped answering. */
int kb_floor_round(kb_floor *f, kdloss_gemm_provider provider, double ns[KB_GEMM_COUNT]);
/* Ends the child. */
void kb_floor_stop(kb_floor *f);
/* The child's side: `kdloss __gemm-floor IN_FD OUT_FD BT HS HT V`. Returns an exit status. */
int kb_floor_child_main(int argc, char **argv);

/*
 * The floor beside a benchmark's timed calls (`bench distill_jsd`, `bench topk_distill`):
 *  1. kb_floor_bench_start: starts the child and runs one survey round per loadable provider
 *     (an untimed one first below a TFLOP); the fastest is the floor;
 *  2. kb_floor_bench_time: `reps` rounds, each the benchmark's n_calls calls (one timed call of
 *     each, after `warmup` untimed ones the first time) then one floor round with the fastest
 *     provider, so the calls and the floor see the same machine load; stats[c] gets call c's
 *     quantiles; the pair (call 0, floor) of each round gives a paired ratio;
 *  3. kb_floor_bench_print_survey (a line per provider, "gemm floor, onednn ...") and
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

typedef struct kb_floor_bench {
    kb_floor fl;
    int64_t bt, hs, ht, v, reps;
    int forward, n_calls;
    kb_floor_providers providers;
    int n, best;              /* survey: providers that loaded; the fastest, -1 when none ran */
    kdloss_gemm_info info[2];
    double sum[2];            /* survey round, seconds of the GEMMs that count; < 0: failed */
    double *kd;               /* [c * reps + r]: call c's time in round r (sorted after timing) */
    double *floor_sum;        /* [r]: the floor round's sum, -1 when not measured */
    double *paired;           /* [r]: call 0 / floor, back to back */
    double *gemm_ns;          /* [g * reps + r]: each GEMM of each round */
} kb_floor_bench;

/* Returns 0 when a floor will be measured, -1 when not (KB_FLOOR_NONE, or the child or every
 * provider failed; the calls are still timed). */
int kb_floor_bench_start(kb_floor_bench *b, int64_t bt, int64_t hs, int64_t ht, int64_t v,
                         int forward, kb_floor_providers providers, int64_t reps, int n_calls);
kdloss_status kb_floor_bench_time(kb_floor_bench *b, const kb_call_fn *fns, void *const *ctxs,
                                  int64_t warmup, size_t working_set, kb_stats *stats);
void kb_floor_bench_print_survey(const kb_floor_bench *b, kb_result *res);
int kb_floor_bench_report(kb_floor_bench *b, kb_result *res, double kd_median_ns,
                          double *floor_ns, double *ratio);
const char *kb_floor_bench_provider(const kb_floor_bench *b); /* "onednn", ...; "none" */
void kb_floor_bench_end(kb_floor_bench *b);

#endif
