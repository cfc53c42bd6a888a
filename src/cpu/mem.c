#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define KD_HUGE_PAGE ((uintptr_t)2 << 20)

void *kd_malloc_large(size_t bytes) {
    void *p = malloc(bytes);
#ifdef MADV_HUGEPAGE
    if (p && bytes >= KD_HUGE_MIN) {
        uintptr_t lo = ((uintptr_t)p + KD_HUGE_PAGE - 1) & ~(KD_HUGE_PAGE - 1);
        uintptr_t hi = ((uintptr_t)p + bytes) & ~(KD_HUGE_PAGE - 1);
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    }
#endif
    return p;
}
