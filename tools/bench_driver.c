/* `kdloss bench`: parses the shared flags, hands the rest to the chosen kernel, runs it, then
 * adds what every run reports (peak RSS, streaming bandwidth, time stamp), prints the table
 * row and writes the record. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, gmtime_r under strict -std=c11 */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#define KB_STREAM_REPS 5

static const char *const DTYPES[] = {"fp32", "bf16", "fp16"};
static const kdloss_dtype DTYPE_VALUES[] = {KDLOSS_F32, KDLOSS_BF16, KDLOSS_F16};
static const char *const MODES[] = {"forward", "backward", "full"};

const kb_kernel *kb_find_kernel(const char *name) {
    for (int k = 0; kb_kernels[k]; k++)
        if (strcmp(kb_kernels[k]->name, name) == 0 ||
            (kb_kernels[k]->op && strcmp(kb_kernels[k]->op, name) == 0))
            return kb_kernels[k];
    return NULL;
}

void kb_bench_usage(FILE *f) {
    fprintf(f,
            "usage: kdloss bench KERNEL [flags]     time one kernel, print a table row\n"
            "       kdloss bench --list             list the kernels\n"
            "shared flags:\n"
            "  --bt N          rows (tokens), default 16384\n"
            "  --vocab N       columns (vocabulary), default 4096\n"
            "  --dtype T       fp32|bf16|fp16, default fp32\n"
            "  --mode M        forward|backward|full, default full (loss + gradient, one call)\n"
            "  --reps N        timed calls, default 20 (median, p20, p80 reported)\n"
            "  --warmup N      untimed calls first, default 3\n"
            "  --seed N        input generator seed, default 1\n"
            "  --json PATH     also write a KernelIndex-style JSON record\n"
            "  --deadline S    epoch seconds (default $KDLOSS_BENCH_DEADLINE): the fused kernels\n"
            "                  time fewer rounds rather than end after it (a SMALLER line says so)\n"
            "environment: OMP_NUM_THREADS (threads), KDLOSS_CPU_ISA=");
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++) /* the registry's names */
        fprintf(f, "%s%s", i > KDLOSS_ISA_SCALAR ? "|" : "",
                kdloss_cpu_isa_name((kdloss_cpu_isa)i));
    fprintf(f, " (code path)\n");
    for (int k = 0; kb_kernels[k]; k++)
        if (kb_kernels[k]->flags_help)
            fprintf(f, "%s flags:\n%s", kb_kernels[k]->name, kb_kernels[k]->flags_help);
}

static void list_kernels(void) {
    for (int k = 0; kb_kernels[k]; k++)
        if (kb_kernels[k]->op)
            printf("%-14s %s (also: %s)\n", kb_kernels[k]->name, kb_kernels[k]->summary,
                   kb_kernels[k]->op);
        else
            printf("%-14s %s\n", kb_kernels[k]->name, kb_kernels[k]->summary);
}

static void default_options(kb_options *o) {
    memset(o, 0, sizeof *o);
    o->bt = 16384;
    o->vocab = 4096;
    o->dtype = KDLOSS_F32;
    o->mode = KB_MODE_FULL;
    o->reps = 20;
    o->warmup = 3;
    o->seed = 1;
    const char *dl = getenv("KDLOSS_BENCH_DEADLINE"); /* bench/run_main.sh sets it per step */
    o->deadline = dl ? atof(dl) : 0.0;
}

/* One shared flag at argv[i]: entries consumed, 0 if not shared, -1 on error. */
static int parse_shared(kb_options *o, int argc, char **argv, int i) {
    int r, choice = 0;
    int64_t seed = 0;
    if ((r = kb_flag_i64(argc, argv, i, "--bt", 1, &o->bt))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--vocab", 1, &o->vocab))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--reps", 1, &o->reps))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--warmup", 0, &o->warmup))) return r;
    if ((r = kb_flag_str(argc, argv, i, "--json", &o->json_path))) return r;
    if ((r = kb_flag_double(argc, argv, i, "--deadline", 0.0, 1e12, &o->deadline))) return r;
    if ((r = kb_flag_i64(argc, argv, i, "--seed", 0, &seed))) {
        o->seed = (uint64_t)seed;
        return r;
    }
    if ((r = kb_flag_choice(argc, argv, i, "--dtype", DTYPES, 3, &choice))) {
        if (r > 0) o->dtype = DTYPE_VALUES[choice];
        return r;
    }
    if ((r = kb_flag_choice(argc, argv, i, "--mode", MODES, 3, &choice))) {
        if (r > 0) o->mode = (kb_mode)choice;
        return r;
    }
    return 0;
}

/* Every flag after KERNEL: shared ones first, then the kernel's own. -1 on any error. */
static int parse_flags(const kb_kernel *k, kb_options *o, void *kopts, int argc, char **argv) {
    for (int i = 2; i < argc;) {
        int r = parse_shared(o, argc, argv, i);
        if (r == 0 && k->parse_flag) r = k->parse_flag(o, kopts, argc, argv, i);
        if (r == 0) return kb_arg_error("unknown flag '%s' for kernel %s (see kdloss bench --help)",
                                        argv[i], k->name);
        if (r < 0) return -1;
        i += r;
    }
    /* BT x V elements of 8 bytes must be addressable: catches sizes no machine can hold. */
    if (kb_matrix_bytes(o->bt, o->vocab, KDLOSS_I64) == 0 ||
        (uint64_t)o->bt * (uint64_t)o->vocab > (uint64_t)INT64_MAX / 8)
        return kb_arg_error("--bt %lld x --vocab %lld: too large", (long long)o->bt,
                            (long long)o->vocab);
    if (o->reps > 100000000) return kb_arg_error("--reps: %lld is too many", (long long)o->reps);
    return k->check ? k->check(o, kopts) : 0;
}

/* observedAt (ISO 8601 UTC) and the external id's stamp, for the same second. */
static void stamp_now(kb_result *r) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(r->observed_at, sizeof r->observed_at, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
    strftime(r->stamp, sizeof r->stamp, "%Y-%m-%d-%H-%M-%S", &tm);
}

/* Streaming bandwidth over the run's compulsory bytes, printed for the log. */
static void add_stream(kb_result *r) {
    if (r->bytes <= 0 || r->stream_gbs > 0) return;
    kb_stream s;
    kb_stream_measure((size_t)r->bytes, KB_STREAM_REPS, &s);
    r->stream_gbs = s.gbs;
    char nt[48] = "not measured (no AVX2)";
    if (s.nt_used) snprintf(nt, sizeof nt, "%.2f GB/s", s.nt_gbs);
    printf("streaming bandwidth: %.2f GB/s (STREAM add, 3 x %.0f MB, %d threads; plain stores "
           "%.2f GB/s, non-temporal %s)\n",
           s.gbs, (double)s.array_bytes / 1e6, s.threads, s.plain_gbs, nt);
}

/* The machine measured next to each timed call (kb_time_pair_next): the call's time and the GB/s
 * of one STREAM add right after it, so that a call's fraction of the bandwidth compares it with
 * the machine of that moment (this VM's bandwidth drifts by 2x within minutes). The arrays are
 * allocated after the first timed call, once the process's peak RSS (the kernel's) is read. */
typedef struct pair_run {
    size_t stream_bytes;
    kb_stream_arrays s;
    size_t peak_rss; /* before the arrays; 0 until the first call */
    double *ns, *gbs;
    int64_t n, cap;
} pair_run;

static void pair_after_call(void *ctx, double ns) {
    pair_run *p = ctx;
    if (p->n >= p->cap) return;
    if (p->n == 0) {
        p->peak_rss = kb_peak_rss_bytes();
        kb_stream_open(p->stream_bytes, &p->s);
        kb_stream_once(&p->s); /* warm: pages, the OpenMP team */
    }
    p->ns[p->n] = ns;
    p->gbs[p->n] = kb_stream_once(&p->s);
    p->n++;
}

/* The paired fractions' median (and p20, p80 into q[0], q[2]) for res's bytes, or 0. */
static double pair_fraction(const pair_run *p, const kb_result *res, double q[3]) {
    if (p->n < 1 || res->bytes <= 0) return 0.0;
    double *f = malloc((size_t)p->n * sizeof *f);
    if (!f) return 0.0;
    for (int64_t i = 0; i < p->n; i++) f[i] = res->bytes / p->ns[i] / p->gbs[i];
    q[0] = kb_quantile(f, p->n, 0.2);
    q[1] = kb_quantile(f, p->n, 0.5);
    q[2] = kb_quantile(f, p->n, 0.8);
    free(f);
    return q[1];
}

static int run_kernel(const kb_kernel *k, const kb_options *o, const void *kopts) {
    kb_sysinfo sys;
    kb_sysinfo_get(&sys);
    printf("kdloss %s bench %s: BT %lld, V %lld, %s, %s, %lld reps after %lld warm-up, isa %s, "
           "%d threads, %s\n",
           kdloss_version(), k->name, (long long)o->bt, (long long)o->vocab,
           kb_dtype_name(o->dtype), kb_mode_name(o->mode), (long long)o->reps,
           (long long)o->warmup, sys.isa, sys.threads, sys.cpu_model);
    fflush(stdout);
    kb_result res;
    memset(&res, 0, sizeof res);
    /* kernels with a bandwidth target: a STREAM add next to every timed call (full mode) */
    pair_run pr;
    memset(&pr, 0, sizeof pr);
    int paired = k->stream_target > 0 && o->mode == KB_MODE_FULL && o->reps > 0;
    if (paired) {
        pr.stream_bytes = (size_t)(3 * o->bt * o->vocab) * sizeof(float);
        pr.cap = o->reps;
        pr.ns = malloc((size_t)pr.cap * sizeof *pr.ns);
        pr.gbs = malloc((size_t)pr.cap * sizeof *pr.gbs);
        if (pr.ns && pr.gbs) kb_time_pair_next(pair_after_call, &pr);
    }
    int rc = k->run(o, kopts, &res);
    kb_time_pair_next(NULL, NULL);
    if (pr.n > 0) kb_stream_close(&pr.s);
    if (rc != 0) {
        free(pr.ns), free(pr.gbs);
        return rc;
    }
    /* before any stream array raised the high-water mark */
    res.peak_rss = pr.peak_rss ? pr.peak_rss : kb_peak_rss_bytes();
    stamp_now(&res);
    add_stream(&res);
    double pq[3] = {0, 0, 0}, pfrac = pair_fraction(&pr, &res, pq);
    free(pr.ns), free(pr.gbs);
    if (pfrac > 0) {
        kb_result_add_measure(&res, "stream_fraction_paired", "median", "ratio", pfrac);
        printf("paired: each timed call against a STREAM add right after it: %.2f of the "
               "streaming bandwidth (median of %lld; p20 %.2f, p80 %.2f)\n",
               pfrac, (long long)pr.n, pq[0], pq[2]);
    }
    if (k->stream_target > 0 && !res.no_target && o->mode == KB_MODE_FULL && res.stream_gbs > 0) {
        double frac = pfrac > 0 ? pfrac : res.bytes / res.t.median_ns / res.stream_gbs;
        char tag[96]; /* the kernel's name, and its divergence when the workload names one */
        snprintf(tag, sizeof tag, "%s", k->name);
        for (int i = 0; i < res.wl.n; i++)
            if (strcmp(res.wl.kv[i].key, "divergence") == 0 && res.wl.kv[i].type == KB_KV_STR)
                snprintf(tag, sizeof tag, "%s %s", k->name, res.wl.kv[i].s);
        printf("TARGET %s %s %s: %.2f of the streaming bandwidth (%s; target >= %.2f): %s\n",
               tag, kb_dtype_name(o->dtype), kb_mode_name(o->mode), frac,
               pfrac > 0 ? "paired median" : "median over the run's bandwidth", k->stream_target,
               frac >= k->stream_target ? "MET" : "NOT MET");
    }
    if (o->json_path) {
        if (kb_write_record(o->json_path, o, &res, &sys) != 0) return 1;
        printf("record: %s\n", o->json_path);
    }
    /* The table comes last: bench/run_main.sh takes the lines after the header as rows. */
    kb_print_table_header(stdout);
    kb_print_row(stdout, o, &res, sys.isa);
    return 0;
}

int kb_bench_main(int argc, char **argv) {
    if (argc < 2) {
        kb_arg_error("missing KERNEL (see kdloss bench --list)");
        return 2;
    }
    if (strcmp(argv[1], "--list") == 0 && argc == 2) {
        list_kernels();
        return 0;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        kb_bench_usage(stdout);
        return 0;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            kb_bench_usage(stdout);
            return 0;
        }
    }
    const kb_kernel *k = kb_find_kernel(argv[1]);
    if (!k) {
        kb_arg_error("unknown kernel '%s' (see kdloss bench --list)", argv[1]);
        return 2;
    }
    kb_options o;
    default_options(&o);
    void *kopts = k->opts_size ? calloc(1, k->opts_size) : NULL;
    if (k->opts_size && !kopts) return 1;
    if (k->defaults) k->defaults(&o, kopts);
    int rc = parse_flags(k, &o, kopts, argc, argv) < 0 ? 2 : run_kernel(k, &o, kopts);
    free(kopts);
    return rc;
}
