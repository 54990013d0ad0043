/* Kafka's murmur2, the hash its Java client's default partitioner places a key with: what
 * log/_murmur2.c (the partition of a key) and map/_bulk.c (the partition of each row of a
 * batch) compute with. Include after Python.h. */
#ifndef KAFKAKV_MURMUR2_H
#define KAFKAKV_MURMUR2_H

#include <stdint.h>

#define MURMUR2_SEED 0x9747b28cu
#define MURMUR2_M 0x5bd1e995u

/* Kafka's Utils.murmur2 over n bytes: 4 bytes at a time, little-endian, then the 1 to 3 left,
 * then the final mix. Unsigned 32-bit arithmetic is Java's int arithmetic bit for bit. */
static inline uint32_t
murmur2_hash(const unsigned char *data, Py_ssize_t n)
{
    uint32_t h = MURMUR2_SEED ^ (uint32_t)n;
    Py_ssize_t whole = n - (n & 3);
    for (Py_ssize_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= MURMUR2_M;
        k ^= k >> 24;
        k *= MURMUR2_M;
        h = (h * MURMUR2_M) ^ k;
    }
    switch (n & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8;
        /* fall through */
    case 1:
        h ^= data[whole];
        h *= MURMUR2_M;
    }
    h ^= h >> 13;
    h *= MURMUR2_M;
    h ^= h >> 15;
    return h;
}

#endif /* KAFKAKV_MURMUR2_H */
