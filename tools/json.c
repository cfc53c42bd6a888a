#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sha256.h"

typedef enum { KJ_NULL, KJ_BOOL, KJ_INT, KJ_NUM, KJ_STR, KJ_OBJ, KJ_ARR } kj_type;

struct kj {
    kj_type type;
    char *key;         /* set while the value is a member of an object */
    int64_t i;         /* KJ_INT, KJ_BOOL */
    double d;          /* KJ_NUM */
    char *s;           /* KJ_STR */
    kj *first, *last;  /* children of KJ_OBJ / KJ_ARR, in insertion order */
    kj *next;          /* sibling */
    size_t n;          /* number of children */
};

static void *xalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "kdloss: out of memory\n");
        exit(1);
    }
    return p;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xalloc(n);
    memcpy(p, s, n);
    return p;
}

static kj *node(kj_type t) {
    kj *v = xalloc(sizeof *v);
    v->type = t;
    return v;
}

kj *kj_obj(void) { return node(KJ_OBJ); }
kj *kj_arr(void) { return node(KJ_ARR); }

kj *kj_str(const char *s) {
    kj *v = node(KJ_STR);
    v->s = xstrdup(s ? s : "");
    return v;
}

kj *kj_int(int64_t i) {
    kj *v = node(KJ_INT);
    v->i = i;
    return v;
}

kj *kj_num(double d) {
    if (!isfinite(d)) return node(KJ_NULL);
    kj *v = node(KJ_NUM);
    v->d = d;
    return v;
}

kj *kj_bool(int b) {
    kj *v = node(KJ_BOOL);
    v->i = b != 0;
    return v;
}

static void append(kj *parent, kj *val) {
    if (parent->last) parent->last->next = val;
    else parent->first = val;
    parent->last = val;
    parent->n++;
}

kj *kj_put(kj *obj, const char *key, kj *val) {
    val->key = xstrdup(key);
    append(obj, val);
    return val;
}

kj *kj_push(kj *arr, kj *val) {
    append(arr, val);
    return val;
}

void kj_free(kj *v) {
    if (!v) return;
    kj *c = v->first;
    while (c) {
        kj *next = c->next;
        kj_free(c);
        c = next;
    }
    free(v->key);
    free(v->s);
    free(v);
}

/* ---- text output into a growable buffer ---- */

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static void put_bytes(buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "kdloss: out of memory\n");
            exit(1);
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void put_s(buf *b, const char *s) { put_bytes(b, s, strlen(s)); }

/* JSON string escaping as Python does it: short forms for the usual controls, \u00XX for the
 * rest below 0x20; bytes >= 0x80 pass through (UTF-8, ensure_ascii=False). */
static void put_quoted(buf *b, const char *s) {
    put_s(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        switch (c) {
        case '"': put_s(b, "\\\""); break;
        case '\\': put_s(b, "\\\\"); break;
        case '\n': put_s(b, "\\n"); break;
        case '\r': put_s(b, "\\r"); break;
        case '\t': put_s(b, "\\t"); break;
        case '\b': put_s(b, "\\b"); break;
        case '\f': put_s(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                put_s(b, esc);
            } else {
                put_bytes(b, (const char *)&c, 1);
            }
        }
    }
    put_s(b, "\"");
}

void kj_format_double(double d, char out[32]) {
    /* Fewest significant digits that read back as d (what repr() prints). */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    /* Split "-d.ddde+XX" into sign, digit string and decimal exponent. */
    const char *p = e;
    int neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        /* positional: repr keeps at least one digit after the point */
        if (exp10 < 0) {
            o += sprintf(o, "0.");
            for (int k = 0; k < -exp10 - 1; k++) *o++ = '0';
            o += sprintf(o, "%s", digits);
        } else {
            for (int k = 0; k <= exp10; k++) *o++ = k < nd ? digits[k] : '0';
            *o++ = '.';
            if (nd > exp10 + 1) o += sprintf(o, "%s", digits + exp10 + 1);
            else *o++ = '0';
        }
        *o = '\0';
    } else {
        /* scientific: d[.ddd]e<sign><at least two digits> */
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            o += sprintf(o, "%s", digits + 1);
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

static int cmp_key(const void *a, const void *b) {
    const kj *x = *(const kj *const *)a, *y = *(const kj *const *)b;
    return strcmp(x->key, y->key);
}

/* Children of an object in key order (malloc'd array of n pointers). */
static const kj **sorted_members(const kj *obj) {
    const kj **m = xalloc(obj->n * sizeof *m);
    size_t k = 0;
    for (const kj *c = obj->first; c; c = c->next) m[k++] = c;
    qsort(m, obj->n, sizeof *m, cmp_key);
    return m;
}

static void newline(buf *b, int indent, int depth) {
    if (indent < 0) return;
    put_s(b, "\n");
    for (int k = 0; k < indent * depth; k++) put_s(b, " ");
}

/* indent < 0: canonical (no whitespace); otherwise that many spaces per level. */
static void emit(buf *b, const kj *v, int indent, int depth) {
    char tmp[40];
    switch (v->type) {
    case KJ_NULL: put_s(b, "null"); return;
    case KJ_BOOL: put_s(b, v->i ? "true" : "false"); return;
    case KJ_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v->i);
        put_s(b, tmp);
        return;
    case KJ_NUM:
        kj_format_double(v->d, tmp);
        put_s(b, tmp);
        return;
    case KJ_STR: put_quoted(b, v->s); return;
    case KJ_ARR: {
        put_s(b, "[");
        size_t k = 0;
        for (const kj *c = v->first; c; c = c->next, k++) {
            if (k) put_s(b, ",");
            newline(b, indent, depth + 1);
            emit(b, c, indent, depth + 1);
        }
        if (v->n) newline(b, indent, depth);
        put_s(b, "]");
        return;
    }
    case KJ_OBJ: {
        const kj **m = sorted_members(v);
        put_s(b, "{");
        for (size_t k = 0; k < v->n; k++) {
            if (k) put_s(b, ",");
            newline(b, indent, depth + 1);
            put_quoted(b, m[k]->key);
            put_s(b, indent < 0 ? ":" : ": ");
            emit(b, m[k], indent, depth + 1);
        }
        if (v->n) newline(b, indent, depth);
        put_s(b, "}");
        free(m);
        return;
    }
    }
}

char *kj_canonical(const kj *v) {
    buf b = {0};
    emit(&b, v, -1, 0);
    return b.p;
}

void kj_digest(const kj *v, char out[72]) {
    char *text = kj_canonical(v);
    char hex[65];
    kb_sha256_hex(text, strlen(text), hex);
    snprintf(out, 72, "sha256:%s", hex);
    free(text);
}

int kj_write_pretty(FILE *f, const kj *v) {
    buf b = {0};
    emit(&b, v, 2, 0);
    put_s(&b, "\n");
    int ok = fwrite(b.p, 1, b.len, f) == b.len;
    free(b.p);
    return ok ? 0 : -1;
}
