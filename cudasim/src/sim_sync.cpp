/* Barriers and warp operations of the CUDA simulator, and synccheck. A fiber that reaches one
 * records where it waits and yields; the scheduler (sim_exec.cpp) calls the resolvers below
 * when no fiber of the block can run. Warps are the block's linear threads 32w .. 32w + 31. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <atomic>

#include "sim_exec.h"

static std::atomic<uint64_t> g_launch_ids{0};
uint64_t kd_next_launch_id(void) { return ++g_launch_ids; }

static const char *const kd_checker_names[] = {"memcheck", "racecheck", "synccheck", "initcheck"};

void kd_kernel_report(kd_exec &x, int checker, const kd_fiber *f, const char *fmt, ...) {
    const kd_launch_run *L = x.L;
    if (kd_sim_model_mode()) return; /* model mode: memory of blocks not run stays unwritten */
    if (x.report_launch != L->launch_id) {
        x.report_launch = L->launch_id;
        memset(x.reported, 0, sizeof x.reported);
    }
    if (x.reported[checker]++ >= 3) return; /* the first few of a launch say enough */
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char who[160] = "";
    if (f)
        snprintf(who, sizeof who, " thread (%u,%u,%u)", f->tid.x, f->tid.y, f->tid.z);
    kd_sim_report(kd_checker_names[checker], "kernel %s (launched at %s:%d) block (%u,%u,%u)%s: %s",
                  L->ref.name, L->cfg->file, L->cfg->line, x.bid.x, x.bid.y, x.bid.z, who, msg);
}

extern "C" void kd_sim_syncthreads(const char *file, int line) {
    kd_exec &x = t_exec;
    kd_fiber *f = x.cur;
    if (!f) return; /* host code: nothing to wait for */
    f->state = KD_F_BARRIER;
    f->file = file;
    f->line = line;
    kd_yield(x, f, 0);
}

extern "C" uint64_t kd_sim_warp_op(int op, unsigned mask, uint64_t value, int arg, int width,
                                   const char *file, int line) {
    kd_exec &x = t_exec;
    kd_fiber *f = x.cur;
    if (!f) return value;
    f->state = KD_F_WARP;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    f->file = file;
    f->line = line;
    kd_yield(x, f, 0);
    return f->result;
}

static const char *state_name(const kd_fiber *f) {
    switch (f->state) {
    case KD_F_DONE: return "has exited";
    case KD_F_BARRIER: return "waits at __syncthreads";
    case KD_F_WARP: return "waits at another warp operation";
    case KD_F_CLUSTER: return "waits at cluster.sync";
    }
    return "runs";
}

/* The source lane of lane l for a shuffle, or l itself where CUDA returns the caller's value. */
static int shfl_src(int op, int l, int arg, int width) {
    const int seg = l & ~(width - 1), in = l & (width - 1);
    switch (op) {
    case KD_SIM_SHFL_DOWN: return in + arg < width ? l + arg : l;
    case KD_SIM_SHFL_UP: return in >= arg ? l - arg : l;
    case KD_SIM_SHFL_XOR: return ((l ^ arg) & ~(width - 1)) == seg ? l ^ arg : l;
    default: return seg + (arg & (width - 1));
    }
}

/* Completes the warp operation of the lanes in `part` (bit i: lane i of warp w). */
static void complete(kd_exec &x, int w, unsigned part) {
    kd_fiber *lanes = x.fibers + 32 * w;
    uint64_t any = 0, all = 1, ballot = 0;
    for (int l = 0; l < 32; l++)
        if (part >> l & 1u) {
            any |= lanes[l].value != 0;
            all &= lanes[l].value != 0;
            ballot |= (uint64_t)(lanes[l].value != 0) << l;
        }
    for (int l = 0; l < 32; l++) {
        if (!(part >> l & 1u)) continue;
        kd_fiber *f = &lanes[l];
        if (f->op == KD_SIM_VOTE_ANY) f->result = any;
        else if (f->op == KD_SIM_VOTE_ALL) f->result = all;
        else if (f->op == KD_SIM_VOTE_BALLOT) f->result = ballot & f->mask;
        else {
            int src = shfl_src(f->op, l, f->arg, f->width);
            if (!(part >> src & 1u)) {
                kd_kernel_report(x, KD_CK_SYNC, f, "shuffle at %s:%d reads lane %d, which is not "
                                 "taking part (mask 0x%08x)", f->file, f->line, src, f->mask);
                src = l;
            }
            f->result = lanes[src].value;
        }
        f->state = KD_F_READY;
    }
}

/* Lanes of warp w that wait at a warp operation, as a bit set. */
static unsigned waiting(const kd_exec &x, int w) {
    unsigned m = 0;
    for (int l = 0; l < 32 && 32 * w + l < x.nfib; l++)
        if (x.fibers[32 * w + l].state == KD_F_WARP) m |= 1u << l;
    return m;
}

/* One warp: complete every group of waiting lanes whose mask has fully arrived (same mask, same
 * operation). With force, report the first lane that cannot arrive and complete without it. */
static int resolve_warp(kd_exec &x, int w, int force) {
    const unsigned wait = waiting(x, w);
    kd_fiber *lanes = x.fibers + 32 * w;
    int done = 0;
    for (int l = 0; l < 32; l++) {
        if (!(wait >> l & 1u) || lanes[l].state != KD_F_WARP) continue;
        const kd_fiber *f = &lanes[l];
        unsigned part = 0, missing = 0;
        for (int j = 0; j < 32; j++) {
            if (!(f->mask >> j & 1u)) continue;
            const kd_fiber *g = 32 * w + j < x.nfib ? &lanes[j] : NULL;
            if (g && g->state == KD_F_WARP && g->mask == f->mask) part |= 1u << j;
            else missing |= 1u << j;
        }
        if (!(f->mask >> l & 1u)) {
            kd_kernel_report(x, KD_CK_SYNC, f, "warp operation at %s:%d with mask 0x%08x that "
                             "does not name the calling lane %d", f->file, f->line, f->mask, l);
            part |= 1u << l;
        }
        if (missing && !force) continue;
        if (missing) {
            int j = __builtin_ctz(missing);
            const kd_fiber *g = 32 * w + j < x.nfib ? &lanes[j] : NULL;
            kd_kernel_report(x, KD_CK_SYNC, f, "warp operation at %s:%d (mask 0x%08x): lane %d %s",
                             f->file, f->line, f->mask, j, g ? state_name(g) : "does not exist");
        }
        for (int j = 0; j < 32; j++)
            if ((part >> j & 1u) && (lanes[j].op != f->op || lanes[j].line != f->line ||
                                     strcmp(lanes[j].file, f->file))) {
                kd_kernel_report(x, KD_CK_SYNC, &lanes[j], "lanes of one mask meet at different "
                                 "warp operations (%s:%d and %s:%d)", lanes[j].file,
                                 lanes[j].line, f->file, f->line);
                break;
            }
        complete(x, w, part);
        done = 1;
        if (force) return 1;
    }
    return done;
}

int kd_resolve_warps(kd_exec &x, int force) {
    const int nw = (x.nfib + 31) / 32;
    int done = 0;
    for (int w = 0; w < nw; w++) {
        done |= resolve_warp(x, w, force);
        if (done && force) return 1;
    }
    return done;
}

/* Releases the barrier when every live thread waits at it (one site); with force, when some wait
 * elsewhere (a deadlock on a GPU). Threads that exited while others wait are reported. */
int kd_resolve_barrier(kd_exec &x, int force) {
    const kd_fiber *first = NULL, *other = NULL, *exited = NULL, *elsewhere = NULL;
    int n_at = 0;
    for (int i = 0; i < x.nfib; i++) {
        const kd_fiber *f = &x.fibers[i];
        if (f->state == KD_F_BARRIER) {
            n_at++;
            if (!first) first = f;
            else if (!other && (f->line != first->line || strcmp(f->file, first->file))) other = f;
        } else if (f->state == KD_F_DONE) {
            if (!exited) exited = f;
        } else if (!elsewhere) {
            elsewhere = f;
        }
    }
    if (!first || (elsewhere && !force)) return 0;
    if (elsewhere)
        kd_kernel_report(x, KD_CK_SYNC, elsewhere, "__syncthreads at %s:%d waited for by %d "
                         "threads, while this thread %s (%s:%d)", first->file, first->line, n_at,
                         state_name(elsewhere), elsewhere->file, elsewhere->line);
    if (other)
        kd_kernel_report(x, KD_CK_SYNC, other, "divergent __syncthreads: threads wait at %s:%d "
                         "and at %s:%d", first->file, first->line, other->file, other->line);
    if (exited)
        kd_kernel_report(x, KD_CK_SYNC, exited, "exited while %d threads wait at __syncthreads "
                         "%s:%d", n_at, first->file, first->line);
    for (int i = 0; i < x.nfib; i++)
        if (x.fibers[i].state == KD_F_BARRIER) x.fibers[i].state = KD_F_READY;
    x.epoch++; /* racecheck: a new barrier interval */
    return 1;
}

/* ---- thread-block clusters (cooperative_groups.h) ------------------------------------------ */

extern "C" void kd_sim_cluster_sync(const char *file, int line) {
    kd_exec &x = t_exec;
    kd_fiber *f = x.cur;
    if (!f) return;
    if (!x.cl) { /* a launch without clusters: a cluster of one block */
        kd_sim_syncthreads(file, line);
        return;
    }
    f->state = KD_F_CLUSTER;
    f->file = file;
    f->line = line;
    kd_yield(x, f, 0);
}

extern "C" unsigned kd_sim_cluster_rank(void) { return t_exec.cl ? t_exec.crank : 0; }
extern "C" unsigned kd_sim_cluster_size(void) { return t_exec.cl ? t_exec.cl->size : 1; }

/* Distributed shared memory: p in this block's dynamic shared memory -> the same offset in the
 * dynamic shared memory of block `rank` of the cluster. */
extern "C" void *kd_sim_map_shared_rank(const void *p, unsigned rank) {
    kd_exec &x = t_exec;
    const uintptr_t a = (uintptr_t)p;
    const unsigned size = x.cl ? x.cl->size : 1;
    if (rank >= size || a < x.dyn_user || a >= x.dyn_user + x.dyn_size) {
        kd_kernel_report(x, KD_CK_MEM, x.cur, "map_shared_rank(%p, %u): %s", p, rank,
                         rank >= size ? "rank outside the cluster"
                                      : "not in this block's dynamic shared memory");
        return (void *)p;
    }
    return x.cl ? (void *)(x.cl->dyn_user[rank] + (a - x.dyn_user)) : (void *)p;
}

/* Every live thread of this block waits at cluster.sync(): the block arrives at the cluster's
 * host barrier and this OS thread waits for the cluster's other blocks (each on its own OS
 * thread). A block of the cluster that has exited meanwhile is reported (on a GPU the others would
 * wait forever) and not waited for. Returns 1 when it released the block's threads. */
int kd_resolve_cluster(kd_exec &x) {
    int at = 0;
    for (int i = 0; i < x.nfib; i++) {
        const int s = x.fibers[i].state;
        if (s == KD_F_CLUSTER) at++;
        else if (s != KD_F_DONE) return 0;
    }
    if (!at || !x.cl) return 0;
    kd_cluster_run &c = *x.cl;
    {
        std::unique_lock<std::mutex> lk(c.mu);
        const uint64_t g = c.gen;
        auto open = [&] { c.gone = c.exited, c.arrived = 0, c.gen++, c.cv.notify_all(); };
        if (++c.arrived + c.exited >= c.size) {
            open();
        } else {
            c.cv.wait(lk, [&] { return c.gen != g || c.arrived + c.exited >= c.size; });
            if (c.gen == g) open(); /* the last block to come exited instead */
        }
        if (c.gone)
            kd_kernel_report(x, KD_CK_SYNC, NULL, "cluster.sync while %u block(s) of the cluster "
                             "had exited", c.gone);
    }
    for (int i = 0; i < x.nfib; i++)
        if (x.fibers[i].state == KD_F_CLUSTER) x.fibers[i].state = KD_F_READY;
    x.epoch++; /* racecheck: a cluster barrier is a barrier of the block too */
    return 1;
}
