/* The `phases:` line of `bench distill_jsd` and `bench topk_distill`: where a fused call's time
 * goes, from the library's per-phase counters (src/cpu/fld_phase.h), over the timed calls only. */
#include <string.h>

#include "bench.h"

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
