/* A loss in a forked child (README, "A forked child runs serially"): the parent runs OpenMP work
 * on 2 threads (a fused loss and a KL call, so libgomp's pool has a worker), then forks; the
 * child makes the same calls and must finish within TIMEOUT_S with the parent's bits (the fused
 * loss is thread-count independent; KL's sum too, kdloss.h). Without the library's pthread_atfork
 * handler the child's first parallel region waits forever for the pool's worker, which fork did
 * not copy: the parent then kills it and the test fails. Also with a child of a child, and
 * with a fork before any kdloss call (only a plain OpenMP region ran in the parent). */
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kdloss.h"
#include "ref_fld.h"
#include "testutil.h"

#define TIMEOUT_S 20

enum { BT = 96, HS = 64, HT = 48, V = 2048 };

static kt_fld_problem prob;
static float *kx, *kt;

/* The fused loss (loss, soft loss) and a KL call (sum): three scalars into r. */
static kdloss_status work(float r[3]) {
    kdloss_fljsd_params p;
    kdloss_fljsd_params_default(&p);
    p.chunk_size = 32;
    kdloss_fljsd_out out;
    memset(&out, 0, sizeof out);
    out.loss = &r[0];
    out.soft_loss = &r[1];
    kdloss_cmat xs = {prob.pxs, KDLOSS_F32, 0}, ws = {prob.pws, KDLOSS_F32, 0};
    kdloss_cmat xt = {prob.pxt, KDLOSS_F32, 0}, wt = {prob.pwt, KDLOSS_F32, 0};
    kdloss_status st = kdloss_fused_linear_jsd(&p, BT, HS, HT, V, xs, ws, prob.pbias_s, xt, wt,
                                               prob.pbias_t,
                                               (kdloss_labels){prob.labels, KDLOSS_I64}, &out,
                                               NULL, 0);
    if (st != KDLOSS_OK) return st;
    kdloss_kl_params kp;
    kdloss_kl_params_default(&kp);
    kp.reduction = KDLOSS_REDUCTION_SUM;
    kdloss_cmat in = {kx, KDLOSS_F32, V}, tg = {kt, KDLOSS_F32, V};
    kdloss_mat none = {NULL, KDLOSS_F32, 0};
    return kdloss_kl_div(&kp, 256, V, in, tg, &r[2], NULL, none, none);
}

/* Forks; the child runs `work` (depth more levels of children first, each checked the same
 * way) and reports its scalars through *shared. 1 when the child finished with want's bits. */
static int child_ok(const float want[3], int depth, const char *what) {
    float *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return 0;
    memset(shared, 0xff, 16);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(2 * TIMEOUT_S); /* never outlive the test, whatever the parent does */
        if (depth > 0 && !child_ok(want, depth - 1, what)) _exit(3);
        float r[3];
        _exit(work(r) == KDLOSS_OK && (memcpy(shared, r, sizeof r), 1) ? 0 : 2);
    }
    if (pid < 0) return 0;
    int status = 0, done = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            done = 1;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > TIMEOUT_S) break;
        usleep(20000);
    }
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    int ok = done && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
             !memcmp(shared, want, 3 * sizeof(float));
    KT_CHECK(ok, "%s: the forked child %s", what,
             !done ? "hung (killed after the timeout)" : "ended wrongly or with other results");
    munmap(shared, 4096);
    return ok;
}

int main(void) {
    kt_rng rng;
    kt_rng_seed(&rng, kt_base_seed());
    omp_set_num_threads(2); /* a pool with a worker, even on one core */
    /* a fork before any kdloss call: only a plain OpenMP region ran in the parent */
    double acc = 0;
#pragma omp parallel reduction(+ : acc)
    acc += omp_get_thread_num();
    kt_fld_problem_make(&prob, &rng, BT, HS, HT, V, KDLOSS_F32, KDLOSS_F32, 1, 2.0, 3, -100, 0);
    kx = malloc(sizeof(float) * 256 * V);
    kt = malloc(sizeof(float) * 256 * V);
    for (int64_t i = 0; i < 256; i++) { /* log-probs of uniform rows with some spread */
        for (int64_t c = 0; c < V; c++) {
            kx[i * V + c] = (float)(kt_uniform(&rng) - log((double)V) - 0.5);
            kt[i * V + c] = (float)(kt_uniform(&rng) / (double)V);
        }
    }
    float want[3];
    omp_set_num_threads(1); /* the reference bits, computed before any fork (and serially) */
    KT_CHECK(work(want) == KDLOSS_OK, "the serial call failed");
    omp_set_num_threads(2);
    child_ok(want, 0, "fork after a plain OpenMP region (before any threaded kdloss call)");
    float again[3];
    KT_CHECK(work(again) == KDLOSS_OK && !memcmp(again, want, sizeof again),
             "the parent's 2-thread call differs from its serial one");
    child_ok(want, 0, "fork after a 2-thread kdloss call");
    child_ok(want, 1, "a child of a forked child");
    KT_CHECK(omp_get_max_threads() == 2, "the parent's thread count changed: %d",
             omp_get_max_threads());
    (void)acc;
    free(kx);
    free(kt);
    kt_fld_problem_free(&prob);
    return kt_finish("test_fork");
}
