/* The `phases:` line of `bench distill_jsd` and `bench topk_distill`: where a fused call's time
 * goes, from the library's per-phase counters (src/cpu/fld_phase.h), over the timed calls only. */
#include <string.h>

#include "bench.h"
#include "bench_gemm_floor.h"

void kb_phases_init(kb_phases *p, int64_t warmup) {
    memset(p, 0, sizeof *p);
    p->warmup = warmup;
}

void kb_phases_begin(kb_phases *p) {
    kdloss_internal_phase_attach(p->seen < p->warmup ? &p->warm : &p->timed);
}

void kb_phases_end(kb_phases *p) {
    kdloss_internal_phase_attach(NULL);
    p->seen++;
}

void kb_phases_print(const kb_phases *p, const char *label) {
    const kdloss_phase_stats *s = &p->timed;
    if (s->calls == 0) return;
    double n = (double)s->calls;
    printf("phases: %s, %.1f ms a call (mean of %lld timed calls):", label, s->call_ns / n * 1e-6,
           (long long)s->calls);
    for (int i = 0; i < KD_PH_COUNT; i++) {
        if (i != KD_PH_OTHER && s->runs[i] == 0) continue; /* the phase did not run */
        double ms = s->ns[i] / n * 1e-6; /* 3 significant digits down to a microsecond */
        printf(" %s %.*f ms (%.1f%%)%s", kdloss_internal_phase_name(i), ms >= 100 ? 0 : ms >= 1 ? 1 : 3,
               ms, 100.0 * s->ns[i] / s->call_ns, i + 1 < KD_PH_COUNT ? ";" : "");
    }
    printf("\n");
}

/* The floor's GEMM (kb_gemm_name's order) a phase stands against, or -1: every nanosecond of
 * the other phases is beyond the floor. */
static int floor_gemm(int phase) {
    switch (phase) {
    case KD_PH_GEMM_ZT: return KB_GEMM_ZT;
    case KD_PH_GEMM_ZS: return KB_GEMM_ZS;
    case KD_PH_GEMM_DX: return KB_GEMM_DXS;
    case KD_PH_GEMM_DW: return KB_GEMM_DWS;
    default: return -1;
    }
}

void kb_phases_vs_floor(const kb_phases *p, const double *floor_ns) {
    const kdloss_phase_stats *s = &p->timed;
    if (s->calls == 0) return;
    double n = (double)s->calls, worst = 0.0;
    int worst_i = -1;
    printf("beyond the floor, ms a call:");
    for (int i = 0; i < KD_PH_COUNT; i++) {
        if (i != KD_PH_OTHER && s->runs[i] == 0) continue;
        int g = floor_gemm(i);
        double d = s->ns[i] / n - (g >= 0 ? floor_ns[g] : 0.0);
        printf(" %s %+.1f;", kdloss_internal_phase_name(i), d * 1e-6);
        if (d > worst) worst = d, worst_i = i;
    }
    if (worst_i >= 0) printf(" most: %s\n", kdloss_internal_phase_name(worst_i));
    else printf(" none over\n");
}

void kb_phases_record(const kb_phases *p, kb_result *res) {
    const kdloss_phase_stats *s = &p->timed;
    if (s->calls == 0) return;
    for (int i = 0; i < KD_PH_COUNT; i++) {
        if (i != KD_PH_OTHER && s->runs[i] == 0) continue;
        char metric[32];
        snprintf(metric, sizeof metric, "phase_%s", kdloss_internal_phase_name(i));
        kb_result_add_measure(res, metric, "mean", "ns", s->ns[i] / (double)s->calls);
    }
}
