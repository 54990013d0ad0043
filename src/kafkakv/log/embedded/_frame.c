/* kafkakv.log.embedded._frame: the embedded log's batch encoding in C, and one decoding.
 *
 * Six functions over bytes, each the same as its Python twin in frame.py (read_head's is in
 * head.py; tests/log/test_frame.py checks each pair input by input, results and errors alike):
 *
 *   plain_body(records, limit)  the msgpack body of a batch of plain records, or None
 *   plain_body_columns(length, wide, key_offsets, key_data, value_offsets, value_data, limit)
 *                               the same body of the rows of two binary columns, or None
 *   frame(base_offset, body, record_count, last_offset_delta, base_timestamp,
 *         max_timestamp, attributes, delete_horizon_ms, producer)
 *                               a whole batch: the 56-byte header, its CRC, the body
 *   pack_head(state)            the 80-byte head record of a HeadState
 *   read_head(mapped, last)     the head record in a mapping, checked and unpacked
 *   latest_into(target, body, first, limit)
 *                               a batch body's rows put into a dict, the last value per key
 *
 * and one that writes: append_plain(...), the steady-state append of partition.py, whose
 * locked section (flock, head, tail check, batch, head publish, unlock) runs here in one call
 * without the GIL, and which declines (returns None, having changed nothing) whenever anything
 * is not the steady state, for Partition.append's Python path to handle. See append_plain below.
 *
 * The formats are in format.py and head.py. The CRC is zlib's CRC-32, as Python's zlib.crc32
 * computes it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <zlib.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_msgpack.h" /* the msgpack writers (src/kafkakv/_msgpack.h) */
#include "_rows.h"    /* the msgpack row readers latest_into and read_plain use */

static PyObject *record_type;  /* kafkakv.log.base.Record, set by frame.py through bind() */
static PyObject *empty_tuple;  /* a record's headers when it has none */
static PyObject *struct_error; /* struct.error: what the twin's Struct.pack raises */
static PyObject *head_type;    /* kafkakv.log.embedded.head.HeadState, set through bind() */

/* -- little-endian stores --------------------------------------------------------------- */

static inline void
put_u16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void
put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static inline void
put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* An int argument of ``bits`` bits, unsigned or signed (64 bits), as struct.pack checks it: a
 * non-int or an int out of range raises struct.error. Returns 0, or -1 with the error set. */
static int
as_field(PyObject *obj, int is_unsigned, int bits, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_SetString(struct_error, "required argument is not an integer");
        return -1;
    }
    int overflow = 0;
    if (is_unsigned) {
        unsigned long long v = PyLong_AsUnsignedLongLong(obj);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) { /* negative, or past 64 bits */
            PyErr_Clear();
            goto range;
        }
        if (bits < 64 && v >> bits) {
            goto range;
        }
        *out = (uint64_t)v;
        return 0;
    }
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow) {
        goto range;
    }
    *out = (uint64_t)v; /* bits == 64 for every signed field */
    return 0;
range:
    PyErr_Format(struct_error, "argument out of range");
    return -1;
}

/* -- plain_body ------------------------------------------------------------------------- */

static inline Py_ssize_t
array_header_size(Py_ssize_t n)
{
    return n < 16 ? 1 : n < 65536 ? 3 : 5;
}

static inline unsigned char *
put_array_header(unsigned char *p, Py_ssize_t n)
{
    if (n < 16) {
        *p++ = (unsigned char)(0x90 | n);
    }
    else if (n < 65536) {
        *p++ = 0xdc;
        *p++ = (unsigned char)(n >> 8);
        *p++ = (unsigned char)n;
    }
    else {
        *p++ = 0xdd;
        for (int i = 3; i >= 0; i--) {
            *p++ = (unsigned char)(n >> (8 * i));
        }
    }
    return p;
}

/* The checks of the twin (records.plain_batch), in its order: every record an exact Record,
 * every key exact bytes, every value exact bytes or None, then no record with headers (a
 * truth test, which may call Python code), then no record with a timestamp, then the largest
 * key plus the largest value within ``limit``. Any failed check: None (the checked path
 * decides what is wrong); an error from a truth test propagates, as in the twin. */
static PyObject *
plain_body(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "plain_body(records, limit) takes 2 arguments");
        return NULL;
    }
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "kafkakv.log.embedded._frame: bind() not called");
        return NULL;
    }
    if (!PyLong_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "plain_body(): limit must be an int, not %.100s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    int overflow = 0; /* a limit past 64 bits holds every record, or none */
    long long limit = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow) {
        limit = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    }
    /* A tuple of its own: a truth test below may run code that changes a list. */
    PyObject *seq = PySequence_Tuple(args[0]);
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    PyObject *result = NULL;
    Py_ssize_t max_key = 0, max_value = 0, size = array_header_size(n);
    if (n == 0) {
        goto not_plain; /* not a batch: the checked path says why */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((PyObject *)Py_TYPE(items[i]) != record_type || PyTuple_GET_SIZE(items[i]) < 4) {
            goto not_plain;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(items[i], 0))) {
            goto not_plain;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyTuple_GET_ITEM(items[i], 1);
        if (value != Py_None && !PyBytes_CheckExact(value)) {
            goto not_plain;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int headers = PyObject_IsTrue(PyTuple_GET_ITEM(items[i], 2));
        if (headers < 0) {
            goto done;
        }
        if (headers) {
            goto not_plain;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyTuple_GET_ITEM(items[i], 3) != Py_None) {
            goto not_plain;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(items[i], 0), *value = PyTuple_GET_ITEM(items[i], 1);
        Py_ssize_t klen = PyBytes_GET_SIZE(key);
        Py_ssize_t vlen = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        max_key = klen > max_key ? klen : max_key;
        max_value = vlen > max_value ? vlen : max_value;
        size += 1 + uint_size((uint64_t)i) + 1 + bin_size(klen) + 1;
        size += value == Py_None ? 1 : bin_size(vlen);
    }
    if ((long long)(max_key + max_value) > limit) {
        goto not_plain;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        goto done;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result);
    p = put_array_header(p, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(items[i], 0), *value = PyTuple_GET_ITEM(items[i], 1);
        *p++ = 0x95; /* [offset_delta, timestamp_delta, key, value, headers] */
        p = put_uint(p, (uint64_t)i);
        *p++ = 0x00;
        p = put_bin(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        if (value == Py_None) {
            *p++ = 0xc0;
        }
        else {
            p = put_bin(p, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        }
        *p++ = 0xc0;
    }
    assert((char *)p == PyBytes_AS_STRING(result) + size);
    goto done;
not_plain:
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(seq);
    return result;
}

/* -- plain_body_columns ----------------------------------------------------------------- */

/* Row i's bounds in a column of ``n`` rows: offsets 32-bit or, when ``wide``, 64-bit. */
static inline long long
offset_at(const void *offsets, int wide, Py_ssize_t i)
{
    if (wide) {
        int64_t o;
        memcpy(&o, (const char *)offsets + 8 * i, 8);
        return o;
    }
    int32_t o;
    memcpy(&o, (const char *)offsets + 4 * i, 4);
    return o;
}

/* Whether ``offsets`` (``n + 1`` of them) bound rows of ``data``: from 0 or more, never
 * going back, none past the data's end. Else ValueError naming the column and the row. */
static int
check_offsets(const Py_buffer *offsets, const Py_buffer *data, int wide, Py_ssize_t n,
              const char *what)
{
    Py_ssize_t width = wide ? 8 : 4;
    if (offsets->len != (n + 1) * width) {
        PyErr_Format(PyExc_ValueError,
                     "plain_body_columns(): %s offsets hold %zd bytes, not the %zd of %zd rows",
                     what, offsets->len, (n + 1) * width, n);
        return -1;
    }
    long long previous = offset_at(offsets->buf, wide, 0);
    if (previous < 0) {
        PyErr_Format(PyExc_ValueError, "plain_body_columns(): %s offsets start below 0", what);
        return -1;
    }
    for (Py_ssize_t i = 1; i <= n; i++) {
        long long next = offset_at(offsets->buf, wide, i);
        if (next < previous || next > (long long)data->len) {
            PyErr_Format(PyExc_ValueError,
                         "plain_body_columns(): %s %zd ends at %lld, outside %lld..%zd", what,
                         i - 1, next, previous, data->len);
            return -1;
        }
        previous = next;
    }
    return 0;
}

/* The body plain_body would make of the records (key, value) of the rows of two binary
 * columns (see kafkakv.log.columns.Columns); None for no rows, or when the largest key plus
 * the largest value is over ``limit``. */
static PyObject *
plain_body_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "plain_body_columns(length, wide, key_offsets, key_data, "
                        "value_offsets, value_data, limit) takes 7 arguments");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int wide = PyObject_IsTrue(args[1]);
    if (wide < 0) {
        return NULL;
    }
    int overflow = 0;
    long long limit = PyLong_AsLongLongAndOverflow(args[6], &overflow);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow) {
        limit = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    }
    if (n < 0 || n > (PY_SSIZE_T_MAX - 9) / 8) {
        PyErr_Format(PyExc_ValueError, "plain_body_columns(): %zd rows", n);
        return NULL;
    }
    Py_buffer views[4];
    int taken = 0;
    PyObject *result = NULL;
    for (; taken < 4; taken++) {
        if (PyObject_GetBuffer(args[2 + taken], &views[taken], PyBUF_SIMPLE) < 0) {
            goto done;
        }
    }
    if (check_offsets(&views[0], &views[1], wide, n, "key") < 0 ||
        check_offsets(&views[2], &views[3], wide, n, "value") < 0) {
        goto done;
    }
    if (n == 0) {
        result = Py_NewRef(Py_None); /* not a batch: the records' path says why */
        goto done;
    }
    const void *ko = views[0].buf, *vo = views[2].buf;
    const char *kd = views[1].buf, *vd = views[3].buf;
    Py_ssize_t max_key = 0, max_value = 0, size = array_header_size(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t klen = (Py_ssize_t)(offset_at(ko, wide, i + 1) - offset_at(ko, wide, i));
        Py_ssize_t vlen = (Py_ssize_t)(offset_at(vo, wide, i + 1) - offset_at(vo, wide, i));
        max_key = klen > max_key ? klen : max_key;
        max_value = vlen > max_value ? vlen : max_value;
        /* each row's framing is at most 24 bytes past its key and value; the data's sizes
         * bound the sum, so no overflow for any buffer that exists */
        size += 1 + uint_size((uint64_t)i) + 1 + bin_size(klen) + bin_size(vlen) + 1;
    }
    if ((long long)max_key + (long long)max_value > limit) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        goto done;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(result);
    p = put_array_header(p, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long k0 = offset_at(ko, wide, i), v0 = offset_at(vo, wide, i);
        *p++ = 0x95; /* [offset_delta, timestamp_delta, key, value, headers] */
        p = put_uint(p, (uint64_t)i);
        *p++ = 0x00;
        p = put_bin(p, kd + k0, (Py_ssize_t)(offset_at(ko, wide, i + 1) - k0));
        p = put_bin(p, vd + v0, (Py_ssize_t)(offset_at(vo, wide, i + 1) - v0));
        *p++ = 0xc0;
    }
    assert((char *)p == PyBytes_AS_STRING(result) + size);
done:
    while (taken > 0) {
        PyBuffer_Release(&views[--taken]);
    }
    return result;
}

/* -- frame ------------------------------------------------------------------------------ */

#define HEADER_SIZE 56
#define CRC_START 16
#define BATCH_MAGIC 2 /* the CRC covers the base offset too (format.py; 1 did not) */

static uLong
crc_of(uLong crc, const unsigned char *data, Py_ssize_t n)
{
    while (n > 0) { /* zlib's length is a uInt */
        uInt chunk = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        crc = crc32(crc, data, chunk);
        data += chunk;
        n -= chunk;
    }
    return crc;
}

/* The CRC of header h, the part a batch's CRC covers before its body: the base offset (its
 * first 8 bytes), then the bytes from CRC_START on. */
static uLong
header_crc(const unsigned char *h)
{
    uLong crc = crc32(crc32(0L, Z_NULL, 0), h, 8);
    return crc_of(crc, h + CRC_START, HEADER_SIZE - CRC_START);
}

/* The CRC of a batch: header h (see header_crc) followed by body. Lets go of the GIL where it
 * takes long: the body is a bytes object (immutable) the caller holds. */
static uint32_t
batch_crc(const unsigned char *h, PyObject *body)
{
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(body);
    Py_ssize_t n = PyBytes_GET_SIZE(body);
    uLong crc = header_crc(h);
    if (n < (1 << 16)) {
        crc = crc_of(crc, data, n);
    }
    else {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_of(crc, data, n);
        Py_END_ALLOW_THREADS
    }
    return (uint32_t)crc;
}

/* The fields of frame() and frame_header() (9 arguments, the body second) into h, the
 * header of a batch of that body, its CRC (over the body too) included; *size is the
 * batch's. -1 with an error set. */
static int
fill_header(const char *name, PyObject *const *args, Py_ssize_t nargs, unsigned char *h,
            Py_ssize_t *size)
{
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "%s() takes 9 arguments", name);
        return -1;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "%s(): body must be bytes, not %.100s", name,
                     Py_TYPE(args[1])->tp_name);
        return -1;
    }
    /* base_offset Q, (size I), (crc I), (magic B), attributes B, (reserved H),
     * record_count I, last_offset_delta I, base_timestamp q, max_timestamp q,
     * delete_horizon_ms q, producer I */
    static const struct {
        int is_unsigned, bits;
    } kinds[9] = {{1, 64}, {0, 0}, {1, 32}, {1, 32}, {0, 64}, {0, 64}, {1, 8}, {0, 64}, {1, 32}};
    uint64_t v[9];
    for (int i = 0; i < 9; i++) {
        if (i != 1 && as_field(args[i], kinds[i].is_unsigned, kinds[i].bits, &v[i]) < 0) {
            return -1;
        }
    }
    *size = HEADER_SIZE + PyBytes_GET_SIZE(args[1]);
    if (*size > (Py_ssize_t)0xFFFFFFFFu) {
        PyErr_SetString(struct_error, "argument out of range");
        return -1;
    }
    put_u64(h, v[0]);
    put_u32(h + 8, (uint32_t)*size);
    put_u32(h + 12, 0); /* the CRC, filled in last */
    h[16] = BATCH_MAGIC;
    h[17] = (unsigned char)v[6];
    put_u16(h + 18, 0);
    put_u32(h + 20, (uint32_t)v[2]);
    put_u32(h + 24, (uint32_t)v[3]);
    put_u64(h + 28, v[4]);
    put_u64(h + 36, v[5]);
    put_u64(h + 44, v[7]);
    put_u32(h + 52, (uint32_t)v[8]);
    put_u32(h + 12, batch_crc(h, args[1]));
    return 0;
}

static PyObject *
frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned char h[HEADER_SIZE];
    Py_ssize_t size;
    if (fill_header("frame", args, nargs, h, &size) < 0) {
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        return NULL;
    }
    memcpy(PyBytes_AS_STRING(out), h, HEADER_SIZE);
    memcpy(PyBytes_AS_STRING(out) + HEADER_SIZE, PyBytes_AS_STRING(args[1]),
           (size_t)(size - HEADER_SIZE));
    return out;
}

static PyObject *
frame_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned char h[HEADER_SIZE];
    Py_ssize_t size;
    if (fill_header("frame_header", args, nargs, h, &size) < 0) {
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)h, HEADER_SIZE);
}

/* -- pack_head -------------------------------------------------------------------------- */

#define HEAD_SIZE 80

static PyObject *
pack_head(PyObject *module, PyObject *state)
{
    if (!PyTuple_Check(state) || PyTuple_GET_SIZE(state) != 8) {
        PyErr_SetString(struct_error, "pack_head() takes a head state of 8 fields");
        return NULL;
    }
    unsigned char raw[HEAD_SIZE];
    memcpy(raw, "KKVH", 4);
    for (int i = 0; i < 7; i++) {
        uint64_t v;
        if (as_field(PyTuple_GET_ITEM(state, i), 1, 64, &v) < 0) {
            return NULL;
        }
        put_u64(raw + 8 + 8 * i, v);
    }
    PyObject *boot = PyTuple_GET_ITEM(state, 7);
    const char *data;
    Py_ssize_t n;
    if (PyBytes_Check(boot)) {
        data = PyBytes_AS_STRING(boot);
        n = PyBytes_GET_SIZE(boot);
    }
    else if (PyByteArray_Check(boot)) {
        data = PyByteArray_AS_STRING(boot);
        n = PyByteArray_GET_SIZE(boot);
    }
    else {
        PyErr_SetString(struct_error, "argument for 's' must be a bytes object");
        return NULL;
    }
    /* struct's 16s: truncated past 16 bytes, padded with zeros below */
    memset(raw + 64, 0, 16);
    memcpy(raw + 64, data, (size_t)(n < 16 ? n : 16));
    put_u32(raw + 4, (uint32_t)crc32(crc32(0L, Z_NULL, 0), raw + 8, HEAD_SIZE - 8));
    return PyBytes_FromStringAndSize((const char *)raw, HEAD_SIZE);
}

/* -- append_plain ----------------------------------------------------------------------- */

/* The steady state of Partition.append, in one call that lets go of the GIL once:
 *
 *   append_plain(lock_fd, wfd, ifd, head_fd, head_map, boot_id, layout_version, active_base,
 *                write_limit, segment_bytes, roll_at_ms, index_interval, body, count,
 *                base_timestamp, max_timestamp, sync, bell_fd)
 *
 * takes the partition's flock without waiting, reads the head from ``head_map`` (the head
 * file's mmap), checks the tail after the published end with one pread, writes the batch with
 * one pwritev and, when one is due, an index entry to ``ifd`` (opened O_APPEND), fdatasyncs the
 * segment when ``sync``, publishes the new head with one pwrite, rings the log's bell (one byte
 * written to ``bell_fd``, unless it is -1; see bell.py) and releases the flock: the same system
 * calls, with the same bytes, as the Python path's prepare_locked, write_locked, sync_locked
 * and publish_locked. Returns (first offset, head bytes, HeadState).
 *
 * It declines, returning None with the flock released and nothing written, whenever the
 * Python path has more to do: the flock is held elsewhere (waiting is the Python path's); the
 * head is torn, from another boot, or names another manifest (``layout_version``) or active
 * segment (``active_base``) than the one ``wfd`` is open on; the file does not reach the
 * published end or holds bytes after it (a dead writer's tail, a pending transaction); the
 * batch would roll the segment (``segment_bytes``, ``roll_at_ms``, the offset span) or write
 * past ``write_limit`` (the preallocated size under fsync=always; -1: no limit); an argument is
 * not what it should be.
 *
 * A failed write raises OSError with the flock released: a batch, or its index entry, that was
 * not all written is cut off again (the segment and the index truncated to where they ended
 * before, as _truncate_locked does); a batch written but not published (the fdatasync or the
 * head write failed) stays as a tail, as on the Python path, for the next writer to cut. */

#define MAX_SEGMENT_SPAN 2147483647LL /* partition.py's _MAX_SEGMENT_SPAN */
#define TAIL_PROBE (HEADER_SIZE + 1)

enum outcome { APPENDED, DECLINED, FAILED };

struct plan {
    /* in */
    int lock_fd, wfd, ifd, head_fd, bell_fd, sync;
    const unsigned char *head_map;
    const unsigned char *boot_id;
    long long layout_version, active_base, write_limit, segment_bytes, roll_at_ms, interval;
    const char *body;
    Py_ssize_t body_len;
    uint32_t count;
    long long base_ts, max_ts;
    /* out */
    uint64_t first;
    unsigned char head[HEAD_SIZE];
    uint64_t fields[7];
    int error;
};

static inline uint64_t
get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint32_t
get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static long long
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Everything between taking and releasing the flock; no Python objects, no GIL. */
static enum outcome
append_locked(struct plan *w)
{
    unsigned char head[HEAD_SIZE];
    memcpy(head, w->head_map, HEAD_SIZE);
    if (memcmp(head, "KKVH", 4) != 0 ||
        get_u32(head + 4) != (uint32_t)crc32(crc32(0L, Z_NULL, 0), head + 8, HEAD_SIZE - 8) ||
        memcmp(head + 64, w->boot_id, 16) != 0) {
        return DECLINED;
    }
    /* seq, next_offset, start_offset, active_base, active_pos, layout_version, last_index */
    uint64_t f[7];
    for (int i = 0; i < 7; i++) {
        f[i] = get_u64(head + 8 + 8 * i);
    }
    if (f[3] != (uint64_t)w->active_base || f[5] != (uint64_t)w->layout_version ||
        f[1] > (uint64_t)LLONG_MAX || f[4] > (uint64_t)LLONG_MAX || f[6] > f[4]) {
        return DECLINED;
    }
    long long next = (long long)f[1], pos = (long long)f[4], last_index = (long long)f[6];
    long long size = HEADER_SIZE + (long long)w->body_len;
    if (pos > LLONG_MAX - size) {
        return DECLINED;
    }
    if (pos > 0 && (pos + size > w->segment_bytes || now_ms() >= w->roll_at_ms)) {
        return DECLINED; /* rolls first */
    }
    if (next - w->active_base >= MAX_SEGMENT_SPAN || next > LLONG_MAX - (long long)w->count) {
        return DECLINED;
    }
    if (w->write_limit >= 0 && pos + size > w->write_limit) {
        return DECLINED; /* preallocates first */
    }
    /* The tail: the byte before the published end and a header's worth after it. */
    unsigned char probe[TAIL_PROBE];
    long long at = pos ? pos - 1 : 0;
    ssize_t got = pread(w->wfd, probe, TAIL_PROBE, (off_t)at);
    if (got < 0 || at + got < pos) {
        return DECLINED;
    }
    for (ssize_t i = (ssize_t)(pos - at); i < got; i++) {
        if (probe[i] != 0) {
            return DECLINED;
        }
    }
    /* The batch: format.py's header (attributes 0, delete horizon -1, producer 0), its CRC
     * over the header (see header_crc) and the body. */
    unsigned char h[HEADER_SIZE];
    put_u64(h, (uint64_t)next);
    put_u32(h + 8, (uint32_t)size);
    h[16] = BATCH_MAGIC;
    h[17] = 0; /* attributes */
    put_u16(h + 18, 0);
    put_u32(h + 20, w->count);
    put_u32(h + 24, w->count - 1);
    put_u64(h + 28, (uint64_t)w->base_ts);
    put_u64(h + 36, (uint64_t)w->max_ts);
    put_u64(h + 44, (uint64_t)-1LL);
    put_u32(h + 52, 0);
    uLong crc = crc_of(header_crc(h), (const unsigned char *)w->body, w->body_len);
    put_u32(h + 12, (uint32_t)crc);
    struct iovec iov[2] = {{h, HEADER_SIZE}, {(void *)w->body, (size_t)w->body_len}};
    /* An index entry when due: (offset relative to the segment's base, position), u32 each. */
    int index = pos > 0 && pos - last_index >= w->interval;
    unsigned char entry[8];
    off_t index_end = 0;
    if (index) {
        if (next - w->active_base > 0xFFFFFFFFLL || pos > 0xFFFFFFFFLL) {
            return DECLINED; /* the Python path's struct.pack says what is wrong */
        }
        put_u32(entry, (uint32_t)(next - w->active_base));
        put_u32(entry + 4, (uint32_t)pos);
        index_end = lseek(w->ifd, 0, SEEK_END); /* where a failed entry is cut back to */
        if (index_end < 0) {
            return DECLINED;
        }
    }
    ssize_t written = pwritev(w->wfd, iov, 2, (off_t)pos);
    if (written != (ssize_t)size) {
        w->error = written < 0 ? errno : ENOSPC;
        if (written != 0) {
            (void)ftruncate(w->wfd, (off_t)pos);
        }
        return FAILED;
    }
    if (index) {
        ssize_t noted = write(w->ifd, entry, sizeof entry);
        if (noted != (ssize_t)sizeof entry) {
            w->error = noted < 0 ? errno : ENOSPC;
            (void)ftruncate(w->wfd, (off_t)pos);
            if (noted > 0) {
                (void)ftruncate(w->ifd, index_end);
            }
            return FAILED;
        }
        last_index = pos;
    }
    if (w->sync && fdatasync(w->wfd) != 0) {
        w->error = errno;
        return FAILED;
    }
    /* The new head: HeadState(seq + 1, next + count, start, base, pos + size, layout,
     * last_index, boot_id), packed as pack_head packs it. */
    f[0] += 1;
    f[1] = (uint64_t)(next + (long long)w->count);
    f[4] = (uint64_t)(pos + size);
    f[6] = (uint64_t)last_index;
    memcpy(w->head, "KKVH", 4);
    for (int i = 0; i < 7; i++) {
        put_u64(w->head + 8 + 8 * i, f[i]);
    }
    memcpy(w->head + 64, w->boot_id, 16);
    put_u32(w->head + 4, (uint32_t)crc32(crc32(0L, Z_NULL, 0), w->head + 8, HEAD_SIZE - 8));
    ssize_t published = pwrite(w->head_fd, w->head, HEAD_SIZE, 0);
    if (published != HEAD_SIZE) {
        w->error = published < 0 ? errno : EIO;
        return FAILED;
    }
    if (w->bell_fd >= 0) {
        /* Other processes' waiters wake now, not after the unlock and the return to Python.
         * A ring that fails only makes them look later: no error (as Bell.ring). */
        ssize_t rung = pwrite(w->bell_fd, "\1", 1, 0);
        (void)rung;
    }
    w->first = (uint64_t)next;
    memcpy(w->fields, f, sizeof f);
    return APPENDED;
}

/* A HeadState (the class bind_head gave) of the seven u64 fields, in head.py's order, and the
 * boot id ``boot`` (borrowed); NULL with an error set. */
static PyObject *
new_head_state(const uint64_t *f, PyObject *boot)
{
    PyTypeObject *type = (PyTypeObject *)head_type;
    PyObject *state = type->tp_alloc(type, 8);
    if (state == NULL) {
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(f[i]);
        if (v == NULL) {
            Py_DECREF(state);
            return NULL;
        }
        PyTuple_SET_ITEM(state, i, v);
    }
    PyTuple_SET_ITEM(state, 7, Py_NewRef(boot));
    return state;
}

/* An int argument as a long long; 0 with *ok cleared (and no error set) when it is not one. */
static long long
ll_arg(PyObject *obj, int *ok)
{
    if (!PyLong_Check(obj)) {
        *ok = 0;
        return 0;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    return v;
}

static PyObject *
append_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "append_plain() takes 18 arguments");
        return NULL;
    }
    if (head_type == NULL) {
        Py_RETURN_NONE; /* not bound: the Python path */
    }
    struct plan w;
    memset(&w, 0, sizeof w);
    int ok = 1;
    long long lock_fd = ll_arg(args[0], &ok), wfd = ll_arg(args[1], &ok);
    long long ifd = ll_arg(args[2], &ok), head_fd = ll_arg(args[3], &ok);
    w.layout_version = ll_arg(args[6], &ok);
    w.active_base = ll_arg(args[7], &ok);
    w.write_limit = ll_arg(args[8], &ok);
    w.segment_bytes = ll_arg(args[9], &ok);
    w.roll_at_ms = ll_arg(args[10], &ok);
    w.interval = ll_arg(args[11], &ok);
    long long count = ll_arg(args[13], &ok);
    w.base_ts = ll_arg(args[14], &ok);
    w.max_ts = ll_arg(args[15], &ok);
    long long bell_fd = ll_arg(args[17], &ok);
    w.sync = PyObject_IsTrue(args[16]);
    if (w.sync < 0) {
        return NULL;
    }
    if (!ok || lock_fd < 0 || lock_fd > INT_MAX || wfd < 0 || wfd > INT_MAX || ifd < 0 ||
        ifd > INT_MAX || head_fd < 0 || head_fd > INT_MAX || bell_fd < -1 || bell_fd > INT_MAX ||
        w.layout_version < 0 ||
        w.active_base < 0 || count < 1 || count > 0xFFFFFFFFLL || w.interval < 0 ||
        !PyBytes_Check(args[5]) || PyBytes_GET_SIZE(args[5]) != 16 || !PyBytes_Check(args[12]) ||
        PyBytes_GET_SIZE(args[12]) > (Py_ssize_t)0xFFFFFFFFu - HEADER_SIZE) {
        Py_RETURN_NONE; /* the Python path says what is wrong, if anything is */
    }
    w.lock_fd = (int)lock_fd;
    w.wfd = (int)wfd;
    w.ifd = (int)ifd;
    w.head_fd = (int)head_fd;
    w.bell_fd = (int)bell_fd;
    w.count = (uint32_t)count;
    w.boot_id = (const unsigned char *)PyBytes_AS_STRING(args[5]);
    w.body = PyBytes_AS_STRING(args[12]);
    w.body_len = PyBytes_GET_SIZE(args[12]);
    Py_buffer map;
    if (PyObject_GetBuffer(args[4], &map, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* no mapping (a closed one, None): the Python path */
        Py_RETURN_NONE;
    }
    if (map.len < HEAD_SIZE) {
        PyBuffer_Release(&map);
        Py_RETURN_NONE;
    }
    w.head_map = (const unsigned char *)map.buf;
    enum outcome outcome = DECLINED;
    /* The arguments (the body, the boot id) and the exported mapping stay alive meanwhile:
     * the caller holds them, and an mmap with an export cannot close. */
    Py_BEGIN_ALLOW_THREADS
    if (flock(w.lock_fd, LOCK_EX | LOCK_NB) == 0) {
        outcome = append_locked(&w);
        (void)flock(w.lock_fd, LOCK_UN);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&map);
    if (outcome == DECLINED) {
        Py_RETURN_NONE;
    }
    if (outcome == FAILED) {
        errno = w.error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *state = new_head_state(w.fields, args[5]);
    if (state == NULL) {
        return NULL;
    }
    PyObject *raw = PyBytes_FromStringAndSize((const char *)w.head, HEAD_SIZE);
    PyObject *first = PyLong_FromUnsignedLongLong(w.first);
    if (raw == NULL || first == NULL) {
        Py_XDECREF(raw);
        Py_XDECREF(first);
        Py_DECREF(state);
        return NULL;
    }
    PyObject *out = PyTuple_New(3);
    if (out == NULL) {
        Py_DECREF(raw);
        Py_DECREF(first);
        Py_DECREF(state);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, first);
    PyTuple_SET_ITEM(out, 1, raw);
    PyTuple_SET_ITEM(out, 2, state);
    return out;
}

/* -- read_head -------------------------------------------------------------------------- */

/* head.py's HeadFile.read, one look: read_head(mapped, last) copies the head record's 80 bytes
 * out of ``mapped`` (the head file's mmap) and returns ``last`` itself, a (raw, state) pair,
 * when they are ``raw``; else a new (raw, HeadState) pair when they are a whole head record
 * (magic and CRC), or None when they are not (torn by a publish under way, or no head). Its
 * twin is head.py's py_read_head. */
static PyObject *
read_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 2) {
        PyErr_SetString(PyExc_TypeError, "read_head() takes a buffer and a (raw, state) pair");
        return NULL;
    }
    if (head_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_head() before bind_head()");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    unsigned char raw[HEAD_SIZE];
    Py_ssize_t have = view.len;
    if (have >= HEAD_SIZE) {
        memcpy(raw, view.buf, HEAD_SIZE); /* one copy: what is checked is what is returned */
    }
    PyBuffer_Release(&view);
    if (have < HEAD_SIZE) {
        Py_RETURN_NONE;
    }
    PyObject *last = args[1];
    PyObject *last_raw = PyTuple_GET_ITEM(last, 0);
    if (PyBytes_Check(last_raw) && PyBytes_GET_SIZE(last_raw) == HEAD_SIZE &&
        memcmp(PyBytes_AS_STRING(last_raw), raw, HEAD_SIZE) == 0) {
        return Py_NewRef(last);
    }
    if (memcmp(raw, "KKVH", 4) != 0 ||
        get_u32(raw + 4) != (uint32_t)crc32(crc32(0L, Z_NULL, 0), raw + 8, HEAD_SIZE - 8)) {
        Py_RETURN_NONE;
    }
    uint64_t f[7];
    for (int i = 0; i < 7; i++) {
        f[i] = get_u64(raw + 8 + 8 * i);
    }
    PyObject *boot = PyBytes_FromStringAndSize((const char *)raw + 64, 16);
    if (boot == NULL) {
        return NULL;
    }
    PyObject *state = new_head_state(f, boot);
    Py_DECREF(boot);
    if (state == NULL) {
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)raw, HEAD_SIZE);
    if (bytes == NULL) {
        Py_DECREF(state);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(bytes);
        Py_DECREF(state);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, bytes);
    PyTuple_SET_ITEM(out, 1, state);
    return out;
}

/* -- latest_into ------------------------------------------------------------------------ */

/* The read side's one function: a stored batch body (format.py's rows, ``[[offset_delta,
 * timestamp_delta, key, value, headers], ...]``) decoded straight into a dict of the last
 * value per key, with no tuple or int made per row. Its twin is frame.py's py_latest_into
 * (msgspec's typed decode of format.py, then a loop): the same rows are accepted, and every
 * body msgspec refuses raises ValueError here (the message differs). */


/* latest_into(target, body, first, limit) -> (taken, last, done): puts the key and value of
 * each row of ``body`` whose offset delta is ``first`` or more, at most ``limit`` of them, into
 * the dict ``target`` in order (so a key keeps its last value). ``taken`` is how many rows were
 * put, ``last`` the offset delta of the last (-1 when none), ``done`` False when a row after it
 * was left for ``limit``. The whole body is checked before anything is put: a malformed one
 * raises ValueError and leaves ``target`` as it was. */
static PyObject *
latest_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "latest_into(target, body, first, limit) takes 4 arguments");
        return NULL;
    }
    PyObject *target = args[0];
    if (!PyDict_CheckExact(target)) {
        PyErr_SetString(PyExc_TypeError, "latest_into(): target must be a dict");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[2]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    reader r = {view.buf, (const unsigned char *)view.buf + view.len};
    selection s;
    row x;
    int64_t last = -1;
    uint64_t last_huge = 0;
    /* Pass 1: check every row, find which ones go in. Pass 2 (only over those): put them. */
    if (select_rows(&r, first, limit, &s) < 0) {
        goto out;
    }
    r.at = s.from;
    for (Py_ssize_t put = 0; put < s.taken; put++) {
        if (next_row_from(&r, first, &x) < 0) {
            goto out; /* checked above: cannot happen */
        }
        PyObject *k = bytes_or_none(x.key, x.key_size);
        PyObject *v = k == NULL ? NULL : bytes_or_none(x.value, x.value_size);
        if (v == NULL || PyDict_SetItem(target, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            goto out;
        }
        Py_DECREF(k);
        Py_DECREF(v);
        last = x.delta;
        last_huge = x.huge;
    }
    PyObject *done = s.done ? Py_True : Py_False;
    result = last_huge ? Py_BuildValue("(nKO)", s.taken, (unsigned long long)last_huge, done)
                       : Py_BuildValue("(nLO)", s.taken, (long long)last, done);
out:
    PyBuffer_Release(&view);
    return result;
}

/* -- read_plain ------------------------------------------------------------------------- */

#define MAX_READ (1LL << 22) /* bytes read at once: partition.py's _MAX_READ_CHUNK */

/* One record of a row: Record(key, value, (), timestamp, partition, offset), a new reference. */
static PyObject *
new_record(const unsigned char *key, Py_ssize_t key_size, const unsigned char *value,
           Py_ssize_t value_size, long long timestamp, PyObject *partition, long long offset)
{
    PyTypeObject *type = (PyTypeObject *)record_type;
    PyObject *r = type->tp_alloc(type, 6);
    if (r == NULL) {
        return NULL;
    }
    PyObject *k = bytes_or_none(key, key_size);
    PyObject *v = k == NULL ? NULL : bytes_or_none(value, value_size);
    PyObject *ts = v == NULL ? NULL : PyLong_FromLongLong(timestamp);
    PyObject *at = ts == NULL ? NULL : PyLong_FromLongLong(offset);
    if (at == NULL) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        Py_XDECREF(ts);
        Py_DECREF(r);
        return NULL;
    }
    PyTuple_SET_ITEM(r, 0, k);
    PyTuple_SET_ITEM(r, 1, v);
    PyTuple_SET_ITEM(r, 2, Py_NewRef(empty_tuple));
    PyTuple_SET_ITEM(r, 3, ts);
    PyTuple_SET_ITEM(r, 4, Py_NewRef(partition));
    PyTuple_SET_ITEM(r, 5, at);
    return r;
}

/* The first want rows of one batch body (count rows exactly; want <= count) appended to out as
 * records, when each of them is plain and in order: offset deltas rising from 0 to at most
 * last_delta, no headers (nil or empty), timestamps that fit; when want is count, the body
 * must end after them too. 1 when taken (*last_delta_taken set), 0 when they are not such
 * (out unchanged, no error), -1 on an error (out may hold some of it: the caller drops out). */
static int
take_plain_rows(const unsigned char *body, Py_ssize_t size, Py_ssize_t count, Py_ssize_t want,
                long long base, long long base_ts, long long last_delta, PyObject *partition,
                PyObject *out, long long *last_delta_taken)
{
    reader r = {body, body + size};
    Py_ssize_t rows, fields, key_size, value_size;
    int64_t delta, stamp;
    uint64_t huge, stamp_huge;
    const unsigned char *key, *value;
    /* Pass 1: is every row plain? (A malformed body is not: the caller's Python path says
     * what is wrong.) */
    if (read_array(&r, &rows) < 0 || rows != count || want > rows || want < 0) {
        PyErr_Clear();
        return 0;
    }
    long long previous = -1;
    for (Py_ssize_t i = 0; i < want; i++) {
        if (read_array(&r, &fields) < 0 || fields != 5 || read_int(&r, &delta, &huge) < 0 ||
            read_int(&r, &stamp, &stamp_huge) < 0 || read_bin(&r, 1, &key, &key_size) < 0 ||
            read_bin(&r, 1, &value, &value_size) < 0) {
            PyErr_Clear();
            return 0;
        }
        if (r.at < r.end && *r.at == 0xc0) { /* headers: nil */
            r.at++;
        }
        else if (r.at < r.end && *r.at == 0x90) { /* headers: an empty array */
            r.at++;
        }
        else {
            return 0;
        }
        if (huge || stamp_huge || delta <= previous || delta > last_delta ||
            (stamp > 0 && base_ts > LLONG_MAX - stamp) ||
            (stamp < 0 && base_ts < LLONG_MIN - stamp)) {
            return 0;
        }
        previous = delta;
    }
    if (want == rows && r.at != r.end) {
        return 0;
    }
    /* Pass 2: the records. */
    r.at = body;
    (void)read_array(&r, &rows);
    for (Py_ssize_t i = 0; i < want; i++) {
        (void)read_array(&r, &fields);
        (void)read_int(&r, &delta, &huge);
        (void)read_int(&r, &stamp, &stamp_huge);
        (void)read_bin(&r, 1, &key, &key_size);
        (void)read_bin(&r, 1, &value, &value_size);
        r.at++; /* the headers, nil or empty */
        PyObject *record =
            new_record(key, key_size, value, value_size, base_ts + stamp, partition, base + delta);
        if (record == NULL) {
            return -1;
        }
        int failed = PyList_Append(out, record);
        Py_DECREF(record);
        if (failed < 0) {
            return -1;
        }
    }
    *last_delta_taken = previous;
    return 1;
}

/* read_plain(fd, pos, end, low, limit, partition, room, budget) -> (records, after, pos, low,
 * room, budget) or None: Partition._read_segment's common case in one call. Reads the
 * segment's bytes from pos (one pread, without the GIL, up to end and about budget) and takes
 * whole batches from there while each one is as an append leaves it: a valid header, base
 * offset exactly low (then one past the batch before), offsets below limit, the CRC right,
 * every row plain (see take_plain_rows), and no more rows than room left. It stops before the
 * first batch that is not, or that does not fit in what was read, or once room or budget
 * (bytes of batches taken) runs out; it returns None when it took no batch, so that the
 * Python path reads from pos and says what is wrong, if anything is. After the batches taken:
 * after, one past the offset of their last record; pos and low, where the next batch begins
 * and the offset it must have; room and budget, what is left of them. */
static PyObject *
read_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "read_plain(fd, pos, end, low, limit, partition, room, "
                                         "budget) takes 8 arguments");
        return NULL;
    }
    if (record_type == NULL) {
        Py_RETURN_NONE; /* not bound: the Python path */
    }
    int ok = 1;
    long long fd = ll_arg(args[0], &ok), pos = ll_arg(args[1], &ok), end = ll_arg(args[2], &ok),
              low = ll_arg(args[3], &ok), limit = ll_arg(args[4], &ok),
              room = ll_arg(args[6], &ok), budget = ll_arg(args[7], &ok);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!ok || fd < 0 || fd > INT_MAX || pos < 0 || end - pos < HEADER_SIZE || low < 0 ||
        room <= 0 || budget <= 0 || !PyLong_CheckExact(args[5])) {
        Py_RETURN_NONE;
    }
    /* As the Python path: up to the end, not far past what the caller wants. */
    long long want = end - pos, most = budget < HEADER_SIZE ? HEADER_SIZE : budget;
    if (want > most) {
        want = most;
    }
    if (want > MAX_READ) {
        want = MAX_READ;
    }
    PyObject *buf = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)want);
    if (buf == NULL) {
        return NULL;
    }
    unsigned char *data = (unsigned char *)PyBytes_AS_STRING(buf);
    ssize_t got;
    Py_BEGIN_ALLOW_THREADS
    got = pread((int)fd, data, (size_t)want, (off_t)pos);
    Py_END_ALLOW_THREADS
    PyObject *out = NULL, *result = NULL;
    if (got < HEADER_SIZE) {
        Py_DECREF(buf);
        Py_RETURN_NONE; /* an error or a short file: the Python path reports it */
    }
    uint32_t first = get_u32(data + 8);
    if (first > got && first <= end - pos) {
        /* One batch larger than the budget or MAX_READ: as the Python path, read exactly it
         * (a read always takes at least one batch; the published end bounds its size). A
         * bulk append's batch of 65,536 records is 7 MB: refused here, it went to Python. */
        if (_PyBytes_Resize(&buf, (Py_ssize_t)first) < 0) {
            return NULL;
        }
        data = (unsigned char *)PyBytes_AS_STRING(buf);
        Py_BEGIN_ALLOW_THREADS
        got = pread((int)fd, data, (size_t)first, (off_t)pos);
        Py_END_ALLOW_THREADS
        if (got < (ssize_t)first) {
            Py_DECREF(buf);
            Py_RETURN_NONE;
        }
    }
    out = PyList_New(0);
    if (out == NULL) {
        goto fail;
    }
    Py_ssize_t p = 0;
    int batches = 0;
    long long after = -1;
    while (room > 0 && budget > 0 && got - p >= HEADER_SIZE) {
        const unsigned char *h = data + p;
        long long base = (long long)get_u64(h);
        uint32_t size = get_u32(h + 8), crc = get_u32(h + 12), count = get_u32(h + 20),
                 last_delta = get_u32(h + 24);
        unsigned char magic = h[16];
        long long base_ts = (long long)get_u64(h + 28);
        if ((magic != BATCH_MAGIC && magic != 1) || size < HEADER_SIZE ||
            (long long)count > (long long)last_delta + 1 || base != low ||
            base > LLONG_MAX - (long long)last_delta || base + (long long)last_delta >= limit ||
            (Py_ssize_t)size > got - p || (long long)count > room) {
            break;
        }
        uLong sum = magic == BATCH_MAGIC ? crc32(crc32(0L, Z_NULL, 0), h, 8)
                                         : crc32(0L, Z_NULL, 0);
        if ((uint32_t)crc_of(sum, h + CRC_START, (Py_ssize_t)size - CRC_START) != crc) {
            break;
        }
        long long taken_delta = -1;
        int took = take_plain_rows(h + HEADER_SIZE, (Py_ssize_t)size - HEADER_SIZE,
                                   (Py_ssize_t)count, (Py_ssize_t)count, base, base_ts,
                                   (long long)last_delta, args[5], out, &taken_delta);
        if (took < 0) {
            goto fail;
        }
        if (took == 0) {
            break;
        }
        if (count > 0) {
            after = base + taken_delta + 1;
        }
        room -= count;
        budget -= size;
        low = base + (long long)last_delta + 1;
        p += size;
        batches++;
    }
    if (batches == 0) {
        Py_DECREF(out);
        Py_DECREF(buf);
        Py_RETURN_NONE;
    }
    result = Py_BuildValue("(OLLLLL)", out, after, pos + (long long)p, low, room, budget);
fail:
    Py_XDECREF(out);
    Py_DECREF(buf);
    return result;
}

/* first_records(buf, pos, partition, want) -> list or None: the first want records of the
 * batch whose header is at pos in buf (whose CRC the caller has checked), with none of the
 * rows after them decoded; None when those rows are not all plain (see take_plain_rows) or
 * the batch does not lie in buf, for the Python path to decode the batch. A read of a few
 * records from the start of a large batch (a map's open reads the first record of a data
 * topic whose first batch may be a whole flush of 500,000 keys) costs those few. */
static PyObject *
first_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "first_records(buf, pos, partition, want) takes 4 "
                                         "arguments");
        return NULL;
    }
    if (record_type == NULL || !PyLong_CheckExact(args[2])) {
        Py_RETURN_NONE;
    }
    int ok = 1;
    long long pos = ll_arg(args[1], &ok), want = ll_arg(args[3], &ok);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *out = NULL;
    const unsigned char *h = (const unsigned char *)view.buf + pos;
    if (!ok || pos < 0 || want <= 0 || view.len - pos < HEADER_SIZE) {
        goto decline;
    }
    uint32_t size = get_u32(h + 8), count = get_u32(h + 20), last_delta = get_u32(h + 24);
    long long base = (long long)get_u64(h), base_ts = (long long)get_u64(h + 28);
    if (size < HEADER_SIZE || (Py_ssize_t)size > view.len - pos || want > (long long)count ||
        (long long)count > (long long)last_delta + 1 || base > LLONG_MAX - (long long)last_delta) {
        goto decline;
    }
    out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    long long taken_delta = -1;
    int took = take_plain_rows(h + HEADER_SIZE, (Py_ssize_t)size - HEADER_SIZE, (Py_ssize_t)count,
                               (Py_ssize_t)want, base, base_ts, (long long)last_delta, args[2],
                               out, &taken_delta);
    PyBuffer_Release(&view);
    if (took < 0) {
        Py_DECREF(out);
        return NULL;
    }
    if (took == 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
decline:
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* -- module ----------------------------------------------------------------------------- */

static PyObject *
bind(PyObject *module, PyObject *record)
{
    if (!PyType_Check(record) || !PyType_IsSubtype((PyTypeObject *)record, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes the Record class (a tuple type)");
        return NULL;
    }
    Py_XSETREF(record_type, Py_NewRef(record));
    Py_RETURN_NONE;
}

static PyObject *
bind_head(PyObject *module, PyObject *state)
{
    if (!PyType_Check(state) || !PyType_IsSubtype((PyTypeObject *)state, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bind_head() takes the HeadState class (a tuple type)");
        return NULL;
    }
    Py_XSETREF(head_type, Py_NewRef(state));
    Py_RETURN_NONE;
}

static PyMethodDef frame_methods[] = {
    {"plain_body", (PyCFunction)(void (*)(void))plain_body, METH_FASTCALL,
     PyDoc_STR("plain_body(records, limit): the msgpack body of plain records, or None.")},
    {"plain_body_columns", (PyCFunction)(void (*)(void))plain_body_columns, METH_FASTCALL,
     PyDoc_STR("plain_body_columns(length, wide, key_offsets, key_data, value_offsets, "
               "value_data, limit): the plain body of the rows of two binary columns, or "
               "None.")},
    {"frame", (PyCFunction)(void (*)(void))frame, METH_FASTCALL,
     PyDoc_STR("frame(base_offset, body, record_count, last_offset_delta, base_timestamp, "
               "max_timestamp, attributes, delete_horizon_ms, producer): a whole batch.")},
    {"frame_header", (PyCFunction)(void (*)(void))frame_header, METH_FASTCALL,
     PyDoc_STR("frame_header(base_offset, body, ...): as frame(), the header alone (its CRC "
               "covers the body): frame(...) == frame_header(...) + body.")},
    {"pack_head", pack_head, METH_O, PyDoc_STR("pack_head(state): the 80-byte head record.")},
    {"append_plain", (PyCFunction)(void (*)(void))append_plain, METH_FASTCALL,
     PyDoc_STR("append_plain(lock_fd, wfd, ifd, head_fd, head_map, boot_id, layout_version, "
               "active_base, write_limit, segment_bytes, roll_at_ms, index_interval, body, "
               "count, base_timestamp, max_timestamp, sync, bell_fd): the steady-state append, or "
               "None.")},
    {"latest_into", (PyCFunction)(void (*)(void))latest_into, METH_FASTCALL,
     PyDoc_STR("latest_into(target, body, first, limit): a batch body's rows into a dict of "
               "the last value per key; (taken, last, done).")},
    {"read_plain", (PyCFunction)(void (*)(void))read_plain, METH_FASTCALL,
     PyDoc_STR("read_plain(fd, pos, end, low, limit, partition, room, budget): whole plain "
               "batches from pos as records, (records, after, pos, low, room, budget), or "
               "None.")},
    {"first_records", (PyCFunction)(void (*)(void))first_records, METH_FASTCALL,
     PyDoc_STR("first_records(buf, pos, partition, want): the first want records of the "
               "batch at pos, none after them decoded, or None.")},
    {"read_head", (PyCFunction)(void (*)(void))read_head, METH_FASTCALL,
     PyDoc_STR("read_head(mapped, last): ``last`` when the head record in ``mapped`` is its raw "
               "bytes, else a new (raw, HeadState) pair, or None when torn.")},
    {"bind", bind, METH_O, PyDoc_STR("bind(Record): the record class plain_body accepts.")},
    {"bind_head", bind_head, METH_O,
     PyDoc_STR("bind_head(HeadState): the head state class append_plain returns.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef frame_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.log.embedded._frame",
    .m_doc = PyDoc_STR("The embedded log's batch encoding in C, and the decoding of "
                       "Log.read_latest (see kafkakv.log.embedded.frame)."),
    .m_size = -1,
    .m_methods = frame_methods,
};

PyMODINIT_FUNC
PyInit__frame(void)
{
    PyObject *struct_module = PyImport_ImportModule("struct");
    if (struct_module == NULL) {
        return NULL;
    }
    struct_error = PyObject_GetAttrString(struct_module, "error");
    Py_DECREF(struct_module);
    if (struct_error == NULL) {
        return NULL;
    }
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&frame_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[ssssssssssss]", "append_plain", "bind", "bind_head",
                                  "first_records", "frame", "frame_header", "latest_into",
                                  "pack_head", "plain_body", "plain_body_columns", "read_head",
                                  "read_plain");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
