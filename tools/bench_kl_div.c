/* `kdloss bench kl_div`: kdloss_kl_div on the reference workload (student log-probs from
 * log_softmax(randn), target probabilities from softmax(randn), reduction batchmean). */
#include "bench.h"

typedef struct kl_ctx {
    kdloss_kl_params params;
    int64_t bt, v;
    kdloss_cmat input, target;
    float loss;
    float *loss_out;  /* &loss, or NULL in backward mode */
    kdloss_mat grad;  /* data NULL in forward mode */
} kl_ctx;

static kdloss_status kl_call(void *p) {
    kl_ctx *c = p;
    kdloss_mat no_elem = {NULL, KDLOSS_F32, 0};
    return kdloss_kl_div(&c->params, c->bt, c->v, c->input, c->target, c->loss_out, NULL, no_elem,
                         c->grad);
}

/* Bytes no implementation can avoid: the KL gradient -t does not depend on the input, so the
 * backward pass needs only the target; the loss needs both. */
static double kl_compulsory_bytes(kb_mode mode, size_t tensor_bytes) {
    switch (mode) {
    case KB_MODE_FULL: return 3.0 * (double)tensor_bytes;     /* read y, read t, write grad */
    case KB_MODE_BACKWARD: return 2.0 * (double)tensor_bytes; /* read t, write grad */
    case KB_MODE_FORWARD: return 2.0 * (double)tensor_bytes;  /* read y, read t */
    }
    return 0;
}

static void kl_describe(const kb_options *o, kb_workload *w) {
    kb_workload_init(w, "kl_div", "KL-divergence loss", o->dtype, o->bt, o->vocab);
    kb_wl_str(w, "reduction", "batchmean");
    kb_wl_bool(w, "log_target", 0);
    kb_wl_str(w, "input", "log_softmax(randn)");
    kb_wl_str(w, "target", "softmax(randn)");
}

static int kl_run(const kb_options *o, const void *kopts, kb_result *res) {
    (void)kopts;
    size_t tb = kb_matrix_bytes(o->bt, o->vocab, o->dtype);
    int want_grad = o->mode != KB_MODE_FORWARD;
    void *y = kb_alloc(tb, "input"), *t = kb_alloc(tb, "target");
    void *g = want_grad ? kb_alloc(tb, "gradient") : NULL;
    kb_fill_logprobs(y, o->dtype, o->bt, o->vocab, o->seed);
    kb_fill_probs(t, o->dtype, o->bt, o->vocab, o->seed + 1);

    kl_ctx c = {.bt = o->bt, .v = o->vocab};
    kdloss_kl_params_default(&c.params);
    c.params.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    c.input = (kdloss_cmat){y, o->dtype, 0};
    c.target = (kdloss_cmat){t, o->dtype, 0};
    c.loss_out = o->mode == KB_MODE_BACKWARD ? NULL : &c.loss;
    c.grad = (kdloss_mat){g, o->dtype, 0};

    kl_describe(o, &res->wl);
    res->bytes = kl_compulsory_bytes(o->mode, tb);
    res->working_set = (want_grad ? 3 : 2) * tb;
    kdloss_status st = kb_time(kl_call, &c, o->warmup, o->reps, res->working_set, &res->t);
    res->loss = c.loss;
    res->has_loss = c.loss_out != NULL;
    kb_free(y);
    kb_free(t);
    kb_free(g);
    if (st != KDLOSS_OK) {
        kb_report_status("kdloss_kl_div", st);
        return 1;
    }
    return 0;
}

const kb_kernel kb_kernel_kl_div = {
    .name = "kl_div",
    .summary = "KL(target || input), PyTorch KLDivLoss, reduction batchmean",
    .flags_help = NULL,
    .opts_size = 0,
    .defaults = NULL,
    .parse_flag = NULL,
    .check = NULL,
    .run = kl_run,
    .stream_target = 0.8,
};
