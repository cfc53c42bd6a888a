/* Flag parsing helpers shared by the driver and every kernel benchmark. All errors are one
 * line on stderr naming the flag; the caller turns -1 into exit status 2. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

const char *kb_mode_name(kb_mode m) {
    switch (m) {
    case KB_MODE_FORWARD: return "forward";
    case KB_MODE_BACKWARD: return "backward";
    case KB_MODE_FULL: return "full";
    }
    return "?";
}

const char *kb_dtype_name(kdloss_dtype dt) {
    return kdloss_dtype_size(dt) ? kdloss_dtype_name(dt) : "?";
}

int kb_arg_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kdloss bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return -1;
}

int kb_divergence_arg(const char *kernel, const char *name, kdloss_divergence *d) {
    if (kdloss_divergence_from_name(name, d) == KDLOSS_OK) return 0;
    fprintf(stderr, "kdloss bench: %s: --divergence: unknown '%s' (one of:", kernel, name);
    for (int i = 0; i < KDLOSS_DIV_COUNT; i++)
        fprintf(stderr, " %s", kdloss_divergence_name((kdloss_divergence)i));
    fprintf(stderr, ")\n");
    return -1;
}

/* The value after a flag, or NULL after reporting that it is missing. A following "--x" is
 * taken as a missing value rather than swallowed, so "--bt --reps 3" reports --bt. */
static const char *flag_value(int argc, char **argv, int i, const char *flag) {
    if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] == '-')) {
        kb_arg_error("%s: missing value", flag);
        return NULL;
    }
    return argv[i + 1];
}

int kb_flag_i64(int argc, char **argv, int i, const char *flag, int64_t min, int64_t *out) {
    if (strcmp(argv[i], flag) != 0) return 0;
    const char *s = flag_value(argc, argv, i, flag);
    if (!s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') return kb_arg_error("%s: '%s' is not an integer", flag, s);
    if (errno == ERANGE) return kb_arg_error("%s: '%s' is out of range", flag, s);
    if (v < min) return kb_arg_error("%s: %lld is below the minimum %lld", flag, v, (long long)min);
    *out = (int64_t)v;
    return 2;
}

int kb_flag_double(int argc, char **argv, int i, const char *flag, double min, double max,
                   double *out) {
    if (strcmp(argv[i], flag) != 0) return 0;
    const char *s = flag_value(argc, argv, i, flag);
    if (!s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v))
        return kb_arg_error("%s: '%s' is not a finite number", flag, s);
    if (v < min || v > max) return kb_arg_error("%s: %g is outside [%g, %g]", flag, v, min, max);
    *out = v;
    return 2;
}

int kb_flag_str(int argc, char **argv, int i, const char *flag, const char **out) {
    if (strcmp(argv[i], flag) != 0) return 0;
    const char *s = flag_value(argc, argv, i, flag);
    if (!s) return -1;
    if (!*s) return kb_arg_error("%s: empty value", flag);
    *out = s;
    return 2;
}

int kb_flag_choice(int argc, char **argv, int i, const char *flag, const char *const *choices,
                   int n, int *out) {
    if (strcmp(argv[i], flag) != 0) return 0;
    const char *s = flag_value(argc, argv, i, flag);
    if (!s) return -1;
    for (int k = 0; k < n; k++) {
        if (strcmp(s, choices[k]) == 0) {
            *out = k;
            return 2;
        }
    }
    char list[256] = "";
    for (int k = 0; k < n; k++) {
        strncat(list, k ? "|" : "", sizeof list - strlen(list) - 1);
        strncat(list, choices[k], sizeof list - strlen(list) - 1);
    }
    return kb_arg_error("%s: unknown value '%s' (use %s)", flag, s, list);
}
