/* `kdloss bench jsd`: kdloss_jsd, generalized JSD(beta) between student and teacher log-probs
 * (both log_softmax(randn)), no labels. Its own flag --beta shows how a kernel adds flags. */
#include "bench.h"

typedef struct jsd_opts {
    double beta; /* --beta, in [0, 1] */
} jsd_opts;

typedef struct jsd_ctx {
    kdloss_jsd_params params;
    int64_t bt, v;
    kdloss_cmat student, teacher;
    float loss;
    float *loss_out;  /* &loss, or NULL in backward mode */
    kdloss_mat grad;  /* data NULL in forward mode */
} jsd_ctx;

static void jsd_defaults(kb_options *o, void *kopts) {
    (void)o;
    ((jsd_opts *)kopts)->beta = 0.5;
}

static int jsd_parse(kb_options *o, void *kopts, int argc, char **argv, int i) {
    (void)o;
    return kb_flag_double(argc, argv, i, "--beta", 0.0, 1.0, &((jsd_opts *)kopts)->beta);
}

static kdloss_status jsd_call(void *p) {
    jsd_ctx *c = p;
    kdloss_labels no_labels = {NULL, KDLOSS_I64};
    return kdloss_jsd(&c->params, c->bt, c->v, c->student, c->teacher, no_labels, c->loss_out,
                      NULL, c->grad);
}

/* The loss and the gradient both need both tensors: reads of X and Y, plus the gradient's
 * write whenever it is wanted. */
static double jsd_compulsory_bytes(kb_mode mode, size_t tensor_bytes) {
    return (mode == KB_MODE_FORWARD ? 2.0 : 3.0) * (double)tensor_bytes;
}

static void jsd_describe(const kb_options *o, double beta, kb_workload *w) {
    kb_workload_init(w, "jsd", "Generalized JSD loss", o->dtype, o->bt, o->vocab);
    kb_wl_num(w, "beta", beta);
    kb_wl_str(w, "labels", "none");
    kb_wl_str(w, "student", "log_softmax(randn)");
    kb_wl_str(w, "teacher", "log_softmax(randn)");
}

static int jsd_run(const kb_options *o, const void *kopts, kb_result *res) {
    const jsd_opts *k = kopts;
    size_t tb = kb_matrix_bytes(o->bt, o->vocab, o->dtype);
    int want_grad = o->mode != KB_MODE_FORWARD;
    void *x = kb_alloc(tb, "student"), *y = kb_alloc(tb, "teacher");
    void *g = want_grad ? kb_alloc(tb, "gradient") : NULL;
    kb_fill_logprobs(x, o->dtype, o->bt, o->vocab, o->seed);
    kb_fill_logprobs(y, o->dtype, o->bt, o->vocab, o->seed + 1);

    jsd_ctx c = {.bt = o->bt, .v = o->vocab};
    kdloss_jsd_params_default(&c.params);
    c.params.beta = k->beta;
    c.student = (kdloss_cmat){x, o->dtype, 0};
    c.teacher = (kdloss_cmat){y, o->dtype, 0};
    c.loss_out = o->mode == KB_MODE_BACKWARD ? NULL : &c.loss;
    c.grad = (kdloss_mat){g, o->dtype, 0};

    jsd_describe(o, k->beta, &res->wl);
    res->bytes = jsd_compulsory_bytes(o->mode, tb);
    res->working_set = (want_grad ? 3 : 2) * tb;
    snprintf(res->note, sizeof res->note, "beta %g", k->beta);
    kdloss_status st = kb_time(jsd_call, &c, o->warmup, o->reps, res->working_set, &res->t);
    res->loss = c.loss;
    res->has_loss = c.loss_out != NULL;
    kb_free(x);
    kb_free(y);
    kb_free(g);
    if (st != KDLOSS_OK) {
        kb_report_status("kdloss_jsd", st);
        return 1;
    }
    return 0;
}

const kb_kernel kb_kernel_jsd = {
    .name = "jsd",
    .summary = "generalized Jensen-Shannon divergence JSD(beta), no labels",
    .flags_help = "  --beta X        JSD beta in [0, 1], default 0.5 (0 forward KL, 1 reverse KL)\n",
    .opts_size = sizeof(jsd_opts),
    .defaults = jsd_defaults,
    .parse_flag = jsd_parse,
    .check = NULL,
    .run = jsd_run,
    .stream_target = 0.8,
};
