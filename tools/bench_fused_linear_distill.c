/* `kdloss bench distill_jsd`: kdloss_fused_linear_distill (by default JSD, which is what
 * kdloss_fused_linear_jsd computes) on the reference distillation workload
 * (bench/README.md, "The reference workloads"): torch.rand hidden states, nn.Linear default
 * weights (uniform in +-1/sqrt(H), no bias), labels randint(0, V), no ignored rows, beta 0.5,
 * T 1, weights 0.5/0.5. --divergence (and --beta, --alpha, --temperature, --t2-scale) choose
 * another member of the family; the record's workload block names it.
 *
 * Besides the kernel's latency it reports, from the same run:
 *  - the GEMM floor: the four GEMMs (student logits, teacher logits, dXs, dWs) at full size,
 *    fp32 on fp32 operands, and with --dtype bf16 also bf16 x bf16 -> fp32 (kdloss's native
 *    tiles, oneDNN's own threaded matmul), timed in a child process (so their buffers, two
 *    BT x V fp32 matrices, never count in this process's peak RSS): one round with every way
 *    the machine has (all printed), then rounds with the fastest that alternate with the timed
 *    kdloss calls (so both see the same load on a shared machine); and the ratio of the
 *    medians kdloss / sum(GEMMs) (forward mode compares with the two logits GEMMs only);
 *  - memory: what this process holds (inputs, outputs, the library's workspace, allocated
 *    once here and passed to every call as a training loop would) against the 2 x BT x V fp32
 *    logits a materializing implementation needs on top of the same inputs and outputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_gemm_floor.h"

/* The full-mode targets: kdloss within 8% of the fastest provider's four bare GEMMs for JSD in
 * fp32, within 10% for the other divergences (the row pass hides in GEMM
 * time) and for bf16 against the bf16 floor (the best of native bf16, fp32 and
 * oneDNN's own matmul). Judged on the median of the back-to-back (call, floor) pairs, which a
 * shared machine's load swings far less than either median alone. */
#define DJ_FLOOR_TARGET 1.08
#define DJ_DIV_TARGET 1.10
#define DJ_BF16_TARGET 1.10

typedef struct dj_opts {
    int64_t hs, ht, chunk, budget_mib;
    int skip_openblas; /* --floor-providers onednn: no OpenBLAS survey round */
    const char *divergence; /* --divergence NAME, default jsd */
    double beta, alpha, temperature;
    int t2_scale; /* --t2-scale: multiply the soft part by T^2 */
} dj_opts;

typedef struct dj_ctx {
    kdloss_fused_linear_distill_params params;
    int64_t bt, hs, ht, v;
    kdloss_cmat xs, ws, xt, wt;
    kdloss_labels labels;
    kdloss_fused_linear_distill_out out;
    float loss;
    void *work;
    size_t work_bytes;
    kb_phases ph; /* the library's per-phase time of the timed calls */
} dj_ctx;

static void dj_defaults(kb_options *o, void *kopts) {
    dj_opts *k = kopts;
    o->bt = 2048;
    o->vocab = 32768;
    o->dtype = KDLOSS_BF16;
    o->reps = 3; /* one default-shape call is seconds of GEMM on a small CPU */
    o->warmup = 1;
    k->hs = 1024;
    k->ht = 2048;
    k->chunk = 0;
    k->divergence = "jsd";
    k->beta = 0.5;
    k->alpha = 0.1;
    k->temperature = 1.0;
    k->t2_scale = 0;
}

static int dj_parse(kb_options *o, void *kopts, int argc, char **argv, int i) {
    dj_opts *k = kopts;
    int r;
    if ((r = kb_flag_i64(argc, argv, i, "--hs", 1, &k->hs))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--ht", 1, &k->ht))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--chunk", 0, &k->chunk))) return r;
    if ((r = kb_flag_str(argc, argv, i, "--divergence", &k->divergence))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--beta", 0.0, 1.0, &k->beta))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--alpha", 0.0, 1.0, &k->alpha))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--temperature", 1e-6, 1e6, &k->temperature)))
        return r;
    if (strcmp(argv[i], "--t2-scale") == 0) {
        k->t2_scale = 1;
        return 1;
    }
    if ((r = kb_flag_i64(argc, argv, i, "--budget", 0, &k->budget_mib))) return r;
    if (strcmp(argv[i], "--floor-providers") == 0 && i + 1 < argc) {
        if (strcmp(argv[i + 1], "onednn") == 0) k->skip_openblas = 1;
        else if (strcmp(argv[i + 1], "all") == 0) k->skip_openblas = 0;
        else return kb_arg_error("distill_jsd: --floor-providers takes all or onednn");
        return 2;
    }
    if (strcmp(argv[i], "--seed-shape") == 0) { /* the reference record's shape */
        o->bt = 8192;
        o->vocab = 128256;
        k->hs = 2048;
        k->ht = 4096;
        return 1;
    }
    return 0;
}

static int dj_check(const kb_options *o, const void *kopts) {
    const dj_opts *k = kopts;
    kdloss_divergence d;
    if (kb_divergence_arg("distill_jsd", k->divergence, &d) != 0) return -1;
    if (o->dtype == KDLOSS_F16) return kb_arg_error("distill_jsd: --dtype must be fp32 or bf16");
    if (k->budget_mib > ((int64_t)1 << 40)) return kb_arg_error("distill_jsd: --budget too large");
    if (k->hs > 0x7fffffff || k->ht > 0x7fffffff || o->vocab > 0x7fffffff)
        return kb_arg_error("distill_jsd: --hs, --ht and --vocab must fit a 32-bit int");
    return 0;
}

static kdloss_status dj_call(void *p) {
    dj_ctx *c = p;
    kb_phases_begin(&c->ph);
    kdloss_status st = kdloss_fused_linear_distill(&c->params, c->bt, c->hs, c->ht, c->v, c->xs,
                                                   c->ws, NULL, c->xt, c->wt, NULL, c->labels,
                                                   &c->out, c->work, c->work_bytes);
    kb_phases_end(&c->ph);
    return st;
}

static void dj_describe(const kb_options *o, const dj_opts *k, kb_workload *w) {
    kdloss_divergence d = KDLOSS_DIV_JSD;
    kdloss_divergence_from_name(k->divergence, &d); /* checked in dj_check */
    kb_workload_init(w, "distill_jsd", "Fused-linear distillation loss", o->dtype, o->bt,
                     o->vocab);
    kb_wl_int(w, "hidden_student", k->hs, 1);
    kb_wl_int(w, "hidden_teacher", k->ht, 1);
    kb_wl_str(w, "divergence", kdloss_divergence_name(d));
    kb_wl_num(w, "beta", k->beta);
    kb_wl_num(w, "alpha", k->alpha);
    kb_wl_num(w, "temperature", k->temperature);
    kb_wl_bool(w, "t2_scale", k->t2_scale);
    kb_wl_num(w, "weight_hard_loss", 0.5);
    kb_wl_num(w, "weight_soft_loss", 0.5);
    kb_wl_int(w, "chunk_size", k->chunk, 0);
    kb_wl_int(w, "memory_budget_mib", k->budget_mib ? k->budget_mib : 256, 0);
    kb_wl_bool(w, "bias", 0);
    kb_wl_str(w, "inputs", "rand; nn.Linear init; randint labels");
}

static double mb(double bytes) { return bytes / 1048576.0; }

/* Prints and records the floor, the ratio and the memory figures. */
static void report(const kb_options *o, const dj_opts *k, const dj_ctx *c, kb_result *res,
                   kb_floor_bench *fb, double in_bytes, double out_bytes) {
    kb_floor_bench_print_survey(fb, res);
    char label[64];
    snprintf(label, sizeof label, "distill_jsd %s %s %s", k->divergence, kb_dtype_name(o->dtype),
             kb_mode_name(o->mode));
    kb_phases_print(&c->ph, label);
    kb_phases_record(&c->ph, res);
    printf("memory: inputs %.1f MiB, outputs %.1f MiB, library workspace %.1f MiB; "
           "materializing BT x V fp32 logits for both models would add %.1f MiB\n",
           mb(in_bytes), mb(out_bytes), mb((double)c->work_bytes),
           mb(2.0 * 4.0 * (double)o->bt * (double)o->vocab));
    kb_result_add_measure(res, "workspace", "bytes", "B", (double)c->work_bytes);
    double kd_med = res->t.median_ns, fl_med, ratio, paired;
    if (kb_floor_bench_report(fb, res, kd_med, &fl_med, &ratio) != 0) {
        snprintf(res->note, sizeof res->note, "hs%lld ht%lld gemm floor not measured",
                 (long long)k->hs, (long long)k->ht);
        return;
    }
    double per_gemm[KB_GEMM_COUNT];
    for (int g = 0; g < KB_GEMM_COUNT; g++) per_gemm[g] = kb_floor_bench_gemm_median(fb, g);
    kb_phases_vs_floor(&c->ph, per_gemm);
    int jsd = strcmp(k->divergence, "jsd") == 0;
    double target = o->dtype == KDLOSS_BF16 ? DJ_BF16_TARGET : jsd ? DJ_FLOOR_TARGET : DJ_DIV_TARGET;
    paired = kb_floor_bench_paired(fb);
    if (o->mode != KB_MODE_FORWARD)
        printf("TARGET distill_jsd %s%s%s BT %lld V %lld: kdloss / fastest GEMM floor %.3f "
               "(median of the back-to-back pairs; medians %.3f; target <= %.2f): %s\n",
               jsd ? "" : k->divergence, jsd ? "" : " ", kb_dtype_name(o->dtype),
               (long long)o->bt, (long long)o->vocab, paired, ratio, target,
               paired <= target ? "MET" : "NOT MET");
    snprintf(res->note, sizeof res->note, "hs%lld ht%lld floor(%s) %.2fs %.2fx",
             (long long)k->hs, (long long)k->ht, kb_floor_bench_provider(fb), fl_med * 1e-9,
             ratio);
}

static int dj_run(const kb_options *o, const void *kopts, kb_result *res) {
    const dj_opts *k = kopts;
    int64_t bt = o->bt, v = o->vocab;
    int grad = o->mode != KB_MODE_FORWARD, loss = o->mode != KB_MODE_BACKWARD;
    size_t bxs = kb_matrix_bytes(bt, k->hs, o->dtype), bws = kb_matrix_bytes(v, k->hs, o->dtype);
    size_t bxt = kb_matrix_bytes(bt, k->ht, o->dtype), bwt = kb_matrix_bytes(v, k->ht, o->dtype);
    if (!bxs || !bws || !bxt || !bwt) {
        kb_arg_error("distill_jsd: shape too large");
        return 2;
    }
    dj_ctx c;
    memset(&c, 0, sizeof c);
    kdloss_fused_linear_distill_params_default(&c.params);
    kdloss_divergence_from_name(k->divergence, &c.params.div.divergence); /* checked */
    c.params.div.beta = k->beta;
    c.params.div.alpha = k->alpha;
    c.params.temperature = k->temperature;
    c.params.t2_scale = k->t2_scale;
    c.params.chunk_size = k->chunk;
    c.params.memory_budget = (size_t)k->budget_mib << 20;
    kb_phases_init(&c.ph, o->warmup);
    c.bt = bt;
    c.hs = k->hs;
    c.ht = k->ht;
    c.v = v;

    void *xs = kb_alloc(bxs, "xs"), *ws = kb_alloc(bws, "ws");
    void *xt = kb_alloc(bxt, "xt"), *wt = kb_alloc(bwt, "wt");
    int64_t *labels = kb_alloc((size_t)bt * sizeof(int64_t), "labels");
    kb_fill_uniform(xs, o->dtype, bxs / kdloss_dtype_size(o->dtype), 0.0f, 1.0f, o->seed);
    kb_fill_uniform(xt, o->dtype, bxt / kdloss_dtype_size(o->dtype), 0.0f, 1.0f, o->seed + 1);
    float as = 1.0f / sqrtf((float)k->hs), at = 1.0f / sqrtf((float)k->ht);
    kb_fill_uniform(ws, o->dtype, bws / kdloss_dtype_size(o->dtype), -as, as, o->seed + 2);
    kb_fill_uniform(wt, o->dtype, bwt / kdloss_dtype_size(o->dtype), -at, at, o->seed + 3);
    for (int64_t r = 0; r < bt; r++)
        labels[r] = (int64_t)((double)kb_uniform_at(o->seed + 4, (uint64_t)r) * (double)v) % v;
    c.xs = (kdloss_cmat){xs, o->dtype, 0};
    c.ws = (kdloss_cmat){ws, o->dtype, 0};
    c.xt = (kdloss_cmat){xt, o->dtype, 0};
    c.wt = (kdloss_cmat){wt, o->dtype, 0};
    c.labels = (kdloss_labels){labels, KDLOSS_I64};

    void *dxs = grad ? kb_alloc(bxs, "dxs") : NULL, *dws = grad ? kb_alloc(bws, "dws") : NULL;
    c.out.dxs = (kdloss_mat){dxs, o->dtype, 0};
    c.out.dws = (kdloss_mat){dws, o->dtype, 0};
    c.out.loss = loss ? &c.loss : NULL;
    kdloss_status st = kdloss_fused_linear_distill_workspace_size(&c.params, bt, k->hs, k->ht, v,
                                                                  o->dtype, grad, &c.work_bytes);
    if (st == KDLOSS_OK) c.work = kb_alloc(c.work_bytes, "workspace");

    dj_describe(o, k, &res->wl);
    double in_bytes = (double)(bxs + bws + bxt + bwt) + 8.0 * (double)bt;
    double out_bytes = grad ? (double)(bxs + bws) : 0.0;
    res->bytes = in_bytes + out_bytes;
    res->working_set = (size_t)res->bytes + c.work_bytes;
    kb_floor_bench fb;
    kb_floor_bench_start(&fb, bt, k->hs, k->ht, v, o->mode == KB_MODE_FORWARD,
                         o->dtype == KDLOSS_BF16, k->skip_openblas ? KB_FLOOR_ONEDNN : KB_FLOOR_ALL, o->reps, 1);
    fb.deadline = o->deadline;
    fb.what = "distill_jsd";
    kb_call_fn fn = dj_call;
    void *ctx = &c;
    if (st == KDLOSS_OK) st = kb_floor_bench_time(&fb, &fn, &ctx, o->warmup, res->working_set, &res->t);
    kb_floor_stop(&fb.fl);
    res->loss = c.loss;
    res->has_loss = loss;
    if (st == KDLOSS_OK) report(o, k, &c, res, &fb, in_bytes, out_bytes);
    kb_floor_bench_end(&fb);
    void *all[] = {xs, ws, xt, wt, labels, dxs, dws, c.work};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kb_free(all[i]);
    if (st != KDLOSS_OK) {
        kb_report_status("kdloss_fused_linear_distill", st);
        return 1;
    }
    return 0;
}

const kb_kernel kb_kernel_distill_jsd = {
    .name = "distill_jsd",
    .op = "fused_linear_distill",
    .summary = "chunked fused-linear divergence (default JSD) + CE loss, with its GEMM floor",
    .flags_help =
        "  --hs N          student hidden size, default 1024 (--bt default 2048, --vocab 32768,\n"
        "                  --dtype bf16, --reps 3, --warmup 1 for this kernel)\n"
        "  --ht N          teacher hidden size, default 2048\n"
        "  --chunk N       rows per chunk, default 0 (automatic from the memory budget)\n"
        "  --budget MiB    the library's memory_budget, default 0 (= 256 MiB)\n"
        "  --divergence D  one of `kdloss divergences`,\n"
        "                  default jsd (kdloss_fused_linear_distill)\n"
        "  --beta X        JSD beta in [0, 1], default 0.5\n"
        "  --alpha X       skew KL alpha in [0, 1], default 0.1\n"
        "  --temperature T default 1\n"
        "  --t2-scale      multiply the soft part by T^2\n"
        "  --seed-shape    BT 8192, Hs 2048, Ht 4096, V 128256 (later flags override)\n"
        "  --floor-providers all|onednn  GEMM providers surveyed for the floor, default all\n"
        "                  (onednn skips OpenBLAS: minutes per round where its kernel is generic)\n",
    .opts_size = sizeof(dj_opts),
    .defaults = dj_defaults,
    .parse_flag = dj_parse,
    .check = dj_check,
    .run = dj_run,
};
