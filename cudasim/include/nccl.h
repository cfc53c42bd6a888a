/* nccl.h of the CUDA simulator (cudasim/): the part of NCCL that kdloss and its tests call,
 * served on the CPU by cudasim/src/sim_nccl.cpp. C and C++. Names and values follow NCCL.
 *
 * The ranks of a communicator are threads of one process (the simulator has one device, so every
 * rank may sit on device 0). A collective blocks its thread until every rank of the communicator
 * has made the same call; it then completes at once (the stream argument orders nothing: the
 * simulator runs every stream operation when it is issued). The reduction is deterministic: rank
 * 0's values, then rank 1's, ... combined in the data type. A rank that does not arrive within
 * the time limit (20 s; the environment variable KD_SIM_NCCL_TIMEOUT_MS, read once, changes it)
 * makes the waiting ranks fail with ncclSystemError instead of hanging. */
#ifndef KD_SIM_NCCL_H
#define KD_SIM_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"
#include "kd_sim.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 18
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 21800
/* NCCL's encoding of a version: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after */
#define NCCL_VERSION(X, Y, Z)                                                                      \
    (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_UNIQUE_ID_BYTES 128

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kd_sim_nccl_comm *ncclComm_t;

typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6, /* another rank failed this collective */
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

/* Served: the integer types and ncclFloat32 / ncclFloat64 (not the 16-bit floats). */
typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

/* ncclMax / ncclMin of floats follow fmax / fmin (as NCCL's device max does): a NaN meets a
 * number -> the number. ncclAvg: the sum, then divided by the rank count in the data type. */
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5
} ncclRedOp_t;

KD_SIM_API ncclResult_t ncclGetVersion(int *version);
KD_SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
/* Joins the communicator named by commId as `rank` of `nranks`; returns once every rank joined. */
KD_SIM_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                         int rank);
/* ndev communicators of one clique from one thread; devlist NULL: every rank on device 0. */
KD_SIM_API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
KD_SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm);
KD_SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
KD_SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
KD_SIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
/* ncclSystemError once a collective of this communicator timed out, else ncclSuccess. */
KD_SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
KD_SIM_API const char *ncclGetErrorString(ncclResult_t result);

/* No-ops (every call completes when issued). */
KD_SIM_API ncclResult_t ncclGroupStart(void);
KD_SIM_API ncclResult_t ncclGroupEnd(void);

/* count elements of datatype, sendbuff -> recvbuff (device memory; in place when equal). */
KD_SIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
