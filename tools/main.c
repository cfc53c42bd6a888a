/* The `kdloss` command: `bench` (tools/bench_*.c), `info`, and help. Exit status: 0 success,
 * 1 a library call or the machine failed, 2 bad command-line arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <omp.h>

#include "bench.h"
#include "bench_gemm_floor.h"
#include "kdloss.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kdloss COMMAND [args]\n"
            "commands:\n"
            "  bench KERNEL [flags]   time a loss kernel (kdloss bench --help, --list)\n"
            "  info                   version, CPU, threads, code path, GEMM providers, bf16 GEMM\n"
            "                         choice, compiler\n"
            "  divergences            the divergence names, one a line (the library's registry)\n"
            "  --help                 this text\n"
            "  --version              the library version\n");
}

/* GFLOP/s of a 2048 x 4096 x 1024 fp32 product (17 GFLOP) with `p`: best of 3 after a
 * warm-up; < 0 if it failed. */
static double sgemm_gflops(kdloss_gemm_provider p) {
    const int64_t m = 2048, n = 4096, k = 1024;
    float *a = malloc(sizeof(float) * (size_t)(m * k)), *b = malloc(sizeof(float) * (size_t)(n * k));
    float *c = malloc(sizeof(float) * (size_t)(m * n));
    double best = -1.0;
    if (a && b && c) {
        for (int64_t i = 0; i < m * k; i++) a[i] = (float)(i % 13) * 0.01f;
        for (int64_t i = 0; i < n * k; i++) b[i] = (float)(i % 7) * 0.01f;
        for (int r = 0; r < 4; r++) {
            double t0 = kb_now_ns();
            if (kdloss_gemm_f32(p, 0, 1, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n) != KDLOSS_OK) {
                best = -1.0;
                break;
            }
            double gf = 2.0 * (double)(m * n * k) / (kb_now_ns() - t0);
            if (r > 0 && gf > best) best = gf;
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* One line per GEMM provider kdloss can load, the one in use first. */
static void gemm_info(void) {
    kdloss_gemm_info use, g;
    if (kdloss_gemm_query(KDLOSS_GEMM_AUTO, &use) != KDLOSS_OK) {
        printf("gemm        none loadable\n");
        return;
    }
    static const kdloss_gemm_provider all[] = {KDLOSS_GEMM_ONEDNN, KDLOSS_GEMM_BUILTIN,
                                               KDLOSS_GEMM_OPENBLAS};
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            if ((all[i] == use.provider) != (pass == 0)) continue;
            if (kdloss_gemm_query(all[i], &g) != KDLOSS_OK) continue;
            double gf = sgemm_gflops(all[i]);
            printf("gemm        %-8s %-7s kernel %s%s; sgemm 2048x4096x1024 %s%.0f GFLOP/s on %d "
                   "threads%s%s%s\n",
                   g.name, g.version, g.kernel, g.generic ? " (GENERIC on this CPU)" : "",
                   gf < 0 ? "FAILED " : "", gf < 0 ? 0.0 : gf, omp_get_max_threads(),
                   pass == 0 ? "; in use" : "",
                   g.thread_independent ? ", thread-count independent" : "",
                   pass == 0 ? (g.bf16_native ? ", bf16 native" : ", bf16 widened to fp32") : "");
        }
    }
}

/* The bf16 GEMM choice (kdloss_gemm_bf16_query): both measured rates and what runs. */
static void bf16_info(void) {
    kdloss_bf16_gemm_info b;
    if (kdloss_gemm_bf16_query(&b) != KDLOSS_OK) return;
    static const char *const modes[] = {"auto", "widen", "native"};
    printf("bf16 gemm   %lldx%lldx%lld on 1 thread: native bf16 ", (long long)b.m,
           (long long)b.n, (long long)b.k);
    if (b.native_gflops > 0) printf("%.1f GFLOP/s (%s)", b.native_gflops, b.kernel);
    else if (b.available) printf("not timed (%s)", b.kernel);
    else printf("not available (%s)", strncmp(b.kernel, "none (no oneDNN", 15) == 0
                                          ? "built without oneDNN"
                                          : "oneDNN has no bf16 matmul for this CPU");
    printf(", widen + sgemm %.1f GFLOP/s", b.widen_gflops);
    if (b.native_gflops > 0 && b.widen_gflops > 0)
        printf(" (native %.2fx)", b.native_gflops / b.widen_gflops);
    printf("; measured choice %s (native needs >= %.2fx); mode %s: %s, backward %s\n",
           b.auto_native ? "NATIVE" : "WIDEN", b.margin, modes[b.mode],
           b.native ? "native" : "widened", b.grad_native ? "native from bf16 dZ" :
           "fp32 dZ, widened operands");
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
    for (int k = KDLOSS_ISA_SCALAR; k < KDLOSS_ISA_COUNT; k++) /* the registry, in enum order */
        if (kdloss_cpu_isa_supported((kdloss_cpu_isa)k))
            printf(" %s", kdloss_cpu_isa_name((kdloss_cpu_isa)k));
    printf("\n");
    gemm_info();
    bf16_info();
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
    if (strcmp(cmd, "divergences") == 0) {
        for (int i = 0; i < KDLOSS_DIV_COUNT; i++)
            printf("%s\n", kdloss_divergence_name((kdloss_divergence)i));
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("kdloss %s\n", kdloss_version());
        return 0;
    }
    fprintf(stderr, "kdloss: unknown command '%s' (see kdloss --help)\n", cmd);
    return 2;
}
