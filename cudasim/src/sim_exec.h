/* Internal to cudasim/src: the execution state shared by sim_exec.cpp (fibers, scheduling),
 * sim_sync.cpp (barriers and warp operations) and sim_hooks.cpp (the access checkers). */
#ifndef KD_SIM_EXEC_H
#define KD_SIM_EXEC_H

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "sim_core.h"

enum { KD_F_READY, KD_F_BARRIER, KD_F_WARP, KD_F_DONE, KD_F_CLUSTER };

/* A thread-block cluster being run (sim_exec.cpp): its blocks run at once, block rank r on OS
 * thread r of the launch, which meet at host barriers for cluster.sync() and between clusters. */
#define KD_MAX_CLUSTER 8
struct kd_cluster_run {
    unsigned size;
    std::mutex mu;
    std::condition_variable cv;
    unsigned arrived, exited; /* at the current cluster.sync; blocks of this cluster done */
    uint64_t gen;             /* cluster.sync generations */
    unsigned gone;            /* blocks exited when the last cluster.sync opened */
    unsigned phase_in;        /* threads at the between-clusters barrier */
    uint64_t phase_gen;
    uintptr_t dyn_user[KD_MAX_CLUSTER]; /* each block's dynamic shared memory */
    size_t dyn_size;
    int live[KD_MAX_CLUSTER];           /* the block has not exited */
};

/* The trace's model of read traffic (sim_hooks.cpp, kd_trace_read). A warp's lanes run in
 * lockstep on a GPU: the k-th device read of each lane of a warp is one instruction, whose
 * distinct 32-byte sectors (a GPU's unit of device traffic) are requested once. Each request
 * goes through an L1 model of 64 KiB a block, direct-mapped: less than an H100 SM's 256 KiB of
 * L1 and shared memory, so a kernel is never credited with more reuse than it could get. */
#define KD_L1_SECTOR 32u
#define KD_L1_SECTORS 2048u
#define KD_WARP_SECTORS 16u /* sectors one warp read can touch coalesced: 32 lanes x 16 bytes */
struct kd_warp_read {
    uint64_t sec[KD_WARP_SECTORS];
    uint32_t n;
};

/* One simulated thread. The kd_sim_thread part is what threadIdx & co. read. */
struct kd_fiber : kd_sim_thread {
    void *sp;        /* saved stack pointer while not running */
    char *stack_lo;
    int lin;         /* linear thread index in the block */
    int state;
    const char *file; /* where it waits: barrier or warp operation */
    int line;
    int op;           /* warp operation */
    unsigned mask;
    int arg, width;
    uint64_t value, result;
    uint32_t dev_reads; /* device reads so far in the block: the trace's lockstep index */
};

/* A launch being executed (shared by the OS threads running its blocks). */
struct kd_launch_run {
    const kd_sim_launch_cfg *cfg;
    void (*thunk)(const void *fn, const void *args);
    const void *args;
    size_t args_size;
    kd_kernel_ref ref;
    int nthreads;
    const kd_alloc_snap *snap;
    uint64_t launch_id;
    uint64_t nblocks, nrun; /* grid size; blocks executed (fewer under block sampling) */
    std::atomic<uint64_t> bytes_r{0}, bytes_w{0}; /* device memory, the blocks that ran */
};

/* racecheck's record of one byte of shared memory in the current barrier interval */
struct kd_race_cell {
    uint64_t epoch;
    int16_t writer, reader; /* thread (linear), -1 none; reader -2: several */
    uint8_t atomic_w;
    uint8_t pad[3];
};

/* Per OS thread. */
struct kd_exec {
    int in_kernel;
    kd_fiber *cur;
    void *sched_sp;
    const void *sched_bottom;
    size_t sched_size;
    const void *asan_prev_bottom;
    size_t asan_prev_size;
    uint64_t fp_word;
    const kd_launch_run *L;
    uint3 bid;
    uint64_t epoch;        /* barrier intervals, never reused: block starts and barriers bump it */
    uint64_t block_serial;
    /* fibers */
    char *region, *stacks;
    size_t region_size;
    kd_fiber *fibers;
    int cap, nfib;
    /* static __shared__: the kernel object's TLS block on this thread */
    const void *tls_obj;
    uintptr_t tls_lo, tls_hi;
    /* dynamic shared memory: [dyn_lo, dyn_user) guard, [dyn_user, + dyn_size), guard to dyn_hi */
    char *dyn_raw;
    size_t dyn_cap, dyn_size;
    uintptr_t dyn_lo, dyn_user, dyn_hi;
    /* racecheck cells of the static and dynamic shared ranges */
    kd_race_cell *race_tls, *race_dyn;
    size_t race_tls_n, race_dyn_n;
    /* reports made in the current launch, per checker (a few are printed, then suppressed) */
    uint64_t report_launch;
    int reported[8];
    /* device-memory bytes this thread's fibers read / wrote in the current launch (the trace):
     * reads through a model of an SM's L1 (kd_l1_read), so a block re-reading what it just
     * read, or threads reading one word, count once, as on a GPU */
    uint64_t bytes_r, bytes_w;
    uint64_t l1_tag[KD_L1_SECTORS]; /* sector address + 1, 0 empty; cleared per block */
    uint64_t l1_block;              /* the block_serial the tags and warp reads belong to */
    std::vector<kd_warp_read> warp_reads[32]; /* per warp of the block: its k-th reads */
    /* a cluster launch: the cluster this thread runs a block of, and that block's rank */
    kd_cluster_run *cl;
    unsigned crank;
    ~kd_exec(); /* the thread's stacks and buffers go with it */
};

extern thread_local kd_exec t_exec;

void kd_yield(kd_exec &x, kd_fiber *f, int dying); /* from fiber f back to the scheduler */
int kd_resolve_warps(kd_exec &x, int force);
int kd_resolve_barrier(kd_exec &x, int force);
int kd_resolve_cluster(kd_exec &x);
int kd_race_prepare(kd_exec &x);
uint64_t kd_next_launch_id(void);
/* A checker's finding inside a kernel: names kernel, site, block and thread. */
void kd_kernel_report(kd_exec &x, int checker, const kd_fiber *f, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
enum { KD_CK_MEM, KD_CK_RACE, KD_CK_SYNC, KD_CK_INIT };

#endif
