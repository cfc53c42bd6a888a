/* A small JSON tree for the benchmark records. Objects always serialize with their keys in
 * sorted (byte) order, so the same tree gives the same text: the canonical form (no whitespace)
 * is what the records' "sha256:" digests are taken over, and it equals Python's
 *   json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
 * including the float formatting (shortest round-trip digits, repr's layout), so a record can
 * be checked with a one-line script. Allocation failure exits the process (a CLI has no better
 * recovery). */
#ifndef KB_JSON_H
#define KB_JSON_H

#include <stdint.h>
#include <stdio.h>

typedef struct kj kj; /* one value; objects and arrays own their children */

kj *kj_obj(void);
kj *kj_arr(void);
kj *kj_str(const char *s);
kj *kj_int(int64_t i);
kj *kj_num(double d); /* NaN and infinities become null: JSON cannot hold them */
kj *kj_bool(int b);

/* Adds key: val to an object (the object takes ownership) and returns val, so nested
 * objects can be built in one expression. Keys must be unique within an object. */
kj *kj_put(kj *obj, const char *key, kj *val);
/* Appends val to an array (which takes ownership) and returns val. */
kj *kj_push(kj *arr, kj *val);

/* Canonical text, malloc'd (caller frees). */
char *kj_canonical(const kj *v);
/* "sha256:<hex>" of the canonical text into out (72 bytes). */
void kj_digest(const kj *v, char out[72]);
/* Indented text (two spaces, sorted keys) plus a newline; returns 0, or -1 on a write error. */
int kj_write_pretty(FILE *f, const kj *v);

void kj_free(kj *v);

/* Python repr()-style shortest round-trip text of a finite double ("2.0", "1e-05"). */
void kj_format_double(double d, char out[32]);

#endif
