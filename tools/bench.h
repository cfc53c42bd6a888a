/*
 * `kdloss bench`: the benchmark harness. One kernel benchmark per source file, all listed in
 * one table, sharing the option parser, the timing loop, the streaming-bandwidth measurement,
 * peak RSS, the table printer and the KernelIndex-style JSON record writer declared here.
 *
 * HOW TO ADD A KERNEL (e.g. `distill_jsd`)
 *
 *  1. Create tools/bench_<name>.c (CMake compiles every tools .c file) defining one constant:
 *
 *       const kb_kernel kb_kernel_distill_jsd = {
 *           .name = "distill_jsd",               // the KERNEL argument of `kdloss bench`
 *           .summary = "fused-linear JSD + CE distillation loss",   // for `bench --list`
 *           .flags_help = "  --hs N  student hidden size (default 2048)\n...",  // or NULL
 *           .opts_size = sizeof(struct my_opts),  // private options, 0 if none
 *           .defaults = my_defaults,   // may change shared defaults (o->bt, o->vocab, o->dtype)
 *                                      // and must initialise the private options; or NULL
 *           .parse_flag = my_parse,    // offered each flag the shared parser does not know;
 *                                      // or NULL (then every other flag is an error)
 *           .check = my_check,         // cross-flag checks after parsing; or NULL
 *           .run = my_run,             // required: allocate, generate, time, fill the result
 *       };
 *
 *     parse_flag returns what the kb_flag_* helpers return: the number of argv entries it
 *     consumed, 0 for "not my flag", -1 after printing a one-line error (the tool exits 2).
 *     A typical body:  int r; if ((r = kb_flag_i64(argc, argv, i, "--hs", 1, &k->hs))) return r;
 *
 *     run() does, in order: describe the workload (kb_workload_init + kb_wl_* into res->wl),
 *     allocate inputs with kb_alloc and fill them (kb_fill_logprobs / kb_fill_probs or your
 *     own), set res->bytes (compulsory bytes of one call) and res->working_set, time the call
 *     with kb_time() (one call per callback; the callback returns the kdloss_status), put the
 *     loss of the last call in res->loss (res->has_loss = 1), optionally a short res->note
 *     (e.g. "hs2048 ht4096 gemm-floor 0.91x"), free everything and return 0. On a library
 *     error print it with kb_report_status() and return 1. The driver then reads peak RSS,
 *     measures the streaming bandwidth (unless res->stream_gbs was set, or res->bytes is 0),
 *     prints the table row and writes the JSON record if --json was given. For a kernel with a
 *     stream_target in full mode it also runs a STREAM add after each timed call of its
 *     kb_time (kb_time_pair_next) and judges the target on the median of the per-call
 *     fractions (bench/README.md).
 *     Kernel-specific numbers that belong in the record go in res->wl (workload key/values;
 *     in_id = 1 puts them in the external id, e.g. hidden4096) or res->extra (extra
 *     measurements such as a GEMM-floor time, via kb_result_add_measure). A fused-linear
 *     kernel times its GEMM floor beside its calls with kb_floor_bench_* (bench_gemm_floor.h;
 *     bench_fused_linear_distill.c and bench_fused_linear_topk_distill.c use it).
 *
 *  2. Register it in tools/bench_registry.c, the ONE list of kernels: add
 *       extern const kb_kernel kb_kernel_distill_jsd;
 *     and &kb_kernel_distill_jsd to kb_kernels[].
 *
 *  Nothing else changes: `kdloss bench --list` shows it, the help text lists its flags, and
 *  bench/run_main.sh runs `bench distill_jsd` whenever --list shows it.
 *
 * Shared flags (parsed before a kernel's own): --bt --vocab --dtype --mode --reps --warmup
 * --seed --json. Error convention: bad arguments exit 2, a failing library call exits 1.
 */
#ifndef KB_BENCH_H
#define KB_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fld_phase.h" /* the library's private per-phase counters */
#include "kdloss.h"

/* ---- options ------------------------------------------------------------------------------ */

typedef enum kb_mode {
    KB_MODE_FORWARD = 0,  /* loss only: no gradient output */
    KB_MODE_BACKWARD = 1, /* gradient only: no loss outputs */
    KB_MODE_FULL = 2      /* loss and gradient from one call (the reference protocol's "full") */
} kb_mode;

const char *kb_mode_name(kb_mode m);         /* "forward", "backward", "full" */
const char *kb_dtype_name(kdloss_dtype dt);  /* "fp32", "bf16", "fp16" */

/* Options every kernel shares. Defaults: BT 16384, V 4096, fp32, full, 20 reps, 3 warm-ups. */
typedef struct kb_options {
    int64_t bt;            /* --bt: rows (tokens) */
    int64_t vocab;         /* --vocab: columns */
    kdloss_dtype dtype;    /* --dtype fp32|bf16|fp16 */
    kb_mode mode;          /* --mode forward|backward|full */
    int64_t reps;          /* --reps: timed calls, >= 1 */
    int64_t warmup;        /* --warmup: untimed calls first, >= 0 */
    uint64_t seed;         /* --seed: input generator seed (inputs are reproducible) */
    const char *json_path; /* --json PATH, NULL when not given */
    double deadline;       /* --deadline EPOCH_S, default $KDLOSS_BENCH_DEADLINE, 0: none. A kernel
                              whose rounds take seconds (the fused ones) times fewer of them
                              rather than end after it, and prints a SMALLER line saying so */
} kb_options;

/* Flag helpers. Each looks at argv[i]: returns 0 if it is not `flag`, 2 after parsing its value
 * (argv[i + 1]) into *out, or -1 after printing "kdloss bench: <flag>: <why>" to stderr
 * (missing value, not a number, out of range). */
int kb_flag_i64(int argc, char **argv, int i, const char *flag, int64_t min, int64_t *out);
int kb_flag_double(int argc, char **argv, int i, const char *flag, double min, double max,
                   double *out);
int kb_flag_str(int argc, char **argv, int i, const char *flag, const char **out);
/* Value must be one of choices[0..n): *out gets its index. */
int kb_flag_choice(int argc, char **argv, int i, const char *flag, const char *const *choices,
                   int n, int *out);
/* Prints "kdloss bench: <fmt...>" and a newline to stderr; returns -1 (for `return kb_arg_error(...)`). */
int kb_arg_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* *d = the divergence named `name`; 0, or -1 after printing every name (kernel: the message's
 * prefix). */
int kb_divergence_arg(const char *kernel, const char *name, kdloss_divergence *d);

/* ---- workload description (goes into the record and its digest) ----------------------------- */

typedef enum kb_kv_type { KB_KV_INT, KB_KV_NUM, KB_KV_STR, KB_KV_BOOL } kb_kv_type;

typedef struct kb_kv {
    char key[32];
    kb_kv_type type;
    int64_t i;   /* KB_KV_INT, KB_KV_BOOL */
    double d;    /* KB_KV_NUM */
    char s[64];  /* KB_KV_STR */
    int in_id;   /* 1: "<key><value>" joins the external id / record name (sorted by key) */
} kb_kv;

#define KB_MAX_KV 24

typedef struct kb_workload {
    char kernel[32];   /* benchmark name, e.g. "kl_div" */
    char title[64];    /* human title, e.g. "KL-divergence loss" */
    kdloss_dtype dtype;/* appended to the external id after the in_id keys */
    int64_t bt, v;     /* shown in the table */
    int n;
    kb_kv kv[KB_MAX_KV];
} kb_workload;

/* Sets kernel, title, dtype, bt, v and adds "tokens", "vocab" (both in_id) and "dtype". */
void kb_workload_init(kb_workload *w, const char *kernel, const char *title, kdloss_dtype dtype,
                      int64_t bt, int64_t v);
void kb_wl_int(kb_workload *w, const char *key, int64_t value, int in_id);
void kb_wl_num(kb_workload *w, const char *key, double value);
void kb_wl_str(kb_workload *w, const char *key, const char *value);
void kb_wl_bool(kb_workload *w, const char *key, int value);
/* "tokens16384-vocab4096-fp32": in_id keys in key order, then the dtype. */
void kb_workload_slug(const kb_workload *w, char *out, size_t size);

/* ---- timing --------------------------------------------------------------------------------- */

typedef struct kb_stats {
    double median_ns, p20_ns, p80_ns; /* quantiles with linear interpolation (as torch.quantile) */
    double min_ns, max_ns;
    int64_t n;
} kb_stats;

/* One timed call; returns KDLOSS_OK or the failing call's status. */
typedef kdloss_status (*kb_call_fn)(void *ctx);

/* Runs `warmup` untimed calls, then `reps` calls each timed with CLOCK_MONOTONIC. When
 * working_set_bytes is below 256 MB a 64 MB buffer is written between calls so every call
 * starts with cold caches. Returns KDLOSS_OK, or the first failing status (stats unset). */
kdloss_status kb_time(kb_call_fn fn, void *ctx, int64_t warmup, int64_t reps,
                      size_t working_set_bytes, kb_stats *out);
/* Pairing: the next kb_time call (only that one) calls fn(ctx, ns) right after each timed call,
 * ns its time, so that the driver can measure the machine next to every call. NULL: none. */
typedef void (*kb_pair_fn)(void *ctx, double ns);
void kb_time_pair_next(kb_pair_fn fn, void *ctx);
/* Quantile q in [0,1] of n samples (sorted in place), linear interpolation. */
double kb_quantile(double *x, int64_t n, double q);
double kb_now_ns(void); /* CLOCK_MONOTONIC */
double kb_epoch_s(void); /* CLOCK_REALTIME, seconds since the epoch (for --deadline) */

/* ---- machine -------------------------------------------------------------------------------- */

typedef struct kb_stream {
    double plain_gbs, nt_gbs, gbs; /* plain stores, non-temporal stores, the faster one */
    size_t array_bytes;            /* each of the three arrays */
    int threads;
    int nt_used;                   /* 0 when the CPU has no AVX2 (non-temporal not measured) */
} kb_stream;

/* STREAM "add" c[i] = a[i] + b[i] over three float arrays of total max(total_bytes, 256 MB),
 * OpenMP with the library's thread count, median of `reps` runs each with plain and with
 * non-temporal stores; bandwidth counts 3 x array bytes. Exits 1 if it cannot allocate. */
void kb_stream_measure(size_t total_bytes, int reps, kb_stream *out);

/* One STREAM add at a time, for measurements paired with a kernel's calls: the arrays (total
 * max(total_bytes, 256 MB)) stay allocated between runs. kb_stream_once returns one run's GB/s
 * with non-temporal stores where the CPU has AVX2 (the faster kind here), else plain ones. */
typedef struct kb_stream_arrays {
    float *a, *b, *c;
    size_t n;
    int nt;
} kb_stream_arrays;
void kb_stream_open(size_t total_bytes, kb_stream_arrays *s);
double kb_stream_once(kb_stream_arrays *s);
void kb_stream_close(kb_stream_arrays *s);

size_t kb_peak_rss_bytes(void); /* getrusage ru_maxrss of this process, in bytes */

typedef struct kb_sysinfo {
    char cpu_model[128];  /* /proc/cpuinfo "model name", or "unknown" */
    char cpu_slug[128];   /* lower-case, dashes: "amd-epyc" */
    char vendor[32];      /* "amd", "intel", or the raw vendor id */
    int cores;            /* online logical CPUs */
    int threads;          /* omp_get_max_threads() */
    const char *isa;      /* kdloss_cpu_isa_name(kdloss_cpu_get_isa()) */
    char compiler[96];    /* "gcc 12.2.0" */
    char gemm[128];       /* the GEMM provider in use: "onednn 2.6.3 avx512_core_bf16" */
} kb_sysinfo;

void kb_sysinfo_get(kb_sysinfo *s);

/* ---- inputs --------------------------------------------------------------------------------- */

/* 64-byte aligned, first touched in parallel (pages land near the threads that use them).
 * Prints "out of memory (N MB for what)" and exits 1 on failure. Free with kb_free. */
void *kb_alloc(size_t bytes, const char *what);
void kb_free(void *p);
/* bt x v elements of dt, element count checked against overflow; 0 if it does not fit size_t. */
size_t kb_matrix_bytes(int64_t bt, int64_t v, kdloss_dtype dt);

/* Rows of log_softmax(randn) (what the reference feeds the student/input), generated in fp32
 * per row and rounded to dt (nearest even). Row r depends only on (seed, r): any thread count
 * gives the same tensor. */
void kb_fill_logprobs(void *dst, kdloss_dtype dt, int64_t bt, int64_t v, uint64_t seed);
/* Rows of softmax(randn): probabilities (the reference's KL target). */
void kb_fill_probs(void *dst, kdloss_dtype dt, int64_t bt, int64_t v, uint64_t seed);

/* A uniform [0, 1) from (seed, i) alone. */
float kb_uniform_at(uint64_t seed, uint64_t i);
/* n elements of dt (fp32 or bf16): lo + (hi - lo) * kb_uniform_at(seed, i), rounded to dt; any
 * thread count fills the same tensor (torch.rand hidden states, nn.Linear's uniform init). */
void kb_fill_uniform(void *dst, kdloss_dtype dt, size_t n, float lo, float hi, uint64_t seed);

/* A sparse top-k teacher (kdloss_topk_teacher), bt x k, contiguous: per row the k most likely
 * ids of log_softmax(scale * randn(v)) (int32, most likely first) and their log-probs (fp32,
 * normalized over all v). Row r depends only on (seed, r). scale 5 at v 32768: the top 1 holds
 * about 0.45 of the mass and the top 64 about 0.94, a peaked teacher with a tail. */
void kb_fill_topk_teacher(int32_t *ids, float *logprobs, int64_t bt, int64_t v, int64_t k,
                          double scale, uint64_t seed);

/* ---- results -------------------------------------------------------------------------------- */

/* An extra measurement for the record (besides latency p20/p80 and peak memory). */
typedef struct kb_measure {
    char metric[32];    /* e.g. "gemm_floor_latency" */
    char statistic[16]; /* e.g. "median" */
    char unit[16];      /* e.g. "ns" */
    double value;
} kb_measure;

#define KB_MAX_MEASURES 32

typedef struct kb_result {
    kb_workload wl;         /* filled by the kernel */
    kb_stats t;             /* from kb_time */
    double bytes;           /* compulsory bytes of one call (0: no bandwidth columns) */
    size_t working_set;     /* bytes the timed call touches (decides the cache flush) */
    double loss;            /* loss of the last call, when has_loss */
    int has_loss;
    char note[96];          /* free text for the table's last column */
    int n_extra;
    kb_measure extra[KB_MAX_MEASURES];
    /* filled by the driver */
    size_t peak_rss;
    double stream_gbs;      /* set by the kernel to skip the driver's measurement */
    int no_target;          /* set by the kernel: this run has no stream target */
    char observed_at[32];   /* ISO 8601 UTC, "2025-01-02T03:04:05.000Z" */
    char stamp[24];         /* same instant, "2025-01-02-03-04-05" */
} kb_result;

void kb_result_add_measure(kb_result *r, const char *metric, const char *statistic,
                           const char *unit, double value);

/* Table: one header line starting with "kernel", then one line per run starting with the
 * kernel name (bench/run_main.sh collects these). */
void kb_print_table_header(FILE *f);
void kb_print_row(FILE *f, const kb_options *o, const kb_result *r, const char *isa);

/* Writes the KernelIndex-style record (run, protocol, environment) to path. Returns 0, or -1
 * after printing why. */
int kb_write_record(const char *path, const kb_options *o, const kb_result *r,
                    const kb_sysinfo *sys);

/* Prints "kdloss bench: <what>: <kdloss_status_string>" to stderr. */
void kb_report_status(const char *what, kdloss_status st);

/* ---- per-phase time of the fused calls (src/cpu/fld_phase.h) -------------------------------- */

/* One benchmarked call's counters: its `warmup` untimed calls add into `warm`, the timed ones
 * into `timed`. Wrap each call in kb_phases_begin / kb_phases_end (they attach the library's
 * thread-local counters to this thread for that call alone). */
typedef struct kb_phases {
    kdloss_phase_stats timed, warm;
    int64_t warmup, seen;
} kb_phases;

void kb_phases_init(kb_phases *p, int64_t warmup);
void kb_phases_begin(kb_phases *p);
void kb_phases_end(kb_phases *p);
/* "phases: LABEL, T ms a call (mean of N timed calls): gemm_zt X ms (P%); ...; other Y ms (P%)":
 * the phases that ran, mean per timed call; nothing when no fused call was timed. */
void kb_phases_print(const kb_phases *p, const char *label);
/* The same as measures phase_<name> (mean ns a call) in the record. */
void kb_phases_record(const kb_phases *p, kb_result *res);
/* "beyond the floor, ms a call: gemm_zt -1.2; ...; rows +626.0; ... most: rows": each GEMM
 * phase against the floor's median of the same GEMM (floor_ns in kb_gemm_name's order,
 * bench_gemm_floor.h), every other phase whole: the phase a miss of the floor target lives in. */
void kb_phases_vs_floor(const kb_phases *p, const double *floor_ns);

/* ---- kernels -------------------------------------------------------------------------------- */

typedef struct kb_kernel {
    const char *name;       /* KERNEL argument of `kdloss bench` (the records' workload name) */
    const char *op;         /* the operation's name (docs/ARCHITECTURE.md), also accepted as
                               KERNEL where it differs from name; may be NULL */
    const char *summary;    /* one line for `kdloss bench --list` */
    const char *flags_help; /* its own flags for --help, lines starting "  --"; may be NULL */
    size_t opts_size;       /* bytes of its private options (allocated zeroed by the driver) */
    void (*defaults)(kb_options *o, void *kopts);
    int (*parse_flag)(kb_options *o, void *kopts, int argc, char **argv, int i);
    int (*check)(const kb_options *o, const void *kopts);
    int (*run)(const kb_options *o, const void *kopts, kb_result *res);
    /* > 0: in full mode the run prints a TARGET line, met when the median moves at least this
     * fraction of the streaming bandwidth measured in the same run. */
    double stream_target;
} kb_kernel;

/* The registry (tools/bench_registry.c): NULL-terminated. */
extern const kb_kernel *const kb_kernels[];
const kb_kernel *kb_find_kernel(const char *name);

/* `kdloss bench ...` with argv[0] = "bench"; returns the process exit code. */
int kb_bench_main(int argc, char **argv);
void kb_bench_usage(FILE *f);

#endif
