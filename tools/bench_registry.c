/* The one list of benchmarked kernels. To add one: define `const kb_kernel kb_kernel_<name>`
 * in tools/bench_<name>.c, then declare it and add it to kb_kernels[] below (see bench.h). */
#include "bench.h"

extern const kb_kernel kb_kernel_kl_div;
extern const kb_kernel kb_kernel_jsd;
extern const kb_kernel kb_kernel_distill;
extern const kb_kernel kb_kernel_distill_logits;
extern const kb_kernel kb_kernel_distill_jsd;
extern const kb_kernel kb_kernel_topk_distill;

const kb_kernel *const kb_kernels[] = {
    &kb_kernel_kl_div,
    &kb_kernel_jsd,
    &kb_kernel_distill,
    &kb_kernel_distill_logits,
    &kb_kernel_distill_jsd,
    &kb_kernel_topk_distill,
    NULL,
};
