/* Internal to the simulator's sources (cudasim/src): what the runtime core (sim.cpp) offers the
 * stand-ins of cuBLAS / cuBLASLt (sim_blas.cpp) and NCCL (sim_nccl.cpp). */
#ifndef KD_SIM_INTERNAL_H
#define KD_SIM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "kd_sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records one checker report and prints it to stderr: "cuda-sim <checker>: <message>".
 * checker: "memcheck", "racecheck", "synccheck", "initcheck", "launch", "blas", "nccl". */
void kd_sim_report(const char *checker, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 1 when [p, p + bytes) lies inside one live device allocation (cudaMalloc); otherwise records
 * a memcheck report naming `who` and returns 0. bytes == 0 always passes. */
int kd_sim_dev_check(const void *p, size_t bytes, const char *who);

/* initcheck: 1 when every byte of [p, p + bytes) has been written since its allocation (by a
 * kernel, a copy, a memset, a GEMM or a collective); otherwise records an initcheck report naming
 * `who` and returns 0. Call kd_sim_dev_check first: this one assumes the range is device memory. */
int kd_sim_dev_check_init(const void *p, size_t bytes, const char *who);

/* Marks [p, p + bytes) as written (initcheck's shadow). */
void kd_sim_dev_mark_init(void *p, size_t bytes);

/* The sticky error state: a stand-in that finds a fault it would turn into a device error sets
 * it; cudaGetLastError / cudaStreamSynchronize return it. */
void kd_sim_set_error(cudaError_t e);

/* The trace (sim_trace.cpp): recording on, model mode's switches, and adding operations. */
int kd_sim_tracing(void);
long kd_sim_sample_blocks(void); /* 0: every block runs */
int kd_sim_gemm_count_only(void);
int kd_sim_model_mode(void); /* either switch on: the checkers are quiet */
void kd_sim_trace_add(const kd_sim_op *op);
void kd_sim_trace_simple(int kind, const char *name, double bytes_read, double bytes_written);

#ifdef __cplusplus
}
#endif
#endif
