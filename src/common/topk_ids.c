/* The value check of a sparse teacher's ids in host memory (check.h), run before any output is
 * written: every backend whose ids the host can read calls it (args.c, args_fld.c). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "topk_row.h" /* kd_topk_id */

/* Row r: ids in range and distinct, with `seen` (v bits, all clear) as scratch; leaves it clear. */
static int row_ok(const void *ids, int is64, int64_t ld, int64_t r, int64_t k, int64_t v,
                  uint64_t *seen) {
    int ok = 1;
    int64_t j = 0;
    for (; j < k; j++) {
        int64_t id = kd_topk_id(ids, is64, ld, r, j);
        if (id == -1) continue;
        if (id < 0 || id >= v || (seen[id >> 6] >> (id & 63) & 1)) {
            if (id < 0 || id >= v)
                kd_detail("teacher ids[%lld][%lld] = %lld is neither -1 nor in [0, %lld)",
                          (long long)r, (long long)j, (long long)id, (long long)v);
            else
                kd_detail("teacher ids[%lld][%lld] = %lld repeats an id of the same row",
                          (long long)r, (long long)j, (long long)id);
            ok = 0;
            break;
        }
        seen[id >> 6] |= (uint64_t)1 << (id & 63);
    }
    for (int64_t i = 0; i < j; i++) { /* clear what this row set: O(K), not O(V) */
        int64_t id = kd_topk_id(ids, is64, ld, r, i);
        if (id >= 0 && id < v) seen[id >> 6] &= ~((uint64_t)1 << (id & 63));
    }
    return ok;
}

kdloss_status kd_topk_check_ids(kdloss_topk_teacher t, int64_t bt, int64_t v) {
    uint64_t stack[4096]; /* 2^18 ids */
    size_t words = (size_t)((v + 63) / 64);
    uint64_t *seen = stack;
    if (words > sizeof stack / sizeof stack[0]) {
        seen = malloc(words * sizeof(uint64_t));
        if (!seen) {
            kd_detail("teacher ids: no memory for the check's %zu-byte bitmap of V = %lld ids",
                      words * sizeof(uint64_t), (long long)v);
            return KDLOSS_ERR_OUT_OF_MEMORY;
        }
    }
    memset(seen, 0, words * sizeof(uint64_t));
    int is64 = t.ids.dtype == KDLOSS_I64;
    int64_t ld = t.ids.ld ? t.ids.ld : t.k;
    kdloss_status st = KDLOSS_OK;
    for (int64_t r = 0; r < bt && st == KDLOSS_OK; r++)
        if (!row_ok(t.ids.data, is64, ld, r, t.k, v, seen)) st = KDLOSS_ERR_INVALID_ID;
    if (seen != stack) free(seen);
    return st;
}
