/* Large allocations of the library's own (a fused call's workspace when the caller gives none). */
#ifndef KDLOSS_CPU_MEM_H
#define KDLOSS_CPU_MEM_H

#include <stddef.h>

/* malloc(bytes), a block of KD_HUGE_MIN bytes or more advised onto transparent huge pages: a
 * fresh block comes from its own mmap, whose first touch page-faults 4 KiB at a time where THP
 * is in its default "madvise" mode (BENCHMARKS.md: a 512 MiB buffer's first touch took 110-150
 * ms with 4 KiB pages, 55-60 ms with 2 MiB ones). Only the 2 MiB-aligned interior is advised,
 * and a failing madvise changes nothing. Freed with free(). */
#define KD_HUGE_MIN ((size_t)32 << 20)
void *kd_malloc_large(size_t bytes);

#endif
