/* What the records and `kdloss info` say about the machine and the build. */
#include <ctype.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

/* Value of the first "key<spaces>: value" line of /proc/cpuinfo, or 0 if absent. */
static int cpuinfo_field(const char *key, char *out, size_t size) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    char line[512];
    size_t klen = strlen(key);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        char *colon = strchr(line + klen, ':');
        if (!colon) continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = '\0';
        snprintf(out, size, "%s", v);
        found = 1;
    }
    fclose(f);
    return found;
}

/* "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz" -> "intel-xeon-gold-6338-cpu": trademarks and the
 * clock suffix dropped, lower case, runs of other characters turned into one dash. */
static void slugify_cpu(const char *model, char *out, size_t size) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", model);
    char *at = strstr(tmp, " @ ");
    if (at) *at = '\0';
    static const char *const marks[] = {"(R)", "(r)", "(TM)", "(tm)"};
    for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
        char *m;
        while ((m = strstr(tmp, marks[k])) != NULL) memmove(m, m + strlen(marks[k]), strlen(m + strlen(marks[k])) + 1);
    }
    size_t o = 0;
    int dash = 0;
    for (const char *p = tmp; *p && o + 1 < size; p++) {
        if (isalnum((unsigned char)*p)) {
            if (dash && o > 0 && o + 2 < size) out[o++] = '-';
            out[o++] = (char)tolower((unsigned char)*p);
            dash = 0;
        } else {
            dash = 1;
        }
    }
    out[o] = '\0';
    if (o == 0) snprintf(out, size, "unknown-cpu");
}

static void vendor_name(char *out, size_t size) {
    char raw[32];
    if (!cpuinfo_field("vendor_id", raw, sizeof raw)) snprintf(raw, sizeof raw, "unknown");
    if (strcmp(raw, "AuthenticAMD") == 0) snprintf(out, size, "amd");
    else if (strcmp(raw, "GenuineIntel") == 0) snprintf(out, size, "intel");
    else snprintf(out, size, "%s", raw);
}

void kb_sysinfo_get(kb_sysinfo *s) {
    memset(s, 0, sizeof *s);
    if (!cpuinfo_field("model name", s->cpu_model, sizeof s->cpu_model))
        snprintf(s->cpu_model, sizeof s->cpu_model, "unknown");
    slugify_cpu(s->cpu_model, s->cpu_slug, sizeof s->cpu_slug);
    vendor_name(s->vendor, sizeof s->vendor);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    s->cores = n > 0 ? (int)n : 1;
    s->threads = omp_get_max_threads();
    s->isa = kdloss_cpu_isa_name(kdloss_cpu_get_isa());
    kdloss_gemm_info g;
    if (kdloss_gemm_query(KDLOSS_GEMM_AUTO, &g) == KDLOSS_OK)
        snprintf(s->gemm, sizeof s->gemm, "%s %s %s%s", g.name, g.version, g.kernel,
                 g.generic ? " (generic)" : "");
    else
        snprintf(s->gemm, sizeof s->gemm, "unknown");
#if defined(__clang__)
    snprintf(s->compiler, sizeof s->compiler, "clang %s", __clang_version__);
#elif defined(__GNUC__)
    snprintf(s->compiler, sizeof s->compiler, "gcc %s", __VERSION__);
#else
    snprintf(s->compiler, sizeof s->compiler, "unknown");
#endif
}
