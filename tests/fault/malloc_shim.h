/* Shared state of the allocation-failure shim (malloc_shim.c) and its driver. */
#ifndef KDLOSS_MALLOC_SHIM_H
#define KDLOSS_MALLOC_SHIM_H

typedef struct kdfi_state {
    long count;     /* allocation requests seen while counting */
    long fail_at;   /* the request number that fails (-1: none) */
    int counting;   /* 1: count (and fail) requests */
    int failed;     /* 1 once the fail_at request was refused */
    char where[96]; /* file name of the object that made the refused request */
} kdfi_state;

/* Points the shim at `s` (NULL: its own private state). Resolved with dlsym by the driver. */
typedef void (*kdfi_use_fn)(kdfi_state *s);

#endif
