/* kdloss_bench_vp: the vocabulary-parallel fused losses under MPI, for BENCHMARKS.md.
 * Run with mpirun -np R; every rank holds V/R rows of the LM heads. Per call it reports the
 * median wall time (p20, p80) over --reps calls, the share of it spent inside the communicator
 * (every all-reduce timed by a wrapper around include/kdloss_mpi.h's), and the bytes each rank
 * contributed per token. With one rank it also times the single-process call on the whole heads
 * (kdloss_fused_linear_*_distill), for the ratio.
 *   mpirun -np 2 build/kdloss_bench_vp [--bt N] [--hs N] [--v N] [--k N (0: dense)] [--reps N]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kdloss_mpi.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The timing wrapper: the MPI adapter's all-reduce, with time and bytes counted. */
typedef struct timed {
    kdloss_mpi_comm mpi;
    double seconds, bytes;
    long calls;
} timed;

static int timed_allreduce(void *ctx, void *buf, int64_t n, kdloss_dtype dt, kdloss_comm_op op) {
    timed *t = (timed *)ctx;
    double t0 = now();
    int rc = t->mpi.comm.allreduce(&t->mpi, buf, n, dt, op);
    t->seconds += now() - t0;
    t->bytes += (double)n * (double)kdloss_dtype_size(dt);
    t->calls++;
    return rc;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int64_t arg(int argc, char **argv, const char *name, int64_t dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return atoll(argv[i + 1]);
    return dflt;
}

static float *randf(size_t n, float scale, unsigned *seed) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = scale * ((float)rand_r(seed) / (float)RAND_MAX - 0.5f);
    return p;
}

typedef struct job {
    int64_t bt, hs, v, k;
    float *xs, *ws, *xt, *wt, *dxs, *dws, *lp;
    int32_t *ids;
    int64_t *labels;
} job;

/* One call on rows [lo, lo + n) of the heads; shard NULL: the single-process call. */
static kdloss_status call(const job *j, const kdloss_vocab_shard *sh, int64_t lo, int64_t n) {
    float loss;
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = &loss;
    o.dxs = (kdloss_mat){j->dxs, KDLOSS_F32, 0};
    o.dws = (kdloss_mat){j->dws, KDLOSS_F32, 0};
    kdloss_labels lab = {j->labels, KDLOSS_I64};
    kdloss_cmat xs = {j->xs, KDLOSS_F32, 0}, ws = {j->ws + lo * j->hs, KDLOSS_F32, 0};
    if (j->k) {
        kdloss_fused_linear_topk_distill_params p;
        kdloss_fused_linear_topk_distill_params_default(&p);
        kdloss_topk_teacher t = {j->k, {j->ids, KDLOSS_I32, 0}, {j->lp, KDLOSS_F32, 0}};
        return sh ? kdloss_fused_linear_topk_distill_vp(&p, sh, j->bt, j->hs, n, xs, ws, NULL, t,
                                                        lab, &o, NULL, 0)
                  : kdloss_fused_linear_topk_distill(&p, j->bt, j->hs, n, xs, ws, NULL, t, lab,
                                                     &o, NULL, 0);
    }
    kdloss_fused_linear_distill_params p;
    kdloss_fused_linear_distill_params_default(&p);
    kdloss_cmat xt = {j->xt, KDLOSS_F32, 0}, wt = {j->wt + lo * j->hs, KDLOSS_F32, 0};
    return sh ? kdloss_fused_linear_distill_vp(&p, sh, j->bt, j->hs, j->hs, n, xs, ws, NULL, xt,
                                               wt, NULL, lab, &o, NULL, 0)
              : kdloss_fused_linear_distill(&p, j->bt, j->hs, j->hs, n, xs, ws, NULL, xt, wt,
                                            NULL, lab, &o, NULL, 0);
}

static void report(const char *what, double *t, int reps) {
    qsort(t, (size_t)reps, sizeof(double), cmp);
    printf("%-28s median %.3f s  p20 %.3f  p80 %.3f\n", what, t[reps / 2], t[reps / 5],
           t[(4 * reps) / 5]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    timed tc;
    memset(&tc, 0, sizeof tc);
    kdloss_comm_from_mpi(MPI_COMM_WORLD, &tc.mpi);
    kdloss_comm comm = {tc.mpi.comm.rank, tc.mpi.comm.size, timed_allreduce, &tc};
    int rank = comm.rank, size = comm.size, reps = (int)arg(argc, argv, "--reps", 5);
    job j;
    memset(&j, 0, sizeof j);
    j.bt = arg(argc, argv, "--bt", 2048);
    j.hs = arg(argc, argv, "--hs", 1024);
    j.v = arg(argc, argv, "--v", 32768);
    j.k = arg(argc, argv, "--k", 0);
    unsigned seed = 1234; /* the same inputs on every rank */
    size_t vh = (size_t)(j.v * j.hs), bh = (size_t)(j.bt * j.hs);
    j.xs = randf(bh, 1.0f, &seed), j.ws = randf(vh, 0.2f, &seed);
    j.xt = randf(bh, 1.0f, &seed), j.wt = randf(vh, 0.2f, &seed);
    j.dxs = malloc(bh * sizeof(float)), j.dws = malloc(vh * sizeof(float));
    j.labels = malloc((size_t)j.bt * sizeof(int64_t));
    j.ids = malloc((size_t)(j.bt * (j.k ? j.k : 1)) * sizeof(int32_t));
    j.lp = malloc((size_t)(j.bt * (j.k ? j.k : 1)) * sizeof(float));
    for (int64_t r = 0; r < j.bt; r++) {
        j.labels[r] = rand_r(&seed) % j.v;
        for (int64_t c = 0; c < j.k; c++) { /* distinct ids spread over the vocabulary */
            j.ids[r * j.k + c] = (int32_t)((r * 7919 + c * (j.v / j.k)) % j.v);
            j.lp[r * j.k + c] = -1.0f - 0.05f * (float)c;
        }
    }
    int64_t lo = j.v * rank / size, n = j.v * (rank + 1) / size - lo;
    kdloss_vocab_shard sh = {&comm, j.v, lo};
    double *t = malloc((size_t)reps * sizeof(double)), comm_s = 0.0, bytes = 0.0;
    for (int i = -1; i < reps; i++) { /* one warm-up call */
        MPI_Barrier(MPI_COMM_WORLD);
        tc.seconds = tc.bytes = 0.0;
        double t0 = now();
        kdloss_status st = call(&j, &sh, lo, n);
        if (st != KDLOSS_OK) {
            fprintf(stderr, "rank %d: %s\n", rank, kdloss_status_string(st));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (i < 0) continue;
        t[i] = now() - t0;
        comm_s += tc.seconds / reps;
        bytes = tc.bytes;
    }
    if (rank == 0) {
        printf("kdloss_bench_vp: %d ranks x %d threads, BT %lld, H %lld, V %lld, %s\n", size,
               omp_get_max_threads(), (long long)j.bt, (long long)j.hs, (long long)j.v,
               j.k ? "top-k teacher (bucket, forward KL)" : "dense teacher (JSD)");
        char what[64];
        snprintf(what, sizeof what, "vocab-parallel (%d ranks)", size);
        report(what, t, reps);
        qsort(t, (size_t)reps, sizeof(double), cmp);
        printf("  in the communicator: %.3f s a call (%.1f%% of the median); %.0f bytes a token"
               " a rank (%.0f of them dxs)\n",
               comm_s, 100.0 * comm_s / t[reps / 2], bytes / (double)j.bt, 4.0 * (double)j.hs);
    }
    /* the single-process call only in a 1-rank run: while rank 0 ran it, the other ranks
     * would poll in MPI_Finalize and take its cores (run `mpirun -np 1` with the ranks' threads
     * together for the comparison) */
    if (size > 1 && rank == 0)
        printf("single process: run with mpirun -np 1 and OMP_NUM_THREADS = %d x the threads\n",
               size);
    if (size == 1) {
        for (int i = -1; i < reps; i++) {
            double t0 = now();
            call(&j, NULL, 0, j.v);
            if (i >= 0) t[i] = now() - t0;
        }
        char what[64];
        snprintf(what, sizeof what, "single process (%d threads)", omp_get_max_threads());
        report(what, t, reps);
    }
    MPI_Finalize();
    return 0;
}
