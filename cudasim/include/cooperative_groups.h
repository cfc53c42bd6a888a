/* The simulator's cooperative_groups: the thread-block cluster of sm_90 (this_cluster()), what
 * src/cuda uses of CUDA's header. Calls go to the simulator's scheduler (sim_exec.cpp):
 * sync() is a barrier of every thread of every block of the cluster, map_shared_rank() maps an
 * address in this block's dynamic shared memory to the same offset in another block's
 * (distributed shared memory; memcheck checks the bounds, racecheck does not see these). */
#ifndef KD_SIM_COOPERATIVE_GROUPS_H
#define KD_SIM_COOPERATIVE_GROUPS_H

#include "cuda_runtime.h"

namespace cooperative_groups {

struct cluster_group {
    void sync() const { kd_sim_cluster_sync(__FILE__, __LINE__); }
    unsigned block_rank() const { return kd_sim_cluster_rank(); }
    unsigned num_blocks() const { return kd_sim_cluster_size(); }
    template <class T>
    T *map_shared_rank(T *p, unsigned rank) const {
        return (T *)kd_sim_map_shared_rank((const void *)p, rank);
    }
};

static inline cluster_group this_cluster() { return cluster_group(); }

} /* namespace cooperative_groups */

#endif
