/* The vector exp / log / log1p / tanh accuracy checks (vmath_check.h), compiled once per ISA with
 * a vector layer as test_vmath_<name> (CMakeLists.txt, cmake/isas.cmake: KD_ISA_NAME and the
 * layer defined); skips itself on a CPU without that ISA. */
#include "vmath_check.h"

#define KT_STR_(x) #x
#define KT_STR(x) KT_STR_(x)

int main(void) {
    const char *isa = KT_STR(KD_ISA_NAME);
    int supported = 0;
    for (int i = KDLOSS_ISA_SCALAR; i < KDLOSS_ISA_COUNT; i++)
        if (!strcmp(kdloss_cpu_isa_name((kdloss_cpu_isa)i), isa))
            supported = kdloss_cpu_isa_supported((kdloss_cpu_isa)i);
    if (!supported) {
        printf("skipped: this CPU has no %s\n0 passed, 0 failed\n", isa);
        return 0;
    }
    return run_vmath_checks("test_vmath_" KT_STR(KD_ISA_NAME));
}
