/* kd_sim_scan: the kernel registry of the CUDA simulator (cudasim/).
 *
 *   build: cc -std=c11 -O2 -Wall -Wextra -Werror -o kd_sim_scan cudasim/tools/kd_sim_scan.c
 *   use:   kd_sim_scan OUT.cpp src/cuda/FILE.cu src/cuda/FILE.cuh ...  (all of src/cuda)
 *
 * Reads the CUDA sources and writes OUT.cpp, a C++ file that hands the simulator, at static
 * initialisation, every __global__ kernel and every KD_LAUNCH site of them (kd_sim_register,
 * declared in cudasim/include/kd_sim.h). The simulator needs the list ahead of time because it
 * only learns of a kernel when it is launched: with the list it can say which kernels and which
 * launch sites a test run never reached, and check a launch against the kernel's
 * __launch_bounds__. Prints "kd_sim_scan: N kernels, M launch sites".
 *
 * What it recognises (a lexer, not a C++ parser: enough for the style of src/cuda):
 *  - a kernel: `__global__` (outside comments, strings and preprocessor lines), then tokens up to
 *    the first identifier followed by `(`, which is the kernel's name; `__launch_bounds__(N, ...)`
 *    on the way gives N (an integer constant expression of literals and object-like #defines of
 *    the scanned files; 0 when absent). A prototype and its definition count once (name + file).
 *  - a launch site: the token KD_LAUNCH followed by `(` outside comments, strings and
 *    preprocessor lines (so the macro's own #define is no site). The kernel is the macro's
 *    variadic part (what follows its fourth top-level comma) reduced to its base identifier:
 *    `&ns::kd_cast_kernel<KDLOSS_BF16>` -> `kd_cast_kernel`.
 *
 * The line of a site is the line of the KD_LAUNCH token, because that is what __LINE__ inside the
 * macro's expansion reports with g++ (the simulator's compiler). Measured with g++ 12.2 and
 * clang 14 on a macro call whose arguments span lines:
 *     g++:     __LINE__ = the line of the macro's name (also when the call is itself an argument
 *              of another macro: then the line of the inner name);
 *     clang++: __LINE__ = the line of the call's closing parenthesis.
 * Both agree only when the name and the closing parenthesis share a line, so a KD_LAUNCH(...)
 * head that spans lines is an error here (the argument list after the head may wrap freely).
 *
 * Exits non-zero, with a message on stderr, on an unreadable file, a KD_LAUNCH whose kernel is
 * not among the scanned kernels, or anything it cannot read the way it expects. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers -------------------------------------------------------------------------- */

static const char *g_out_path; /* removed on failure, so a stale registry never survives */
static char *g_tmp_path;        /* the file being written, removed on failure */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kd_sim_scan: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static char *xstrndup(const char *s, size_t n) {
    char *d = xrealloc(NULL, n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static int is_id_start(int c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static int is_id_char(int c) { return is_id_start(c) || (c >= '0' && c <= '9'); }
static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* The name the simulator matches sites by: __FILE__ carries whatever path the build passed to
 * the compiler, so both sides keep only the base name. */
static const char *base_name(const char *path) {
    const char *b = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' || *p == '\\') b = p + 1;
    return b;
}

/* ---- reading a file: comments and literals blanked, lines kept ------------------------------ */

/* Returns the file's text with every comment and string / character literal replaced by spaces
 * (newlines kept, so offsets still map to the same lines), so that nothing in them is taken for
 * code. A comment is not a token boundary problem here: blanks separate tokens either way. */
static char *read_clean(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot read %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *s = xrealloc(NULL, cap);
    for (;;) {
        if (n == cap) s = xrealloc(s, cap *= 2);
        size_t got = fread(s + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) die("cannot read %s: %s", path, strerror(errno));
    fclose(f);
    s = xrealloc(s, n + 1);
    s[n] = '\0';
    if (strlen(s) != n) die("%s: contains a NUL byte (not a source file?)", path);

    enum { CODE, LINE_C, BLOCK_C, STR, CHR } st = CODE;
    int line = 1, start_line = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\n') line++;
        switch (st) {
        case CODE:
            if (c == '/' && s[i + 1] == '/') {
                st = LINE_C;
                s[i] = s[i + 1] = ' ';
                i++;
            } else if (c == '/' && s[i + 1] == '*') {
                st = BLOCK_C;
                start_line = line;
                s[i] = s[i + 1] = ' ';
                i++;
            } else if (c == '"' || c == '\'') {
                /* a digit separator (1'000) is no character literal */
                if (c == '\'' && i > 0 && is_id_char((unsigned char)s[i - 1]) &&
                    is_digit((unsigned char)s[i + 1]))
                    break;
                st = c == '"' ? STR : CHR;
                start_line = line;
                s[i] = ' ';
            }
            break;
        case LINE_C:
            /* a backslash-newline continues a // comment (translation phase 2) */
            if (c == '\n' && !(i > 0 && s[i - 1] == '\\')) st = CODE;
            else if (c != '\n') s[i] = ' ';
            break;
        case BLOCK_C:
            if (c == '*' && s[i + 1] == '/') {
                s[i] = s[i + 1] = ' ';
                i++;
                st = CODE;
            } else if (c != '\n') s[i] = ' ';
            break;
        case STR:
        case CHR:
            if (c == '\\' && s[i + 1] != '\0') {
                if (s[i + 1] == '\n') line++;
                else s[i + 1] = ' ';
                s[i] = ' ';
                i++;
            } else if ((st == STR && c == '"') || (st == CHR && c == '\'')) {
                s[i] = ' ';
                st = CODE;
            } else if (c == '\n') {
                die("%s:%d: unterminated %s literal", path, start_line,
                    st == STR ? "string" : "character");
            } else s[i] = ' ';
            break;
        }
    }
    if (st == BLOCK_C) die("%s:%d: unterminated /* comment", path, start_line);
    if (st == STR || st == CHR) die("%s:%d: unterminated literal", path, start_line);
    *len_out = n;
    return s;
}

/* ---- tokens --------------------------------------------------------------------------------- */

typedef struct tok {
    const char *p; /* into the cleaned text */
    int len;
    int line;
    int pp;      /* 0: code; else the number (1, 2, ...) of the preprocessor directive it is in */
    int pp_name; /* 1: the directive's name (define, include, if, ...) */
} tok;

typedef struct toks {
    tok *t;
    int n, cap;
} toks;

static int tok_is(const tok *t, const char *s) {
    return t->len == (int)strlen(s) && memcmp(t->p, s, (size_t)t->len) == 0;
}
static int tok_is_id(const tok *t) { return is_id_start((unsigned char)t->p[0]); }

/* Identifiers, numbers (pp-numbers), and punctuation one character at a time except `::`, which
 * the kernel-name reduction needs whole. Preprocessor directives (a `#` first on a line, up to
 * the end of the line and its backslash continuations) are marked, so #define bodies are told
 * apart from code. */
static toks tokenize(const char *s, size_t n) {
    toks T = {0};
    int line = 1, at_line_start = 1, in_pp = 0, npp = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '\n') {
            /* a directive ends at a newline not escaped by a backslash (CRLF files too) */
            if (!((i > 0 && s[i - 1] == '\\') || (i > 1 && s[i - 1] == '\r' && s[i - 2] == '\\')))
                in_pp = 0;
            at_line_start = 1;
            line++;
            i++;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\\') {
            i++;
            continue;
        }
        tok t = {s + i, 1, line, in_pp, 0};
        if (at_line_start && c == '#' && !in_pp) {
            in_pp = t.pp = ++npp;
        } else if (is_id_start((unsigned char)c)) {
            size_t j = i;
            while (j < n && is_id_char((unsigned char)s[j])) j++;
            t.len = (int)(j - i);
        } else if (is_digit((unsigned char)c) || (c == '.' && is_digit((unsigned char)s[i + 1]))) {
            size_t j = i;
            while (j < n &&
                   (is_id_char((unsigned char)s[j]) || s[j] == '.' ||
                    (s[j] == '\'' && is_digit((unsigned char)s[j + 1])) ||
                    ((s[j] == '+' || s[j] == '-') &&
                     (s[j - 1] == 'e' || s[j - 1] == 'E' || s[j - 1] == 'p' || s[j - 1] == 'P'))))
                j++;
            t.len = (int)(j - i);
        } else if (c == ':' && s[i + 1] == ':') {
            t.len = 2;
        }
        at_line_start = 0;
        if (T.n > 0 && in_pp && T.t[T.n - 1].pp == in_pp && T.t[T.n - 1].len == 1 &&
            T.t[T.n - 1].p[0] == '#' && tok_is_id(&t))
            t.pp_name = 1;
        if (T.n == T.cap)
            T.t = xrealloc(T.t, sizeof(tok) * (size_t)(T.cap = T.cap ? 2 * T.cap : 4096));
        T.t[T.n++] = t;
        i += (size_t)t.len;
    }
    return T;
}

/* Index of the `)` matching the `(` at index open, or -1. Counts only parentheses: that is how
 * the preprocessor and a call's argument list nest. */
static int match_paren(const toks *T, int open) {
    int depth = 0;
    for (int i = open; i < T->n; i++) {
        if (T->t[i].len != 1) continue;
        if (T->t[i].p[0] == '(') depth++;
        else if (T->t[i].p[0] == ')' && --depth == 0) return i;
    }
    return -1;
}

/* ---- object-like #defines, for __launch_bounds__(NAME) ------------------------------------- */

typedef struct macro {
    char *name;
    char *body; /* cleaned text of the replacement list, trimmed */
    const char *file;
    int line;
} macro;

static macro *g_macros;
static int g_nmacros;

static void collect_defines(const toks *T, const char *file) {
    for (int i = 0; i + 1 < T->n; i++) {
        if (!T->t[i].pp_name || !tok_is(&T->t[i], "define")) continue;
        const tok *name = &T->t[i + 1];
        if (name->pp != T->t[i].pp || !tok_is_id(name)) continue;
        /* function-like when `(` follows the name with no space: not a constant */
        if (name->p[name->len] == '(') continue;
        int j = i + 2;
        while (j < T->n && T->t[j].pp == name->pp) j++;
        /* body: tokens i+2 .. j-1, re-joined with single spaces (continuation lines included) */
        size_t cap = 16, n = 0;
        char *body = xrealloc(NULL, cap);
        for (int k = i + 2; k < j; k++) {
            size_t need = n + (size_t)T->t[k].len + 2;
            if (need > cap) body = xrealloc(body, cap = 2 * need);
            if (n) body[n++] = ' ';
            memcpy(body + n, T->t[k].p, (size_t)T->t[k].len);
            n += (size_t)T->t[k].len;
        }
        body[n] = '\0';
        g_macros = xrealloc(g_macros, sizeof(macro) * (size_t)(g_nmacros + 1));
        g_macros[g_nmacros++] =
            (macro){xstrndup(name->p, (size_t)name->len), body, file, name->line};
    }
}

/* The definition of name seen by a file: its own, else the one the other scanned files agree
 * on (a header's). NULL when none; dies when other files disagree. */
static const macro *find_macro(const char *name, size_t len, const char *file) {
    const macro *own = NULL, *other = NULL;
    for (int i = 0; i < g_nmacros; i++) {
        const macro *m = &g_macros[i];
        if (strlen(m->name) != len || memcmp(m->name, name, len) != 0) continue;
        if (m->file == file) own = m;
        else if (!other) other = m;
        else if (strcmp(other->body, m->body) != 0)
            die("%.*s is defined differently in %s:%d and %s:%d: cannot tell which one %s sees",
                (int)len, name, other->file, other->line, m->file, m->line, file);
    }
    return own ? own : other;
}

/* A constant expression of integer literals, object-like macros, + - * / % and parentheses:
 * what a __launch_bounds__ argument can reasonably be. */
typedef struct cexpr {
    const char *s;
    const char *file;
    int line;
    int depth; /* macro expansion depth, against self-reference */
} cexpr;

static long long cexpr_add(cexpr *e);

static void cexpr_skip(cexpr *e) {
    while (*e->s == ' ') e->s++;
}

static long long cexpr_eval_text(const char *text, const char *file, int line, int depth);

static long long cexpr_primary(cexpr *e) {
    cexpr_skip(e);
    const char *s = e->s;
    if (*s == '(') {
        e->s++;
        long long v = cexpr_add(e);
        cexpr_skip(e);
        if (*e->s != ')') die("%s:%d: __launch_bounds__: ')' expected", e->file, e->line);
        e->s++;
        return v;
    }
    if (*s == '-' || *s == '+') {
        e->s++;
        long long v = cexpr_primary(e);
        return *s == '-' ? -v : v;
    }
    if (is_digit((unsigned char)*s)) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 0);
        if (errno) die("%s:%d: __launch_bounds__: number out of range", e->file, e->line);
        while (*end == 'u' || *end == 'U' || *end == 'l' || *end == 'L') end++;
        if (is_id_char((unsigned char)*end) || *end == '.')
            die("%s:%d: __launch_bounds__: not an integer: %s", e->file, e->line, s);
        e->s = end;
        return v;
    }
    if (is_id_start((unsigned char)*s)) {
        const char *b = s;
        while (is_id_char((unsigned char)*s)) s++;
        const macro *m = find_macro(b, (size_t)(s - b), e->file);
        if (!m)
            die("%s:%d: __launch_bounds__: %.*s is no #define of the scanned files (pass the "
                "headers that define it too)",
                e->file, e->line, (int)(s - b), b);
        if (e->depth > 32)
            die("%s:%d: __launch_bounds__: %s expands without end", e->file, e->line, m->name);
        e->s = s;
        return cexpr_eval_text(m->body, m->file, m->line, e->depth + 1);
    }
    die("%s:%d: __launch_bounds__: cannot evaluate '%s'", e->file, e->line, s);
    return 0;
}

static long long cexpr_mul(cexpr *e) {
    long long v = cexpr_primary(e);
    for (;;) {
        cexpr_skip(e);
        char op = *e->s;
        if (op != '*' && op != '/' && op != '%') return v;
        e->s++;
        long long r = cexpr_primary(e);
        if (op != '*' && r == 0)
            die("%s:%d: __launch_bounds__: division by zero", e->file, e->line);
        v = op == '*' ? v * r : op == '/' ? v / r : v % r;
    }
}

static long long cexpr_add(cexpr *e) {
    long long v = cexpr_mul(e);
    for (;;) {
        cexpr_skip(e);
        char op = *e->s;
        if (op != '+' && op != '-') return v;
        e->s++;
        long long r = cexpr_mul(e);
        v = op == '+' ? v + r : v - r;
    }
}

static long long cexpr_eval_text(const char *text, const char *file, int line, int depth) {
    cexpr e = {text, file, line, depth};
    long long v = cexpr_add(&e);
    cexpr_skip(&e);
    if (*e.s) die("%s:%d: __launch_bounds__: cannot evaluate '%s'", file, line, text);
    return v;
}

/* ---- the scan ------------------------------------------------------------------------------- */

typedef struct kernel {
    char *name;
    const char *file; /* base name */
    const char *path;
    int line;
    int has_body;
    char *lb_text; /* first __launch_bounds__ argument, NULL if none */
    int lb_line;
    int launch_bounds;
} kernel;

typedef struct site {
    const char *file; /* base name */
    const char *path;
    int line;
    char *kernel;
} site;

static kernel *g_kernels;
static int g_nkernels;
static site *g_sites;
static int g_nsites;

/* Joins tokens [a, b) with single spaces. */
static char *join_toks(const toks *T, int a, int b) {
    size_t n = 0;
    for (int k = a; k < b; k++) n += (size_t)T->t[k].len + 1;
    char *s = xrealloc(NULL, n + 1), *w = s;
    for (int k = a; k < b; k++) {
        if (k > a) *w++ = ' ';
        memcpy(w, T->t[k].p, (size_t)T->t[k].len);
        w += T->t[k].len;
    }
    *w = '\0';
    return s;
}

static void add_kernel(const toks *T, int gi, const char *path) {
    int i = gi + 1, name = -1, lb_a = -1, lb_b = -1;
    for (; i + 1 < T->n && !T->t[i].pp; i++) {
        const tok *t = &T->t[i];
        if (t->len == 1 && strchr(";{}=", t->p[0])) break;
        if (tok_is(t, "__launch_bounds__")) {
            if (!tok_is(&T->t[i + 1], "("))
                die("%s:%d: __launch_bounds__ without '('", path, t->line);
            int close = match_paren(T, i + 1);
            if (close < 0) die("%s:%d: __launch_bounds__( not closed", path, t->line);
            lb_a = i + 2;
            lb_b = lb_a;
            int depth = 0;
            while (lb_b < close && !(depth == 0 && tok_is(&T->t[lb_b], ","))) {
                if (tok_is(&T->t[lb_b], "(")) depth++;
                if (tok_is(&T->t[lb_b], ")")) depth--;
                lb_b++;
            }
            if (lb_b == lb_a) die("%s:%d: empty __launch_bounds__()", path, t->line);
            i = close;
            continue;
        }
        if (tok_is_id(t) && tok_is(&T->t[i + 1], "(")) {
            name = i;
            break;
        }
    }
    if (name < 0) die("%s:%d: __global__ without a function name after it", path, T->t[gi].line);
    int close = match_paren(T, name + 1);
    if (close < 0) die("%s:%d: parameter list of %.*s not closed", path, T->t[name].line,
                       T->t[name].len, T->t[name].p);
    /* after the parameters: `{` is a definition, `;` a prototype (nothing else is expected of a
     * kernel: no trailing return type, no const) */
    int has_body = close + 1 < T->n && tok_is(&T->t[close + 1], "{");
    if (!has_body && !(close + 1 < T->n && tok_is(&T->t[close + 1], ";")))
        die("%s:%d: kernel %.*s: neither '{' nor ';' after its parameters", path, T->t[name].line,
            T->t[name].len, T->t[name].p);

    char *nm = xstrndup(T->t[name].p, (size_t)T->t[name].len);
    char *lb = lb_a >= 0 ? join_toks(T, lb_a, lb_b) : NULL;
    const char *file = base_name(path);
    for (int k = 0; k < g_nkernels; k++) {
        kernel *K = &g_kernels[k];
        if (strcmp(K->name, nm) != 0 || strcmp(K->file, file) != 0) continue;
        /* the same kernel again: a prototype and its definition (or a second prototype) */
        if (has_body && K->has_body)
            die("%s:%d: kernel %s defined twice in %s (first at line %d); overloads are not "
                "supported by the registry",
                path, T->t[name].line, nm, file, K->line);
        if (has_body) { /* the definition's line is the one that names the kernel's code */
            K->line = T->t[name].line;
            K->has_body = 1;
        }
        if (lb && !K->lb_text) {
            K->lb_text = lb;
            K->lb_line = T->t[name].line;
        } else free(lb);
        free(nm);
        return;
    }
    g_kernels = xrealloc(g_kernels, sizeof(kernel) * (size_t)(g_nkernels + 1));
    g_kernels[g_nkernels++] = (kernel){nm, file, path, T->t[name].line, has_body, lb,
                                       T->t[name].line, 0};
}

/* nargs: 5 for KD_LAUNCH, 6 for KD_LAUNCH_CLUSTER (the cluster size before the kernel) */
static void add_site(const toks *T, int li, const char *path, int nargs) {
    const tok *kt = &T->t[li];
    int open = li + 1, close = match_paren(T, open);
    if (close < 0) die("%s:%d: KD_LAUNCH( not closed", path, kt->line);
    if (T->t[close].line != kt->line)
        die("%s:%d: the KD_LAUNCH(...) head spans lines %d-%d: keep it on one line (g++ reports "
            "the line of KD_LAUNCH, clang the line of its ')': only one line makes both the site)",
            path, kt->line, kt->line, T->t[close].line);
    /* the variadic part: after the fourth comma at parenthesis depth 0 (the preprocessor splits
     * the template arguments' commas too; __VA_ARGS__ takes them all back) */
    int commas = 0, depth = 0, va = -1;
    for (int i = open + 1; i < close; i++) {
        if (tok_is(&T->t[i], "(")) depth++;
        else if (tok_is(&T->t[i], ")")) depth--;
        else if (depth == 0 && tok_is(&T->t[i], ",") && ++commas == nargs - 1) {
            va = i + 1;
            break;
        }
    }
    if (va < 0 || va >= close)
        die("%s:%d: KD_LAUNCH needs 5 arguments (grid, block, smem, stream, kernel), "
            "KD_LAUNCH_CLUSTER 6 (the cluster size before the kernel)", path, kt->line);
    /* base identifier: the last identifier outside template arguments; drops `&`, `ns::` and
     * `<...>` (`>>` is two tokens here, so it closes two; a `<` or `>` in parentheses is a
     * comparison) */
    int angle = 0, id = -1;
    depth = 0;
    for (int i = va; i < close; i++) {
        const tok *t = &T->t[i];
        if (tok_is(t, "(")) depth++;
        else if (tok_is(t, ")")) depth--;
        else if (depth > 0) continue;
        else if (tok_is(t, "<")) angle++;
        else if (tok_is(t, ">")) angle--;
        else if (angle == 0 && tok_is_id(t)) id = i;
    }
    if (id < 0 || angle != 0) {
        char *txt = join_toks(T, va, close);
        die("%s:%d: KD_LAUNCH: cannot find the kernel's name in '%s'", path, kt->line, txt);
    }
    g_sites = xrealloc(g_sites, sizeof(site) * (size_t)(g_nsites + 1));
    g_sites[g_nsites++] = (site){base_name(path), path, kt->line,
                                 xstrndup(T->t[id].p, (size_t)T->t[id].len)};
}

static void scan_file(const toks *T, const char *path) {
    for (int i = 0; i < T->n; i++) {
        const tok *t = &T->t[i];
        if (t->pp) continue; /* #define KD_LAUNCH(...), #define X __global__, ... */
        if (tok_is(t, "__global__")) add_kernel(T, i, path);
        else if (tok_is(t, "KD_LAUNCH") && i + 1 < T->n && tok_is(&T->t[i + 1], "("))
            add_site(T, i, path, 5);
        else if (tok_is(t, "KD_LAUNCH_CLUSTER") && i + 1 < T->n && tok_is(&T->t[i + 1], "("))
            add_site(T, i, path, 6);
    }
}

/* ---- output --------------------------------------------------------------------------------- */

static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static void write_out(const char *out, int nfiles, char **files) {
    size_t n = strlen(out);
    char *tmp = g_tmp_path = xrealloc(NULL, n + 8);
    snprintf(tmp, n + 8, "%s.tmp", out);
    FILE *f = fopen(tmp, "w");
    if (!f) die("cannot write %s: %s", tmp, strerror(errno));
    fputs("/* Generated by cudasim/tools/kd_sim_scan.c: the simulator's registry of the kernels\n"
          " * and KD_LAUNCH sites of",
          f);
    int col = 25;
    for (int i = 0; i < nfiles; i++) {
        const char *b = base_name(files[i]);
        if (col + 1 + (int)strlen(b) > 96) {
            fputs("\n *", f);
            col = 2;
        }
        col += fprintf(f, " %s", b);
    }
    fputs(".\n * Do not edit: the build writes it anew. */\n#include \"kd_sim.h\"\n\n", f);

    fputs("static const kd_sim_kernel_info kd_sim_scan_kernels[] = {\n", f);
    for (int i = 0; i < g_nkernels; i++) {
        fputs("    {", f);
        put_str(f, g_kernels[i].name);
        fputs(", ", f);
        put_str(f, g_kernels[i].file);
        fprintf(f, ", %d, %d},\n", g_kernels[i].line, g_kernels[i].launch_bounds);
    }
    if (!g_nkernels) fputs("    {0, 0, 0, 0},\n", f); /* C++ has no empty arrays */
    fputs("};\n\nstatic const kd_sim_site_info kd_sim_scan_sites[] = {\n", f);
    for (int i = 0; i < g_nsites; i++) {
        fputs("    {", f);
        put_str(f, g_sites[i].file);
        fprintf(f, ", %d, ", g_sites[i].line);
        put_str(f, g_sites[i].kernel);
        fputs("},\n", f);
    }
    if (!g_nsites) fputs("    {0, 0, 0},\n", f);
    fprintf(f,
            "};\n\n"
            "namespace {\n"
            "struct kd_sim_scan_registrar {\n"
            "    kd_sim_scan_registrar() {\n"
            "        kd_sim_register(kd_sim_scan_kernels, %d, kd_sim_scan_sites, %d);\n"
            "    }\n"
            "};\n"
            "const kd_sim_scan_registrar kd_sim_scan_registrar_instance;\n"
            "}  // namespace\n",
            g_nkernels, g_nsites);
    if (fflush(f) != 0 || ferror(f) || fclose(f) != 0)
        die("cannot write %s: %s", tmp, strerror(errno));
    /* rename: a reader (the compiler of a parallel build) never sees half a file */
    if (rename(tmp, out) != 0) die("cannot rename %s to %s: %s", tmp, out, strerror(errno));
    g_tmp_path = NULL;
    free(tmp);
}

static void remove_out(void) {
    if (g_tmp_path) remove(g_tmp_path);
    if (g_out_path) remove(g_out_path);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: kd_sim_scan OUT.cpp FILE.cu|FILE.cuh...\n");
        return 2;
    }
    /* OUT is removed when the scan fails: make sure it is no source given in the wrong place */
    if (!ends_with(argv[1], ".cpp")) {
        fprintf(stderr, "kd_sim_scan: error: the output %s must be a .cpp file\n", argv[1]);
        return 2;
    }
    g_out_path = argv[1];
    atexit(remove_out); /* cleared on success: a failed scan leaves no OUT.cpp */
    int nf = argc - 2;
    char **files = argv + 2;
    /* file scope, not main's: the kernels and sites point into them to the end */
    static char **text;
    static toks *T;
    text = xrealloc(NULL, sizeof(char *) * (size_t)nf);
    T = xrealloc(NULL, sizeof(toks) * (size_t)nf);
    for (int i = 0; i < nf; i++) {
        size_t n;
        text[i] = read_clean(files[i], &n);
        T[i] = tokenize(text[i], n);
        collect_defines(&T[i], files[i]);
    }
    for (int i = 0; i < nf; i++) scan_file(&T[i], files[i]);

    /* launch bounds, once every file's #defines are known (headers may come last) */
    for (int k = 0; k < g_nkernels; k++) {
        kernel *K = &g_kernels[k];
        if (!K->lb_text) continue;
        long long v = cexpr_eval_text(K->lb_text, K->path, K->lb_line, 0);
        if (v <= 0 || v > 1 << 20)
            die("%s:%d: kernel %s: __launch_bounds__(%s) = %lld is no thread count", K->path,
                K->lb_line, K->name, K->lb_text, v);
        K->launch_bounds = (int)v;
    }
    /* every site must name a scanned kernel (any file: headers hold shared kernels) */
    for (int s = 0; s < g_nsites; s++) {
        int found = 0;
        for (int k = 0; k < g_nkernels && !found; k++)
            found = strcmp(g_kernels[k].name, g_sites[s].kernel) == 0;
        if (!found)
            die("%s:%d: KD_LAUNCH of %s, which is no __global__ kernel of the scanned files",
                g_sites[s].path, g_sites[s].line, g_sites[s].kernel);
    }

    write_out(argv[1], nf, files);
    g_out_path = NULL;
    printf("kd_sim_scan: %d kernels, %d launch sites\n", g_nkernels, g_nsites);
    return 0;
}
