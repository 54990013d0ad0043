/* kafkakv.log.embedded._columns: the last value per key of stored batches, as columns.
 *
 * One type, LatestColumns(seed): an accumulator for Log.latest_columns. Each stored batch body
 * a read takes is given to add(body, first, limit), which checks the whole body as latest_into
 * does and notes, for each row taken, where its key and value lie in the body: no bytes object
 * per row, no copy. A hash table (open addressing over the key bytes, hashed with ``seed``)
 * keeps one entry per key, whose value the later rows replace. finish(apart) then writes the
 * keys and values of the entries that are not tombstones, in the order the keys first came,
 * as the offsets and data buffers of two Arrow binary arrays.
 *
 * Its twin is columns.py's PyLatestColumns (a dict, py_latest_into, columns_of); the tests
 * give both the same bodies and compare what finish returns.
 *
 * One function, packed(values, allocate=None, narrow=INT32_MAX): a list of bytes or None as
 * the buffers of one binary column (for a Spark task's rows, in place of pa.array's converter,
 * which grows its buffers as it goes). Its twin is columns.py's py_packed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_rows.h"

typedef struct {
    const unsigned char *key, *value; /* value NULL: the key's last record is a tombstone */
    Py_ssize_t key_size, value_size;
    uint64_t hash;
} entry;

typedef struct {
    PyObject_HEAD
    uint64_t seed;
    entry *entries;      /* one per key, in the order the keys first came */
    Py_ssize_t used, room;
    uint64_t *slots;     /* 0 for an empty slot, else slot_value(): hash tag, entry index */
    size_t mask;         /* slots - 1 (a power of two less one; 0: no table yet) */
    Py_buffer *views;    /* the bodies entries point into, held until the object goes */
    Py_ssize_t views_used, views_room;
    PyObject *held;      /* a list of the bytes put() was given (entries point into them) */
} LatestColumns;

/* -- the hash --------------------------------------------------------------------------- */

static inline uint64_t
mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* A seeded hash of the key bytes, eight at a time. Not a cryptographic one: the seed (random
 * per object) keeps keys chosen to collide from being chosen in advance. */
static uint64_t
hash_key(uint64_t seed, const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = seed ^ ((uint64_t)n * 0x9e3779b97f4a7c15ULL);
    uint64_t w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ mix(w ^ seed)) * 0x9e3779b97f4a7c15ULL;
        h = (h << 31) | (h >> 33);
    }
    w = 0;
    if (n > 0) {
        memcpy(&w, p, (size_t)n);
    }
    return mix(h ^ mix(w ^ seed ^ (uint64_t)n));
}

/* -- the table -------------------------------------------------------------------------- */

/* A slot holds the high 32 bits of its key's hash (a probe compares them before it looks at
 * the entry, which is rarely in cache) and 1 + the entry's index. */
static inline uint64_t
slot_value(uint64_t hash, Py_ssize_t index)
{
    return (hash & 0xffffffff00000000ULL) | (uint64_t)(index + 1);
}

static inline Py_ssize_t
slot_index(uint64_t slot)
{
    return (Py_ssize_t)(slot & 0xffffffffULL) - 1;
}

/* The slot of a key: the one holding its entry, or the empty one where it would go. */
static inline size_t
slot_of(const LatestColumns *self, const unsigned char *key, Py_ssize_t size, uint64_t h)
{
    uint64_t tag = h & 0xffffffff00000000ULL;
    size_t i = (size_t)h & self->mask;
    for (;;) {
        uint64_t slot = self->slots[i];
        if (slot == 0) {
            return i;
        }
        if ((slot & 0xffffffff00000000ULL) == tag) {
            const entry *e = &self->entries[slot_index(slot)];
            if (e->key_size == size && memcmp(e->key, key, (size_t)size) == 0) {
                return i;
            }
        }
        i = (i + 1) & self->mask;
    }
}

/* Room for ``more`` entries beyond those there: the entries grow by half (or to fit), the
 * slots double until they are at most half full. */
static int
make_room(LatestColumns *self, Py_ssize_t more)
{
    Py_ssize_t need = self->used + more;
    if (need >= (Py_ssize_t)0xffffffffLL) {
        PyErr_SetString(PyExc_OverflowError, "LatestColumns holds at most 2**32 - 2 keys");
        return -1;
    }
    if (need > self->room) {
        Py_ssize_t room = self->room < 1024 ? 1024 : self->room + self->room / 2;
        if (room < need) {
            room = need;
        }
        entry *grown = PyMem_Realloc(self->entries, (size_t)room * sizeof(entry));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->entries = grown;
        self->room = room;
    }
    size_t size = self->mask + 1;
    if (self->mask != 0 && (size_t)need * 2 <= size) {
        return 0;
    }
    if (size < 2048) {
        size = 2048;
    }
    while ((size_t)need * 2 > size) {
        size *= 2;
    }
    uint64_t *slots = PyMem_Calloc(size, sizeof(uint64_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->slots);
    self->slots = slots;
    self->mask = size - 1;
    for (Py_ssize_t j = 0; j < self->used; j++) {
        uint64_t h = self->entries[j].hash;
        size_t i = (size_t)h & self->mask;
        while (slots[i] != 0) {
            i = (i + 1) & self->mask;
        }
        slots[i] = slot_value(h, j);
    }
    return 0;
}

/* Take ``e`` (a copy: it may lie in the entries past ``used``) into the table: a new key's
 * entry, or the new value of a key there. Room was made. */
static inline void
take_entry(LatestColumns *self, entry e)
{
    size_t i = slot_of(self, e.key, e.key_size, e.hash);
    uint64_t slot = self->slots[i];
    if (slot != 0) {
        entry *there = &self->entries[slot_index(slot)];
        there->value = e.value;
        there->value_size = e.value_size;
        return;
    }
    self->entries[self->used] = e;
    self->slots[i] = slot_value(e.hash, self->used);
    self->used++;
}

/* The index of a key's entry, or -1. */
static Py_ssize_t
find(const LatestColumns *self, const unsigned char *key, Py_ssize_t size)
{
    if (self->mask == 0) {
        return -1;
    }
    uint64_t slot = self->slots[slot_of(self, key, size, hash_key(self->seed, key, size))];
    return slot == 0 ? -1 : slot_index(slot);
}

/* -- the type --------------------------------------------------------------------------- */

static int
init(LatestColumns *self, PyObject *args, PyObject *kwargs)
{
    unsigned long long seed = 0;
    static char *names[] = {"seed", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|K:LatestColumns", names, &seed)) {
        return -1;
    }
    if (self->held != NULL) {
        PyErr_SetString(PyExc_TypeError, "LatestColumns is initialized once");
        return -1;
    }
    self->held = PyList_New(0);
    if (self->held == NULL) {
        return -1;
    }
    self->seed = seed;
    return 0;
}

static void
dealloc(LatestColumns *self)
{
    for (Py_ssize_t i = 0; i < self->views_used; i++) {
        PyBuffer_Release(&self->views[i]);
    }
    PyMem_Free(self->views);
    PyMem_Free(self->entries);
    PyMem_Free(self->slots);
    Py_XDECREF(self->held);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
check_ready(LatestColumns *self)
{
    if (self->held == NULL) {
        PyErr_SetString(PyExc_TypeError, "LatestColumns.__init__ was not called");
        return -1;
    }
    return 0;
}

/* add(body, first, limit) -> (taken, last, done): as latest_into, into this table. The body
 * is held while the object lives (when a row was taken from it). */
static PyObject *
add(LatestColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(body, first, limit) takes 3 arguments");
        return NULL;
    }
    if (check_ready(self) < 0) {
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (self->views_used == self->views_room) {
        Py_ssize_t room = self->views_room < 16 ? 16 : self->views_room * 2;
        Py_buffer *grown = PyMem_Realloc(self->views, (size_t)room * sizeof(Py_buffer));
        if (grown == NULL) {
            return PyErr_NoMemory();
        }
        self->views = grown;
        self->views_room = room;
    }
    Py_buffer *view = &self->views[self->views_used];
    if (PyObject_GetBuffer(args[0], view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    reader r = {view->buf, (const unsigned char *)view->buf + view->len};
    Py_ssize_t rows, taken = 0, keyed = 0;
    int done = 1;
    row x;
    int64_t last = -1;
    uint64_t last_huge = 0;
    /* Pass 1 checks the whole body, and notes each row taken that has a key, with its hash,
     * past the entries in use: a malformed body changes nothing. */
    if (read_array(&r, &rows) < 0 || make_room(self, rows) < 0) {
        PyBuffer_Release(view);
        return NULL;
    }
    entry *noted = self->entries + self->used;
    for (Py_ssize_t i = 0; i < rows; i++) {
        __builtin_prefetch(r.at + 1024); /* as in select_rows (_rows.h) */
        if (read_row(&r, &x) < 0) {
            PyBuffer_Release(view);
            return NULL;
        }
        if (!row_from(&x, first)) {
            continue;
        }
        if (taken == limit) {
            done = 0;
            continue;
        }
        taken++;
        last = x.delta;
        last_huge = x.huge;
        if (x.key != NULL) {
            noted[keyed++] = (entry){x.key, x.value, x.key_size, x.value_size,
                                     hash_key(self->seed, x.key, x.key_size)};
        }
    }
    if (r.at != r.end) {
        malformed("bytes after the rows");
        PyBuffer_Release(view);
        return NULL;
    }
    /* Pass 2 takes them into the table in order, the slot of a row a few ahead fetched into
     * cache meanwhile (the slots of a large table are rarely in cache). A noted row is at or
     * past ``used``: taken as a new entry, it moves down to ``used``. */
    const Py_ssize_t ahead = 8;
    for (Py_ssize_t j = 0; j < keyed; j++) {
        if (j + ahead < keyed) {
            __builtin_prefetch(&self->slots[(size_t)noted[j + ahead].hash & self->mask]);
        }
        take_entry(self, noted[j]);
    }
    if (keyed > 0) {
        self->views_used++;
    }
    else {
        PyBuffer_Release(view);
    }
    PyObject *finished = done ? Py_True : Py_False;
    return last_huge ? Py_BuildValue("(nKO)", taken, (unsigned long long)last_huge, finished)
                     : Py_BuildValue("(nLO)", taken, (long long)last, finished);
}

/* put(key, value): the key's value is now ``value`` (None: a tombstone). A None key is not
 * a key: nothing is put. */
static PyObject *
put(LatestColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "put(key, value) takes 2 arguments");
        return NULL;
    }
    if (check_ready(self) < 0) {
        return NULL;
    }
    PyObject *key = args[0], *value = args[1];
    if (key == Py_None) {
        Py_RETURN_NONE;
    }
    if (!PyBytes_CheckExact(key) || (value != Py_None && !PyBytes_CheckExact(value))) {
        PyErr_SetString(PyExc_TypeError, "put(): key must be bytes, value bytes or None");
        return NULL;
    }
    if (PyList_Append(self->held, key) < 0 ||
        (value != Py_None && PyList_Append(self->held, value) < 0)) {
        return NULL;
    }
    const unsigned char *v = NULL;
    Py_ssize_t value_size = 0;
    if (value != Py_None) {
        v = (const unsigned char *)PyBytes_AS_STRING(value);
        value_size = PyBytes_GET_SIZE(value);
    }
    if (make_room(self, 1) < 0) {
        return NULL;
    }
    const unsigned char *k = (const unsigned char *)PyBytes_AS_STRING(key);
    Py_ssize_t key_size = PyBytes_GET_SIZE(key);
    take_entry(self, (entry){k, v, key_size, value_size, hash_key(self->seed, k, key_size)});
    Py_RETURN_NONE;
}

/* A buffer of ``size`` bytes to write: new bytes, or what ``allocate(size)`` returns (any
 * writable buffer of at least that size; Arrow's pool keeps its pages from one read to the next,
 * where fresh bytes fault every page in). Sets *obj (a new reference) and *at. */
static int
new_buffer(PyObject *allocate, Py_ssize_t size, PyObject **obj, char **at)
{
    if (allocate == Py_None) {
        *obj = PyBytes_FromStringAndSize(NULL, size);
        if (*obj == NULL) {
            return -1;
        }
        *at = PyBytes_AS_STRING(*obj);
        return 0;
    }
    *obj = PyObject_CallFunction(allocate, "n", size);
    if (*obj == NULL) {
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(*obj, &view, PyBUF_WRITABLE) < 0) {
        Py_CLEAR(*obj);
        return -1;
    }
    *at = view.buf; /* the object owns the memory: it stays while *obj lives */
    Py_ssize_t got = view.len;
    PyBuffer_Release(&view);
    if (got < size) {
        PyErr_Format(PyExc_ValueError, "allocate(%zd) gave a buffer of %zd bytes", size, got);
        Py_CLEAR(*obj);
        return -1;
    }
    return 0;
}

static inline void
put_offset(char *offsets, Py_ssize_t i, int width, Py_ssize_t at)
{
    if (width == 4) {
        int32_t v = (int32_t)at;
        memcpy(offsets + 4 * i, &v, 4);
    }
    else {
        int64_t v = (int64_t)at;
        memcpy(offsets + 8 * i, &v, 8);
    }
}

/* finish(apart, allocate=None) -> (count, wide, key_offsets, key_data, value_offsets,
 * value_data, found): see columns.py's Columns. ``apart``: a tuple of keys set aside rather
 * than put in the columns; ``found`` maps each of them that has an entry to its value (None: a
 * tombstone). The four buffers are bytes, or what ``allocate(size)`` gives. Leaves the table
 * as it was. */
static PyObject *
finish(LatestColumns *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "finish(apart, allocate=None) takes 1 or 2 arguments");
        return NULL;
    }
    PyObject *apart = args[0], *allocate = nargs == 2 ? args[1] : Py_None;
    if (check_ready(self) < 0) {
        return NULL;
    }
    if (!PyTuple_CheckExact(apart)) {
        PyErr_SetString(PyExc_TypeError, "finish(): apart must be a tuple of bytes");
        return NULL;
    }
    PyObject *found = PyDict_New();
    if (found == NULL) {
        return NULL;
    }
    Py_ssize_t napart = PyTuple_GET_SIZE(apart);
    Py_ssize_t *skip = PyMem_Calloc(napart ? (size_t)napart : 1, sizeof(Py_ssize_t));
    PyObject *result = NULL, *key_offsets = NULL, *key_data = NULL;
    PyObject *value_offsets = NULL, *value_data = NULL;
    if (skip == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < napart; i++) {
        PyObject *name = PyTuple_GET_ITEM(apart, i);
        skip[i] = -1;
        if (!PyBytes_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "finish(): apart must be a tuple of bytes");
            goto out;
        }
        Py_ssize_t at = find(self, (const unsigned char *)PyBytes_AS_STRING(name),
                             PyBytes_GET_SIZE(name));
        if (at < 0) {
            continue;
        }
        skip[i] = at;
        const entry *e = &self->entries[at];
        PyObject *value = bytes_or_none(e->value, e->value_size);
        if (value == NULL || PyDict_SetItem(found, name, value) < 0) {
            Py_XDECREF(value);
            goto out;
        }
        Py_DECREF(value);
    }
    Py_ssize_t n = 0, keys_total = 0, values_total = 0;
    for (Py_ssize_t j = 0; j < self->used; j++) {
        const entry *e = &self->entries[j];
        int set_aside = 0;
        for (Py_ssize_t i = 0; i < napart; i++) {
            set_aside |= skip[i] == j;
        }
        if (e->value == NULL || set_aside) {
            continue;
        }
        n++;
        keys_total += e->key_size;
        values_total += e->value_size;
    }
    int wide = keys_total > INT32_MAX || values_total > INT32_MAX;
    int width = wide ? 8 : 4;
    char *ko, *kd, *vo, *vd;
    if (new_buffer(allocate, (n + 1) * width, &key_offsets, &ko) < 0 ||
        new_buffer(allocate, keys_total, &key_data, &kd) < 0 ||
        new_buffer(allocate, (n + 1) * width, &value_offsets, &vo) < 0 ||
        new_buffer(allocate, values_total, &value_data, &vd) < 0) {
        goto out;
    }
    Py_ssize_t row = 0, ka = 0, va = 0;
    for (Py_ssize_t j = 0; j < self->used; j++) {
        const entry *e = &self->entries[j];
        int set_aside = 0;
        for (Py_ssize_t i = 0; i < napart; i++) {
            set_aside |= skip[i] == j;
        }
        if (e->value == NULL || set_aside) {
            continue;
        }
        put_offset(ko, row, width, ka);
        put_offset(vo, row, width, va);
        memcpy(kd + ka, e->key, (size_t)e->key_size);
        memcpy(vd + va, e->value, (size_t)e->value_size);
        ka += e->key_size;
        va += e->value_size;
        row++;
    }
    put_offset(ko, n, width, ka);
    put_offset(vo, n, width, va);
    result = Py_BuildValue("(nOOOOOO)", n, wide ? Py_True : Py_False, key_offsets, key_data,
                           value_offsets, value_data, found);
out:
    PyMem_Free(skip);
    Py_XDECREF(key_offsets);
    Py_XDECREF(key_data);
    Py_XDECREF(value_offsets);
    Py_XDECREF(value_data);
    Py_DECREF(found);
    return result;
}

/* len(): how many keys have an entry (tombstones and keys set apart too). */
static Py_ssize_t
length(LatestColumns *self)
{
    return self->used;
}

static PyMethodDef methods[] = {
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL,
     PyDoc_STR("add(body, first, limit): a batch body's rows, as latest_into takes them; "
               "(taken, last, done).")},
    {"put", (PyCFunction)(void (*)(void))put, METH_FASTCALL,
     PyDoc_STR("put(key, value): one key's value (None: a tombstone).")},
    {"finish", (PyCFunction)(void (*)(void))finish, METH_FASTCALL,
     PyDoc_STR("finish(apart, allocate=None): the columns (see kafkakv.log.columns.Columns).")},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods as_sequence = {.sq_length = (lenfunc)length};

static PyTypeObject latest_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkakv.log.embedded._columns.LatestColumns",
    .tp_basicsize = sizeof(LatestColumns),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("LatestColumns(seed=0): the last value per key of the rows added, "
                        "as Arrow-shaped columns."),
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = methods,
    .tp_as_sequence = &as_sequence,
};

/* -- packed: a list of values as one column ------------------------------------------ */

/* packed(values, allocate=None, narrow=INT32_MAX) -> (length, wide, offsets, data, valid,
 * nulls): the values (a list of bytes or None) as the buffers of one Arrow binary column, in
 * two passes: their sizes, then their bytes copied into buffers of the exact size. ``wide``
 * (64-bit offsets) when the data is over ``narrow`` bytes; ``valid`` is None when no value is
 * None, else a bitmap (bit i of byte i / 8 set for a value, least significant first). The
 * buffers are bytes, or what ``allocate(size)`` gives. Raises TypeError naming the first row
 * that is neither bytes nor None. */
static PyObject *
packed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError,
                        "packed(values, allocate=None, narrow=INT32_MAX) takes 1 to 3 arguments");
        return NULL;
    }
    PyObject *values = args[0], *allocate = nargs >= 2 ? args[1] : Py_None;
    Py_ssize_t narrow = INT32_MAX;
    if (nargs == 3 && (narrow = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "packed(): values must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values), total = 0, nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        if (value == Py_None) {
            nulls++;
        }
        else if (PyBytes_CheckExact(value)) {
            total += PyBytes_GET_SIZE(value);
        }
        else {
            PyErr_Format(PyExc_TypeError, "packed(): row %zd is %.100s, not bytes or None", i,
                         Py_TYPE(value)->tp_name);
            return NULL;
        }
    }
    int wide = total > narrow;
    int width = wide ? 8 : 4;
    PyObject *offsets = NULL, *data = NULL, *valid = NULL, *result = NULL;
    char *o, *d, *v = NULL;
    if (new_buffer(allocate, (n + 1) * width, &offsets, &o) < 0 ||
        new_buffer(allocate, total, &data, &d) < 0 ||
        (nulls && new_buffer(allocate, (n + 7) / 8, &valid, &v) < 0)) {
        goto out;
    }
    /* allocate() ran Python code, which may have changed the list: every row is checked
     * again, and nothing is written past the sizes of the first pass. */
    Py_ssize_t at = 0;
    if (v != NULL) {
        memset(v, 0, (size_t)((n + 7) / 8));
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_GET_SIZE(values) != n) {
            PyErr_SetString(PyExc_RuntimeError, "packed(): the list changed while packed");
            goto out;
        }
        PyObject *value = PyList_GET_ITEM(values, i);
        put_offset(o, i, width, at);
        if (value == Py_None ? v == NULL
                             : !PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) > total - at) {
            PyErr_SetString(PyExc_RuntimeError, "packed(): the list changed while packed");
            goto out;
        }
        if (value != Py_None) {
            Py_ssize_t size = PyBytes_GET_SIZE(value);
            memcpy(d + at, PyBytes_AS_STRING(value), (size_t)size);
            at += size;
            if (v != NULL) {
                v[i >> 3] |= (char)(1u << (i & 7));
            }
        }
    }
    if (at != total) {
        PyErr_SetString(PyExc_RuntimeError, "packed(): the list changed while packed");
        goto out;
    }
    put_offset(o, n, width, at);
    result = Py_BuildValue("(nOOOOn)", n, wide ? Py_True : Py_False, offsets, data,
                           valid != NULL ? valid : Py_None, nulls);
out:
    Py_XDECREF(offsets);
    Py_XDECREF(data);
    Py_XDECREF(valid);
    return result;
}

static PyMethodDef module_methods[] = {
    {"packed", (PyCFunction)(void (*)(void))packed, METH_FASTCALL,
     PyDoc_STR("packed(values, allocate=None, narrow=INT32_MAX): a list of bytes or None as "
               "one binary column; (length, wide, offsets, data, valid, nulls).")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef columns_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.log.embedded._columns",
    .m_doc = PyDoc_STR("The last value per key of stored batches, as columns, and a list of "
                       "values as one column (see kafkakv.log.embedded.columns)."),
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    if (PyType_Ready(&latest_type) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&columns_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[ss]", "LatestColumns", "packed");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "LatestColumns", (PyObject *)&latest_type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
