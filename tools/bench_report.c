/* Workload descriptions, result bookkeeping and the text table. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static kb_kv *new_kv(kb_workload *w, const char *key, kb_kv_type type) {
    if (w->n >= KB_MAX_KV) {
        /* A programming error in a kernel file, not a user error: fail loudly. */
        fprintf(stderr, "kdloss bench: too many workload keys (max %d)\n", KB_MAX_KV);
        exit(1);
    }
    kb_kv *kv = &w->kv[w->n++];
    memset(kv, 0, sizeof *kv);
    snprintf(kv->key, sizeof kv->key, "%s", key);
    kv->type = type;
    return kv;
}

void kb_wl_int(kb_workload *w, const char *key, int64_t value, int in_id) {
    kb_kv *kv = new_kv(w, key, KB_KV_INT);
    kv->i = value;
    kv->in_id = in_id;
}

void kb_wl_num(kb_workload *w, const char *key, double value) {
    new_kv(w, key, KB_KV_NUM)->d = value;
}

void kb_wl_str(kb_workload *w, const char *key, const char *value) {
    snprintf(new_kv(w, key, KB_KV_STR)->s, sizeof w->kv[0].s, "%s", value);
}

void kb_wl_bool(kb_workload *w, const char *key, int value) {
    new_kv(w, key, KB_KV_BOOL)->i = value != 0;
}

void kb_workload_init(kb_workload *w, const char *kernel, const char *title, kdloss_dtype dtype,
                      int64_t bt, int64_t v) {
    memset(w, 0, sizeof *w);
    snprintf(w->kernel, sizeof w->kernel, "%s", kernel);
    snprintf(w->title, sizeof w->title, "%s", title);
    w->dtype = dtype;
    w->bt = bt;
    w->v = v;
    kb_wl_int(w, "tokens", bt, 1);
    kb_wl_int(w, "vocab", v, 1);
    kb_wl_str(w, "dtype", kb_dtype_name(dtype));
}

static int cmp_kv_key(const void *a, const void *b) {
    return strcmp((*(const kb_kv *const *)a)->key, (*(const kb_kv *const *)b)->key);
}

void kb_workload_slug(const kb_workload *w, char *out, size_t size) {
    /* Same layout as the reference ids: hidden4096-tokens8192-vocab128256-bf16. */
    const kb_kv *ids[KB_MAX_KV];
    int n = 0;
    for (int k = 0; k < w->n; k++)
        if (w->kv[k].in_id && w->kv[k].type == KB_KV_INT) ids[n++] = &w->kv[k];
    qsort(ids, (size_t)n, sizeof ids[0], cmp_kv_key);
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < n && len < size; k++)
        len += (size_t)snprintf(out + len, size - len, "%s%lld-", ids[k]->key, (long long)ids[k]->i);
    if (len < size) snprintf(out + len, size - len, "%s", kb_dtype_name(w->dtype));
}

void kb_result_add_measure(kb_result *r, const char *metric, const char *statistic,
                           const char *unit, double value) {
    if (r->n_extra >= KB_MAX_MEASURES) {
        fprintf(stderr, "kdloss bench: too many extra measurements (max %d)\n", KB_MAX_MEASURES);
        exit(1);
    }
    kb_measure *m = &r->extra[r->n_extra++];
    snprintf(m->metric, sizeof m->metric, "%s", metric);
    snprintf(m->statistic, sizeof m->statistic, "%s", statistic);
    snprintf(m->unit, sizeof m->unit, "%s", unit);
    m->value = value;
}

void kb_report_status(const char *what, kdloss_status st) {
    fprintf(stderr, "kdloss bench: %s: %s\n", what, kdloss_status_string(st));
}

#define ROW_FMT "%-12s %-8s %7s %7s %-5s %-7s %10s %10s %10s %8s %6s %8s %13s  %s\n"

void kb_print_table_header(FILE *f) {
    fprintf(f, ROW_FMT, "kernel", "mode", "BT", "V", "dtype", "isa", "median_ms", "p20_ms",
            "p80_ms", "GB/s", "stream", "RSS_MiB", "loss", "note");
}

void kb_print_row(FILE *f, const kb_options *o, const kb_result *r, const char *isa) {
    char bt[24], v[24], med[24], p20[24], p80[24], gbs[24] = "-", frac[24] = "-", rss[24],
                                                   loss[32] = "-";
    snprintf(bt, sizeof bt, "%lld", (long long)r->wl.bt);
    snprintf(v, sizeof v, "%lld", (long long)r->wl.v);
    snprintf(med, sizeof med, "%.3f", r->t.median_ns / 1e6);
    snprintf(p20, sizeof p20, "%.3f", r->t.p20_ns / 1e6);
    snprintf(p80, sizeof p80, "%.3f", r->t.p80_ns / 1e6);
    if (r->bytes > 0) {
        double achieved = r->bytes / r->t.median_ns; /* bytes per ns = GB/s */
        snprintf(gbs, sizeof gbs, "%.2f", achieved);
        if (r->stream_gbs > 0) snprintf(frac, sizeof frac, "%.2f", achieved / r->stream_gbs);
    }
    snprintf(rss, sizeof rss, "%.0f", (double)r->peak_rss / (1 << 20));
    if (r->has_loss) snprintf(loss, sizeof loss, "%.7g", r->loss);
    fprintf(f, ROW_FMT, r->wl.kernel, kb_mode_name(o->mode), bt, v, kb_dtype_name(r->wl.dtype),
            isa, med, p20, p80, gbs, frac, rss, loss, r->note);
}
