/* memcheck, racecheck and initcheck of the CUDA simulator. The racecheck build compiles the
 * kernels (the .cu files of src/cuda) with the compiler's thread-sanitizer instrumentation
 * (-fsanitize=thread) but links no ThreadSanitizer runtime: the __tsan_* callbacks it emits
 * before every load, store and atomic are defined here, so the simulator sees each access of a
 * kernel with its address and size. Outside a kernel they return at once. Inside one, by address:
 *  - the fibers' stacks and the launch's parameters: private, not checked;
 *  - dynamic shared memory (with guard zones) and the object's thread-local block, which holds
 *    its static __shared__ variables: memcheck of the dynamic bounds, racecheck;
 *  - device allocations: memcheck (guard zones, use after free, alignment of the access) and
 *    initcheck (each byte written since cudaMalloc, by a kernel, a copy, a memset, a GEMM);
 *  - loaded objects' images (constants): not checked; anything else: memcheck (host memory).
 * The ASan build does not instrument the kernels this way (the two sanitizers exclude each
 * other); there ASan and UBSan check the same kernels' accesses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_exec.h"

static int g_hooks; /* set by __tsan_init, which every instrumented object calls when loaded */

int kd_sim_hooks_active(void) { return g_hooks; }

int kd_race_prepare(kd_exec &x) {
    const size_t nt = x.tls_hi - x.tls_lo, nd = x.dyn_size;
    if (!g_hooks) return 1;
    if (x.race_tls_n < nt) {
        free(x.race_tls);
        x.race_tls = (kd_race_cell *)calloc(nt, sizeof(kd_race_cell));
        x.race_tls_n = x.race_tls ? nt : 0;
        if (!x.race_tls) return 0;
    }
    if (x.race_dyn_n < nd) {
        free(x.race_dyn);
        x.race_dyn = (kd_race_cell *)calloc(nd, sizeof(kd_race_cell));
        x.race_dyn_n = x.race_dyn ? nd : 0;
        if (!x.race_dyn) return 0;
    }
    return 1;
}

static const char *kind(int write, int atomic) {
    return atomic ? "atomic" : write ? "write" : "read";
}

/* racecheck: n bytes at cells c (offset off in the named space) by fiber f. A hazard is two
 * threads touching one byte in one barrier interval, one of them writing, not both atomically. */
static void race(kd_exec &x, kd_fiber *f, kd_race_cell *c, size_t off, size_t n, int write,
                 int atomic, const char *space) {
    const int16_t t = (int16_t)f->lin;
    for (size_t i = 0; i < n; i++) {
        kd_race_cell &e = c[i];
        if (e.epoch != x.epoch) e = {x.epoch, -1, -1, 0, {0, 0, 0}};
        int other = -1;
        const char *what = NULL;
        if (e.writer >= 0 && e.writer != t && !(atomic && e.atomic_w)) {
            other = e.writer, what = write ? "write after write" : "read after write";
        } else if (write && (e.reader == -2 || (e.reader >= 0 && e.reader != t))) {
            other = e.reader, what = "write after read";
        }
        if (what) {
            kd_kernel_report(x, KD_CK_RACE, f, "%s hazard on %s memory at offset %zu: this "
                             "thread's %zu-byte %s and thread %d%s in the same barrier interval",
                             what, space, off + i, n, kind(write, atomic), other,
                             other == -2 ? "s (several)" : "");
            e.epoch = 0; /* one report per byte and interval is enough */
            return;
        }
        if (write) {
            e.writer = t;
            e.atomic_w = (uint8_t)atomic;
        } else if (e.reader == -1) {
            e.reader = t;
        } else if (e.reader != t) {
            e.reader = -2;
        }
    }
}

/* One sector requested from the L1 model: 32 bytes of device traffic on a miss. */
static void l1_request(kd_exec &x, uint64_t s) {
    uint64_t &t = x.l1_tag[s % KD_L1_SECTORS];
    if (t == s + 1) return;
    t = s + 1;
    x.bytes_r += KD_L1_SECTOR;
}

/* The trace's read traffic (sim_exec.h): fiber f's k-th device read joins its warp's k-th read;
 * a sector that read already requested costs nothing more. Deterministic: a block's fibers run in
 * a fixed order. Lanes whose paths diverge pair up approximately. */
static void trace_read(kd_exec &x, kd_fiber *f, uintptr_t p, size_t n) {
    if (x.l1_block != x.block_serial) {
        memset(x.l1_tag, 0, sizeof x.l1_tag);
        for (auto &w : x.warp_reads) w.clear();
        x.l1_block = x.block_serial;
    }
    std::vector<kd_warp_read> &w = x.warp_reads[(f->lin / 32) & 31];
    const uint32_t k = f->dev_reads++;
    if (k >= w.size()) w.push_back(kd_warp_read{{0}, 0});
    kd_warp_read &r = w[k];
    for (uint64_t s = p / KD_L1_SECTOR; s <= (p + n - 1) / KD_L1_SECTOR; s++) {
        uint32_t i = 0;
        while (i < r.n && r.sec[i] != s) i++;
        if (i < r.n) continue; /* another lane of this read asked for it */
        if (r.n < KD_WARP_SECTORS) r.sec[r.n++] = s;
        l1_request(x, s);
    }
}

static void device(kd_exec &x, kd_fiber *f, const kd_alloc *a, uintptr_t p, size_t n, int write,
                   int atomic, int aligned) {
    if (p < a->user || p + n > a->user + a->size) {
        long long off = (long long)(p - a->user);
        kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s at offset %lld of a %zu-byte device "
                         "allocation: out of bounds", n, kind(write, atomic), off, a->size);
        return;
    }
    if (a->freed) {
        kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s of freed device memory (offset %zu of %zu "
                         "bytes)", n, kind(write, atomic), (size_t)(p - a->user), a->size);
        return;
    }
    if (aligned && (p & (n - 1)))
        kd_kernel_report(x, KD_CK_MEM, f, "misaligned %zu-byte %s at device address %#lx", n,
                         kind(write, atomic), (unsigned long)p);
    /* the trace: an atomic reads and writes its bytes at L2; a read goes through the L1 model */
    if (atomic) x.bytes_r += n;
    else if (!write) trace_read(x, f, p, n);
    if (write) x.bytes_w += n;
    uint8_t *s = a->shadow ? a->shadow + (p - a->user) : NULL;
    if (!s) return;
    if (!write || atomic) {
        for (size_t i = 0; i < n; i++)
            if (!s[i]) {
                kd_kernel_report(x, KD_CK_INIT, f, "%zu-byte %s of never-written device memory "
                                 "(offset %zu of a %zu-byte allocation)", n, kind(write, atomic),
                                 (size_t)(p - a->user), a->size);
                break;
            }
    }
    if (write) memset(s, 1, n);
}

/* Distributed shared memory: an access to another block of the cluster's dynamic shared memory
 * (its guard zones included) is checked against that block's bounds and liveness; racecheck does
 * not see it. 0 when p is not there. */
static int remote_shared(kd_exec &x, kd_fiber *f, uintptr_t p, size_t n, int write, int atomic) {
    const kd_cluster_run &c = *x.cl;
    for (unsigned r = 0; r < c.size; r++) {
        const uintptr_t u = c.dyn_user[r];
        if (r == x.crank || p < u - KD_GUARD || p >= u + c.dyn_size + KD_GUARD) continue;
        if (p < u || p + n > u + c.dyn_size)
            kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s at offset %lld of block rank %u's %zu "
                             "bytes of dynamic shared memory: out of bounds", n,
                             kind(write, atomic), (long long)(p - u), r, c.dyn_size);
        else if (!c.live[r])
            kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s of block rank %u's shared memory after "
                             "that block exited", n, kind(write, atomic), r);
        return 1;
    }
    return 0;
}

[[maybe_unused]] static void on_access(void *addr, size_t n, int write, int atomic, int aligned) {
    kd_exec &x = t_exec;
    if (!x.in_kernel || !x.cur) return;
    const uintptr_t p = (uintptr_t)addr;
    kd_fiber *f = x.cur;
    const kd_launch_run *L = x.L;
    if (p - (uintptr_t)x.region < x.region_size) return;
    if (p - (uintptr_t)L->args < L->args_size) return;
    if (p - x.dyn_lo < x.dyn_hi - x.dyn_lo) {
        if (p < x.dyn_user || p + n > x.dyn_user + x.dyn_size) {
            kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s at offset %lld of %zu bytes of dynamic "
                             "shared memory: out of bounds", n, kind(write, atomic),
                             (long long)(p - x.dyn_user), x.dyn_size);
            return;
        }
        if (aligned && (p & (n - 1)))
            kd_kernel_report(x, KD_CK_MEM, f, "misaligned %zu-byte %s of shared memory", n,
                             kind(write, atomic));
        race(x, f, x.race_dyn + (p - x.dyn_user), p - x.dyn_user, n, write, atomic,
             "dynamic shared");
        return;
    }
    if (p - x.tls_lo < x.tls_hi - x.tls_lo) {
        race(x, f, x.race_tls + (p - x.tls_lo), p - x.tls_lo, n, write, atomic, "static shared");
        return;
    }
    if (x.cl && remote_shared(x, f, p, n, write, atomic)) return;
    const kd_alloc *a = kd_sim_find(L->snap, p);
    if (a) {
        device(x, f, a, p, n, write, atomic, aligned);
        return;
    }
    if (!x.tls_lo || kd_sim_is_module_addr(p)) return;
    kd_kernel_report(x, KD_CK_MEM, f, "%zu-byte %s at %#lx: not device or shared memory (a host "
                     "pointer?)", n, kind(write, atomic), (unsigned long)p);
}

/* ---- the callbacks of -fsanitize=thread (exported: the instrumented objects call them). Not in
 * the ASan build, which instruments nothing this way (and where GCC declares them itself). ---- */
#if !defined(__SANITIZE_ADDRESS__)
#pragma GCC visibility push(default)
extern "C" {
void __tsan_init(void) { g_hooks = 1; }
void __tsan_func_entry(void *) {}
void __tsan_func_exit(void) {}
void __tsan_vptr_update(void **, void *) {}
void __tsan_vptr_read(void **) {}
void __tsan_read_range(void *a, unsigned long n) { on_access(a, n, 0, 0, 0); }
void __tsan_write_range(void *a, unsigned long n) { on_access(a, n, 1, 0, 0); }

#define KD_RW(n)                                                                   \
    void __tsan_read##n(void *a) { on_access(a, n, 0, 0, 1); }                     \
    void __tsan_write##n(void *a) { on_access(a, n, 1, 0, 1); }                    \
    void __tsan_unaligned_read##n(void *a) { on_access(a, n, 0, 0, 0); }           \
    void __tsan_unaligned_write##n(void *a) { on_access(a, n, 1, 0, 0); }          \
    void __tsan_volatile_read##n(void *a) { on_access(a, n, 0, 0, 1); }            \
    void __tsan_volatile_write##n(void *a) { on_access(a, n, 1, 0, 1); }
KD_RW(1)
KD_RW(2)
KD_RW(4)
KD_RW(8)
KD_RW(16)
#undef KD_RW

/* Atomics: recorded as atomic accesses, then done with the same builtins (sequentially
 * consistent: stronger than any order the kernel asked for). */
#define KD_ATOMIC(bits, T)                                                                        \
    T __tsan_atomic##bits##_load(const volatile T *a, int) {                                      \
        on_access((void *)a, sizeof(T), 0, 1, 1);                                                 \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                              \
    }                                                                                             \
    void __tsan_atomic##bits##_store(volatile T *a, T v, int) {                                   \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                 \
    }                                                                                             \
    T __tsan_atomic##bits##_exchange(volatile T *a, T v, int) {                                   \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                       \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_add(volatile T *a, T v, int) {                                  \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                        \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_sub(volatile T *a, T v, int) {                                  \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                        \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_and(volatile T *a, T v, int) {                                  \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                        \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_or(volatile T *a, T v, int) {                                   \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                         \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_xor(volatile T *a, T v, int) {                                  \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                        \
    }                                                                                             \
    T __tsan_atomic##bits##_fetch_nand(volatile T *a, T v, int) {                                 \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                       \
    }                                                                                             \
    int __tsan_atomic##bits##_compare_exchange_strong(volatile T *a, T *c, T v, int, int) {       \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_compare_exchange_n(a, c, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    }                                                                                             \
    int __tsan_atomic##bits##_compare_exchange_weak(volatile T *a, T *c, T v, int, int) {         \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        return __atomic_compare_exchange_n(a, c, v, 1, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);       \
    }                                                                                             \
    T __tsan_atomic##bits##_compare_exchange_val(volatile T *a, T c, T v, int, int) {             \
        on_access((void *)a, sizeof(T), 1, 1, 1);                                                 \
        __atomic_compare_exchange_n(a, &c, v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
        return c;                                                                                 \
    }
KD_ATOMIC(8, uint8_t)
KD_ATOMIC(16, uint16_t)
KD_ATOMIC(32, uint32_t)
KD_ATOMIC(64, uint64_t)
#undef KD_ATOMIC
void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) {}
}
#pragma GCC visibility pop
#endif
