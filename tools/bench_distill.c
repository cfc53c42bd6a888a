/* `kdloss bench distill`: kdloss_distill, a divergence of the family (--divergence, default
 * forward_kl; --beta for JSD, --alpha for the skew KLs) between student and teacher log-probs
 * (both log_softmax(randn)), no labels. `kdloss bench jsd` is the same kernel with divergence
 * jsd under its old name (kdloss_jsd is kdloss_distill's JSD wrapper): only --beta, the old
 * workload block and the 0.8 bandwidth target. */
#include <string.h>

#include "bench.h"

typedef struct distill_opts {
    const char *divergence; /* --divergence NAME (kdloss_divergence_from_name) */
    double beta, alpha;     /* --beta, --alpha, in [0, 1] */
    double temperature;     /* --temperature (distill_logits) */
    int jsd;                /* run as `kdloss bench jsd` */
    int logits;             /* run as `kdloss bench distill_logits` */
} distill_opts;

typedef struct distill_ctx {
    kdloss_distill_params params;
    kdloss_distill_logits_params lparams; /* distill_logits */
    int logits;
    int64_t bt, v;
    kdloss_cmat student, teacher;
    float loss;
    float *loss_out; /* &loss, or NULL in backward mode */
    kdloss_mat grad; /* data NULL in forward mode */
} distill_ctx;

static void distill_defaults(kb_options *o, void *kopts) {
    (void)o;
    distill_opts *k = kopts;
    k->divergence = "forward_kl";
    k->beta = 0.5;
    k->alpha = 0.1;
    k->temperature = 1.0;
}

static void logits_defaults(kb_options *o, void *kopts) {
    distill_defaults(o, kopts);
    ((distill_opts *)kopts)->logits = 1;
}

static void jsd_defaults(kb_options *o, void *kopts) {
    distill_defaults(o, kopts);
    distill_opts *k = kopts;
    k->divergence = "jsd";
    k->jsd = 1;
}

static int jsd_parse(kb_options *o, void *kopts, int argc, char **argv, int i) {
    (void)o;
    return kb_flag_double(argc, argv, i, "--beta", 0.0, 1.0, &((distill_opts *)kopts)->beta);
}

static int distill_parse(kb_options *o, void *kopts, int argc, char **argv, int i) {
    (void)o;
    distill_opts *k = kopts;
    int r;
    if ((r = kb_flag_str(argc, argv, i, "--divergence", &k->divergence))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--beta", 0.0, 1.0, &k->beta))) return r;
    if (k->logits &&
        (r = kb_flag_double(argc, argv, i, "--temperature", 1e-3, 1e3, &k->temperature)))
        return r;
    return kb_flag_double(argc, argv, i, "--alpha", 0.0, 1.0, &k->alpha);
}

static int distill_check(const kb_options *o, const void *kopts) {
    (void)o;
    const distill_opts *k = kopts;
    kdloss_divergence d;
    if (kb_divergence_arg("distill", k->divergence, &d) != 0) return -1;
    return 0;
}

static kdloss_status distill_call(void *p) {
    distill_ctx *c = p;
    kdloss_labels no_labels = {NULL, KDLOSS_I64};
    if (c->logits)
        return kdloss_distill_logits(&c->lparams, c->bt, c->v, c->student, c->teacher, no_labels,
                                     c->loss_out, NULL, c->grad);
    return kdloss_distill(&c->params, c->bt, c->v, c->student, c->teacher, no_labels, c->loss_out,
                          NULL, c->grad);
}

static void distill_describe(const kb_options *o, const kdloss_div_params *d, int jsd,
                             const distill_opts *k, kb_workload *w) {
    if (k->logits) {
        kb_workload_init(w, "distill_logits", "Divergence-family distillation loss on logits",
                         o->dtype, o->bt, o->vocab);
        kb_wl_str(w, "divergence", kdloss_divergence_name(d->divergence));
        kb_wl_num(w, "temperature", k->temperature);
    } else if (jsd) { /* the records' workload block of `kdloss bench jsd`, as before the family */
        kb_workload_init(w, "jsd", "Generalized JSD loss", o->dtype, o->bt, o->vocab);
    } else {
        kb_workload_init(w, "distill", "Divergence-family distillation loss on log-probs",
                         o->dtype, o->bt, o->vocab);
        kb_wl_str(w, "divergence", kdloss_divergence_name(d->divergence));
    }
    kb_wl_num(w, "beta", d->beta);
    if (!jsd) kb_wl_num(w, "alpha", d->alpha);
    kb_wl_str(w, "labels", "none");
    kb_wl_str(w, "student", "log_softmax(randn)"); /* as logits too: shift-invariant */
    kb_wl_str(w, "teacher", "log_softmax(randn)");
}

static int distill_run(const kb_options *o, const void *kopts, kb_result *res) {
    const distill_opts *k = kopts;
    size_t tb = kb_matrix_bytes(o->bt, o->vocab, o->dtype);
    int want_grad = o->mode != KB_MODE_FORWARD;
    void *x = kb_alloc(tb, "student"), *y = kb_alloc(tb, "teacher");
    void *g = want_grad ? kb_alloc(tb, "gradient") : NULL;
    kb_fill_logprobs(x, o->dtype, o->bt, o->vocab, o->seed);
    kb_fill_logprobs(y, o->dtype, o->bt, o->vocab, o->seed + 1);

    distill_ctx c = {.bt = o->bt, .v = o->vocab, .logits = k->logits};
    kdloss_distill_params_default(&c.params);
    kdloss_divergence_from_name(k->divergence, &c.params.div.divergence); /* checked */
    c.params.div.beta = k->beta;
    c.params.div.alpha = k->alpha;
    kdloss_distill_logits_params_default(&c.lparams);
    c.lparams.div = c.params.div;
    c.lparams.temperature = k->temperature;
    c.student = (kdloss_cmat){x, o->dtype, 0};
    c.teacher = (kdloss_cmat){y, o->dtype, 0};
    c.loss_out = o->mode == KB_MODE_BACKWARD ? NULL : &c.loss;
    c.grad = (kdloss_mat){g, o->dtype, 0};

    distill_describe(o, &c.params.div, k->jsd, k, &res->wl);
    /* reads of X and Y, plus the gradient's write whenever it is wanted */
    res->bytes = (want_grad ? 3.0 : 2.0) * (double)tb;
    res->working_set = (want_grad ? 3 : 2) * tb;
    /* on logits the target is the KL class's in fp32 (two exps an element); the mixtures and
     * narrower logits (half the bytes for the same arithmetic: compute-bound) report */
    res->no_target = k->logits && ((c.params.div.divergence != KDLOSS_DIV_FORWARD_KL &&
                                    c.params.div.divergence != KDLOSS_DIV_REVERSE_KL) ||
                                   o->dtype != KDLOSS_F32);
    if (k->jsd) snprintf(res->note, sizeof res->note, "beta %g", k->beta);
    else snprintf(res->note, sizeof res->note, "%s beta %g alpha %g%s",
                  kdloss_divergence_name(c.params.div.divergence), k->beta, k->alpha,
                  k->logits ? " logits" : "");
    kdloss_status st = kb_time(distill_call, &c, o->warmup, o->reps, res->working_set, &res->t);
    res->loss = c.loss;
    res->has_loss = c.loss_out != NULL;
    kb_free(x);
    kb_free(y);
    kb_free(g);
    if (st != KDLOSS_OK) {
        kb_report_status(k->logits ? "kdloss_distill_logits" : "kdloss_distill", st);
        return 1;
    }
    return 0;
}

/* The target for the KL class on log-probs: >= 0.6 of the streaming bandwidth (one
 * target for every divergence: the JSD and skew ones do more transcendentals per element). */
const kb_kernel kb_kernel_distill = {
    .name = "distill",
    .summary = "divergence family (kdloss_distill) on log-probs, no labels",
    .flags_help =
        "  --divergence D  one of `kdloss divergences`,\n"
        "                  default forward_kl\n"
        "  --beta X        JSD beta in [0, 1], default 0.5\n"
        "  --alpha X       skew KL alpha in [0, 1], default 0.1\n",
    .opts_size = sizeof(distill_opts),
    .defaults = distill_defaults,
    .parse_flag = distill_parse,
    .check = distill_check,
    .run = distill_run,
    .stream_target = 0.6,
};

/* The seed record's JSD target: >= 0.8 of the streaming bandwidth. */
const kb_kernel kb_kernel_jsd = {
    .name = "jsd",
    .summary = "generalized Jensen-Shannon divergence JSD(beta), no labels (distill --divergence jsd)",
    .flags_help = "  --beta X        JSD beta in [0, 1], default 0.5 (0 forward KL, 1 reverse KL)\n",
    .opts_size = sizeof(distill_opts),
    .defaults = jsd_defaults,
    .parse_flag = jsd_parse,
    .check = distill_check,
    .run = distill_run,
    .stream_target = 0.8,
};

/* The same divergences on logits (kdloss_distill_logits: both log-softmaxes, the divergence and
 * dz in one call); the KL-class target of 0.6 of the streaming bandwidth applies here too. */
const kb_kernel kb_kernel_distill_logits = {
    .name = "distill_logits",
    .summary = "divergence family on logits (kdloss_distill_logits), no labels",
    .flags_help =
        "  --divergence D  as distill's, default forward_kl; --beta X, --alpha X as distill's\n"
        "  --temperature T default 1\n",
    .opts_size = sizeof(distill_opts),
    .defaults = logits_defaults,
    .parse_flag = distill_parse,
    .check = distill_check,
    .run = distill_run,
    .stream_target = 0.6,
};
