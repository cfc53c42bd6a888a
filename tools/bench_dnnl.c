/* oneDNN's own bf16 matmul on its own threads, for the bf16 GEMM floor (bench_gemm_floor.c):
 * a second way to run the floor's bf16 products besides kdloss's tile grid, so the floor is the
 * best the machine has, not only what kdloss does with its dependency. */
#include "bench_dnnl.h"

#include <dnnl.h>
#include <stdio.h>

static dnnl_engine_t engine(void) {
    static dnnl_engine_t eng = NULL;
    if (!eng && dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success) eng = NULL;
    return eng;
}

static int desc(dnnl_memory_desc_t *d, int64_t rows, int64_t cols, int trans, int64_t ld,
                dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols}, strides = {trans ? 1 : ld, trans ? ld : 1};
    return dnnl_memory_desc_init_by_strides(d, 2, dims, dt, strides) == dnnl_success ? 0 : -1;
}

int kb_dnnl_bf16_matmul(int ta, int tb, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                        int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc,
                        char *impl, size_t impl_len) {
    dnnl_engine_t eng = engine();
    dnnl_memory_desc_t da, db, dc;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t st = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    if (!eng || desc(&da, m, k, ta, lda, dnnl_bf16) || desc(&db, k, n, tb, ldb, dnnl_bf16) ||
        desc(&dc, m, n, 0, ldc, dnnl_f32))
        return -1;
    dnnl_status_t s = dnnl_matmul_desc_init(&md, &da, &db, NULL, &dc);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL);
    const char *name = NULL;
    if (s == dnnl_success && impl &&
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, impl_len, "%s", name);
    if (s == dnnl_success) s = dnnl_primitive_create(&prim, pd);
    if (s == dnnl_success) s = dnnl_stream_create(&st, eng, dnnl_stream_default_flags);
    if (s == dnnl_success) s = dnnl_memory_create(&ma, &da, eng, (void *)a);
    if (s == dnnl_success) s = dnnl_memory_create(&mb, &db, eng, (void *)b);
    if (s == dnnl_success) s = dnnl_memory_create(&mc, &dc, eng, c);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
        s = dnnl_primitive_execute(prim, st, 3, args);
        if (s == dnnl_success) s = dnnl_stream_wait(st);
    }
    if (mc) dnnl_memory_destroy(mc);
    if (mb) dnnl_memory_destroy(mb);
    if (ma) dnnl_memory_destroy(ma);
    if (st) dnnl_stream_destroy(st);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    return s == dnnl_success ? 0 : -1;
}
