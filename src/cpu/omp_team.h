/* Whether an OpenMP region can have more than one thread. libgomp mallocs a team for every
 * region of one thread (it keeps only larger teams for reuse), so a region opened under
 * OMP_NUM_THREADS=1, or in a forked child (dispatch.c makes it serial), would allocate on every
 * call, and libgomp exits when that allocation fails: the passes run without a region then, as
 * they do below their size thresholds. */
#ifndef KD_OMP_TEAM_H
#define KD_OMP_TEAM_H

#include <omp.h>

static inline int kd_omp_team(void) { return omp_get_max_threads() > 1; }

#endif
