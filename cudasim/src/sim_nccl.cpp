/* sim_nccl.cpp: the NCCL stand-in of the CUDA simulator (nccl.h). The ranks of a communicator
 * are threads of this process; a "clique" is the state they share. A collective is a barrier
 * with a generation counter: each rank posts its arguments in its slot, the last to arrive
 * checks that all agree, reduces in rank order (deterministic), writes every rank's recvbuff and
 * releases the others. Nothing hangs: a rank that waits longer than the time limit withdraws,
 * marks the clique broken and gets ncclSystemError (with a report naming the missing ranks). */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "nccl.h"
#include "sim_internal.h"

namespace {
struct clique;
}

struct kd_sim_nccl_comm {
    clique *cq;
    int rank;
    int device;
};

namespace {

/* One rank's part in the current collective. */
struct slot {
    bool present;
    const void *send;
    void *recv;
    size_t count;
    int type, op;
    ncclResult_t local; /* the rank's own argument and memory checks */
};

struct clique {
    std::mutex mu;
    std::condition_variable cv;
    int nranks = 0;
    int joined = 0;      /* ranks that joined (ncclCommInitRank) */
    int alive = 0;       /* communicators not destroyed */
    bool broken = false; /* a rank timed out: every later collective fails at once */
    uint64_t gen = 0;    /* completed collectives */
    int arrived = 0;     /* ranks waiting in the current one */
    std::vector<slot> slots;
    std::vector<ncclResult_t> res; /* per rank, the outcome of the last completed collective */
    std::vector<kd_sim_nccl_comm *> comms;
};

const char ID_MAGIC[16] = "kd-sim-nccl-id";

/* Lock order: g_pending_mu, then a clique's mu, then g_live_mu (a leaf: nothing is taken while
 * it is held). The tables are leaked on purpose: no destruction-order issues at exit. */
std::mutex g_pending_mu;
std::map<uint64_t, clique *> *g_pending; /* unique id -> clique still gathering its ranks */
std::mutex g_live_mu;
std::unordered_set<const void *> *g_live; /* live communicators */
std::atomic<uint64_t> g_next_id{1};

int timeout_ms() {
    static const int ms = [] {
        const char *e = getenv("KD_SIM_NCCL_TIMEOUT_MS");
        const long v = e ? strtol(e, nullptr, 10) : 0;
        return v > 0 && v < 3600000 ? (int)v : 20000;
    }();
    return ms;
}

std::chrono::steady_clock::time_point deadline() {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms());
}

bool comm_live(const void *c) {
    std::lock_guard<std::mutex> lk(g_live_mu);
    return g_live && g_live->count(c) == 1;
}

/* NULL -> ncclInvalidArgument quietly; a dead communicator is also reported (use after destroy). */
ncclResult_t check_comm(const void *c, const char *api) {
    if (!c) return ncclInvalidArgument;
    if (comm_live(c)) return ncclSuccess;
    kd_sim_report("nccl", "%s: communicator %p is not live (destroyed, or never created)", api, c);
    return ncclInvalidArgument;
}

clique *clique_new(int nranks) {
    clique *cq = new clique;
    cq->nranks = nranks;
    cq->slots.assign((size_t)nranks, slot{});
    cq->res.assign((size_t)nranks, ncclSuccess);
    cq->comms.assign((size_t)nranks, nullptr);
    return cq;
}

/* A communicator for `rank`, registered as live; call with cq->mu held. */
kd_sim_nccl_comm *comm_new(clique *cq, int rank, int device) {
    kd_sim_nccl_comm *c = new kd_sim_nccl_comm{cq, rank, device};
    cq->comms[(size_t)rank] = c;
    cq->joined++;
    cq->alive++;
    std::lock_guard<std::mutex> lk(g_live_mu);
    if (!g_live) g_live = new std::unordered_set<const void *>;
    g_live->insert(c);
    return c;
}

size_t type_size(int t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0; /* the 16-bit floats are not simulated */
    }
}

/* ---- the reduction ----------------------------------------------------------------------------
 */

/* a op b in T; integer sums and products wrap (computed unsigned, as the GPU does). */
template <class T>
T apply(T a, T b, int op) {
    if constexpr (std::is_floating_point<T>::value) {
        switch (op) {
        case ncclProd: return a * b;
        case ncclMax: return std::fmax(a, b); /* NCCL's device max: NaN loses to a number */
        case ncclMin: return std::fmin(a, b);
        default: return a + b; /* ncclSum, ncclAvg */
        }
    } else {
        typedef typename std::make_unsigned<T>::type U;
        switch (op) {
        case ncclProd: return (T)(U)((U)a * (U)b);
        case ncclMax: return std::max(a, b);
        case ncclMin: return std::min(a, b);
        default: return (T)(U)((U)a + (U)b);
        }
    }
}

/* out[0..count) = rank 0's send op rank 1's send op ... (then / nranks for ncclAvg). */
template <class T>
void reduce_ranks(const clique &cq, size_t count, int op, T *out) {
    memcpy(out, cq.slots[0].send, count * sizeof(T));
    for (int r = 1; r < cq.nranks; ++r) {
        const T *s = (const T *)cq.slots[(size_t)r].send;
        for (size_t i = 0; i < count; ++i) out[i] = apply(out[i], s[i], op);
    }
    if (op == ncclAvg)
        for (size_t i = 0; i < count; ++i) out[i] = (T)(out[i] / (T)cq.nranks);
}

void reduce_typed(const clique &cq, size_t count, int type, int op, void *out) {
    switch (type) {
    case ncclInt8: reduce_ranks(cq, count, op, (int8_t *)out); break;
    case ncclUint8: reduce_ranks(cq, count, op, (uint8_t *)out); break;
    case ncclInt32: reduce_ranks(cq, count, op, (int32_t *)out); break;
    case ncclUint32: reduce_ranks(cq, count, op, (uint32_t *)out); break;
    case ncclInt64: reduce_ranks(cq, count, op, (int64_t *)out); break;
    case ncclUint64: reduce_ranks(cq, count, op, (uint64_t *)out); break;
    case ncclFloat32: reduce_ranks(cq, count, op, (float *)out); break;
    case ncclFloat64: reduce_ranks(cq, count, op, (double *)out); break;
    default: break;
    }
}

/* ---- the collective ---------------------------------------------------------------------------
 */

/* The ranks' verdict before reducing: a rank's own failure stays its result (the others get
 * ncclRemoteError); ranks that disagree on count / datatype / op all get ncclInvalidUsage. */
bool verdict(clique &cq) {
    bool any_local = false, agree = true;
    const slot &s0 = cq.slots[0];
    for (const slot &s : cq.slots) {
        any_local = any_local || s.local != ncclSuccess;
        agree = agree && s.count == s0.count && s.type == s0.type && s.op == s0.op;
    }
    for (int r = 0; r < cq.nranks; ++r) {
        const slot &s = cq.slots[(size_t)r];
        cq.res[(size_t)r] = any_local ? (s.local != ncclSuccess ? s.local : ncclRemoteError)
                            : agree   ? ncclSuccess
                                      : ncclInvalidUsage;
        const bool differs = s.count != s0.count || s.type != s0.type || s.op != s0.op;
        if (!any_local && differs)
            kd_sim_report("nccl",
                          "ncclAllReduce: ranks disagree: rank %d passed count %zu, "
                          "datatype %d, op %d (rank 0: %zu, %d, %d)",
                          r, s.count, s.type, s.op, s0.count, s0.type, s0.op);
    }
    return !any_local && agree;
}

/* Run by the last rank to arrive, cq->mu held (the others are blocked, their buffers still). */
void complete(clique &cq) {
    if (verdict(cq)) {
        const slot &s0 = cq.slots[0];
        const size_t bytes = s0.count * type_size(s0.type);
        void *tmp = malloc(bytes ? bytes : 1); /* the recvbuffs may alias the sendbuffs */
        if (!tmp) {
            std::fill(cq.res.begin(), cq.res.end(), ncclSystemError);
        } else {
            if (bytes) reduce_typed(cq, s0.count, s0.type, s0.op, tmp);
            for (const slot &s : cq.slots) {
                if (!bytes) break;
                memcpy(s.recv, tmp, bytes);
                kd_sim_dev_mark_init(s.recv, bytes);
            }
            free(tmp);
        }
    }
    for (slot &s : cq.slots) s.present = false;
    cq.arrived = 0;
    cq.gen++;
    cq.cv.notify_all();
}

/* The first rank to give up names the ranks that never arrived. Call with cq->mu held. */
void report_missing(const clique &cq, int rank) {
    char who[256];
    size_t n = 0;
    who[0] = '\0';
    for (int r = 0; r < cq.nranks && n < sizeof who - 16; ++r)
        if (!cq.slots[(size_t)r].present)
            n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? ", " : "", r);
    kd_sim_report("nccl", "ncclAllReduce: rank %d waited %d ms: rank(s) %s did not arrive", rank,
                  timeout_ms(), who);
}

/* Posts the rank's slot and waits for the collective; returns this rank's result. */
ncclResult_t arrive(clique &cq, int rank, const slot &mine) {
    std::unique_lock<std::mutex> lk(cq.mu);
    if (cq.broken) return ncclSystemError;
    const uint64_t my_gen = cq.gen;
    cq.slots[(size_t)rank] = mine;
    cq.slots[(size_t)rank].present = true;
    if (++cq.arrived == cq.nranks) {
        complete(cq);
        return cq.res[(size_t)rank];
    }
    cq.cv.wait_until(lk, deadline(), [&] { return cq.gen != my_gen || cq.broken; });
    if (cq.gen != my_gen) return cq.res[(size_t)rank];
    if (!cq.broken) report_missing(cq, rank);
    cq.broken = true; /* its buffers are no longer held: no later completion may read them */
    cq.slots[(size_t)rank].present = false;
    cq.arrived--;
    cq.cv.notify_all();
    return ncclSystemError;
}

/* The rank's own checks: arguments, then memcheck and initcheck of its buffers. */
ncclResult_t local_checks(const void *send, void *recv, size_t count, int type, int op, int rank) {
    if (type == ncclFloat16 || type == ncclBfloat16) {
        kd_sim_report("nccl", "ncclAllReduce: datatype %d is not simulated", type);
        return ncclInvalidArgument;
    }
    if (type_size(type) == 0 || op < ncclSum || op >= ncclNumOps) return ncclInvalidArgument;
    if (count == 0) return ncclSuccess;
    if (!send || !recv) return ncclInvalidArgument;
    const size_t bytes = count * type_size(type);
    char who[64];
    snprintf(who, sizeof who, "ncclAllReduce rank %d sendbuff", rank);
    bool ok = kd_sim_dev_check(send, bytes, who) != 0;
    snprintf(who, sizeof who, "ncclAllReduce rank %d recvbuff", rank);
    ok = kd_sim_dev_check(recv, bytes, who) != 0 && ok;
    if (!ok) {
        kd_sim_set_error(cudaErrorIllegalAddress);
        return ncclUnhandledCudaError;
    }
    snprintf(who, sizeof who, "ncclAllReduce rank %d sendbuff", rank);
    return kd_sim_dev_check_init(send, bytes, who) ? ncclSuccess : ncclInvalidUsage;
}

/* ---- joining ----------------------------------------------------------------------------------
 */

/* Finds or creates the clique of `serial` and claims `rank` in it; NULL with *err set when the
 * id's rank count disagrees, the rank is taken, or the clique broke. Leaves cq->mu locked. */
clique *join(uint64_t serial, int nranks, int rank, ncclResult_t *err) {
    std::lock_guard<std::mutex> lk(g_pending_mu);
    if (!g_pending) g_pending = new std::map<uint64_t, clique *>;
    clique *&entry = (*g_pending)[serial];
    if (!entry) entry = clique_new(nranks);
    clique *cq = entry; /* entry dies with its map node when the id is spent */
    cq->mu.lock();
    *err = ncclSuccess;
    if (cq->broken)
        *err = ncclSystemError;
    else if (cq->nranks != nranks || cq->comms[(size_t)rank])
        *err = ncclInvalidUsage;
    if (*err == ncclInvalidUsage)
        kd_sim_report("nccl", "ncclCommInitRank: rank %d of %d: the id has %d ranks%s", rank,
                      nranks, cq->nranks, cq->comms[(size_t)rank] ? ", this one taken" : "");
    if (*err != ncclSuccess) {
        cq->mu.unlock();
        return nullptr;
    }
    if (cq->joined + 1 == nranks) g_pending->erase(serial); /* complete: the id is spent */
    return cq;
}

/* Waits (cq->mu held by lk) until every rank joined; on time-out withdraws `c`. */
ncclResult_t wait_joined(clique *cq, kd_sim_nccl_comm *c, std::unique_lock<std::mutex> &lk) {
    if (cq->joined == cq->nranks) {
        cq->cv.notify_all();
        return ncclSuccess;
    }
    cq->cv.wait_until(lk, deadline(), [&] { return cq->joined == cq->nranks || cq->broken; });
    if (cq->joined == cq->nranks) return ncclSuccess;
    if (!cq->broken)
        kd_sim_report("nccl",
                      "ncclCommInitRank: rank %d waited %d ms: only %d of %d ranks "
                      "joined",
                      c->rank, timeout_ms(), cq->joined, cq->nranks);
    cq->broken = true; /* the clique stays in the table, broken: later joiners fail at once */
    cq->comms[(size_t)c->rank] = nullptr;
    cq->joined--;
    cq->alive--;
    cq->cv.notify_all();
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live->erase(c);
    delete c;
    return ncclSystemError;
}

} /* namespace */

/* ==== the C API ================================================================================
 */

extern "C" {

KD_SIM_API ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return ncclInvalidArgument;
    const uint64_t serial = g_next_id.fetch_add(1);
    memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    memcpy(uniqueId->internal, ID_MAGIC, sizeof ID_MAGIC);
    memcpy(uniqueId->internal + sizeof ID_MAGIC, &serial, sizeof serial);
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                         int rank) {
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    *comm = nullptr;
    if (memcmp(commId.internal, ID_MAGIC, sizeof ID_MAGIC) != 0) {
        kd_sim_report("nccl", "ncclCommInitRank: the id was not made by ncclGetUniqueId");
        return ncclInvalidArgument;
    }
    uint64_t serial;
    memcpy(&serial, commId.internal + sizeof ID_MAGIC, sizeof serial);
    ncclResult_t err;
    clique *cq = join(serial, nranks, rank, &err);
    if (!cq) return err;
    std::unique_lock<std::mutex> lk(cq->mu, std::adopt_lock);
    kd_sim_nccl_comm *c = comm_new(cq, rank, 0);
    err = wait_joined(cq, c, lk);
    if (err == ncclSuccess) *comm = c;
    return err;
}

KD_SIM_API ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    if (!comms || ndev < 1) return ncclInvalidArgument;
    int ndevices = 0;
    if (cudaGetDeviceCount(&ndevices) != cudaSuccess) return ncclUnhandledCudaError;
    for (int i = 0; devlist && i < ndev; ++i)
        if (devlist[i] < 0 || devlist[i] >= ndevices) return ncclInvalidArgument;
    clique *cq = clique_new(ndev);
    std::lock_guard<std::mutex> lk(cq->mu);
    for (int r = 0; r < ndev; ++r) comms[r] = comm_new(cq, r, devlist ? devlist[r] : 0);
    return ncclSuccess;
}

/* NULL is a no-op (as in NCCL). The clique goes with its last communicator. */
KD_SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    ncclResult_t e = check_comm(comm, "ncclCommDestroy");
    if (e != ncclSuccess) return e;
    {
        std::lock_guard<std::mutex> g(g_live_mu);
        g_live->erase(comm);
    }
    clique *cq = comm->cq;
    bool last;
    {
        std::lock_guard<std::mutex> lk(cq->mu);
        cq->comms[(size_t)comm->rank] = nullptr;
        last = --cq->alive == 0 && cq->joined == cq->nranks;
    }
    delete comm;
    if (last) delete cq;
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    ncclResult_t e = check_comm(comm, "ncclCommCount");
    if (e != ncclSuccess) return e;
    if (!count) return ncclInvalidArgument;
    *count = comm->cq->nranks;
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    ncclResult_t e = check_comm(comm, "ncclCommUserRank");
    if (e != ncclSuccess) return e;
    if (!rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    ncclResult_t e = check_comm(comm, "ncclCommCuDevice");
    if (e != ncclSuccess) return e;
    if (!device) return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

KD_SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    ncclResult_t e = check_comm(comm, "ncclCommGetAsyncError");
    if (e != ncclSuccess) return e;
    if (!asyncError) return ncclInvalidArgument;
    std::lock_guard<std::mutex> lk(comm->cq->mu);
    *asyncError = comm->cq->broken ? ncclSystemError : ncclSuccess;
    return ncclSuccess;
}

KD_SIM_API const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error (a rank did not arrive in time)";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

KD_SIM_API ncclResult_t ncclGroupStart(void) { return ncclSuccess; }

KD_SIM_API ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

KD_SIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
    (void)stream; /* completes now, which is in stream order in the simulator */
    ncclResult_t e = check_comm(comm, "ncclAllReduce");
    if (e != ncclSuccess) return e;
    slot mine{};
    mine.send = sendbuff;
    mine.recv = recvbuff;
    mine.count = count;
    mine.type = (int)datatype;
    mine.op = (int)op;
    mine.local = local_checks(sendbuff, recvbuff, count, (int)datatype, (int)op, comm->rank);
    return arrive(*comm->cq, comm->rank, mine);
}

} /* extern "C" */
