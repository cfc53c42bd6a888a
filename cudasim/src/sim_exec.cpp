/* Kernel execution in the CUDA simulator: every thread of a block is a fiber with its own stack;
 * the fibers of a block run on one OS thread, each until it reaches a barrier, a warp operation
 * or its end, and the scheduler releases a barrier when every live thread of the block waits at
 * it, a warp operation when every lane its mask names has arrived. Blocks run in parallel on
 * OpenMP threads. The checkers:
 *  - synccheck (here): a barrier some live threads wait at while others wait elsewhere or at
 *    another barrier, a thread that exits while others wait at a barrier, a warp operation whose
 *    mask names a lane that cannot arrive. Reported, then resolved so nothing hangs;
 *  - memcheck, racecheck, initcheck (sim_hooks.cpp): the racecheck build compiles the kernels with
 *    the compiler's thread-sanitizer instrumentation, whose callbacks the simulator implements.
 *  - launch: an invalid configuration fails as CUDA fails it (the last error). */
#include <dlfcn.h>
#include <link.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sim_exec.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KD_FIBER_STACK ((size_t)512 << 10) /* ASan's frames at -O0 are large */
#else
#define KD_FIBER_STACK ((size_t)256 << 10)
#endif
#define KD_STACK_GUARD ((size_t)4096) /* an inaccessible page below each stack: overflow faults */

thread_local kd_exec t_exec;

extern "C" const kd_sim_thread *kd_sim_self(void) { return t_exec.cur; }

/* ---- context switch (x86-64 System V): callee-saved registers, MXCSR and the x87 control word
 * on the stack, then the stack pointer ------------------------------------------------------- */
extern "C" void kd_ctx_switch(void **save_sp, void *to_sp);
extern "C" void kd_fiber_tramp(void);
__asm__(".text\n"
        ".globl kd_ctx_switch\n.hidden kd_ctx_switch\n.type kd_ctx_switch,@function\n"
        "kd_ctx_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size kd_ctx_switch, .-kd_ctx_switch\n"
        ".globl kd_fiber_tramp\n.hidden kd_fiber_tramp\n.type kd_fiber_tramp,@function\n"
        "kd_fiber_tramp:\n"
        "  movq %r12, %rdi\n  callq *%r13\n  ud2\n"
        ".size kd_fiber_tramp, .-kd_fiber_tramp\n");

/* ---- AddressSanitizer must be told about every stack switch -------------------------------- */
#if defined(__SANITIZE_ADDRESS__)
static void switch_to(kd_exec &x, void **save, void *to, const void *bottom, size_t size,
                      int dying) {
    void *fake = NULL;
    __sanitizer_start_switch_fiber(dying ? NULL : &fake, bottom, size);
    kd_ctx_switch(save, to);
    __sanitizer_finish_switch_fiber(fake, &x.asan_prev_bottom, &x.asan_prev_size);
}
#else
static void switch_to(kd_exec &, void **save, void *to, const void *, size_t, int) {
    kd_ctx_switch(save, to);
}
#endif

/* From a fiber back to the scheduler. */
void kd_yield(kd_exec &x, kd_fiber *f, int dying) {
    switch_to(x, &f->sp, x.sched_sp, x.sched_bottom, x.sched_size, dying);
}

static void fiber_main(kd_fiber *f) {
    kd_exec &x = t_exec;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(NULL, &x.sched_bottom, &x.sched_size);
#endif
    x.L->thunk(x.L->cfg->fn, x.L->args);
    f->state = KD_F_DONE;
    kd_yield(x, f, 1);
    __builtin_trap(); /* a finished fiber is never resumed */
}

/* ---- per OS thread: fibers and their stacks, shared memory, the racecheck shadows ----------- */

/* Returns a region to the system. Its AddressSanitizer shadow is cleared first: a later mapping
 * at the same addresses would otherwise inherit the redzones of the frames that ran there. */
static void release_region(kd_exec &x) {
    if (!x.region) return;
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(x.region, x.region_size);
#endif
    munmap(x.region, x.region_size);
    x.region = NULL, x.cap = 0;
}

kd_exec::~kd_exec() {
    release_region(*this);
    free(dyn_raw);
    free(race_tls);
    free(race_dyn);
}

/* Fibers and stacks for n threads (at least 256: most blocks are that size), reserved, not
 * committed until a stack is used; a page below each stack faults on overflow. */
static int ensure_region(kd_exec &x, int n) {
    if (x.cap >= n) return 1;
    release_region(x);
    n = n < 256 ? 256 : n;
    size_t fib = ((size_t)n * sizeof(kd_fiber) + 4095) & ~(size_t)4095;
    x.region_size = fib + (size_t)n * KD_FIBER_STACK;
    void *r = mmap(NULL, x.region_size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) {
        x.region = NULL, x.cap = 0;
        return 0;
    }
    x.region = (char *)r;
    x.fibers = (kd_fiber *)r;
    x.stacks = x.region + fib;
    x.cap = n;
    for (int i = 0; i < n; i++) /* the lowest page of each stack */
        mprotect(x.stacks + (size_t)i * KD_FIBER_STACK, KD_STACK_GUARD, PROT_NONE);
    return 1;
}

/* The static __shared__ variables of the kernel's object are its thread-local block on this OS
 * thread: found once per (thread, object). */
static void find_static_shared(kd_exec &x, const void *fn) {
    Dl_info di;
    if (!dladdr(fn, &di)) return;
    if (x.tls_obj == di.dli_fbase) return;
    x.tls_obj = di.dli_fbase;
    x.tls_lo = x.tls_hi = 0;
    struct q { const void *base; size_t size; } qq = {di.dli_fbase, 0};
    dl_iterate_phdr(
        [](struct dl_phdr_info *info, size_t, void *v) -> int {
            q *w = (q *)v;
            for (int i = 0; i < info->dlpi_phnum; i++)
                if (info->dlpi_phdr[i].p_type == PT_LOAD && info->dlpi_phdr[i].p_offset == 0 &&
                    (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr) == w->base) {
                    for (int j = 0; j < info->dlpi_phnum; j++)
                        if (info->dlpi_phdr[j].p_type == PT_TLS) w->size = info->dlpi_phdr[j].p_memsz;
                    return 1;
                }
            return 0;
        },
        &qq);
    if (!qq.size) return;
    void *h = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen(NULL, RTLD_LAZY);
    void *blk = NULL;
    if (h && dlinfo(h, RTLD_DI_TLS_DATA, &blk) == 0 && blk) {
        x.tls_lo = (uintptr_t)blk;
        x.tls_hi = x.tls_lo + qq.size;
    }
    if (h) dlclose(h);
}

static int prepare_shared(kd_exec &x, const kd_launch_run *L) {
    find_static_shared(x, L->cfg->fn);
    size_t dyn = L->cfg->smem;
    size_t need = dyn + 2 * KD_GUARD;
    if (x.dyn_cap < need) {
        free(x.dyn_raw);
        x.dyn_raw = (char *)aligned_alloc(KD_GUARD, (need + KD_GUARD - 1) / KD_GUARD * KD_GUARD);
        if (!x.dyn_raw) return x.dyn_cap = 0, 0;
        x.dyn_cap = need;
    }
    x.dyn_lo = (uintptr_t)x.dyn_raw;
    x.dyn_user = x.dyn_lo + KD_GUARD;
    x.dyn_size = dyn;
    x.dyn_hi = x.dyn_user + dyn + KD_GUARD;
    return kd_race_prepare(x);
}

extern "C" void *kd_sim_dyn_smem(void) { return (void *)t_exec.dyn_user; }

static void setup_fiber(kd_exec &x, kd_fiber *f, int lin, const kd_launch_run *L, uint3 bid) {
    const dim3 b = L->cfg->block;
    *f = kd_fiber();
    f->tid.x = lin % b.x;
    f->tid.y = (lin / b.x) % b.y;
    f->tid.z = lin / (b.x * b.y);
    f->bid = bid;
    f->bdim = b;
    f->gdim = L->cfg->grid;
    f->lin = lin;
    f->stack_lo = x.stacks + (size_t)lin * KD_FIBER_STACK;
#if defined(__SANITIZE_ADDRESS__)
    /* the last fiber on this stack died inside kd_yield: its frames (fiber_main, kd_yield,
     * switch_to) were never unwound, and their redzones would poison the next fiber's frames */
    ASAN_UNPOISON_MEMORY_REGION(f->stack_lo + KD_FIBER_STACK - 16384, 16384);
#endif
    /* initial frame: MXCSR / x87 word, six registers (r12 = fiber, r13 = entry), trampoline */
    uintptr_t top = ((uintptr_t)f->stack_lo + KD_FIBER_STACK) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 16); /* the slot above the trampoline keeps rsp % 16 == 0 */
    *--sp = (uint64_t)(uintptr_t)&kd_fiber_tramp;
    *--sp = 0;                                 /* rbp */
    *--sp = 0;                                 /* rbx */
    *--sp = (uint64_t)(uintptr_t)f;            /* r12 */
    *--sp = (uint64_t)(uintptr_t)&fiber_main;  /* r13 */
    *--sp = 0;                                 /* r14 */
    *--sp = 0;                                 /* r15 */
    *--sp = x.fp_word;
    f->sp = sp;
    f->state = KD_F_READY;
}

static void run_block(kd_exec &x, const kd_launch_run *L, uint3 bid) {
    const int n = L->nthreads;
    x.bid = bid;
    x.epoch++;           /* racecheck: a new block starts with clean shared memory */
    x.block_serial++;
    for (int i = 0; i < n; i++) setup_fiber(x, &x.fibers[i], i, L, bid);
    x.nfib = n;
    for (;;) {
        int ran = 0, live = 0;
        for (int i = 0; i < n; i++) {
            kd_fiber *f = &x.fibers[i];
            if (f->state == KD_F_READY) {
                x.cur = f;
                switch_to(x, &x.sched_sp, f->sp, f->stack_lo, KD_FIBER_STACK, 0);
                x.cur = NULL;
                ran = 1;
            }
            live += f->state != KD_F_DONE;
        }
        if (!live) break;
        if (ran) continue;
        if (kd_resolve_warps(x, 0)) continue;
        if (kd_resolve_barrier(x, 0)) continue;
        if (kd_resolve_cluster(x)) continue;
        /* nothing can move: report and force progress rather than hang */
        if (!kd_resolve_warps(x, 1)) kd_resolve_barrier(x, 1);
    }
}

static uint64_t fp_word(void) {
    unsigned int mx;
    unsigned short cw;
    __asm__ volatile("stmxcsr %0" : "=m"(mx));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    return (uint64_t)mx | ((uint64_t)cw << 32);
}

/* The i-th of nrun units (blocks, or clusters) to run out of n: i itself when all run, else
 * under block sampling (the trace) the i-th of nrun spread evenly, first and last included. */
static uint64_t spread_at(uint64_t i, uint64_t nrun, uint64_t n) {
    if (nrun == n || nrun < 2) return i;
    return (uint64_t)((unsigned __int128)i * (n - 1) / (nrun - 1));
}

/* Runs the blocks [lo, hi) of the launch's run list (linear order x fastest) on this OS thread;
 * adds the device bytes they moved to the launch's counts. */
static void run_blocks(kd_launch_run *L, uint64_t lo, uint64_t hi) {
    kd_exec &x = t_exec;
    if (!ensure_region(x, L->nthreads) || !prepare_shared(x, L)) {
        kd_sim_report("launch", "%s: cannot allocate the simulated block's stacks", L->ref.name);
        return;
    }
    x.L = L;
    x.fp_word = fp_word();
    x.in_kernel = 1;
    x.bytes_r = x.bytes_w = 0;
    const dim3 g = L->cfg->grid;
    for (uint64_t i = lo; i < hi; i++) {
        const uint64_t b = spread_at(i, L->nrun, L->nblocks);
        uint3 bid;
        bid.x = (unsigned)(b % g.x);
        bid.y = (unsigned)((b / g.x) % g.y);
        bid.z = (unsigned)(b / ((uint64_t)g.x * g.y));
        run_block(x, L, bid);
    }
    x.in_kernel = 0;
    x.L = NULL;
    L->bytes_r += x.bytes_r;
    L->bytes_w += x.bytes_w;
}

/* The trace's record of a finished launch: its bytes scaled from the blocks run to the grid. */
static void trace_launch(const kd_launch_run &L) {
    if (!kd_sim_tracing()) return;
    kd_sim_op op;
    memset(&op, 0, sizeof op);
    const double scale = L.nrun ? (double)L.nblocks / (double)L.nrun : 0.0;
    op.kind = KD_SIM_OP_KERNEL;
    op.name = L.ref.name;
    op.blocks = (double)L.nblocks;
    op.blocks_run = (double)L.nrun;
    op.threads = L.nthreads;
    op.bytes_read = (double)L.bytes_r.load() * scale;
    op.bytes_written = (double)L.bytes_w.load() * scale;
    kd_sim_trace_add(&op);
}

/* ---- thread-block clusters ----------------------------------------------------------------- */

/* The barrier of a cluster launch's OS threads between two clusters: when it opens, every block
 * of the last cluster has finished (nobody reads its shared memory any more) and every block of
 * the next one has published its dynamic shared memory. The last to arrive resets the counts. */
static void cluster_phase(kd_cluster_run &c) {
    std::unique_lock<std::mutex> lk(c.mu);
    const uint64_t g = c.phase_gen;
    if (++c.phase_in == c.size) {
        c.phase_in = 0, c.arrived = 0, c.exited = 0;
        c.phase_gen++;
        c.cv.notify_all();
        return;
    }
    c.cv.wait(lk, [&] { return c.phase_gen != g; });
}

/* OS thread `rank` of a cluster launch: block `rank` of each of the nrun clusters to run. */
static void run_cluster_rank(kd_launch_run *L, kd_cluster_run *c, unsigned rank, uint64_t nrun) {
    kd_exec &x = t_exec;
    const int ok = ensure_region(x, L->nthreads) && prepare_shared(x, L);
    x.cl = c, x.crank = rank;
    x.L = L;
    x.fp_word = fp_word();
    x.bytes_r = x.bytes_w = 0;
    const uint64_t ncl = L->nblocks / c->size;
    for (uint64_t i = 0; i < nrun; i++) {
        const uint64_t cl = spread_at(i, nrun, ncl);
        c->dyn_user[rank] = x.dyn_user;
        c->live[rank] = 1;
        cluster_phase(*c);
        if (ok) {
            x.in_kernel = 1;
            run_block(x, L, uint3{(unsigned)(cl * c->size + rank), 0, 0});
            x.in_kernel = 0;
        }
        {
            std::lock_guard<std::mutex> lk(c->mu);
            c->live[rank] = 0;
            c->exited++;
            c->cv.notify_all();
        }
        cluster_phase(*c);
    }
    if (!ok) kd_sim_report("launch", "%s: cannot allocate the simulated block's stacks", L->ref.name);
    x.cl = NULL, x.L = NULL;
    L->bytes_r += x.bytes_r;
    L->bytes_w += x.bytes_w;
}

/* A cluster launch: `cluster` OS threads, one per block rank, run the clusters in order (under
 * block sampling a spread of them). */
static void run_clusters(kd_launch_run *L, unsigned cluster, long sample) {
    kd_cluster_run c;
    c.size = cluster;
    c.arrived = c.exited = c.phase_in = 0;
    c.gen = c.phase_gen = 0;
    c.gone = 0;
    c.dyn_size = L->cfg->smem;
    const uint64_t ncl = L->nblocks / cluster;
    uint64_t nrun = ncl;
    if (sample > 0) {
        const uint64_t k = (uint64_t)sample / cluster > 0 ? (uint64_t)sample / cluster : 1;
        nrun = k < ncl ? k : ncl;
    }
    L->nrun = nrun * cluster;
    std::vector<std::thread> th;
    for (unsigned r = 0; r < cluster; r++) th.emplace_back(run_cluster_rank, L, &c, r, nrun);
    for (auto &t : th) t.join();
}

/* CUDA's launch checks (sm_90): the error a real launch returns, or cudaSuccess. */
static cudaError_t check_config(const kd_sim_launch_cfg *c, const kd_kernel_ref &r) {
    const dim3 b = c->block, g = c->grid;
    if (!kd_sim_stream_ok(c->stream)) return cudaErrorInvalidResourceHandle;
    if (!b.x || !b.y || !b.z || !g.x || !g.y || !g.z) return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024)
        return cudaErrorInvalidConfiguration;
    if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    if (r.launch_bounds && (uint64_t)b.x * b.y * b.z > (uint64_t)r.launch_bounds)
        return cudaErrorLaunchOutOfResources; /* "too many resources requested for launch" */
    if (c->smem > kd_sim_func_smem_limit(c->fn)) return cudaErrorInvalidValue;
    /* clusters: along x only here, at most the portable 8 blocks, dividing the grid */
    if (c->cluster > 1 && (c->cluster > KD_MAX_CLUSTER || g.y != 1 || g.z != 1 || g.x % c->cluster))
        return cudaErrorInvalidConfiguration;
    return cudaSuccess;
}

extern "C" void kd_sim_launch(const kd_sim_launch_cfg *cfg,
                              void (*thunk)(const void *fn, const void *args), const void *args,
                              size_t args_size) {
    kd_launch_run L;
    L.cfg = cfg;
    L.thunk = thunk;
    L.args = args;
    L.args_size = args_size;
    L.ref = kd_sim_lookup_launch(cfg);
    if (L.ref.kernel < 0)
        kd_sim_report("launch", "%s (%s:%d) is not a registered kernel", cfg->expr, cfg->file,
                      cfg->line);
    cudaError_t e = check_config(cfg, L.ref);
    if (e != cudaSuccess) {
        kd_sim_set_last_error(e);
        return;
    }
    kd_sim_mark_run(L.ref);
    L.nthreads = (int)(cfg->block.x * cfg->block.y * cfg->block.z);
    L.snap = kd_sim_alloc_snapshot();
    L.launch_id = kd_next_launch_id();
    L.nblocks = (uint64_t)cfg->grid.x * cfg->grid.y * cfg->grid.z;
    const long k = kd_sim_sample_blocks();
    if (cfg->cluster > 1) {
        run_clusters(&L, cfg->cluster, k);
        trace_launch(L);
        return;
    }
    L.nrun = k > 0 && L.nblocks > (uint64_t)k ? (uint64_t)k : L.nblocks;
    const uint64_t nb = L.nrun;
    const int nt = nb > 1 && !omp_in_parallel() ? omp_get_max_threads() : 1;
    if (nt <= 1) {
        run_blocks(&L, 0, nb);
    } else {
#pragma omp parallel num_threads(nt)
        {
            /* contiguous chunks per thread: each OS thread keeps its stacks hot */
            const uint64_t t = (uint64_t)omp_get_thread_num(), T = (uint64_t)omp_get_num_threads();
            run_blocks(&L, nb * t / T, nb * (t + 1) / T);
        }
    }
    trace_launch(L);
}
