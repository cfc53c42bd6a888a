/* kd_malloc_large (src/cpu/mem.c, compiled in here: it is internal to the library): a block of
 * KD_HUGE_MIN bytes or more lies in a mapping advised MADV_HUGEPAGE (VmFlags "hg" in
 * /proc/self/smaps) over its 2 MiB-aligned interior, is writable over all its bytes, and a small
 * block is a plain malloc. Skips the mapping check where /proc/self/smaps is missing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cpu/mem.c"
#include "testutil.h"

/* 1 if the mapping holding addr has VmFlags "hg", 0 if not, -1 if smaps cannot be read or has
 * no such mapping. */
static int advised_huge(uintptr_t addr) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = lo <= addr && addr < hi;
        } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

int main(void) {
    size_t big = KD_HUGE_MIN * 2, small = 4096;
    unsigned char *b = kd_malloc_large(big), *s = kd_malloc_large(small);
    if (KT_CHECK(b && s, "kd_malloc_large returned NULL")) {
        memset(b, 0x5a, big);
        memset(s, 0xa5, small);
        KT_CHECK(b[0] == 0x5a && b[big - 1] == 0x5a && s[small - 1] == 0xa5, "blocks writable");
        int h = advised_huge((uintptr_t)b + big / 2);
        if (h < 0) printf("test_mem: no /proc/self/smaps mapping found; advice not checked\n");
        else KT_CHECK(h == 1, "the %zu-byte block's mapping is not advised MADV_HUGEPAGE", big);
    }
    free(b);
    free(s);
    return kt_finish("test_mem");
}
