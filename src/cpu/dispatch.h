/* Run-time choice of the CPU code path among the registry's ISAs (isa.h): each op family
 * compiles one generic source per instruction set; dispatch.c fills one table of their entry
 * points per ISA, each starting from the scalar one (BLIS's bli_cntx_init_<arch> idea), and the
 * drivers call through kd_cpu_kernels(). */
#ifndef KDLOSS_CPU_DISPATCH_H
#define KDLOSS_CPU_DISPATCH_H

#include "elementwise.h"
#include "fld_rows.h"
#include "gemm_fb.h"
#include "isa.h"
#include "kdloss.h"
#include "logits_rows.h"
#include "topk.h"

/* The path in force (never KDLOSS_ISA_AUTO): forced by kdloss_cpu_set_isa(), else by the
 * environment variable KDLOSS_CPU_ISA, else the best the CPU supports. */
kdloss_cpu_isa kd_cpu_isa(void);

/* Every per-ISA entry point, one table per instruction set (dispatch.c, KD_TABLES). */
typedef struct kd_kernel_table {
    kd_row_fn kl_row, div_row;                          /* elementwise.h (KL, divergence family) */
    void (*fld_rows)(const kd_fld_rows *);              /* fld_rows.h: a chunk's rows */
    void (*fld_phase)(const kd_fld_rows *, int);        /* ... one phase of them (vocab-parallel) */
    void (*sparse_rows)(const kd_topk_sparse *);        /* topk.h: the sparse top-k rows */
    void (*sparse_scatter)(const kd_topk_sparse *);     /* ... and their gradient scatter */
    double (*logits_step)(kd_lrow *, kd_lrow *);        /* logits_rows.h; NULL: the scalar rows */
    void (*gemm_fb)(const kd_gemm *, float *);          /* gemm_fb.h: the allocation-free GEMM */
} kd_kernel_table;

/* The table of the path in force (kd_cpu_isa()). */
const kd_kernel_table *kd_cpu_kernels(void);

#endif
