/* LD_PRELOAD allocation-failure shim for test_fault_inject (tests/fault/test_fault_inject.c).
 *
 * It interposes malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign, valloc and
 * pvalloc (free passes through) and forwards to glibc's __libc_* entry points. While the
 * driver has counting switched on, every allocation request gets a sequence number, and the
 * request whose number equals fail_at returns NULL (ENOMEM). The state lives wherever the
 * driver points it (kdfi_use), normally a MAP_SHARED page, so a parent process can read the
 * count and where the failed request came from even when the child dies inside the call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "malloc_shim.h"

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);
extern void __libc_free(void *p);

static kdfi_state local_state = {0, -1, 0, 0, {0}};
static kdfi_state *volatile state = &local_state;

__attribute__((visibility("default"))) void kdfi_use(kdfi_state *s) { state = s ? s : &local_state; }

/* 1 when this request must fail; records the caller of the failed one. */
static int fail_now(void *caller) {
    kdfi_state *s = state;
    if (!__atomic_load_n(&s->counting, __ATOMIC_SEQ_CST)) return 0;
    long n = __atomic_fetch_add(&s->count, 1, __ATOMIC_SEQ_CST);
    if (n != s->fail_at) return 0;
    Dl_info info;
    const char *name = "?";
    if (caller && dladdr(caller, &info) && info.dli_fname) {
        name = strrchr(info.dli_fname, '/');
        name = name ? name + 1 : info.dli_fname;
    }
    size_t k = 0;
    for (; name[k] && k + 1 < sizeof s->where; k++) s->where[k] = name[k];
    s->where[k] = 0;
    __atomic_store_n(&s->failed, 1, __ATOMIC_SEQ_CST);
    return 1;
}

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

void *malloc(size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_realloc(p, n);
}

void free(void *p) { __libc_free(p); }

int posix_memalign(void **out, size_t align, size_t n) {
    if (fail_now(CALLER)) return ENOMEM;
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_memalign(align, n);
}

void *valloc(size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_valloc(n);
}

void *pvalloc(size_t n) {
    if (fail_now(CALLER)) return errno = ENOMEM, NULL;
    return __libc_pvalloc(n);
}
