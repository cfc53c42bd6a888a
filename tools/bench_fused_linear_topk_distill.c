/* `kdloss bench topk_distill`: kdloss_fused_linear_topk_distill, the fused LM head against a
 * sparse top-k teacher (docs/MATH.md section 8), no labels (soft loss alone, weight 1).
 *
 * Inputs: torch.rand hidden states xs (BT x Hs), nn.Linear default weights ws (uniform in
 * +-1/sqrt(Hs), no bias), and a realistic sparse teacher: per row the K most likely ids of
 * log_softmax(5 randn(V)) with their log-probs (int32 ids, most likely first; fp32 log-probs
 * normalized over all V; at V 32768 the top 1 holds about 0.45 of the mass, the top 64 about
 * 0.94). --tail picks the tail mode; --tail all times bucket, renorm_both and (forward KL only)
 * renorm_teacher side by side, one call of each per round.
 *
 * Besides the latency it reports, from the same run (the machinery of `bench distill_jsd`,
 * tools/bench_gemm_floor.h):
 *  - the GEMM floor: the three GEMMs a dense tail needs (logits xs ws^T, dX = dz ws,
 *    dW = dz^T xs; no teacher GEMM), fp32, in a child process, rounds alternating with the
 *    timed calls; the ratio of the first tail's median to the floor's, and in full mode with
 *    the bucket first the TARGET line (<= 1.10);
 *  - with --tail all in full mode: renorm_both / bucket (TARGET <= 0.10);
 *  - memory: inputs, outputs and the library's workspace against the BT x V fp32 logits a
 *    materializing implementation holds; this process's peak RSS, and with --rss-target MiB a
 *    TARGET line on it (bench/run_main.sh: one call at BT 8192, target < 1536 MiB);
 *  - --breakdown: in the same rounds, a forward-only call (loss, no gradient) and the row pass
 *    alone (kdloss_topk_distill_logits on the materialized fp32 logits xs ws^T, the gradient
 *    into a second BT x V buffer; its loss matches the fused call's), to tell where the time
 *    beyond the GEMMs goes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_gemm_floor.h"
#include "half.h"

#define TK_FLOOR_TARGET 1.10  /* bucket (forward KL) / the three GEMMs, full mode */
#define TK_RENORM_TARGET 0.10 /* renorm_both / bucket, full mode */
#define TK_TEACHER_SCALE 5.0  /* teacher logits = 5 randn: peaked, with a tail */
#define TK_TAIL_ALL 3
#define TK_MAX_CALLS 5

typedef struct tk_opts {
    int64_t hs, k, chunk, budget_mib, rss_target_mib;
    int tail; /* kdloss_topk_tail, or TK_TAIL_ALL */
    const char *divergence;
    double beta, alpha, temperature, teacher_scale;
    kb_floor_providers floor;
    int breakdown;
} tk_opts;

/* One timed call: the fused loss (any tail, full or forward-only), or the row pass alone. */
typedef struct tk_ctx {
    const char *label;
    kdloss_fused_linear_topk_distill_params params;
    int64_t bt, hs, v;
    kdloss_cmat xs, ws;
    kdloss_topk_teacher teacher;
    kdloss_fused_linear_distill_out out;
    float loss;
    void *work;
    size_t work_bytes;
    int row_pass;    /* 1: kdloss_topk_distill_logits on `logits`, gradient into `dlogits` */
    float *logits, *dlogits;
    kb_phases ph;    /* the library's per-phase time of the timed fused calls */
} tk_ctx;

static const char *const TAILS[] = {"bucket", "renorm_both", "renorm_teacher", "all"};
static const char *const FLOORS[] = {"all", "onednn", "none"};

static void tk_defaults(kb_options *o, void *kopts) {
    tk_opts *k = kopts;
    o->bt = 2048;
    o->vocab = 32768;
    o->dtype = KDLOSS_F32;
    o->reps = 5; /* one default-shape call is over a second of GEMM on a small CPU */
    o->warmup = 1;
    k->hs = 1024;
    k->k = 64;
    k->tail = KDLOSS_TAIL_BUCKET;
    k->divergence = "forward_kl";
    k->beta = 0.5;
    k->alpha = 0.1;
    k->temperature = 1.0;
    k->teacher_scale = TK_TEACHER_SCALE;
    k->floor = KB_FLOOR_ALL;
}

static int tk_parse(kb_options *o, void *kopts, int argc, char **argv, int i) {
    tk_opts *k = kopts;
    int r, choice = 0;
    if ((r = kb_flag_i64(argc, argv, i, "--v", 1, &o->vocab))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--hs", 1, &k->hs))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--k", 1, &k->k))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--chunk", 0, &k->chunk))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--budget", 0, &k->budget_mib))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--rss-target", 0, &k->rss_target_mib))) return r;
    if ((r = kb_flag_str(argc, argv, i, "--divergence", &k->divergence))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--beta", 0.0, 1.0, &k->beta))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--alpha", 0.0, 1.0, &k->alpha))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--temperature", 1e-6, 1e6, &k->temperature)))
        return r;
    if ((r = kb_flag_double(argc, argv, i, "--teacher-scale", 1e-3, 1e3, &k->teacher_scale)))
        return r;
    if ((r = kb_flag_choice(argc, argv, i, "--tail", TAILS, 4, &choice))) {
        if (r > 0) k->tail = choice;
        return r;
    }
    if ((r = kb_flag_choice(argc, argv, i, "--floor-providers", FLOORS, 3, &choice))) {
        if (r > 0) k->floor = (kb_floor_providers)choice;
        return r;
    }
    if (strcmp(argv[i], "--breakdown") == 0) {
        k->breakdown = 1;
        return 1;
    }
    return 0;
}

static int tk_check(const kb_options *o, const void *kopts) {
    const tk_opts *k = kopts;
    kdloss_divergence d;
    if (kb_divergence_arg("topk_distill", k->divergence, &d) != 0) return -1;
    if (k->tail == KDLOSS_TAIL_RENORM_TEACHER && d != KDLOSS_DIV_FORWARD_KL)
        return kb_arg_error("topk_distill: --tail renorm_teacher is forward_kl only");
    if (o->dtype == KDLOSS_F16) return kb_arg_error("topk_distill: --dtype must be fp32 or bf16");
    if (k->k > o->vocab) return kb_arg_error("topk_distill: --k must be at most --v");
    if (k->hs > 0x7fffffff || o->vocab > 0x7fffffff)
        return kb_arg_error("topk_distill: --hs and --v must fit a 32-bit int (int32 ids)");
    if (k->budget_mib > ((int64_t)1 << 40)) return kb_arg_error("topk_distill: --budget too large");
    if (kb_matrix_bytes(o->bt, k->k, KDLOSS_F32) == 0 ||
        kb_matrix_bytes(o->bt, k->hs, KDLOSS_F32) == 0 ||
        kb_matrix_bytes(o->vocab, k->hs, KDLOSS_F32) == 0)
        return kb_arg_error("topk_distill: shape too large");
    return 0;
}

static kdloss_status tk_call(void *p) {
    tk_ctx *c = p;
    kdloss_labels none = {NULL, KDLOSS_I64};
    if (c->row_pass) {
        kdloss_topk_distill_params rp;
        kdloss_topk_distill_params_default(&rp);
        rp.div = c->params.div;
        rp.tail = c->params.tail;
        rp.temperature = c->params.temperature;
        rp.grad_scale = c->params.grad_scale;
        kdloss_cmat z = {c->logits, KDLOSS_F32, 0};
        kdloss_mat g = {c->out.dxs.data ? c->dlogits : NULL, KDLOSS_F32, 0};
        return kdloss_topk_distill_logits(&rp, c->bt, c->v, z, c->teacher, none,
                                          c->out.loss, NULL, g);
    }
    kb_phases_begin(&c->ph);
    kdloss_status st = kdloss_fused_linear_topk_distill(&c->params, c->bt, c->hs, c->v, c->xs,
                                                        c->ws, NULL, c->teacher, none, &c->out,
                                                        c->work, c->work_bytes);
    kb_phases_end(&c->ph);
    return st;
}

static double mb(double bytes) { return bytes / 1048576.0; }

static void tk_describe(const kb_options *o, const tk_opts *k, kb_workload *w) {
    kdloss_divergence d = KDLOSS_DIV_FORWARD_KL;
    kdloss_divergence_from_name(k->divergence, &d); /* checked in tk_check */
    kb_workload_init(w, "topk_distill", "Fused-linear distillation loss, sparse top-k teacher",
                     o->dtype, o->bt, o->vocab);
    kb_wl_int(w, "hidden", k->hs, 1);
    kb_wl_int(w, "topk", k->k, 1);
    kb_wl_str(w, "tail", TAILS[k->tail]);
    kb_wl_str(w, "divergence", kdloss_divergence_name(d));
    kb_wl_num(w, "beta", k->beta);
    kb_wl_num(w, "alpha", k->alpha);
    kb_wl_num(w, "temperature", k->temperature);
    kb_wl_num(w, "weight_soft_loss", 1.0);
    kb_wl_num(w, "weight_hard_loss", 0.0);
    kb_wl_int(w, "chunk_size", k->chunk, 0);
    kb_wl_int(w, "memory_budget_mib", k->budget_mib ? k->budget_mib : 256, 0);
    kb_wl_bool(w, "bias", 0);
    kb_wl_str(w, "labels", "none");
    kb_wl_str(w, "inputs", "rand; nn.Linear init");
    char t[64];
    snprintf(t, sizeof t, "top-k of log_softmax(%g randn); int32 ids, fp32", k->teacher_scale);
    kb_wl_str(w, "teacher", t);
}

/* The logits the row pass reads: xs ws^T in fp32 (bf16 operands widened first). */
static float *row_pass_logits(const kb_options *o, const tk_opts *k, const void *xs,
                              const void *ws) {
    int64_t bt = o->bt, v = o->vocab, hs = k->hs;
    float *z = kb_alloc(kb_matrix_bytes(bt, v, KDLOSS_F32), "row-pass logits");
    const float *a = xs, *b = ws;
    float *wa = NULL, *wb = NULL;
    if (o->dtype == KDLOSS_BF16) {
        wa = kb_alloc(kb_matrix_bytes(bt, hs, KDLOSS_F32), "widened xs");
        wb = kb_alloc(kb_matrix_bytes(v, hs, KDLOSS_F32), "widened ws");
        for (size_t i = 0; i < (size_t)(bt * hs); i++) wa[i] = kd_bf16_to_f32(((const uint16_t *)xs)[i]);
        for (size_t i = 0; i < (size_t)(v * hs); i++) wb[i] = kd_bf16_to_f32(((const uint16_t *)ws)[i]);
        a = wa, b = wb;
    }
    kdloss_status st = kdloss_gemm_f32(KDLOSS_GEMM_AUTO, 0, 1, bt, v, hs, 1.0f, a, hs, b, hs, 0.0f,
                                       z, v);
    kb_free(wa);
    kb_free(wb);
    if (st != KDLOSS_OK) {
        kb_report_status("row-pass logits (kdloss_gemm_f32)", st);
        exit(1);
    }
    return z;
}

/* Prints and records everything besides the table row. */
static void report(const kb_options *o, const tk_opts *k, tk_ctx *calls, int n_calls,
                   int n_tails, const kb_stats *t, kb_result *res, kb_floor_bench *fb,
                   double in_bytes, double out_bytes, size_t work_bytes) {
    int full = o->mode != KB_MODE_FORWARD;
    const char *div = k->divergence;
    kb_floor_bench_print_survey(fb, res);
    printf("memory: inputs %.1f MiB, outputs %.1f MiB, library workspace %.1f MiB; "
           "materializing BT x V fp32 logits would add %.1f MiB\n",
           mb(in_bytes), mb(out_bytes), mb((double)work_bytes),
           mb(4.0 * (double)o->bt * (double)o->vocab));
    kb_result_add_measure(res, "workspace", "bytes", "B", (double)work_bytes);
    for (int c = 0; c < n_calls; c++) {
        char loss[32] = "-"; /* backward mode: no loss output */
        if (calls[c].out.loss) snprintf(loss, sizeof loss, "%.7g", calls[c].loss);
        printf("%-34s median %.4f s (p20 %.4f, p80 %.4f), loss %s\n", calls[c].label,
               t[c].median_ns * 1e-9, t[c].p20_ns * 1e-9, t[c].p80_ns * 1e-9, loss);
    }
    for (int c = 0; c < n_calls; c++) { /* the row pass alone is no fused call: no line */
        char label[96];
        snprintf(label, sizeof label, "topk_distill %s %s %s", div, kb_dtype_name(o->dtype),
                 calls[c].label);
        kb_phases_print(&calls[c].ph, label);
    }
    kb_phases_record(&calls[0].ph, res);
    for (int c = 1; c < n_calls; c++) {
        char metric[32];
        snprintf(metric, sizeof metric, "latency_%s", calls[c].label);
        for (char *p = metric; *p; p++)
            if (*p == ' ' || *p == '-') *p = '_';
        kb_result_add_measure(res, metric, "median", "ns", t[c].median_ns);
    }
    /* renorm_both / bucket, when both ran (tails come first, bucket is call 0 then) */
    for (int c = 1; c < n_tails; c++) {
        if (calls[c].params.tail != KDLOSS_TAIL_RENORM_BOTH || calls[0].params.tail != KDLOSS_TAIL_BUCKET)
            continue;
        double r = t[c].median_ns / t[0].median_ns;
        printf("renorm_both / bucket = %.4f (medians)\n", r);
        kb_result_add_measure(res, "renorm_both_over_bucket", "median", "x", r);
        if (full)
            printf("TARGET topk_distill %s renorm_both / bucket %s BT %lld V %lld K %lld: %.4f "
                   "(target <= %.2f): %s\n", div, kb_dtype_name(o->dtype), (long long)o->bt,
                   (long long)o->vocab, (long long)k->k, r, TK_RENORM_TARGET,
                   r <= TK_RENORM_TARGET ? "MET" : "NOT MET");
    }
    double fl_med = 0.0, ratio = 0.0;
    int have_floor = kb_floor_bench_report(fb, res, t[0].median_ns, &fl_med, &ratio) == 0;
    double paired = have_floor ? kb_floor_bench_paired(fb) : 0.0;
    if (have_floor) { /* the first call's phases against the floor it is judged by */
        double per_gemm[KB_GEMM_COUNT];
        for (int g = 0; g < KB_GEMM_COUNT; g++) per_gemm[g] = kb_floor_bench_gemm_median(fb, g);
        kb_phases_vs_floor(&calls[0].ph, per_gemm);
    }
    if (have_floor && full && calls[0].params.tail == KDLOSS_TAIL_BUCKET)
        printf("TARGET topk_distill %s bucket %s BT %lld V %lld K %lld: kdloss / fastest GEMM floor "
               "(3 GEMMs) %.3f (median of the back-to-back pairs; medians %.3f; target <= %.2f): "
               "%s\n", div, kb_dtype_name(o->dtype), (long long)o->bt, (long long)o->vocab,
               (long long)k->k, paired, ratio, TK_FLOOR_TARGET,
               paired <= TK_FLOOR_TARGET ? "MET" : "NOT MET");
    if (have_floor && k->breakdown) {
        printf("breakdown (medians, s):");
        for (int c = 0; c < n_calls; c++) printf(" %s %.3f;", calls[c].label, t[c].median_ns * 1e-9);
        printf(" gemm floor %.3f; %s beyond the floor %.3f\n", fl_med * 1e-9, calls[0].label,
               (t[0].median_ns - fl_med) * 1e-9);
    }
    size_t rss = kb_peak_rss_bytes();
    printf("peak RSS of this process so far: %.0f MiB (inputs, outputs, workspace%s; the floor "
           "runs in its own process)\n", mb((double)rss), k->breakdown ? ", row-pass logits and gradient" : "");
    if (k->rss_target_mib > 0)
        printf("TARGET topk_distill peak RSS %s %s %s BT %lld V %lld Hs %lld K %lld: %.0f MiB "
               "(target < %lld MiB): %s\n", div, TAILS[k->tail], kb_dtype_name(o->dtype),
               (long long)o->bt, (long long)o->vocab, (long long)k->hs, (long long)k->k,
               mb((double)rss), (long long)k->rss_target_mib,
               mb((double)rss) < (double)k->rss_target_mib ? "MET" : "NOT MET");
    int len = snprintf(res->note, sizeof res->note, "hs%lld k%lld %s", (long long)k->hs,
                       (long long)k->k, TAILS[calls[0].params.tail]);
    if (have_floor)
        len += snprintf(res->note + len, sizeof res->note - (size_t)len, " floor(%s) %.2fs %.2fx",
                        kb_floor_bench_provider(fb), fl_med * 1e-9, ratio);
    for (int c = 1; c < n_tails && len < (int)sizeof res->note; c++)
        if (calls[c].params.tail == KDLOSS_TAIL_RENORM_BOTH)
            snprintf(res->note + len, sizeof res->note - (size_t)len, " rb/b %.3f",
                     t[c].median_ns / t[0].median_ns);
}

static int tk_run(const kb_options *o, const void *kopts, kb_result *res) {
    const tk_opts *k = kopts;
    int64_t bt = o->bt, v = o->vocab, hs = k->hs;
    int grad = o->mode != KB_MODE_FORWARD, want_loss = o->mode != KB_MODE_BACKWARD;
    size_t bxs = kb_matrix_bytes(bt, hs, o->dtype), bws = kb_matrix_bytes(v, hs, o->dtype);
    size_t bk = kb_matrix_bytes(bt, k->k, KDLOSS_F32);
    kdloss_divergence d = KDLOSS_DIV_FORWARD_KL;
    kdloss_divergence_from_name(k->divergence, &d); /* checked */

    void *xs = kb_alloc(bxs, "xs"), *ws = kb_alloc(bws, "ws");
    int32_t *ids = kb_alloc(bk, "teacher ids");
    float *lp = kb_alloc(bk, "teacher log-probs");
    kb_fill_uniform(xs, o->dtype, bxs / kdloss_dtype_size(o->dtype), 0.0f, 1.0f, o->seed);
    float as = 1.0f / sqrtf((float)hs);
    kb_fill_uniform(ws, o->dtype, bws / kdloss_dtype_size(o->dtype), -as, as, o->seed + 2);
    kb_fill_topk_teacher(ids, lp, bt, v, k->k, k->teacher_scale, o->seed + 5);
    void *dxs = grad ? kb_alloc(bxs, "dxs") : NULL, *dws = grad ? kb_alloc(bws, "dws") : NULL;
    double mass = 0.0, mass_min = 1.0, top1 = 0.0;
    for (int64_t r = 0; r < bt; r++) {
        double m = 0.0;
        for (int64_t j = 0; j < k->k; j++) m += exp((double)lp[r * k->k + j]);
        mass += m, top1 += exp((double)lp[r * k->k]);
        mass_min = m < mass_min ? m : mass_min;
    }
    printf("teacher: top-%lld of log_softmax(%g randn(V)): mass on the K ids %.3f on average "
           "(min %.3f), top 1 %.3f\n", (long long)k->k, k->teacher_scale, mass / (double)bt,
           mass_min, top1 / (double)bt);

    /* the calls of one round: the tails, then the breakdown's */
    int tails[3], n_tails = 0;
    if (k->tail == TK_TAIL_ALL) {
        tails[n_tails++] = KDLOSS_TAIL_BUCKET;
        tails[n_tails++] = KDLOSS_TAIL_RENORM_BOTH;
        if (d == KDLOSS_DIV_FORWARD_KL) tails[n_tails++] = KDLOSS_TAIL_RENORM_TEACHER;
    } else {
        tails[n_tails++] = k->tail;
    }
    tk_ctx calls[TK_MAX_CALLS];
    int n_calls = 0;
    memset(calls, 0, sizeof calls);
    static char labels[TK_MAX_CALLS][48];
    /* --breakdown: a forward-only call (full and backward modes: forward mode times it already),
     * then the row pass */
    int n_fwd = k->breakdown && grad, n_all = n_tails + n_fwd + k->breakdown;
    for (int c = 0; c < n_all; c++) {
        tk_ctx *x = &calls[n_calls++];
        kdloss_fused_linear_topk_distill_params_default(&x->params);
        x->params.div.divergence = d;
        x->params.div.beta = k->beta;
        x->params.div.alpha = k->alpha;
        x->params.tail = (kdloss_topk_tail)tails[c < n_tails ? c : 0];
        x->params.temperature = k->temperature;
        x->params.chunk_size = k->chunk;
        x->params.memory_budget = (size_t)k->budget_mib << 20;
        x->bt = bt, x->hs = hs, x->v = v;
        x->xs = (kdloss_cmat){xs, o->dtype, 0};
        x->ws = (kdloss_cmat){ws, o->dtype, 0};
        x->teacher = (kdloss_topk_teacher){k->k, {ids, KDLOSS_I32, 0}, {lp, KDLOSS_F32, 0}};
        int fwd_only = n_fwd && c == n_tails; /* the breakdown's forward-only call */
        x->row_pass = k->breakdown && c == n_all - 1;
        x->out.loss = want_loss || fwd_only ? &x->loss : NULL;
        if (grad && !fwd_only) {
            x->out.dxs = (kdloss_mat){dxs, o->dtype, 0};
            x->out.dws = (kdloss_mat){dws, o->dtype, 0};
        }
        const char *tn = kdloss_topk_tail_name(x->params.tail);
        if (c < n_tails) snprintf(labels[c], sizeof labels[c], "%s %s", tn, kb_mode_name(o->mode));
        else if (fwd_only) snprintf(labels[c], sizeof labels[c], "%s forward-only", tn);
        else snprintf(labels[c], sizeof labels[c], "%s row pass", tn);
        x->label = labels[c];
    }
    /* one workspace, the largest any call needs (the calls run one after the other) */
    size_t work_bytes = 0;
    kdloss_status st = KDLOSS_OK;
    for (int c = 0; c < n_calls && st == KDLOSS_OK; c++) {
        size_t b = 0;
        if (calls[c].row_pass) continue;
        st = kdloss_fused_linear_topk_distill_workspace_size(
            &calls[c].params, bt, hs, v, k->k, o->dtype, calls[c].out.dxs.data != NULL, &b);
        if (b > work_bytes) work_bytes = b;
    }
    void *work = st == KDLOSS_OK && work_bytes ? kb_alloc(work_bytes, "workspace") : NULL;
    float *logits = k->breakdown && st == KDLOSS_OK ? row_pass_logits(o, k, xs, ws) : NULL;
    float *dlogits = logits && grad ? kb_alloc(kb_matrix_bytes(bt, v, KDLOSS_F32), "row-pass gradient")
                                    : NULL;
    for (int c = 0; c < n_calls; c++) {
        calls[c].work = work, calls[c].work_bytes = work_bytes;
        calls[c].logits = logits, calls[c].dlogits = dlogits;
        kb_phases_init(&calls[c].ph, o->warmup);
    }

    tk_describe(o, k, &res->wl);
    double in_bytes = (double)(bxs + bws + 2 * bk);
    double out_bytes = grad ? (double)(bxs + bws) : 0.0;
    res->bytes = in_bytes + out_bytes;
    res->working_set = (size_t)res->bytes + work_bytes;
    kb_floor_bench fb;
    kb_floor_bench_start(&fb, bt, hs, 0, v, o->mode == KB_MODE_FORWARD, o->dtype == KDLOSS_BF16,
                         k->floor, o->reps,
                         n_calls);
    fb.deadline = o->deadline;
    fb.what = "topk_distill";
    kb_call_fn fns[TK_MAX_CALLS];
    void *ctxs[TK_MAX_CALLS];
    kb_stats t[TK_MAX_CALLS];
    for (int c = 0; c < n_calls; c++) fns[c] = tk_call, ctxs[c] = &calls[c];
    if (st == KDLOSS_OK)
        st = kb_floor_bench_time(&fb, fns, ctxs, o->warmup, res->working_set, t);
    kb_floor_stop(&fb.fl);
    if (st == KDLOSS_OK) {
        res->t = t[0];
        res->loss = calls[0].loss;
        res->has_loss = want_loss;
        report(o, k, calls, n_calls, n_tails, t, res, &fb, in_bytes, out_bytes, work_bytes);
    }
    kb_floor_bench_end(&fb);
    void *all[] = {xs, ws, ids, lp, dxs, dws, work, logits, dlogits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kb_free(all[i]);
    if (st != KDLOSS_OK) {
        kb_report_status("kdloss_fused_linear_topk_distill", st);
        return 1;
    }
    return 0;
}

const kb_kernel kb_kernel_topk_distill = {
    .name = "topk_distill",
    .op = "fused_linear_topk_distill",
    .summary = "fused-linear loss against a sparse top-k teacher, with its GEMM floor",
    .flags_help =
        "  --hs N          hidden size, default 1024 (--bt default 2048, --v/--vocab 32768,\n"
        "                  --dtype fp32, --reps 5, --warmup 1 for this kernel)\n"
        "  --v N           vocabulary (the same as --vocab)\n"
        "  --k N           teacher slots per row, default 64\n"
        "  --tail T        bucket|renorm_both|renorm_teacher|all, default bucket; all: bucket,\n"
        "                  renorm_both and (forward_kl) renorm_teacher side by side\n"
        "  --divergence D  one of `kdloss divergences`,\n"
        "                  default forward_kl\n"
        "  --beta X, --alpha X, --temperature T   as distill_jsd's (defaults 0.5, 0.1, 1)\n"
        "  --teacher-scale S  teacher logits S randn before log_softmax and top-k, default 5\n"
        "  --chunk N, --budget MiB                as distill_jsd's\n"
        "  --floor-providers all|onednn|none      GEMM floor providers, default all\n"
        "  --breakdown     also time a forward-only call and the row pass alone\n"
        "                  (kdloss_topk_distill_logits on materialized logits, 2 x BT x V fp32\n"
        "                  more memory) in the same rounds\n"
        "  --rss-target MiB  print a TARGET line: this process's peak RSS below MiB\n",
    .opts_size = sizeof(tk_opts),
    .defaults = tk_defaults,
    .parse_flag = tk_parse,
    .check = tk_check,
    .run = tk_run,
};
