/* The CUDA simulator's runtime API (cudasim/): device memory as host memory with guard zones and
 * an initialisation shadow, streams that run every operation at once and in order, the error
 * state, the kernel registry, and the checkers' reports. Kernel execution is in sim_exec.cpp.
 * One simulated device (0), an sm_90-like part. Thread-safe: ranks of a test run as threads. */
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "sim_core.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KD_POISON(p, n) ASAN_POISON_MEMORY_REGION((void *)(p), (n))
#define KD_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((void *)(p), (n))
#else
#define KD_POISON(p, n) ((void)(p), (void)(n))
#define KD_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static std::mutex g_mu; /* the allocation table, the registry, the reports */

/* ---- reports --------------------------------------------------------------------------------- */

static std::map<std::string, long> g_reports;
static long g_report_total;

extern "C" void kd_sim_report(const char *checker, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lk(g_mu);
    g_reports[checker]++;
    g_report_total++;
    fprintf(stderr, "cuda-sim %s: %s\n", checker, msg);
    fflush(stderr);
}

extern "C" long kd_sim_report_count(void) {
    std::lock_guard<std::mutex> lk(g_mu);
    return g_report_total;
}

extern "C" long kd_sim_report_count_of(const char *checker) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_reports.find(checker);
    return it == g_reports.end() ? 0 : it->second;
}

/* ---- errors ---------------------------------------------------------------------------------- */

static thread_local cudaError_t t_last = cudaSuccess; /* CUDA's last error is per host thread */
static std::atomic<int> g_sticky{cudaSuccess};          /* a device fault poisons the context */

void kd_sim_set_last_error(cudaError_t e) {
    if (e != cudaSuccess) t_last = e;
}

extern "C" void kd_sim_set_error(cudaError_t e) {
    int ok = cudaSuccess;
    g_sticky.compare_exchange_strong(ok, (int)e);
    kd_sim_set_last_error(e);
}

static cudaError_t sticky(void) { return (cudaError_t)g_sticky.load(); }

extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last != cudaSuccess ? t_last : sticky();
    t_last = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) {
    return t_last != cudaSuccess ? t_last : sticky();
}

extern "C" const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    }
    return "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

/* ---- device ---------------------------------------------------------------------------------- */

static thread_local int t_device = 0;
static std::atomic<size_t> g_device_memory{(size_t)16 << 30}; /* what the properties report */

extern "C" void kd_sim_set_device_memory(size_t bytes) {
    g_device_memory.store(bytes ? bytes : (size_t)16 << 30);
}

extern "C" cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return cudaErrorInvalidValue;
    *count = 1;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *device) {
    if (!device) return cudaErrorInvalidValue;
    *device = t_device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    t_device = device;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (!p) return cudaErrorInvalidValue;
    if (device != 0) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "kdloss cuda-sim (sm_90 limits, CPU)");
    p->totalGlobalMem = g_device_memory.load();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->multiProcessorCount = 132;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
    kd_sim_trace_simple(KD_SIM_OP_SYNC, "cudaDeviceSynchronize", 0.0, 0.0);
    return sticky();
}

/* ---- device memory --------------------------------------------------------------------------- */

static std::map<uintptr_t, kd_alloc *> g_live;       /* by user address */
static std::deque<kd_alloc *> g_quarantine;           /* freed, still recognised */
static size_t g_quarantine_bytes;
static std::vector<kd_alloc *> &g_retired = *new std::vector<kd_alloc *>; /* snapshots hold them */
static uint64_t g_alloc_id;
static std::atomic<uint64_t> g_version{1};
static const size_t KD_QUARANTINE_MAX = (size_t)512 << 20;

/* The NaN pattern of fresh memory: bytes C0 7F C0 7F ... read as fp32, fp64, bf16 and fp16 are
 * all NaN, so a kernel that reads what nobody wrote produces NaN even without initcheck. */
static void fill_nan(void *p, size_t n) {
    uint8_t *b = (uint8_t *)p;
    for (size_t i = 0; i < n; i++) b[i] = (i & 1) ? 0x7f : 0xc0;
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (!p) return cudaErrorInvalidValue;
    *p = NULL;
    if (bytes == 0) return cudaSuccess;
    if (bytes > ((size_t)1 << 40)) return kd_sim_set_last_error(cudaErrorMemoryAllocation),
                                          cudaErrorMemoryAllocation;
    size_t total = KD_GUARD + (bytes + KD_GUARD - 1) / KD_GUARD * KD_GUARD + KD_GUARD;
    void *raw = aligned_alloc(KD_GUARD, total);
    const int want_shadow = kd_sim_hooks_active() && !kd_sim_model_mode();
    uint8_t *shadow = want_shadow ? (uint8_t *)calloc(bytes, 1) : NULL;
    if (!raw || (want_shadow && !shadow)) {
        free(raw);
        free(shadow);
        kd_sim_set_last_error(cudaErrorMemoryAllocation);
        return cudaErrorMemoryAllocation;
    }
    kd_alloc *a = new kd_alloc{(uintptr_t)raw, (uintptr_t)raw + KD_GUARD, bytes, total, shadow, 0, 0};
    fill_nan((void *)a->user, bytes);
    memset(raw, 0xa5, KD_GUARD);
    memset((void *)(a->user + bytes), 0xa5, total - KD_GUARD - bytes);
    KD_POISON(raw, KD_GUARD);
    KD_POISON(a->user + bytes, total - KD_GUARD - bytes);
    std::lock_guard<std::mutex> lk(g_mu);
    a->id = ++g_alloc_id;
    g_live[a->user] = a;
    g_version++;
    *p = (void *)a->user;
    kd_sim_trace_simple(KD_SIM_OP_ALLOC, "cudaMalloc", 0.0, (double)bytes);
    return cudaSuccess;
}

static void release(kd_alloc *a) {
    KD_UNPOISON(a->raw, a->total);
    free((void *)a->raw);
    free(a->shadow);
    a->shadow = NULL;
}

extern "C" cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find((uintptr_t)p);
    if (it == g_live.end()) return cudaErrorInvalidValue;
    kd_alloc *a = it->second;
    g_live.erase(it);
    g_version++;
    if (!kd_sim_hooks_active()) { /* ASan build: ASan's own quarantine finds use-after-free */
        release(a);
        delete a;
        return cudaSuccess;
    }
    a->freed = 1;
    g_quarantine.push_back(a);
    g_quarantine_bytes += a->size;
    while (g_quarantine_bytes > KD_QUARANTINE_MAX) {
        kd_alloc *o = g_quarantine.front();
        g_quarantine.pop_front();
        g_quarantine_bytes -= o->size;
        release(o);
        g_retired.push_back(o);
    }
    return cudaSuccess;
}

/* The allocation whose user range holds p, or NULL. Caller holds g_mu. */
static kd_alloc *live_at(uintptr_t p) {
    auto it = g_live.upper_bound(p);
    if (it == g_live.begin()) return NULL;
    --it;
    kd_alloc *a = it->second;
    return p < a->user + a->size ? a : NULL;
}

extern "C" int kd_sim_dev_check(const void *p, size_t bytes, const char *who) {
    if (bytes == 0) return 1;
    std::lock_guard<std::mutex> lk(g_mu);
    kd_alloc *a = live_at((uintptr_t)p);
    if (a && (uintptr_t)p + bytes <= a->user + a->size) return 1;
    g_mu.unlock();
    if (a)
        kd_sim_report("memcheck", "%s: %zu bytes at %p run %zu bytes past the end of a %zu-byte "
                      "allocation", who, bytes, p,
                      (size_t)((uintptr_t)p + bytes - (a->user + a->size)), a->size);
    else
        kd_sim_report("memcheck", "%s: %p (%zu bytes) is not device memory", who, p, bytes);
    g_mu.lock();
    return 0;
}

extern "C" int kd_sim_dev_check_init(const void *p, size_t bytes, const char *who) {
    if (bytes == 0 || !kd_sim_hooks_active()) return 1;
    size_t bad = 0, first = 0;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        kd_alloc *a = live_at((uintptr_t)p);
        if (!a || !a->shadow) return 1;
        const uint8_t *s = a->shadow + ((uintptr_t)p - a->user);
        for (size_t i = 0; i < bytes; i++)
            if (!s[i] && !bad++) first = i;
    }
    if (!bad) return 1;
    kd_sim_report("initcheck", "%s: reads %zu never-written bytes of %zu at %p (first at +%zu)",
                  who, bad, bytes, p, first);
    return 0;
}

extern "C" void kd_sim_dev_mark_init(void *p, size_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lk(g_mu);
    kd_alloc *a = live_at((uintptr_t)p);
    if (!a || !a->shadow) return;
    size_t off = (uintptr_t)p - a->user;
    memset(a->shadow + off, 1, std::min(bytes, a->size - off));
}

/* Copies the initcheck shadow along with a device-to-device copy. */
static void copy_shadow(void *dst, const void *src, size_t bytes) {
    std::lock_guard<std::mutex> lk(g_mu);
    kd_alloc *d = live_at((uintptr_t)dst), *s = live_at((uintptr_t)src);
    if (!d || !s || !d->shadow || !s->shadow) return;
    memmove(d->shadow + ((uintptr_t)dst - d->user), s->shadow + ((uintptr_t)src - s->user), bytes);
}

static int is_device(const void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    return live_at((uintptr_t)p) != NULL;
}

/* ---- snapshots of the table for the kernels ------------------------------------------------- */

/* kept (and reachable, never destroyed): a kernel on another thread may hold one */
static std::vector<kd_alloc_snap *> &g_snaps = *new std::vector<kd_alloc_snap *>;
static uint64_t g_snap_version;

/* NULL in the ASan build: no instrumentation looks anything up there. */
const kd_alloc_snap *kd_sim_alloc_snapshot(void) {
    if (!kd_sim_hooks_active()) return NULL;
    std::lock_guard<std::mutex> lk(g_mu);
    if (!g_snaps.empty() && g_snap_version == g_version.load()) return g_snaps.back();
    kd_alloc_snap *s = new kd_alloc_snap;
    for (auto &kv : g_live) s->v.push_back(kv.second);
    for (kd_alloc *a : g_quarantine) s->v.push_back(a);
    std::sort(s->v.begin(), s->v.end(),
              [](const kd_alloc *x, const kd_alloc *y) { return x->raw < y->raw; });
    g_snaps.push_back(s);
    g_snap_version = g_version.load();
    return s;
}

const kd_alloc *kd_sim_find(const kd_alloc_snap *s, uintptr_t p) {
    if (!s) return NULL;
    size_t lo = 0, hi = s->v.size();
    while (lo < hi) { /* the last allocation whose raw start is <= p */
        size_t mid = (lo + hi) / 2;
        if (s->v[mid]->raw <= p) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return NULL;
    const kd_alloc *a = s->v[lo - 1];
    return p < a->raw + a->total ? a : NULL;
}

/* ---- copies and fills (the simulator runs stream work at once, in order) -------------------- */

static cudaError_t memcpy_checked(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    if (kind == cudaMemcpyDefault)
        kind = is_device(dst) ? (is_device(src) ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                              : (is_device(src) ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    int dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dd && !kd_sim_dev_check(dst, bytes, "cudaMemcpy destination")) return cudaErrorInvalidValue;
    if (sd && !kd_sim_dev_check(src, bytes, "cudaMemcpy source")) return cudaErrorInvalidValue;
    memmove(dst, src, bytes);
    kd_sim_trace_simple(KD_SIM_OP_COPY, "cudaMemcpy", sd ? (double)bytes : 0.0,
                        dd ? (double)bytes : 0.0);
    if (dd && sd) copy_shadow(dst, src, bytes);
    else if (dd) kd_sim_dev_mark_init(dst, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = memcpy_checked(dst, src, bytes, kind);
    if (bytes) kd_sim_trace_simple(KD_SIM_OP_SYNC, "cudaMemcpy", 0.0, 0.0); /* synchronous */
    if (e != cudaSuccess) return e;
    return sticky();
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                       cudaMemcpyKind kind, cudaStream_t st) {
    if (!kd_sim_stream_ok(st)) return cudaErrorInvalidResourceHandle;
    return memcpy_checked(dst, src, bytes, kind);
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st) {
    if (!kd_sim_stream_ok(st)) return cudaErrorInvalidResourceHandle;
    if (bytes == 0) return cudaSuccess;
    if (!kd_sim_dev_check(p, bytes, "cudaMemset")) return cudaErrorInvalidValue;
    memset(p, value, bytes);
    kd_sim_trace_simple(KD_SIM_OP_MEMSET, "cudaMemset", 0.0, (double)bytes);
    kd_sim_dev_mark_init(p, bytes);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    return cudaMemsetAsync(p, value, bytes, NULL);
}

/* ---- streams: every operation runs when it is queued, so each stream is in order ------------ */

struct kd_sim_stream {
    uint32_t magic;
    unsigned flags;
};
static const uint32_t KD_STREAM_MAGIC = 0x5354524du;

int kd_sim_stream_ok(cudaStream_t st) { return !st || st->magic == KD_STREAM_MAGIC; }

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags) {
    if (!st || flags > cudaStreamNonBlocking) return cudaErrorInvalidValue;
    *st = new kd_sim_stream{KD_STREAM_MAGIC, flags};
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *st) {
    return cudaStreamCreateWithFlags(st, cudaStreamDefault);
}

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t st) {
    if (!st || st->magic != KD_STREAM_MAGIC) return cudaErrorInvalidResourceHandle;
    st->magic = 0; /* kept, so a use after destroy is recognised instead of read freed memory */
    static std::mutex mu;
    static std::vector<kd_sim_stream *> &dead = *new std::vector<kd_sim_stream *>;
    std::lock_guard<std::mutex> lk(mu);
    dead.push_back(st);
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    if (!kd_sim_stream_ok(st)) return cudaErrorInvalidResourceHandle;
    kd_sim_trace_simple(KD_SIM_OP_SYNC, "cudaStreamSynchronize", 0.0, 0.0);
    return sticky();
}

/* ---- per-kernel attributes ------------------------------------------------------------------- */

static std::map<const void *, size_t> g_smem_optin;

extern "C" cudaError_t kd_sim_func_set_attribute(const void *func, cudaFuncAttribute attr,
                                                 int value) {
    if (!func) return cudaErrorInvalidValue;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    if (value < 0 || value > 227 * 1024) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lk(g_mu);
    g_smem_optin[func] = (size_t)value;
    return cudaSuccess;
}

size_t kd_sim_func_smem_limit(const void *fn) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_smem_optin.find(fn);
    return it == g_smem_optin.end() ? 48 * 1024 : std::max<size_t>(48 * 1024, it->second);
}

/* ---- the kernel registry (generated by cudasim/tools/kd_sim_scan.c) ------------------------- */

struct kd_reg_kernel {
    kd_sim_kernel_info info;
    std::atomic<long> runs{0};
};
struct kd_reg_site {
    kd_sim_site_info info;
    std::atomic<long> runs{0};
};
/* Built on first use: generated registries register from their objects' constructors, which
 * may run before this file's. Deques: stable addresses as sets are added. */
static std::deque<kd_reg_kernel> &reg_kernels(void) {
    static std::deque<kd_reg_kernel> d;
    return d;
}
static std::deque<kd_reg_site> &reg_sites(void) {
    static std::deque<kd_reg_site> d;
    return d;
}
#define g_kernels reg_kernels()
#define g_sites reg_sites()

extern "C" void kd_sim_register(const kd_sim_kernel_info *k, int nk, const kd_sim_site_info *s,
                                int ns) {
    std::lock_guard<std::mutex> lk(g_mu);
    for (int i = 0; i < nk; i++) g_kernels.emplace_back().info = k[i];
    for (int i = 0; i < ns; i++) g_sites.emplace_back().info = s[i];
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* "&ns::kernel<A, B>" -> "kernel" */
static std::string kernel_ident(const char *expr) {
    std::string e(expr);
    size_t lt = e.find('<');
    if (lt != std::string::npos) e.resize(lt);
    size_t c = e.rfind(':');
    if (c != std::string::npos) e = e.substr(c + 1);
    size_t b = e.find_first_not_of("& \t(");
    size_t t = e.find_last_not_of(" \t)");
    return b == std::string::npos ? e : e.substr(b, t - b + 1);
}

kd_kernel_ref kd_sim_lookup_launch(const kd_sim_launch_cfg *cfg) {
    kd_kernel_ref r = {-1, -1, 0, cfg->expr};
    std::string id = kernel_ident(cfg->expr);
    const char *file = base_name(cfg->file);
    std::lock_guard<std::mutex> lk(g_mu);
    for (size_t i = 0; i < g_kernels.size(); i++)
        if (id == g_kernels[i].info.name) {
            r.kernel = (int)i;
            r.launch_bounds = g_kernels[i].info.launch_bounds;
            r.name = g_kernels[i].info.name;
            break;
        }
    for (size_t i = 0; i < g_sites.size(); i++)
        if (g_sites[i].info.line == cfg->line && !strcmp(g_sites[i].info.file, file)) {
            r.site = (int)i;
            break;
        }
    return r;
}

void kd_sim_mark_run(kd_kernel_ref r) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (r.kernel >= 0) g_kernels[(size_t)r.kernel].runs++;
    if (r.site >= 0) g_sites[(size_t)r.site].runs++;
}

extern "C" void kd_sim_coverage(int *kernels, int *kernels_run, int *sites, int *sites_run) {
    std::lock_guard<std::mutex> lk(g_mu);
    int kr = 0, sr = 0;
    for (auto &k : g_kernels) kr += k.runs > 0;
    for (auto &s : g_sites) sr += s.runs > 0;
    if (kernels) *kernels = (int)g_kernels.size();
    if (kernels_run) *kernels_run = kr;
    if (sites) *sites = (int)g_sites.size();
    if (sites_run) *sites_run = sr;
}

extern "C" long kd_sim_summary(void) {
    int nk, kr, ns, sr;
    kd_sim_coverage(&nk, &kr, &ns, &sr);
    long reports = kd_sim_report_count();
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto &k : g_kernels)
            if (!k.runs) printf("cuda-sim: kernel %s (%s:%d) never executed\n", k.info.name,
                                k.info.file, k.info.line);
        for (auto &s : g_sites)
            if (!s.runs) printf("cuda-sim: launch site %s:%d (%s) never reached\n", s.info.file,
                                s.info.line, s.info.kernel);
        for (auto &kv : g_reports) printf("cuda-sim: %ld %s reports\n", kv.second, kv.first.c_str());
    }
    printf("cuda-sim: %d of %d launch sites reached\n", sr, ns);
    printf("cuda-sim: %d of %d kernels executed, %ld checker reports\n", kr, nk, reports);
    fflush(stdout);
    return reports;
}

/* ---- the loaded objects' images: a kernel may read constants and globals there ------------- */

struct kd_range {
    uintptr_t lo, hi;
};
static std::vector<kd_range> g_images;
static std::mutex g_img_mu;

static int collect_image(struct dl_phdr_info *info, size_t, void *) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        g_images.push_back({lo, lo + ph->p_memsz});
    }
    return 0;
}

int kd_sim_is_module_addr(uintptr_t p) {
    std::lock_guard<std::mutex> lk(g_img_mu);
    for (int pass = 0; pass < 2; pass++) {
        for (const kd_range &r : g_images)
            if (p >= r.lo && p < r.hi) return 1;
        g_images.clear(); /* an object may have been loaded since: look again once */
        dl_iterate_phdr(collect_image, NULL);
    }
    return 0;
}
