/* The `kdloss` command: `bench` (tools/bench_*.c), `info`, and help. Exit status: 0 success,
 * 1 a library call or the machine failed, 2 bad command-line arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "bench.h"
#include "bench_gemm_floor.h"
#include "kdloss.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kdloss COMMAND [args]\n"
            "commands:\n"
            "  bench KERNEL [flags]   time a loss kernel (kdloss bench --help, --list)\n"
            "  info                   version, CPU, threads, code path, GEMM providers, compiler\n"
            "  --help                 this text\n"
            "  --version              the library version\n");
}

/* `kdloss info`: what a benchmark record's environment would say, plus the ISA choices. */
static int info(void) {
    kb_sysinfo s;
    kb_sysinfo_get(&s);
    struct utsname u;
    const char *arch = uname(&u) == 0 ? u.machine : "unknown";
    const char *forced = getenv("KDLOSS_CPU_ISA");
    printf("kdloss      %s\n", kdloss_version());
    printf("cpu         %s (vendor %s, %s)\n", s.cpu_model, s.vendor, arch);
    printf("cores       %d online, %d OpenMP threads\n", s.cores, s.threads);
    printf("isa path    %s", s.isa);
    if (forced) printf(" (KDLOSS_CPU_ISA=%s)", forced);
    printf("; supported:");
    static const kdloss_cpu_isa all[] = {KDLOSS_ISA_SCALAR, KDLOSS_ISA_AVX2, KDLOSS_ISA_AVX512};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        if (kdloss_cpu_isa_supported(all[k])) printf(" %s", kdloss_cpu_isa_name(all[k]));
    printf("\n");
    printf("compiler    %s\n", s.compiler);
    printf("cuda        %s\n", kdloss_cuda_available() ? "available" : "not available");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "bench") == 0) return kb_bench_main(argc - 1, argv + 1);
    if (strcmp(cmd, "__gemm-floor") == 0) return kb_floor_child_main(argc, argv);
    if (strcmp(cmd, "info") == 0) {
        if (argc == 2) return info();
        fprintf(stderr, "kdloss info: unexpected argument '%s'\n", argv[2]);
        return 2;
    }
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        if (argc == 2) kb_bench_usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("kdloss %s\n", kdloss_version());
        return 0;
    }
    fprintf(stderr, "kdloss: unknown command '%s' (see kdloss --help)\n", cmd);
    return 2;
}
