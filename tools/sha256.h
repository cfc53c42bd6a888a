/* SHA-256 (FIPS 180-4), written from the standard's description for the benchmark records'
 * digests ("sha256:<hex>" of canonical JSON). Streaming interface plus a one-shot hex helper. */
#ifndef KB_SHA256_H
#define KB_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct kb_sha256 {
    uint32_t h[8];      /* chaining state H0..H7 */
    uint8_t block[64];  /* message bytes not yet compressed */
    size_t fill;        /* bytes held in block */
    uint64_t total;     /* message length so far, in bytes */
} kb_sha256;

void kb_sha256_init(kb_sha256 *s);
void kb_sha256_update(kb_sha256 *s, const void *data, size_t len);
/* Pads, compresses the last block(s) and writes the 32-byte digest. */
void kb_sha256_final(kb_sha256 *s, uint8_t digest[32]);
/* Lower-case hex digest of data[0..len) into hex (64 characters + NUL). */
void kb_sha256_hex(const void *data, size_t len, char hex[65]);

#endif
