/* The KernelIndex-style record of one benchmark run, shaped like the reference records in
 * shared/seeds/: a top-level object with `run`, `protocol` and `environment`, each
 * {apiVersion, kind, metadata{name, title[, labels]}, spec}. The run carries
 * "sha256:<hex>" digests of the canonical JSON (sorted keys, no whitespace; see json.h) of the
 * protocol object, the environment object and the workload object (run.spec.workload), each
 * exactly as written in the file, so anyone can recompute them. */
#include <ctype.h>
#include <math.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench.h"
#include "json.h"

#define KB_API_VERSION "kernelindex.dev/v1alpha1"
#define KB_NAME_MAX 100 /* the reference records cut metadata.name at 100 characters */

/* Lower-case, with every run of non-alphanumerics one dash, cut at KB_NAME_MAX. */
static void name_slug(const char *in, char *out, size_t size) {
    size_t o = 0, cap = size - 1 < KB_NAME_MAX ? size - 1 : KB_NAME_MAX;
    int dash = 0;
    for (const char *p = in; *p && o < cap; p++) {
        if (isalnum((unsigned char)*p)) {
            if (dash && o > 0) {
                out[o++] = '-';
                if (o >= cap) break;
            }
            out[o++] = (char)tolower((unsigned char)*p);
            dash = 0;
        } else {
            dash = 1;
        }
    }
    out[o] = '\0';
}

/* {apiVersion, kind, metadata{name, title}, spec{}}; returns the object, *spec its spec. */
static kj *part(const char *kind, const char *name, const char *title, kj **spec, kj **meta) {
    kj *p = kj_obj();
    kj_put(p, "apiVersion", kj_str(KB_API_VERSION));
    kj_put(p, "kind", kj_str(kind));
    *meta = kj_put(p, "metadata", kj_obj());
    kj_put(*meta, "name", kj_str(name));
    kj_put(*meta, "title", kj_str(title));
    *spec = kj_put(p, "spec", kj_obj());
    return p;
}

static const char *pass_words(kb_mode m) {
    switch (m) {
    case KB_MODE_FORWARD: return "the forward pass alone (loss, no gradient output)";
    case KB_MODE_BACKWARD: return "the gradient alone (no loss outputs)";
    case KB_MODE_FULL: return "the loss and its gradient from one fused call (forward + backward)";
    }
    return "?";
}

static kj *protocol_part(const kb_options *o) {
    char name[64], title[96], notes[1024];
    snprintf(name, sizeof name, "kdloss-bench-%s", kb_mode_name(o->mode));
    snprintf(title, sizeof title, "kdloss bench harness - %s pass", kb_mode_name(o->mode));
    snprintf(notes, sizeof notes,
             "Timed: %s, one library call per sample, CLOCK_MONOTONIC around each call after "
             "%lld untimed warm-up calls; median with p20/p80 spread (linear interpolation) over "
             "%lld calls. Inputs are generated in-process, drawn as in the reference benchmark "
             "(see the run's workload). A 64 MB buffer is written between calls when the working set is under "
             "256 MB. Peak memory is the process's peak RSS, inputs included. Comparable only "
             "within one kernel, workload, timed pass and machine.",
             pass_words(o->mode), (long long)o->warmup, (long long)o->reps);
    kj *spec, *meta;
    kj *p = part("BenchmarkProtocol", name, title, &spec, &meta);
    kj *h = kj_put(spec, "harness", kj_obj());
    kj_put(h, "name", kj_str("kdloss bench"));
    kj_put(h, "repository", kj_str("kdloss"));
    kj *m = kj_put(spec, "measurement", kj_obj());
    kj_put(m, "timer", kj_str("clock_gettime_monotonic"));
    kj_put(m, "primaryStatistic", kj_str("median"));
    kj_put(m, "warmup", kj_int(o->warmup));
    kj_put(m, "reps", kj_int(o->reps));
    kj *c = kj_put(spec, "comparability", kj_obj());
    kj_put(c, "family", kj_str("kdloss_bench"));
    kj_put(c, "notes", kj_str(notes));
    return p;
}

static kj *environment_part(const kb_sysinfo *sys) {
    char name[160], title[192];
    struct utsname u;
    const char *arch = uname(&u) == 0 ? u.machine : "unknown";
    snprintf(name, sizeof name, "kdloss-bench-%s-%s-%dt", sys->cpu_slug, sys->isa, sys->threads);
    snprintf(title, sizeof title, "kdloss bench host - %s", sys->cpu_model);
    kj *spec, *meta;
    kj *p = part("ExecutionEnvironment", name, title, &spec, &meta);
    kj *hw = kj_put(spec, "hardware", kj_obj());
    kj_put(hw, "vendor", kj_str(sys->vendor));
    kj_put(hw, "product", kj_str(sys->cpu_model));
    kj_put(hw, "cores", kj_int(sys->cores));
    kj_put(hw, "architecture", kj_str(arch));
    kj_put(hw, "isa", kj_str(sys->isa));
    kj *sw = kj_put(spec, "software", kj_obj());
    kj_put(sw, "compiler", kj_str(sys->compiler));
    kj_put(sw, "gemm", kj_str(sys->gemm));
    kj_put(sw, "kdloss", kj_str(kdloss_version()));
    kj_put(sw, "openmpThreads", kj_int(sys->threads));
    return p;
}

static kj *workload_obj(const kb_workload *w) {
    kj *o = kj_obj();
    kj_put(o, "kernel", kj_str(w->kernel));
    for (int k = 0; k < w->n; k++) {
        const kb_kv *kv = &w->kv[k];
        switch (kv->type) {
        case KB_KV_INT: kj_put(o, kv->key, kj_int(kv->i)); break;
        case KB_KV_NUM: kj_put(o, kv->key, kj_num(kv->d)); break;
        case KB_KV_STR: kj_put(o, kv->key, kj_str(kv->s)); break;
        case KB_KV_BOOL: kj_put(o, kv->key, kj_bool((int)kv->i)); break;
        }
    }
    return o;
}

static kj *measure(const char *metric, const char *statistic, const char *unit, kj *value) {
    kj *m = kj_obj();
    kj_put(m, "metric", kj_str(metric));
    kj_put(m, "statistic", kj_str(statistic));
    kj_put(m, "unit", kj_str(unit));
    kj_put(m, "value", value);
    return m;
}

static kj *measurements(const kb_result *r) {
    kj *a = kj_arr();
    kj_push(a, measure("latency", "p20", "ns", kj_int(llround(r->t.p20_ns))));
    kj_push(a, measure("latency", "p80", "ns", kj_int(llround(r->t.p80_ns))));
    kj_push(a, measure("peak_memory", "max", "bytes", kj_int((int64_t)r->peak_rss)));
    if (r->bytes > 0) {
        kj_push(a, measure("bandwidth", "median", "GB/s", kj_num(r->bytes / r->t.median_ns)));
        kj_push(a, measure("compulsory_bytes", "per_call", "bytes", kj_int((int64_t)r->bytes)));
    }
    if (r->stream_gbs > 0)
        kj_push(a, measure("stream_bandwidth", "median", "GB/s", kj_num(r->stream_gbs)));
    for (int k = 0; k < r->n_extra; k++)
        kj_push(a, measure(r->extra[k].metric, r->extra[k].statistic, r->extra[k].unit,
                           kj_num(r->extra[k].value)));
    return a;
}

/* run.spec.sourceNative: the benchmark's own identifiers and its ms quantiles. */
static kj *source_native(const kb_options *o, const kb_result *r, const kb_sysinfo *sys,
                         char *ext_id, size_t ext_size) {
    char bench[64], shape[256];
    snprintf(bench, sizeof bench, "%s/%s", r->wl.kernel, kb_mode_name(o->mode));
    kb_workload_slug(&r->wl, shape, sizeof shape);
    snprintf(ext_id, ext_size, "%s/kdloss/%s/%s/%s", bench, sys->cpu_slug, shape, r->stamp);
    kj *s = kj_obj();
    kj_put(s, "source", kj_str("kdloss-bench"));
    kj_put(s, "benchmark", kj_str(bench));
    kj_put(s, "externalId", kj_str(ext_id));
    kj *m = kj_put(s, "metrics", kj_obj());
    kj_put(m, "ms_20", kj_num(r->t.p20_ns / 1e6));
    kj_put(m, "ms_50", kj_num(r->t.median_ns / 1e6));
    kj_put(m, "ms_80", kj_num(r->t.p80_ns / 1e6));
    return s;
}

static kj *run_part(const kb_options *o, const kb_result *r, const kb_sysinfo *sys,
                    const kj *protocol, const kj *environment) {
    char ext_id[512], name[KB_NAME_MAX + 1], title[160], digest[72];
    kj *native = source_native(o, r, sys, ext_id, sizeof ext_id);
    name_slug(ext_id, name, sizeof name); /* the id's parts, dashed, like the seed names */
    char prefixed[600];
    snprintf(prefixed, sizeof prefixed, "kdloss-%s", name);
    name_slug(prefixed, name, sizeof name);
    snprintf(title, sizeof title, "%s - kdloss - %s", r->wl.title, kb_mode_name(o->mode));
    kj *spec, *meta;
    kj *p = part("BenchmarkRun", name, title, &spec, &meta);
    kj *labels = kj_put(meta, "labels", kj_obj());
    kj_put(labels, "kdloss_version", kj_str(kdloss_version()));
    kj_put(spec, "status", kj_str("passed"));
    kj *timing = kj_put(spec, "timing", kj_obj());
    kj_put(kj_put(timing, "latencyNs", kj_obj()), "median", kj_int(llround(r->t.median_ns)));
    kj_put(timing, "primaryStatistic", kj_str("median"));
    kj_put(spec, "observedAt", kj_str(r->observed_at));
    kj_put(spec, "measurements", measurements(r));
    kj_put(spec, "sourceNative", native);
    kj *wl = kj_put(spec, "workload", workload_obj(&r->wl));
    kj_digest(protocol, digest);
    kj_put(spec, "protocolDigest", kj_str(digest));
    kj_digest(environment, digest);
    kj_put(spec, "environmentDigest", kj_str(digest));
    kj_digest(wl, digest);
    kj_put(spec, "workloadDigest", kj_str(digest));
    return p;
}

int kb_write_record(const char *path, const kb_options *o, const kb_result *r,
                    const kb_sysinfo *sys) {
    kj *root = kj_obj();
    kj *protocol = protocol_part(o);
    kj *environment = environment_part(sys);
    kj_put(root, "run", run_part(o, r, sys, protocol, environment));
    kj_put(root, "protocol", protocol);
    kj_put(root, "environment", environment);
    FILE *f = fopen(path, "w");
    int rc = -1;
    if (!f) {
        fprintf(stderr, "kdloss bench: --json %s: cannot open for writing\n", path);
    } else {
        rc = kj_write_pretty(f, root);
        if (fclose(f) != 0) rc = -1;
        if (rc != 0) fprintf(stderr, "kdloss bench: --json %s: write failed\n", path);
    }
    kj_free(root);
    return rc;
}
