/* SHA-256 used for the benchmark records' digests: the FIPS 180-4 example vectors, the padding
 * boundaries (55/56/63/64 bytes), and streaming updates split at every point agreeing with the
 * one-shot digest. */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

/* CMake builds each test from its one source file, so the implementation under test is
 * compiled in here rather than linked from the command-line tool. */
#include "../tools/sha256.c"

static void check_hex(const void *data, size_t len, const char *want, const char *what) {
    char hex[65];
    kb_sha256_hex(data, len, hex);
    KT_CHECK(strcmp(hex, want) == 0, "%s: got %s want %s", what, hex, want);
}

/* A deterministic byte pattern for the boundary cases. */
static void pattern(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 7 + 3) % 256);
}

static void test_fips_vectors(void) {
    check_hex("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    check_hex("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_hex(two, strlen(two), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
              "448-bit message");
}

static void test_million_a(void) {
    /* One million 'a' fed in uneven pieces, crossing block boundaries. */
    uint8_t chunk[997];
    memset(chunk, 'a', sizeof chunk);
    kb_sha256 s;
    kb_sha256_init(&s);
    size_t left = 1000000;
    while (left > 0) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        kb_sha256_update(&s, chunk, n);
        left -= n;
    }
    uint8_t d[32];
    kb_sha256_final(&s, d);
    static const uint8_t want[32] = {0xcd, 0xc7, 0x6e, 0x5c, 0x99, 0x14, 0xfb, 0x92,
                                     0x81, 0xa1, 0xc7, 0xe2, 0x84, 0xd7, 0x3e, 0x67,
                                     0xf1, 0x80, 0x9a, 0x48, 0xa4, 0x97, 0x20, 0x0e,
                                     0x04, 0x6d, 0x39, 0xcc, 0xc7, 0x11, 0x2c, 0xd0};
    KT_CHECK(memcmp(d, want, 32) == 0, "one million 'a'");
}

static void test_padding_boundaries(void) {
    /* Lengths around the 56-byte point where the length field spills into another block. */
    static const struct {
        size_t n;
        const char *hex;
    } cases[] = {
        {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
        {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
        {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
        {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
        {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
    };
    uint8_t buf[128];
    pattern(buf, sizeof buf);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "%zu pattern bytes", cases[i].n);
        check_hex(buf, cases[i].n, cases[i].hex, what);
    }
}

static void test_split_updates(void) {
    /* Two updates split anywhere must give the one-shot digest. */
    uint8_t buf[130], one[32], two[32];
    pattern(buf, sizeof buf);
    kb_sha256 s;
    kb_sha256_init(&s);
    kb_sha256_update(&s, buf, sizeof buf);
    kb_sha256_final(&s, one);
    for (size_t cut = 0; cut <= sizeof buf; cut++) {
        kb_sha256_init(&s);
        kb_sha256_update(&s, buf, cut);
        kb_sha256_update(&s, buf + cut, sizeof buf - cut);
        kb_sha256_final(&s, two);
        KT_CHECK(memcmp(one, two, 32) == 0, "split at %zu", cut);
    }
}

int main(void) {
    /* testutil.c calls into libkdloss; with the toolchain's --as-needed the library is only
     * kept when this file itself uses it, so name the version the digests are built with. */
    printf("kdloss %s\n", kdloss_version());
    test_fips_vectors();
    test_million_a();
    test_padding_boundaries();
    test_split_updates();
    return kt_finish("sha256");
}
