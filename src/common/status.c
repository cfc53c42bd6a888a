#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "kdloss.h"

const char *kdloss_version(void) { return "0.1.0"; }

static _Thread_local char g_detail[384];

void kd_detail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_detail, sizeof g_detail, fmt, ap);
    va_end(ap);
}

void kd_detail_clear(void) { g_detail[0] = 0; }

kdloss_status kd_named(const char *name, kdloss_status st) {
    if (st == KDLOSS_OK) return st;
    char tmp[sizeof g_detail + 64];
    snprintf(tmp, sizeof tmp, "%.48s: %s", name, g_detail[0] ? g_detail : kdloss_status_string(st));
    memcpy(g_detail, tmp, sizeof g_detail - 1);
    g_detail[sizeof g_detail - 1] = 0;
    return st;
}

const char *kdloss_error_detail(void) { return g_detail; }

const char *kdloss_dtype_name(kdloss_dtype dt) {
    switch (dt) {
    case KDLOSS_F32: return "fp32";
    case KDLOSS_BF16: return "bf16";
    case KDLOSS_F16: return "fp16";
    case KDLOSS_I32: return "int32";
    case KDLOSS_I64: return "int64";
    case KDLOSS_F64: return "fp64";
    }
    return "unknown";
}

const char *kdloss_status_string(kdloss_status status) {
    switch (status) {
    case KDLOSS_OK: return "ok";
    case KDLOSS_ERR_NULL_POINTER: return "null pointer: a required argument is NULL";
    case KDLOSS_ERR_INVALID_SIZE:
        return "invalid size: sizes must be positive and the tensors addressable in 64 bits";
    case KDLOSS_ERR_INVALID_DTYPE: return "invalid dtype: unknown, or not allowed for this operand";
    case KDLOSS_ERR_INVALID_REDUCTION: return "invalid reduction: use none, sum, mean or batchmean";
    case KDLOSS_ERR_INVALID_PARAM:
        return "invalid parameter: the divergence must be known, beta and alpha in [0,1], eps in [0, FLT_MAX], temperature > 0 "
               "and a normal finite fp32 with 1/T finite (every loss on logits), weights >= 0, chunk_size >= 0, and every scale factor "
               "(grad_scale times the reduction or weight / temperature factors) a finite fp32";
    case KDLOSS_ERR_INVALID_STRIDE:
        return "invalid stride: a leading dimension is below the row length";
    case KDLOSS_ERR_ALIASING:
        return "aliasing: an output overlaps an input or another output";
    case KDLOSS_ERR_LABEL_OUT_OF_RANGE:
        return "label out of range: a label is neither ignore_index nor in [0, V)";
    case KDLOSS_ERR_SHAPE_MISMATCH: return "shape mismatch: operands do not agree";
    case KDLOSS_ERR_NO_OUTPUT: return "no output: every output pointer is NULL";
    case KDLOSS_ERR_OUT_OF_MEMORY: return "out of memory: working space could not be allocated";
    case KDLOSS_ERR_WORKSPACE_TOO_SMALL: return "workspace too small: see *_workspace_size()";
    case KDLOSS_ERR_UNSUPPORTED: return "unsupported: not available in this build or machine";
    case KDLOSS_ERR_BLAS: return "BLAS failure";
    case KDLOSS_ERR_CUDA: return "CUDA failure (runtime, cuBLAS or cuBLASLt)";
    case KDLOSS_ERR_INTERNAL: return "internal error in kdloss";
    case KDLOSS_ERR_BUDGET_TOO_SMALL:
        return "memory budget too small: it cannot hold a one-row chunk; "
               "kdloss_fljsd_min_budget() gives the minimum for these shapes";
    case KDLOSS_ERR_MISALIGNED:
        return "misaligned pointer: every pointer must be aligned to its element size";
    case KDLOSS_ERR_INVALID_ID:
        return "invalid teacher id: an id is neither -1 nor in [0, V), or repeats within a row";
    case KDLOSS_ERR_COMM: return "communicator failure: the all-reduce callback reported an error";
    case KDLOSS_ERR_PEER:
        return "peer rank error: another rank rejected its arguments (it returned the reason)";
    }
    return "unknown status code";
}

size_t kdloss_dtype_size(kdloss_dtype dtype) {
    switch (dtype) {
    case KDLOSS_F32: return 4;
    case KDLOSS_BF16: return 2;
    case KDLOSS_F16: return 2;
    case KDLOSS_I32: return 4;
    case KDLOSS_I64: return 8;
    case KDLOSS_F64: return 8;
    }
    return 0;
}
