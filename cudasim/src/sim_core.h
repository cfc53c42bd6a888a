/* Internal to cudasim/src: what sim.cpp (API, memory, registry, reports) and sim_exec.cpp
 * (fibers, scheduling, checkers) share. */
#ifndef KD_SIM_CORE_H
#define KD_SIM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "cuda_runtime.h"
#include "sim_internal.h"

/* One cudaMalloc'ed allocation: [raw, user) and [user + size, raw + total) are guard zones. */
struct kd_alloc {
    uintptr_t raw, user;
    size_t size, total;
    uint8_t *shadow; /* initcheck: one byte per user byte, 1 once written (racecheck build) */
    int freed;       /* in quarantine: accesses are use-after-free */
    uint64_t id;
};

#define KD_GUARD 256u

/* A consistent copy of the allocation table, sorted by raw, for the kernels' lookups. */
struct kd_alloc_snap {
    std::vector<const kd_alloc *> v;
};
const kd_alloc_snap *kd_sim_alloc_snapshot(void); /* valid until the next launch on any thread */
const kd_alloc *kd_sim_find(const kd_alloc_snap *s, uintptr_t p);

/* The registered kernel of a launch, and its site: indices into the registry or -1. */
struct kd_kernel_ref {
    int kernel, site;
    int launch_bounds;
    const char *name; /* registry name, or the launch's expression */
};
kd_kernel_ref kd_sim_lookup_launch(const kd_sim_launch_cfg *cfg);
void kd_sim_mark_run(kd_kernel_ref r);

int kd_sim_hooks_active(void); /* the racecheck / initcheck instrumentation is linked in */
int kd_sim_stream_ok(cudaStream_t st);
void kd_sim_set_last_error(cudaError_t e);
size_t kd_sim_func_smem_limit(const void *fn);
int kd_sim_is_module_addr(uintptr_t p); /* inside a loaded object's image (globals, constants) */

#endif
