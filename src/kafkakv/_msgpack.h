/* msgpack writers, in the smallest form of each value as msgspec writes it: what _frame.c
 * (a batch's rows) and map/_bulk.c (ops records) encode with. Include after Python.h. */
#ifndef KAFKAKV_MSGPACK_H
#define KAFKAKV_MSGPACK_H

#include <stdint.h>
#include <string.h>

/* Bytes of a msgpack uint (the smallest form, as msgspec writes it). */
static inline Py_ssize_t
uint_size(uint64_t v)
{
    return v < 128 ? 1 : v < 256 ? 2 : v < 65536 ? 3 : v <= 0xFFFFFFFFu ? 5 : 9;
}

static inline unsigned char *
put_uint(unsigned char *p, uint64_t v)
{
    if (v < 128) {
        *p++ = (unsigned char)v;
    }
    else if (v < 256) {
        *p++ = 0xcc;
        *p++ = (unsigned char)v;
    }
    else if (v < 65536) {
        *p++ = 0xcd;
        *p++ = (unsigned char)(v >> 8);
        *p++ = (unsigned char)v;
    }
    else if (v <= 0xFFFFFFFFu) {
        *p++ = 0xce;
        for (int i = 3; i >= 0; i--) {
            *p++ = (unsigned char)(v >> (8 * i));
        }
    }
    else {
        *p++ = 0xcf;
        for (int i = 7; i >= 0; i--) {
            *p++ = (unsigned char)(v >> (8 * i));
        }
    }
    return p;
}

static inline Py_ssize_t
bin_size(Py_ssize_t n)
{
    return (n < 256 ? 2 : n < 65536 ? 3 : 5) + n;
}

static inline unsigned char *
put_bin(unsigned char *p, const char *data, Py_ssize_t n)
{
    if (n < 256) {
        *p++ = 0xc4;
        *p++ = (unsigned char)n;
    }
    else if (n < 65536) {
        *p++ = 0xc5;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    }
    else {
        *p++ = 0xc6;
        for (int i = 3; i >= 0; i--) {
            *p++ = (unsigned char)(n >> (8 * i));
        }
    }
    memcpy(p, data, (size_t)n);
    return p + n;
}

#endif /* KAFKAKV_MSGPACK_H */
