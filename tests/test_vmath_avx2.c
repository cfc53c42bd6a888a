#define KD_ISA_AVX2 1
#include "vmath_check.h"

int main(void) {
    if (!kdloss_cpu_isa_supported(KDLOSS_ISA_AVX2)) {
        printf("skipped: this CPU has no AVX2\n0 passed, 0 failed\n");
        return 0;
    }
    return run_vmath_checks("test_vmath_avx2");
}
