/* kafkakv.map._bulk: the ops records of many puts and removes at once, in C.
 *
 * update_records(record_type, keys, values, partitions, origin, next_seqs, stride, limit)
 *     -> (by_partition, bad)
 *
 * The same as bulk.py's py_update_records, which tests/map/test_bulk.py holds it to: for each
 * row, a record (record_type(key, op, (), None, None, None), a tuple built directly) whose
 * value is the ops record msgspec would encode for [PUT, origin, seq, value], or [REMOVE,
 * origin, seq] for a None value, appended to by_partition[partition]; seq is next_seqs[p],
 * which then moves on by ``stride``. ``bad`` is the first row whose key and op together are
 * over ``limit`` bytes (-1: none); then nothing else is returned and next_seqs is as given.
 *
 * update_columns(columns_type, key_offsets, key_data, value_offsets, value_data, value_valid,
 *                prefix, origin, next_seqs, stride, limit) -> (by_partition, bad)
 *
 * The same records from the buffers of two Arrow large_binary columns (64-bit offsets), as
 * bulk.py's py_update_columns: row i's record key is prefix + its key, its partition the one
 * Kafka's default partitioner picks for that (murmur2, _murmur2.h), its value the ops record
 * update_records makes (a remove where value_valid, a byte per row, holds 0). Each partition
 * that gets a row gets a columns_type(length, True, key_offsets, key_data, value_offsets,
 * value_data, {}) of new bytes: two passes over the rows (partitions and sizes, then the
 * bytes), no Python object per row.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_msgpack.h" /* src/kafkakv/_msgpack.h */
#include "_murmur2.h" /* src/kafkakv/_murmur2.h */

#define OP_PUT 1
#define OP_REMOVE 5

/* Bytes of the ops record of a put of value_size bytes, or of a remove (value_size < 0). */
static inline Py_ssize_t
update_size(Py_ssize_t origin_size, uint64_t seq, Py_ssize_t value_size)
{
    Py_ssize_t size = 1 + 1 + bin_size(origin_size) + uint_size(seq);
    return value_size < 0 ? size : size + bin_size(value_size);
}

/* Writes at p the ops record of a put of value (value_size bytes) or, for value_size < 0, of a
 * remove; returns where it ends. */
static inline unsigned char *
put_update(unsigned char *p, const char *origin, Py_ssize_t origin_size, uint64_t seq,
           const char *value, Py_ssize_t value_size)
{
    *p++ = value_size >= 0 ? 0x94 : 0x93; /* a fixarray of 4 or 3 */
    *p++ = value_size >= 0 ? OP_PUT : OP_REMOVE;
    p = put_bin(p, origin, origin_size);
    p = put_uint(p, seq);
    if (value_size >= 0) {
        p = put_bin(p, value, value_size);
    }
    return p;
}

/* The ops record of one put (value) or remove (value NULL). */
static PyObject *
encode_update(const char *origin, Py_ssize_t origin_size, uint64_t seq, const char *value,
              Py_ssize_t value_size)
{
    if (value == NULL) {
        value_size = -1;
    }
    PyObject *op = PyBytes_FromStringAndSize(NULL, update_size(origin_size, seq, value_size));
    if (op == NULL) {
        return NULL;
    }
    put_update((unsigned char *)PyBytes_AS_STRING(op), origin, origin_size, seq, value,
               value_size);
    return op;
}

static int
check_list(PyObject *o, const char *what)
{
    if (!PyList_CheckExact(o)) {
        PyErr_Format(PyExc_TypeError, "update_records(): %s must be a list", what);
        return -1;
    }
    return 0;
}

static PyObject *
update_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "update_records(record_type, keys, values, partitions, origin, "
                        "next_seqs, stride, limit) takes 8 arguments");
        return NULL;
    }
    PyObject *type = args[0], *keys = args[1], *values = args[2], *parts = args[3];
    PyObject *origin = args[4], *next_seqs = args[5];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "update_records(): record_type must be a tuple type");
        return NULL;
    }
    if (check_list(keys, "keys") < 0 || check_list(values, "values") < 0 ||
        check_list(parts, "partitions") < 0 || check_list(next_seqs, "next_seqs") < 0) {
        return NULL;
    }
    if (!PyBytes_CheckExact(origin)) {
        PyErr_SetString(PyExc_TypeError, "update_records(): origin must be bytes");
        return NULL;
    }
    long long stride = PyLong_AsLongLong(args[6]);
    if (stride == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[7]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys), count = PyList_GET_SIZE(next_seqs);
    if (PyList_GET_SIZE(values) != n || PyList_GET_SIZE(parts) != n) {
        PyErr_SetString(PyExc_ValueError, "update_records(): keys, values and partitions differ "
                                          "in length");
        return NULL;
    }
    if (stride <= 0) {
        PyErr_SetString(PyExc_ValueError, "update_records(): stride must be positive");
        return NULL;
    }
    const char *o = PyBytes_AS_STRING(origin);
    Py_ssize_t origin_size = PyBytes_GET_SIZE(origin);
    PyTypeObject *record_type = (PyTypeObject *)type;
    /* The seqs, read once, moved on here, written back only when every row went in. */
    uint64_t *seqs = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(uint64_t));
    PyObject **lists = PyMem_Calloc((size_t)(count ? count : 1), sizeof(PyObject *));
    PyObject *out = NULL, *result = NULL, *empty = NULL;
    Py_ssize_t bad = -1;
    if (seqs == NULL || lists == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        unsigned long long s = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(next_seqs, p));
        if (s == (unsigned long long)-1 && PyErr_Occurred()) {
            goto done;
        }
        seqs[p] = s;
    }
    out = PyDict_New();
    empty = PyTuple_New(0);
    if (out == NULL || empty == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        Py_ssize_t p = PyLong_AsSsize_t(PyList_GET_ITEM(parts, i));
        if (p == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (p < 0 || p >= count) {
            PyErr_Format(PyExc_ValueError, "update_records(): row %zd's partition %zd is not "
                                           "one of %zd", i, p, count);
            goto done;
        }
        if (!PyBytes_CheckExact(key) || (value != Py_None && !PyBytes_CheckExact(value))) {
            PyErr_Format(PyExc_TypeError, "update_records(): row %zd: a key must be bytes, a "
                                          "value bytes or None", i);
            goto done;
        }
        const char *v = value == Py_None ? NULL : PyBytes_AS_STRING(value);
        Py_ssize_t value_size = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        PyObject *op = encode_update(o, origin_size, seqs[p], v, value_size);
        if (op == NULL) {
            goto done;
        }
        if (PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(op) > limit) {
            Py_DECREF(op);
            bad = i;
            break;
        }
        seqs[p] += (uint64_t)stride;
        PyObject *record = record_type->tp_alloc(record_type, 6);
        if (record == NULL) {
            Py_DECREF(op);
            goto done;
        }
        PyTuple_SET_ITEM(record, 0, Py_NewRef(key));
        PyTuple_SET_ITEM(record, 1, op);
        PyTuple_SET_ITEM(record, 2, Py_NewRef(empty));
        PyTuple_SET_ITEM(record, 3, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(record, 4, Py_NewRef(Py_None));
        PyTuple_SET_ITEM(record, 5, Py_NewRef(Py_None));
        if (lists[p] == NULL) {
            lists[p] = PyList_New(0);
            PyObject *number = lists[p] == NULL ? NULL : PyLong_FromSsize_t(p);
            if (number == NULL || PyDict_SetItem(out, number, lists[p]) < 0) {
                Py_XDECREF(number);
                Py_DECREF(record);
                goto done;
            }
            Py_DECREF(number);
        }
        int appended = PyList_Append(lists[p], record);
        Py_DECREF(record);
        if (appended < 0) {
            goto done;
        }
    }
    if (bad >= 0) {
        PyDict_Clear(out);
    }
    else {
        for (Py_ssize_t p = 0; p < count; p++) {
            PyObject *s = PyLong_FromUnsignedLongLong(seqs[p]);
            if (s == NULL || PyList_SetItem(next_seqs, p, s) < 0) {
                goto done;
            }
        }
    }
    result = Py_BuildValue("(On)", out, bad);
done:
    if (lists != NULL) {
        for (Py_ssize_t p = 0; p < count; p++) {
            Py_XDECREF(lists[p]);
        }
    }
    PyMem_Free(lists);
    PyMem_Free(seqs);
    Py_XDECREF(out);
    Py_XDECREF(empty);
    return result;
}

/* update_columns() from here on. */

/* One partition's share of a batch: counted in the first pass, written in the second. */
typedef struct {
    Py_ssize_t rows, key_size, value_size; /* its rows, bytes of record keys, of ops records */
    PyObject *key_offsets, *key_data, *value_offsets, *value_data; /* new bytes */
    Py_ssize_t row;                                                /* rows written */
    unsigned char *key_at, *value_at;                              /* where the next goes */
} share;

/* Offset i of a buffer of native int64s (copied out: a buffer need not be aligned). */
static inline int64_t
offset_at(const Py_buffer *offsets, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, (const char *)offsets->buf + 8 * i, sizeof v);
    return v;
}

static inline void
set_offset(PyObject *offsets, Py_ssize_t i, int64_t v)
{
    memcpy(PyBytes_AS_STRING(offsets) + 8 * i, &v, sizeof v);
}

/* The bytes of argument ``what``, any C-contiguous buffer: 0, or -1 with an error set. */
static int
get_bytes(PyObject *o, Py_buffer *view, const char *what)
{
    if (!PyObject_CheckBuffer(o)) {
        PyErr_Format(PyExc_TypeError, "update_columns(): %s must be a buffer, not %.200s", what,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    return PyObject_GetBuffer(o, view, PyBUF_SIMPLE);
}

/* The rows a buffer of offsets gives (its int64s less one; none for an empty buffer), or -1
 * with ValueError. */
static Py_ssize_t
offsets_rows(const Py_buffer *offsets, const char *what)
{
    if (offsets->len % 8 != 0) {
        PyErr_Format(PyExc_ValueError,
                     "update_columns(): %s holds %zd bytes, not a whole number of 64-bit offsets",
                     what, offsets->len);
        return -1;
    }
    return offsets->len == 0 ? 0 : offsets->len / 8 - 1;
}

/* 0 when n rows' offsets start at 0 or later, never go down and end inside the data; else -1
 * with a ValueError naming the column and the row. */
static int
check_offsets(const Py_buffer *offsets, Py_ssize_t n, Py_ssize_t data_size, const char *what,
              const char *data_what)
{
    int64_t start = n > 0 ? offset_at(offsets, 0) : 0;
    if (start < 0) {
        PyErr_Format(PyExc_ValueError, "update_columns(): %s: row 0 starts at %lld, before 0",
                     what, (long long)start);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t end = offset_at(offsets, i + 1);
        if (end < start) {
            PyErr_Format(PyExc_ValueError,
                         "update_columns(): %s: row %zd ends at %lld, before it starts at %lld",
                         what, i, (long long)end, (long long)start);
            return -1;
        }
        if (end > (int64_t)data_size) {
            PyErr_Format(PyExc_ValueError,
                         "update_columns(): %s: row %zd ends at %lld, past the %zd bytes of %s",
                         what, i, (long long)end, data_size, data_what);
            return -1;
        }
        start = end;
    }
    return 0;
}

/* Takes size bytes off *room: 0, or -1 when they are not there (nothing taken). Neither side
 * can overflow, whatever the sizes. */
static inline int
take(Py_ssize_t *room, Py_ssize_t size)
{
    if (size > *room) {
        return -1;
    }
    *room -= size;
    return 0;
}

/* Bytes msgpack puts before n bytes of bin (bin_size(n) - n, without the sum). */
static inline Py_ssize_t
bin_head(Py_ssize_t n)
{
    return n < 256 ? 2 : n < 65536 ? 3 : 5;
}

/* Adds size to *total: 0, or -1 past PY_SSIZE_T_MAX (nothing added). */
static inline int
add_size(Py_ssize_t *total, Py_ssize_t size)
{
    if (size > PY_SSIZE_T_MAX - *total) {
        return -1;
    }
    *total += size;
    return 0;
}

/* An int argument as a Py_ssize_t, clamped: what is over PY_SSIZE_T_MAX is PY_SSIZE_T_MAX and
 * what is below -1 is -1 (a limit: either way every row or no row fits alike). */
static int
clamped_limit(PyObject *arg, Py_ssize_t *limit)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (v == -1 && !overflow && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0 || v > (long long)PY_SSIZE_T_MAX) {
        *limit = PY_SSIZE_T_MAX;
    }
    else if (overflow < 0 || v < -1) {
        *limit = -1;
    }
    else {
        *limit = (Py_ssize_t)v;
    }
    return 0;
}

#define COLUMN_VIEWS 5 /* key_offsets, key_data, value_offsets, value_data, value_valid */

static PyObject *
update_columns(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError,
                        "update_columns(columns_type, key_offsets, key_data, value_offsets, "
                        "value_data, value_valid, prefix, origin, next_seqs, stride, limit) "
                        "takes 11 arguments");
        return NULL;
    }
    PyObject *type = args[0], *valid_arg = args[5], *prefix = args[6], *origin = args[7];
    PyObject *next_seqs = args[8];
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "update_columns(): columns_type must be a tuple type");
        return NULL;
    }
    if (!PyBytes_CheckExact(prefix) || !PyBytes_CheckExact(origin)) {
        PyErr_SetString(PyExc_TypeError, "update_columns(): prefix and origin must be bytes");
        return NULL;
    }
    if (!PyList_CheckExact(next_seqs)) {
        PyErr_SetString(PyExc_TypeError, "update_columns(): next_seqs must be a list");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(next_seqs);
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "update_columns(): next_seqs must hold a seq per partition, at least one");
        return NULL;
    }
    int overflow = 0;
    long long stride = PyLong_AsLongLongAndOverflow(args[9], &overflow);
    if (stride == -1 && !overflow && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow > 0) {
        PyErr_SetString(PyExc_OverflowError, "update_columns(): stride is over 2**63 - 1");
        return NULL;
    }
    if (overflow < 0 || stride <= 0) {
        PyErr_SetString(PyExc_ValueError, "update_columns(): stride must be positive");
        return NULL;
    }
    Py_ssize_t limit;
    if (clamped_limit(args[10], &limit) < 0) {
        return NULL;
    }

    Py_buffer views[COLUMN_VIEWS];
    memset(views, 0, sizeof views); /* a view not taken has no obj: releasing it does nothing */
    Py_buffer *ko = &views[0], *kd = &views[1], *vo = &views[2], *vd = &views[3];
    Py_buffer *valid = valid_arg == Py_None ? NULL : &views[4];
    uint64_t *seqs = PyMem_Malloc((size_t)count * sizeof(uint64_t));
    uint64_t *written_seqs = PyMem_Malloc((size_t)count * sizeof(uint64_t)); /* pass 2's */
    share *shares = PyMem_Calloc((size_t)count, sizeof(share));
    Py_ssize_t *order = PyMem_Malloc((size_t)count * sizeof(Py_ssize_t)); /* first seen first */
    uint32_t *parts = NULL;       /* each row's partition */
    unsigned char *joined = NULL; /* prefix + key, when there is a prefix */
    PyObject *out = NULL, *result = NULL;
    Py_ssize_t seen = 0, bad = -1;
    if (seqs == NULL || written_seqs == NULL || shares == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        unsigned long long s = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(next_seqs, p));
        if (s == (unsigned long long)-1 && PyErr_Occurred()) {
            goto done;
        }
        seqs[p] = written_seqs[p] = s;
    }
    if (get_bytes(args[1], ko, "key_offsets") < 0 || get_bytes(args[2], kd, "key_data") < 0 ||
        get_bytes(args[3], vo, "value_offsets") < 0 || get_bytes(args[4], vd, "value_data") < 0 ||
        (valid != NULL && get_bytes(valid_arg, valid, "value_valid") < 0)) {
        goto done;
    }
    Py_ssize_t n = offsets_rows(ko, "key_offsets");
    Py_ssize_t value_rows = n < 0 ? -1 : offsets_rows(vo, "value_offsets");
    if (value_rows < 0) {
        goto done;
    }
    if (value_rows != n) {
        PyErr_Format(PyExc_ValueError,
                     "update_columns(): key_offsets hold %zd rows, value_offsets %zd", n,
                     value_rows);
        goto done;
    }
    if (valid != NULL && valid->len != n) {
        PyErr_Format(PyExc_ValueError,
                     "update_columns(): value_valid holds %zd bytes for %zd rows", valid->len, n);
        goto done;
    }
    /* From here on no Python code runs until the bytes are written (no container is made, so
     * no collection either): the buffers, checked once, cannot change under the passes. */
    if (check_offsets(ko, n, kd->len, "key_offsets", "key_data") < 0 ||
        check_offsets(vo, n, vd->len, "value_offsets", "value_data") < 0) {
        goto done;
    }
    parts = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(uint32_t));
    if (parts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const unsigned char *keys = kd->buf != NULL ? kd->buf : (const unsigned char *)"";
    const char *values = vd->buf != NULL ? vd->buf : "";
    const unsigned char *valid_bytes = valid != NULL ? valid->buf : NULL;
    const char *o = PyBytes_AS_STRING(origin), *head = PyBytes_AS_STRING(prefix);
    Py_ssize_t origin_size = PyBytes_GET_SIZE(origin), head_size = PyBytes_GET_SIZE(prefix);
    Py_ssize_t room = 0; /* bytes of joined */

    /* Pass 1: each row's partition, seq and sizes; the first row over the limit stops it. */
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t k0 = offset_at(ko, i), v0 = offset_at(vo, i);
        Py_ssize_t key_size = (Py_ssize_t)(offset_at(ko, i + 1) - k0);
        Py_ssize_t value_size = valid_bytes == NULL || valid_bytes[i] != 0
                                    ? (Py_ssize_t)(offset_at(vo, i + 1) - v0)
                                    : -1;
        Py_ssize_t left = limit;
        if (take(&left, head_size) < 0 || take(&left, key_size) < 0) {
            bad = i;
            break;
        }
        const unsigned char *key = keys + k0;
        Py_ssize_t record_key_size = head_size + key_size; /* <= limit: no overflow */
        if (head_size > 0) {
            if (record_key_size > room) {
                unsigned char *grown = PyMem_Realloc(joined, (size_t)record_key_size);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                if (joined == NULL) {
                    memcpy(grown, head, (size_t)head_size);
                }
                joined = grown;
                room = record_key_size;
            }
            memcpy(joined + head_size, key, (size_t)key_size);
            key = joined;
        }
        Py_ssize_t p = (Py_ssize_t)(murmur2_hash(key, record_key_size) & 0x7fffffffu) % count;
        uint64_t seq = seqs[p];
        /* The ops record less its value: an origin is a bytes object, far from the bound. */
        if (take(&left, update_size(origin_size, seq, -1)) < 0 ||
            (value_size >= 0 &&
             (take(&left, bin_head(value_size)) < 0 || take(&left, value_size) < 0))) {
            bad = i;
            break;
        }
        if (seq > UINT64_MAX - (uint64_t)stride) {
            PyErr_Format(PyExc_OverflowError,
                         "update_columns(): row %zd: partition %zd's seqs go past 2**64 - 1", i,
                         p);
            goto done;
        }
        seqs[p] = seq + (uint64_t)stride;
        share *s = &shares[p];
        if (s->rows++ == 0) {
            order[seen++] = p;
        }
        if (add_size(&s->key_size, record_key_size) < 0 ||
            add_size(&s->value_size, update_size(origin_size, seq, value_size)) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        parts[i] = (uint32_t)p;
    }
    if (bad >= 0) {
        result = Py_BuildValue("({}n)", bad);
        goto done;
    }

    /* Pass 2: the bytes, into each partition's columns, sized exactly. */
    for (Py_ssize_t j = 0; j < seen; j++) {
        share *s = &shares[order[j]];
        s->key_offsets = PyBytes_FromStringAndSize(NULL, (s->rows + 1) * 8);
        s->key_data = PyBytes_FromStringAndSize(NULL, s->key_size);
        s->value_offsets = PyBytes_FromStringAndSize(NULL, (s->rows + 1) * 8);
        s->value_data = PyBytes_FromStringAndSize(NULL, s->value_size);
        if (s->key_offsets == NULL || s->key_data == NULL || s->value_offsets == NULL ||
            s->value_data == NULL) {
            goto done;
        }
        set_offset(s->key_offsets, 0, 0);
        set_offset(s->value_offsets, 0, 0);
        s->key_at = (unsigned char *)PyBytes_AS_STRING(s->key_data);
        s->value_at = (unsigned char *)PyBytes_AS_STRING(s->value_data);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t p = parts[i];
        share *s = &shares[p];
        int64_t k0 = offset_at(ko, i), v0 = offset_at(vo, i);
        Py_ssize_t key_size = (Py_ssize_t)(offset_at(ko, i + 1) - k0);
        Py_ssize_t value_size = valid_bytes == NULL || valid_bytes[i] != 0
                                    ? (Py_ssize_t)(offset_at(vo, i + 1) - v0)
                                    : -1;
        memcpy(s->key_at, head, (size_t)head_size);
        memcpy(s->key_at + head_size, keys + k0, (size_t)key_size);
        s->key_at += head_size + key_size;
        s->value_at = put_update(s->value_at, o, origin_size, written_seqs[p], values + v0,
                                 value_size);
        written_seqs[p] += (uint64_t)stride;
        s->row++;
        set_offset(s->key_offsets, s->row,
                   (int64_t)(s->key_at - (unsigned char *)PyBytes_AS_STRING(s->key_data)));
        set_offset(s->value_offsets, s->row,
                   (int64_t)(s->value_at - (unsigned char *)PyBytes_AS_STRING(s->value_data)));
    }

    /* The columns, one object per partition, in the order the partitions first came. */
    out = PyDict_New();
    if (out == NULL) {
        goto done;
    }
    for (Py_ssize_t j = 0; j < seen; j++) {
        Py_ssize_t p = order[j];
        share *s = &shares[p];
        PyObject *length = PyLong_FromSsize_t(s->rows), *apart = PyDict_New();
        PyObject *number = PyLong_FromSsize_t(p), *columns = NULL;
        if (length != NULL && apart != NULL && number != NULL) {
            PyObject *fields[7] = {length,       Py_True,       s->key_offsets, s->key_data,
                                   s->value_offsets, s->value_data, apart};
            columns = PyObject_Vectorcall(type, fields, 7, NULL);
        }
        int set = columns == NULL ? -1 : PyDict_SetItem(out, number, columns);
        Py_XDECREF(length);
        Py_XDECREF(apart);
        Py_XDECREF(number);
        Py_XDECREF(columns);
        if (set < 0) {
            goto done;
        }
    }
    /* Every row went in: the seqs move on (columns_type ran Python code: the list may have
     * changed since). */
    if (PyList_GET_SIZE(next_seqs) != count) {
        PyErr_SetString(PyExc_RuntimeError, "update_columns(): next_seqs changed during the call");
        goto done;
    }
    PyObject *moved = PyList_New(count); /* all made first: next_seqs changes whole or not */
    if (moved == NULL) {
        goto done;
    }
    for (Py_ssize_t p = 0; p < count; p++) {
        PyObject *s = PyLong_FromUnsignedLongLong(seqs[p]);
        if (s == NULL) {
            Py_DECREF(moved);
            goto done;
        }
        PyList_SET_ITEM(moved, p, s);
    }
    int replaced = PyList_SetSlice(next_seqs, 0, count, moved);
    Py_DECREF(moved);
    if (replaced < 0) {
        goto done;
    }
    result = Py_BuildValue("(On)", out, (Py_ssize_t)-1);
done:
    for (Py_ssize_t j = 0; j < seen; j++) {
        share *s = &shares[order[j]];
        Py_XDECREF(s->key_offsets);
        Py_XDECREF(s->key_data);
        Py_XDECREF(s->value_offsets);
        Py_XDECREF(s->value_data);
    }
    for (int v = 0; v < COLUMN_VIEWS; v++) {
        PyBuffer_Release(&views[v]);
    }
    PyMem_Free(joined);
    PyMem_Free(parts);
    PyMem_Free(order);
    PyMem_Free(shares);
    PyMem_Free(written_seqs);
    PyMem_Free(seqs);
    Py_XDECREF(out);
    return result;
}

static PyMethodDef bulk_methods[] = {
    {"update_records", (PyCFunction)(void (*)(void))update_records, METH_FASTCALL,
     PyDoc_STR("update_records(record_type, keys, values, partitions, origin, next_seqs, "
               "stride, limit): (records by partition, first row over limit or -1).")},
    {"update_columns", (PyCFunction)(void (*)(void))update_columns, METH_FASTCALL,
     PyDoc_STR("update_columns(columns_type, key_offsets, key_data, value_offsets, value_data, "
               "value_valid, prefix, origin, next_seqs, stride, limit): (columns by partition, "
               "first row over limit or -1).")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bulk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.map._bulk",
    .m_doc = PyDoc_STR("The ops records of many puts and removes at once (see "
                       "kafkakv.map.bulk)."),
    .m_size = -1,
    .m_methods = bulk_methods,
};

PyMODINIT_FUNC
PyInit__bulk(void)
{
    PyObject *module = PyModule_Create(&bulk_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[ss]", "update_columns", "update_records");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
