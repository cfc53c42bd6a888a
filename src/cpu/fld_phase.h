/* Per-phase time of the fused losses' CPU driver (fld.c): where a call's time goes, for `kdloss
 * bench distill_jsd` / `topk_distill` (their `phases:` line) and tests/test_fld_phases.c.
 *
 * Not part of kdloss.h's API: a private entry point the bench and the tests link (exported
 * only because they reach the library through its shared object). The counters are off unless
 * a thread attaches a stats struct it owns; they then count the fused calls made FROM THAT
 * THREAD only (the state is thread-local, so concurrent callers on other threads neither see
 * nor disturb it, and nothing global changes). Off, a phase boundary costs one thread-local
 * load and a branch, a few per chunk of rows (each chunk is milliseconds of GEMM).
 *
 * Accounting: phases nest (a GEMM over widened weight panels holds WIDEN time; the dWs scan
 * for rows whose dz is 0 holds the dWs GEMMs), and each nanosecond counts once, in the
 * innermost phase running (exclusive time). Time in the driver outside every phase is OTHER,
 * so the ten entries of ns[] sum to call_ns. Every boundary is on the calling thread: the
 * GEMMs and the row pass run their OpenMP regions inside one phase each. */
#ifndef KD_FLD_PHASE_H
#define KD_FLD_PHASE_H

#include <stdint.h>

#include "kdloss.h"

typedef enum kd_phase {
    KD_PH_GEMM_ZT = 0, /* the teacher's logits GEMM zt = xt wt^T (widening inside its tiles too) */
    KD_PH_GEMM_ZS,     /* the student's logits GEMM zs = xs ws^T (the same) */
    KD_PH_ROWS,        /* the row pass (vocabulary-parallel: its phases and all-reduces) */
    KD_PH_DBS,         /* dbs += column sums of dzs */
    KD_PH_MASK,        /* the scan for rows whose dz is 0 by the rules with a non-finite xs */
    KD_PH_GEMM_DW,     /* dWs (+)= dzs^T xs, accumulated across chunks (sparse path: scatter) */
    KD_PH_GEMM_DX,     /* dxs = dzs ws (a top-k renorm_both chunk: its sparse rows) */
    KD_PH_WIDEN,       /* bf16 -> fp32: input rows, weight panels or copies, biases */
    KD_PH_ROUND,       /* fp32 -> bf16: dzs in place, dxs rows, the dWs accumulator, dbs */
    KD_PH_OTHER,       /* the driver outside every phase: setup, loss sums, copies, zeros */
    KD_PH_COUNT
} kd_phase;

/* What an attached thread's fused calls add up (the caller zeroes it). */
typedef struct kdloss_phase_stats {
    double ns[KD_PH_COUNT];    /* exclusive nanoseconds of each phase, over every call */
    int64_t runs[KD_PH_COUNT]; /* how many times each phase was entered */
    double call_ns;            /* the calls' whole time, from kd_fld_execute's start to its end */
    int64_t calls;
} kdloss_phase_stats;

/* The fused calls this thread makes from now on add into *s (NULL: counting stops). A call
 * already running on this thread keeps the stats it started with. */
KDLOSS_API void kdloss_internal_phase_attach(kdloss_phase_stats *s);
/* "gemm_zt", "gemm_zs", "rows", "dbs", "mask", "gemm_dw", "gemm_dx", "widen", "round", "other";
 * NULL outside [0, KD_PH_COUNT). */
KDLOSS_API const char *kdloss_internal_phase_name(int phase);

/* ---- inside the library (fld.c) ---- */

/* The calling thread's counting state: the stats of the call in progress (NULL: off), the
 * stack of phases entered and the instant of the last boundary. */
typedef struct kd_ph_state {
    kdloss_phase_stats *attached; /* from kdloss_internal_phase_attach */
    kdloss_phase_stats *call;     /* the running call's (attached at its start), or NULL */
    double last_ns, start_ns;
    int depth, over; /* phases on the stack; entered beyond its 8 slots */
    int stack[8];
} kd_ph_state;

extern _Thread_local kd_ph_state kd_ph_tls;

void kd_ph_call_begin_on(void);
void kd_ph_call_end_on(void);
void kd_ph_enter_on(int phase);
void kd_ph_leave_on(void);

/* A call's start and end (kd_fld_execute), and a phase's: no-ops unless this thread attached. */
static inline void kd_ph_call_begin(void) {
    if (kd_ph_tls.attached) kd_ph_call_begin_on();
}
static inline void kd_ph_call_end(void) {
    if (kd_ph_tls.call) kd_ph_call_end_on();
}
static inline void kd_ph_enter(int phase) {
    if (kd_ph_tls.call) kd_ph_enter_on(phase);
}
static inline void kd_ph_leave(void) {
    if (kd_ph_tls.call) kd_ph_leave_on();
}

#endif
