/* The fused driver's per-phase counters (fld_phase.h): thread-local state, exclusive time. */
#include <time.h>

#include "fld_phase.h"

_Thread_local kd_ph_state kd_ph_tls;

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

void kdloss_internal_phase_attach(kdloss_phase_stats *s) { kd_ph_tls.attached = s; }

const char *kdloss_internal_phase_name(int phase) {
    static const char *const names[KD_PH_COUNT] = {"gemm_zt", "gemm_zs", "rows",  "dbs",
                                                   "mask",    "gemm_dw", "gemm_dx", "widen",
                                                   "round",   "other"};
    return phase >= 0 && phase < KD_PH_COUNT ? names[phase] : NULL;
}

/* The time since the last boundary goes to the phase on top of the stack (OTHER at the
 * bottom). */
static void lap(kd_ph_state *s) {
    double t = now_ns();
    s->call->ns[s->stack[s->depth - 1]] += t - s->last_ns;
    s->last_ns = t;
}

void kd_ph_call_begin_on(void) {
    kd_ph_state *s = &kd_ph_tls;
    if (s->call) return; /* a call inside a call (none today): the outer one counts */
    s->call = s->attached;
    s->depth = 1;
    s->over = 0;
    s->stack[0] = KD_PH_OTHER;
    s->start_ns = s->last_ns = now_ns();
}

void kd_ph_call_end_on(void) {
    kd_ph_state *s = &kd_ph_tls;
    lap(s);
    s->call->call_ns += s->last_ns - s->start_ns;
    s->call->calls++;
    s->call = NULL;
}

void kd_ph_enter_on(int phase) {
    kd_ph_state *s = &kd_ph_tls;
    s->call->runs[phase]++;
    if (s->depth == (int)(sizeof s->stack / sizeof s->stack[0])) { /* none today: 3 levels */
        s->over++; /* its time stays with the top */
        return;
    }
    lap(s);
    s->stack[s->depth++] = phase;
}

void kd_ph_leave_on(void) {
    kd_ph_state *s = &kd_ph_tls;
    if (s->over) {
        s->over--;
        return;
    }
    if (s->depth <= 1) return; /* unbalanced (a bug): OTHER stays at the bottom */
    lap(s);
    s->depth--;
}
