/* gpu-model: the CUDA backend's time on an H100 SXM and an H200, modelled from what the CUDA
 * simulator counts (cudasim/README.md, "The trace"), not measured. Each seed workload runs through
 * the C entry point with exactly the parameters the PyTorch modules' defaults pass, at the seed's
 * full shape and chunk plan; the simulator runs a sample of each launch's blocks and counts GEMMs
 * without computing them, so only the counts mean anything. The rule (docs/MATH.md section 11):
 *   kernel   bytes / (0.85 HBM) + 4 us
 *   GEMM     max(FLOPs / (0.72 peak x wave fill), bytes / (0.85 HBM)) + 4 us, wave fill = output
 *            tiles (128 x 128) / (waves x SMs), no split-K assumed
 *   memset / copy  bytes / (0.85 HBM) + 4 us;  host sync 10 us;  cudaMalloc 10 us
 * one stream: the times add. What it cannot see: instruction issue (the row kernels' exp / log),
 * occupancy, bank conflicts, cuBLASLt's algorithm choice, L2 hits.
 * Usage: gpu_model [--check]   (--check: exit 1 unless the model can tell what it must) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kd_sim.h"
#include "kdloss.h"

int gm_planted_double_read_caught(long sample);

#define GM_SAMPLE 16 /* blocks run of each launch: rows are alike, the counts scale to the grid */

typedef struct gm_gpu {
    const char *name;
    double hbm;        /* bytes / s */
    double bf16, fp32; /* dense FLOP / s: tensor cores (bf16), CUDA cores (fp32, no TF32) */
    int sms;
    size_t memory;
} gm_gpu;

/* docs/MATH.md section 11: public figures */
static const gm_gpu GM_GPUS[2] = {
    {"H100-SXM", 3.35e12, 989e12, 67e12, 132, (size_t)80 << 30},
    {"H200", 4.8e12, 989e12, 67e12, 132, (size_t)141 << 30},
};
static const double GM_STREAM = 0.85, GM_GEMM = 0.72, GM_LAUNCH = 4e-6, GM_SYNC = 10e-6;

/* ---- the rule --------------------------------------------------------------------------------- */

static double gm_wave_fill(const kd_sim_op *o, int sms) {
    const double tiles = ceil((double)o->m / 128.0) * ceil((double)o->n / 128.0);
    return tiles / (ceil(tiles / sms) * sms);
}

static double gm_op_seconds(const kd_sim_op *o, const gm_gpu *g) {
    const double bytes = o->bytes_read + o->bytes_written, stream = bytes / (GM_STREAM * g->hbm);
    switch (o->kind) {
    case KD_SIM_OP_GEMM: {
        const double peak = o->elem_bytes == 4 ? g->fp32 : g->bf16;
        const double compute = o->flops / (GM_GEMM * peak * gm_wave_fill(o, g->sms));
        return (compute > stream ? compute : stream) + GM_LAUNCH;
    }
    case KD_SIM_OP_KERNEL:
    case KD_SIM_OP_MEMSET:
        return stream + GM_LAUNCH;
    case KD_SIM_OP_COPY:
        return bytes > 0 ? stream + GM_LAUNCH : 0.0;
    case KD_SIM_OP_SYNC:
    case KD_SIM_OP_ALLOC:
        return GM_SYNC;
    }
    return 0.0;
}

/* ---- a traced call and its phases -------------------------------------------------------------- */

#define GM_MAX_PHASES 32

typedef struct gm_phase {
    char name[48];
    long count;
    double bytes, flops, sec[2];
} gm_phase;

typedef struct gm_call {
    gm_phase ph[GM_MAX_PHASES];
    int nph;
    double sec[2];
    long syncs, allocs, launches;
} gm_call;

static gm_phase *gm_phase_of(gm_call *c, const kd_sim_op *o) {
    char name[48]; /* a kernel or runtime call by name, a GEMM by its shape (m x n x k) */
    if (o->kind == KD_SIM_OP_GEMM)
        snprintf(name, sizeof name, "gemm %lldx%lldx%lld", o->m, o->n, o->k);
    else
        snprintf(name, sizeof name, "%s", o->name ? o->name : "?");
    for (int i = 0; i < c->nph; i++)
        if (!strcmp(c->ph[i].name, name)) return &c->ph[i];
    if (c->nph == GM_MAX_PHASES) return &c->ph[GM_MAX_PHASES - 1];
    gm_phase *p = &c->ph[c->nph++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

/* The trace since kd_sim_trace_begin, summed per phase and in total on both GPUs. */
static void gm_collect(gm_call *c) {
    memset(c, 0, sizeof *c);
    const long n = kd_sim_trace_end();
    for (long i = 0; i < n; i++) {
        kd_sim_op o;
        if (!kd_sim_trace_get(i, &o)) continue;
        gm_phase *p = gm_phase_of(c, &o);
        p->count++;
        p->bytes += o.bytes_read + o.bytes_written;
        p->flops += o.flops;
        for (int g = 0; g < 2; g++) {
            const double s = gm_op_seconds(&o, &GM_GPUS[g]);
            p->sec[g] += s;
            c->sec[g] += s;
        }
        c->syncs += o.kind == KD_SIM_OP_SYNC;
        c->allocs += o.kind == KD_SIM_OP_ALLOC;
        c->launches += o.kind == KD_SIM_OP_KERNEL || o.kind == KD_SIM_OP_GEMM;
    }
}

static void gm_print(const char *what, const gm_call *c) {
    printf("\n%s (modelled, not measured)\n", what);
    printf("  %-34s %6s %12s %10s %10s %10s\n", "phase", "count", "GB moved", "TFLOP",
           "H100 ms", "H200 ms");
    for (int i = 0; i < c->nph; i++)
        printf("  %-34s %6ld %12.3f %10.3f %10.3f %10.3f\n", c->ph[i].name, c->ph[i].count,
               c->ph[i].bytes / 1e9, c->ph[i].flops / 1e12, c->ph[i].sec[0] * 1e3,
               c->ph[i].sec[1] * 1e3);
    printf("  %-34s %6ld %12s %10s %10.3f %10.3f\n", "total (launches)", c->launches, "", "",
           c->sec[0] * 1e3, c->sec[1] * 1e3);
    printf("  host syncs %ld, device allocations %ld\n", c->syncs, c->allocs);
}

/* Bytes moved by the phases whose names start with one of the prefixes (NULL-terminated). */
static double gm_bytes_of(const gm_call *c, const char *const *prefixes) {
    double b = 0.0;
    for (int i = 0; i < c->nph; i++)
        for (const char *const *p = prefixes; *p; p++)
            if (!strncmp(c->ph[i].name, *p, strlen(*p))) b += c->ph[i].bytes;
    return b;
}

/* ---- device buffers ---------------------------------------------------------------------------- */

static void *gm_dev(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        fprintf(stderr, "gpu-model: cudaMalloc of %zu bytes failed\n", bytes);
        exit(2);
    }
    return p;
}

/* rows x n fp32 at d, every row a copy of `row` */
static void gm_fill_rows(float *d, const float *row, long rows, long n) {
    for (long r = 0; r < rows; r++)
        cudaMemcpy(d + r * n, row, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice);
}

/* ---- the workloads ------------------------------------------------------------------------------ */

/* The fused-linear JSD seed (docs/MATH.md section 6): BT 8192, Hs 2048, Ht 4096, V 128256, bf16,
 * int64 labels, FusedLinearJSDLoss's defaults (JSD beta 0.5, hard and soft weights 0.5, T 1), the
 * Python binding's outputs (loss, soft and hard losses, dxs, dws), memory_budget as given (0: the
 * default the modules pass). The workspace comes from the caller (torch's allocator), outside the
 * traced call, as in the binding. */
#define GM_BT 8192
#define GM_HS 2048
#define GM_HT 4096
#define GM_V 128256

/* The seed's params at a budget, and its workspace on a device of that memory (0 on error): the
 * plan's size, so two devices with the same workspace get the same chunk plan. */
static size_t gm_fused_plan(size_t budget, size_t device_memory,
                            kdloss_fused_linear_distill_params *p) {
    kd_sim_set_device_memory(device_memory);
    kdloss_fused_linear_distill_params_default(p);
    p->memory_budget = budget;
    size_t wsb = 0;
    if (kdloss_cuda_fused_linear_distill_workspace_size(p, GM_BT, GM_HS, GM_HT, GM_V, KDLOSS_BF16,
                                                        1, &wsb))
        return 0;
    return wsb;
}

static int gm_fused(kdloss_cuda_context *ctx, size_t budget, size_t device_memory, gm_call *c) {
    const int64_t bt = GM_BT, hs = GM_HS, ht = GM_HT, v = GM_V;
    kdloss_fused_linear_distill_params p;
    const size_t wsb = gm_fused_plan(budget, device_memory, &p);
    if (!wsb) return 0;
    void *xs = gm_dev((size_t)(bt * hs) * 2), *ws = gm_dev((size_t)(v * hs) * 2);
    void *xt = gm_dev((size_t)(bt * ht) * 2), *wt = gm_dev((size_t)(v * ht) * 2);
    void *dxs = gm_dev((size_t)(bt * hs) * 2), *dws = gm_dev((size_t)(v * hs) * 2);
    float *losses = (float *)gm_dev(3 * sizeof(float));
    int64_t *lab = (int64_t *)gm_dev((size_t)bt * 8), *hl = (int64_t *)malloc((size_t)bt * 8);
    for (int64_t i = 0; i < bt; i++) hl[i] = (i * 7919) % v;
    cudaMemcpy(lab, hl, (size_t)bt * 8, cudaMemcpyHostToDevice);
    void *work = gm_dev(wsb);
    kdloss_fused_linear_distill_out o;
    memset(&o, 0, sizeof o);
    o.loss = losses, o.soft_loss = losses + 1, o.hard_loss = losses + 2;
    o.dxs = (kdloss_mat){dxs, KDLOSS_BF16, 0};
    o.dws = (kdloss_mat){dws, KDLOSS_BF16, 0};
    kd_sim_trace_begin();
    const kdloss_status s = kdloss_cuda_fused_linear_distill(
        ctx, NULL, &p, bt, hs, ht, v, (kdloss_cmat){xs, KDLOSS_BF16, 0},
        (kdloss_cmat){ws, KDLOSS_BF16, 0}, NULL, (kdloss_cmat){xt, KDLOSS_BF16, 0},
        (kdloss_cmat){wt, KDLOSS_BF16, 0}, NULL, (kdloss_labels){lab, KDLOSS_I64}, &o, work, wsb);
    gm_collect(c);
    void *bufs[] = {xs, ws, xt, wt, dxs, dws, losses, lab, work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    free(hl);
    if (s != KDLOSS_OK) fprintf(stderr, "gpu-model: fused call: %s\n", kdloss_status_string(s));
    return s == KDLOSS_OK;
}

/* The KL seed: 16384 x 4096 fp32 log-probs against probabilities, batchmean (Liger's and torch's
 * KLDivLoss bench), loss and gradient, the workspace from the caller. */
static int gm_kl(kdloss_cuda_context *ctx, gm_call *c, double *compulsory) {
    const int64_t bt = 16384, v = 4096;
    float *row = (float *)malloc(sizeof(float) * v), *trow = (float *)malloc(sizeof(float) * v);
    double z = 0.0;
    for (int64_t j = 0; j < v; j++) z += exp(-(double)(j % 97) / 16.0);
    for (int64_t j = 0; j < v; j++) {
        trow[j] = (float)(exp(-(double)(j % 97) / 16.0) / z);
        row[j] = (float)log(1.0 / (double)v);
    }
    const size_t mat = sizeof(float) * (size_t)(bt * v);
    float *in = (float *)gm_dev(mat), *tg = (float *)gm_dev(mat), *gr = (float *)gm_dev(mat);
    float *loss = (float *)gm_dev(sizeof(float));
    gm_fill_rows(in, row, bt, v);
    gm_fill_rows(tg, trow, bt, v);
    size_t wsb = 0;
    kdloss_cuda_kl_div_workspace_size(bt, v, &wsb);
    void *work = wsb ? gm_dev(wsb) : NULL;
    kdloss_kl_params p;
    kdloss_kl_params_default(&p);
    p.reduction = KDLOSS_REDUCTION_BATCHMEAN;
    kd_sim_trace_begin();
    const kdloss_status s = kdloss_cuda_kl_div(ctx, NULL, &p, bt, v, (kdloss_cmat){in, KDLOSS_F32, 0},
                                               (kdloss_cmat){tg, KDLOSS_F32, 0}, loss, NULL,
                                               (kdloss_mat){NULL, KDLOSS_F32, 0},
                                               (kdloss_mat){gr, KDLOSS_F32, 0}, work, wsb);
    gm_collect(c);
    *compulsory = 3.0 * (double)mat; /* input and target read, gradient written */
    cudaFree(in), cudaFree(tg), cudaFree(gr), cudaFree(loss), cudaFree(work);
    free(row), free(trow);
    return s == KDLOSS_OK;
}

/* ---- the report -------------------------------------------------------------------------------- */

static void gm_constants(void) {
    printf("gpu-model: constants: streaming %.0f%% of HBM, GEMMs %.0f%% of dense peak x wave fill "
           "(128x128 tiles, no split-K), %.0f us a launch, %.0f us a host sync\n",
           GM_STREAM * 100, GM_GEMM * 100, GM_LAUNCH * 1e6, GM_SYNC * 1e6);
    for (int g = 0; g < 2; g++)
        printf("gpu-model: %s: HBM %.2f TB/s, bf16 %.0f TFLOP/s, fp32 %.0f TFLOP/s, %d SMs, "
               "%zu GiB (its default chunk budget follows from it)\n",
               GM_GPUS[g].name, GM_GPUS[g].hbm / 1e12, GM_GPUS[g].bf16 / 1e12,
               GM_GPUS[g].fp32 / 1e12, GM_GPUS[g].sms, GM_GPUS[g].memory >> 30);
}

static void gm_target(const char *what, int met) {
    printf("gpu-model: TARGET %s: %s (modelled, not measured)\n", what, met ? "MET" : "NOT MET");
}

int main(int argc, char **argv) {
    const int check = argc > 1 && !strcmp(argv[1], "--check");
    setvbuf(stdout, NULL, _IOLBF, 0);
    kdloss_cuda_context *ctx = NULL;
    if (kdloss_cuda_context_create(0, &ctx) != KDLOSS_OK) return 2;
    const int caught = gm_planted_double_read_caught(GM_SAMPLE);
    kd_sim_set_sample_blocks(GM_SAMPLE);
    kd_sim_set_gemm_count_only(1);
    gm_constants();
    /* the fused seed's plan per GPU (the default budget follows the device's memory) */
    static gm_call fd[2], f256, kl;
    int ok = 1;
    /* a GPU whose plan is the H100's (the same workspace) has the same trace: counted once */
    kdloss_fused_linear_distill_params q;
    ok &= gm_fused(ctx, 0, GM_GPUS[0].memory, &fd[0]);
    if (gm_fused_plan(0, GM_GPUS[1].memory, &q) == gm_fused_plan(0, GM_GPUS[0].memory, &q))
        fd[1] = fd[0];
    else
        ok &= gm_fused(ctx, 0, GM_GPUS[1].memory, &fd[1]);
    ok &= gm_fused(ctx, (size_t)256 << 20, GM_GPUS[0].memory, &f256);
    double kl_bytes = 0.0;
    ok &= gm_kl(ctx, &kl, &kl_bytes);
    gm_print("fused_linear_jsd seed bf16, module defaults, H100-SXM's plan", &fd[0]);
    gm_print("fused_linear_jsd seed bf16, module defaults, H200's plan", &fd[1]);
    gm_print("fused_linear_jsd seed bf16, memory_budget 256 MiB", &f256);
    gm_print("kl_div seed fp32, batchmean, loss and gradient", &kl);
    const double h100 = fd[0].sec[0] * 1e3, h200 = fd[1].sec[1] * 1e3;
    /* the row pass: the slab kernel, fld_row_kernel (the rows the slab leaves, or all), the maps */
    static const char *const row_pass[] = {"fld_slab_kernel", "fld_row_kernel", "fld_map_kernel", NULL};
    const double row_bpl = gm_bytes_of(&fd[1], row_pass) / ((double)GM_BT * GM_V);
    const double kl_pct = 100.0 * (kl_bytes / (GM_STREAM * GM_GPUS[1].hbm)) / kl.sec[1];
    const long fsync = fd[1].syncs + fd[1].allocs, ksync = kl.syncs + kl.allocs;
    printf("\n");
    gm_target("fused_linear_jsd seed <= 36 ms on an H100 SXM", h100 <= 36.0);
    gm_target("fused_linear_jsd seed <= 33 ms on an H200", h200 <= 33.0);
    gm_target("fused row pass <= 12 bytes/logit", row_bpl <= 12.0);
    gm_target("kl_div seed >= 90% of the H200's copy bandwidth", kl_pct >= 90.0);
    gm_target("host syncs: 0 for kl_div, <= 1 a fused call", ksync == 0 && fsync <= 1);
    printf("gpu-model: fused_linear_jsd seed bf16 defaults: H100-SXM %.1f ms, H200 %.1f ms "
           "(modelled, not measured)\n", h100, h200);
    printf("gpu-model: fused_linear_jsd seed bf16 budget 256MiB: H100-SXM %.1f ms, H200 %.1f ms "
           "(modelled, not measured)\n", f256.sec[0] * 1e3, f256.sec[1] * 1e3);
    printf("gpu-model: fused row pass %.1f bytes/logit\n", row_bpl);
    printf("gpu-model: kl_div seed fp32: H200 %.1f%% of copy bandwidth (modelled, not measured)\n",
           kl_pct);
    printf("gpu-model: host syncs per call: kl_div %ld, fused_linear_jsd %ld\n", ksync, fsync);
    printf("gpu-model: planted double read %s\n", caught ? "caught" : "NOT caught");
    kdloss_cuda_context_destroy(ctx);
    if (!ok) return 2;
    /* --check: the model must see the chunk count and the planted defect */
    return check && (!caught || f256.sec[0] <= fd[0].sec[0]) ? 1 : 0;
}
