/* Run-time choice of the CPU code path (BLIS/SLEEF style): each op family compiles one
 * generic source per instruction set and asks kd_cpu_isa() which one to call. */
#ifndef KDLOSS_CPU_DISPATCH_H
#define KDLOSS_CPU_DISPATCH_H

#include "kdloss.h"

/* The path in force (never KDLOSS_ISA_AUTO): forced by kdloss_cpu_set_isa(), else by the
 * environment variable KDLOSS_CPU_ISA, else the best the CPU supports. */
kdloss_cpu_isa kd_cpu_isa(void);

#endif
