/* kafkakv.map._reads: the short read paths of a replica map in C.
 *
 * The same behaviour as PyLocalReads, PyReadGate and PyEndWatch in reads.py (see its module
 * doc for the local and the direct path), which tests/map/test_local_reads.py checks read by
 * read. On the local path a read calls no Python code when the key is an exact str and its
 * codec is str's (fast_encode is str.encode) and the values are kept as they are: one dict
 * lookup, with the key's bytes in a reused probe when it is ASCII (see filled_probe), else
 * with its UTF-8 encoding. The direct path calls the store's lookup, and for a
 * linearizable map engine.catch_up first, unless its EndWatches (one per partition) find the
 * replica at the log's end (a compare of each head's bytes and of one int, no Python call).
 * Every other read goes to the map's _checked_getitem, _checked_get or _checked_contains.
 *
 * A Python class that puts LocalReads first among its bases gets these as its
 * mp_subscript, sq_contains and get: no Python frame of its own per read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* -- ReadGate --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    char open;
} ReadGate;

static PyObject *
gate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "ReadGate() takes no arguments");
        return NULL;
    }
    ReadGate *self = (ReadGate *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->open = 1;
    }
    return (PyObject *)self;
}

static PyMemberDef gate_members[] = {
    {"open", T_BOOL, offsetof(ReadGate, open), 0,
     "True while a local read may skip every check."},
    {NULL},
};

static PyTypeObject ReadGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkakv.map._reads.ReadGate",
    .tp_doc = PyDoc_STR("Whether a local read may skip every check (see reads.PyReadGate)."),
    .tp_basicsize = sizeof(ReadGate),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = gate_new,
    .tp_members = gate_members,
};

/* -- EndWatch --------------------------------------------------------------------------- */

/* Whether a linearizable map's replica is at the log's end, without a Python call: the end
 * offset noted last (with the head bytes that showed it), still what the shared mapping
 * holds, and applied. See reads.PyEndWatch. */
typedef struct {
    PyObject_HEAD
    PyObject *machine; /* the partition's machine: its `applied` */
    PyObject *mapping; /* the head's mapping (a buffer); NULL: nothing noted */
    PyObject *raw;     /* bytes: the mapping's first bytes when end was read */
    long long end;
} EndWatch;

static PyObject *name_applied; /* "applied" */

static PyObject *
watch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *machine;
    static char *kwlist[] = {"machine", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:EndWatch", kwlist, &machine)) {
        return NULL;
    }
    EndWatch *self = (EndWatch *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->machine = Py_NewRef(machine);
    }
    return (PyObject *)self;
}

/* 1 when the mapping still holds the noted bytes and the machine has applied up to the noted
 * end; 0 otherwise, or when anything fails (a closed mapping, ...): the caller then catches
 * up the long way, which reports what is wrong. Runs no Python code. */
static int
watch_at_end(EndWatch *self)
{
    PyObject *raw = self->raw;
    if (self->mapping == NULL || self->machine == NULL || raw == NULL || !PyBytes_CheckExact(raw)) {
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(self->mapping, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    int same = view.len >= n && memcmp(view.buf, PyBytes_AS_STRING(raw), (size_t)n) == 0;
    PyBuffer_Release(&view);
    if (!same) {
        return 0;
    }
    PyObject *applied = PyObject_GetAttr(self->machine, name_applied);
    if (applied == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (!PyLong_Check(applied)) {
        Py_DECREF(applied);
        return 0;
    }
    int overflow = 0;
    long long at = PyLong_AsLongLongAndOverflow(applied, &overflow);
    Py_DECREF(applied);
    if (at == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return overflow > 0 || (overflow == 0 && at >= self->end);
}

static PyObject *
watch_note(EndWatch *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "note() takes 3 arguments (end, mapping, raw), %zd given",
                     nargs);
        return NULL;
    }
    long long end = PyLong_AsLongLong(args[0]);
    if (end == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyBytes_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "note(): raw must be bytes");
        return NULL;
    }
    /* All three at once, under the GIL: a reader never sees one mark's end with another's
     * bytes. */
    PyObject *old_mapping = self->mapping, *old_raw = self->raw;
    self->mapping = Py_NewRef(args[1]);
    self->raw = Py_NewRef(args[2]);
    self->end = end;
    Py_XDECREF(old_mapping);
    Py_XDECREF(old_raw);
    Py_RETURN_NONE;
}

static PyObject *
watch_clear_mark(EndWatch *self, PyObject *unused)
{
    Py_CLEAR(self->mapping);
    Py_CLEAR(self->raw);
    Py_RETURN_NONE;
}

static PyObject *
watch_at_end_method(EndWatch *self, PyObject *unused)
{
    return PyBool_FromLong(watch_at_end(self));
}

static int
watch_traverse(EndWatch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->machine);
    Py_VISIT(self->mapping);
    Py_VISIT(self->raw);
    return 0;
}

static int
watch_clear(EndWatch *self)
{
    Py_CLEAR(self->machine);
    Py_CLEAR(self->mapping);
    Py_CLEAR(self->raw);
    return 0;
}

static void
watch_dealloc(EndWatch *self)
{
    PyObject_GC_UnTrack(self);
    watch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef watch_methods[] = {
    {"note", (PyCFunction)(void (*)(void))watch_note, METH_FASTCALL,
     PyDoc_STR("note($self, end, mapping, raw, /)\n--\n\n"
               "Note a log end read from raw, the first bytes of mapping.")},
    {"clear", (PyCFunction)watch_clear_mark, METH_NOARGS,
     PyDoc_STR("clear($self, /)\n--\n\nForget the noted end.")},
    {"at_end", (PyCFunction)watch_at_end_method, METH_NOARGS,
     PyDoc_STR("at_end($self, /)\n--\n\n"
               "True when the mapping still holds the noted bytes and the machine has "
               "applied up to the noted end.")},
    {NULL},
};

static PyTypeObject EndWatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkakv.map._reads.EndWatch",
    .tp_doc = PyDoc_STR("Whether a replica is at the log's end (see reads.PyEndWatch)."),
    .tp_basicsize = sizeof(EndWatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = watch_new,
    .tp_traverse = (traverseproc)watch_traverse,
    .tp_clear = (inquiry)watch_clear,
    .tp_dealloc = (destructor)watch_dealloc,
    .tp_methods = watch_methods,
};

/* -- LocalReads ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *table;     /* the local path: the store's dict (or any mapping); NULL/None: none */
    PyObject *lookup;    /* the direct path: the store's lookup; NULL/None: none */
    PyObject *catch_up;  /* the direct path of a linearizable map: engine.catch_up */
    PyObject *end_watches; /* EndWatches (a tuple): no catch_up while all are at the end */
    PyObject *prefix;    /* the map's record-key prefix (bytes) */
    PyObject *gate;      /* a ReadGate; anything else closes both paths */
    PyObject *key_bytes; /* the key codec's encode */
    PyObject *decode;    /* the value codec's decode; NULL or None: values as stored */
    PyObject *probe;     /* a bytes object of PROBE_ROOM bytes refilled per read; NULL: none */
    char probe_busy;     /* a lookup through the probe is under way (a key's __eq__ reads) */
} LocalReads;

static PyObject *str_encode;        /* str.encode, the str codec's fast_encode */
static PyObject *name_getitem;      /* "_checked_getitem" */
static PyObject *name_get;          /* "_checked_get" */
static PyObject *name_contains;     /* "_checked_contains" */
static PyObject *name_default;      /* "default" */
static PyObject *name_key;          /* "key" */
static PyObject *name_dot_get;      /* "get" */

#define IS_SET(field) ((field) != NULL && (field) != Py_None)

/* The probe: the local path looks an ASCII str key up in the store's dict of bytes without
 * making a bytes object per read. A str that is all ASCII holds its UTF-8 bytes as they are,
 * and its hash (cached in the str) is the hash of those bytes, as CPython hashes both with
 * _Py_HashBytes (probe_hash_agrees checks that at import). So the key's bytes and hash are
 * copied into one bytes object the LocalReads owns, and the dict is asked with it: no
 * allocation, no free and no hashing per read. A bytes object is immutable only to those who
 * hold it. The probe is refilled only while the LocalReads holds the one reference to it: a
 * lookup that compares the probe with a stored key of a type whose __eq__ runs Python code
 * could keep it or read through this map again; a read during a lookup (probe_busy) makes
 * its own bytes, and a probe someone kept is let go (a new one is made for the next read). */
#define PROBE_ROOM 128
static int probe_hash_agrees;

/* A new reference to self's probe holding key's bytes, or NULL (no error set) when key is
 * not an exact ASCII str of at most PROBE_ROOM characters or the probe is in use. */
static PyObject *
filled_probe(LocalReads *self, PyObject *key)
{
    if (!probe_hash_agrees || self->probe_busy || !PyUnicode_CheckExact(key)
        || !PyUnicode_IS_COMPACT_ASCII(key) || PyUnicode_GET_LENGTH(key) > PROBE_ROOM) {
        return NULL;
    }
    Py_hash_t hash = PyObject_Hash(key); /* a str's hash cannot fail */
    if (self->probe == NULL) {
        self->probe = PyBytes_FromStringAndSize(NULL, PROBE_ROOM);
        if (self->probe == NULL) {
            PyErr_Clear(); /* make this read's own bytes */
            return NULL;
        }
    }
    Py_ssize_t size = PyUnicode_GET_LENGTH(key);
    PyBytesObject *probe = (PyBytesObject *)self->probe;
    memcpy(probe->ob_sval, PyUnicode_DATA(key), (size_t)size);
    probe->ob_sval[size] = '\0';
    Py_SET_SIZE(probe, size);
    _Py_COMP_DIAG_PUSH
    _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    probe->ob_shash = hash; /* the cached hash of the bytes it now holds */
    _Py_COMP_DIAG_POP
    self->probe_busy = 1;
    return Py_NewRef(self->probe);
}

/* The end of a lookup through the probe (a reference to it, which this releases). */
static void
release_probe(LocalReads *self, PyObject *probe)
{
    self->probe_busy = 0;
    if (probe == self->probe && Py_REFCNT(probe) > 2) { /* kept by someone: theirs now */
        Py_CLEAR(self->probe);
    }
    Py_DECREF(probe);
}

/* Encode key with the map's key codec into *out (a new reference): 1 when it did, 0 when the
 * codec refused it (an Exception, cleared: the checked path raises the typed error), -1 on
 * any other error (KeyboardInterrupt, ...), which propagates. */
static int
encode_key(LocalReads *self, PyObject *key, PyObject **out)
{
    PyObject *encode = self->key_bytes;
    PyObject *encoded;
    if (encode == str_encode && PyUnicode_CheckExact(key)) {
        encoded = PyUnicode_AsUTF8String(key);
    }
    else if (encode == NULL) {
        return 0;
    }
    else {
        Py_INCREF(encode);
        encoded = PyObject_CallOneArg(encode, key);
        Py_DECREF(encode);
    }
    if (encoded == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    *out = encoded;
    return 1;
}

typedef enum { OP_ITEM, OP_GET, OP_CONTAINS } Op;
enum { ERROR = -1, ABSENT = 0, FOUND = 1, CHECKED = 2 };

/* 1 when watches is a non-empty tuple of EndWatch and every one is at the end (then no
 * partition of the map has had anything appended since the replica caught up with it); 0
 * otherwise. Runs no Python code. */
static int
all_at_end(PyObject *watches)
{
    if (watches == NULL || !PyTuple_CheckExact(watches) || PyTuple_GET_SIZE(watches) == 0) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(watches); i++) {
        PyObject *watch = PyTuple_GET_ITEM(watches, i);
        if (!Py_IS_TYPE(watch, &EndWatchType) || !watch_at_end((EndWatch *)watch)) {
            return 0;
        }
    }
    return 1;
}

/* The direct path's lookup: catch up first for a linearizable map (unless its end watches say
 * the replica is at the log's end), then lookup(encoded). */
static PyObject *
direct_lookup(PyObject *lookup, PyObject *catch_up, PyObject *end_watches, PyObject *prefix,
              PyObject *encoded)
{
    if (catch_up != NULL && !all_at_end(end_watches)) {
        PyObject *record_key;
        if (prefix == NULL
            || (PyBytes_CheckExact(encoded) && PyBytes_CheckExact(prefix)
                && PyBytes_GET_SIZE(prefix) == 0)) {
            Py_INCREF(encoded); /* no prefix (not set): the key alone */
            record_key = encoded;
        }
        else {
            record_key = PyNumber_Add(prefix, encoded);
            if (record_key == NULL) {
                return NULL;
            }
        }
        PyObject *done = PyObject_CallOneArg(catch_up, record_key);
        Py_DECREF(record_key);
        if (done == NULL) {
            return NULL;
        }
        Py_DECREF(done);
    }
    return PyObject_CallOneArg(lookup, encoded);
}

/* Look key up on the local or the direct path, as op does (table[k], table.get(k), k in
 * table; lookup(k) on the direct path). FOUND with *data (a new reference; Py_True for
 * OP_CONTAINS), ABSENT, CHECKED when the read must take the checked path, ERROR. */
static int
find(LocalReads *self, PyObject *key, Op op, PyObject **data)
{
    PyObject *gate = self->gate;
    if (gate == NULL || !Py_IS_TYPE(gate, &ReadGateType) || !((ReadGate *)gate)->open) {
        return CHECKED;
    }
    /* Strong references: the key codec may run Python code, which may change the fields. */
    PyObject *table = IS_SET(self->table) ? Py_NewRef(self->table) : NULL;
    PyObject *lookup = NULL, *catch_up = NULL, *end_watches = NULL, *prefix = NULL;
    if (table == NULL) {
        if (!IS_SET(self->lookup)) {
            return CHECKED;
        }
        lookup = Py_NewRef(self->lookup);
        catch_up = IS_SET(self->catch_up) ? Py_NewRef(self->catch_up) : NULL;
        end_watches = IS_SET(self->end_watches) ? Py_NewRef(self->end_watches) : NULL;
        prefix = self->prefix != NULL ? Py_NewRef(self->prefix) : NULL; /* NULL: b"" */
    }
    PyObject *encoded = NULL, *probe = NULL;
    int result;
    if (table != NULL && PyDict_CheckExact(table) && self->key_bytes == str_encode
        && (probe = filled_probe(self, key)) != NULL) {
        encoded = Py_NewRef(probe);
        result = 1;
    }
    else {
        result = encode_key(self, key, &encoded);
    }
    if (result <= 0) {
        result = result < 0 ? ERROR : CHECKED;
    }
    else if (table != NULL) {
        PyObject *found;
        if (op == OP_CONTAINS) {
            int in = PyDict_CheckExact(table) ? PyDict_Contains(table, encoded)
                                              : PySequence_Contains(table, encoded);
            found = in < 0 ? NULL : Py_NewRef(in ? Py_True : Py_None);
        }
        else if (PyDict_CheckExact(table)) {
            found = PyDict_GetItemWithError(table, encoded);
            Py_XINCREF(found);
            if (found == NULL && !PyErr_Occurred()) {
                found = Py_NewRef(Py_None);
            }
            else if (op == OP_ITEM && found == Py_None) { /* a None stored: table[k] is it */
                *data = found;
                result = FOUND;
                goto done;
            }
        }
        else if (op == OP_ITEM) {
            found = PyObject_GetItem(table, encoded);
            if (found == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) {
                PyErr_Clear();
                found = Py_NewRef(Py_None);
            }
            else if (found == Py_None) {
                *data = found;
                result = FOUND;
                goto done;
            }
        }
        else {
            found = PyObject_CallMethodOneArg(table, name_dot_get, encoded);
        }
        if (found == NULL) {
            result = ERROR;
        }
        else if (found == Py_None) {
            Py_DECREF(found);
            result = ABSENT;
        }
        else {
            *data = found;
            result = FOUND;
        }
    }
    else {
        PyObject *found = direct_lookup(lookup, catch_up, end_watches, prefix, encoded);
        if (found == NULL) {
            result = ERROR;
        }
        else if (found == Py_None) {
            Py_DECREF(found);
            result = ABSENT;
        }
        else if (op == OP_CONTAINS) {
            Py_DECREF(found);
            *data = Py_NewRef(Py_True);
            result = FOUND;
        }
        else {
            *data = found;
            result = FOUND;
        }
    }
done:
    Py_XDECREF(encoded);
    if (probe != NULL) {
        release_probe(self, probe);
    }
    Py_XDECREF(table);
    Py_XDECREF(lookup);
    Py_XDECREF(catch_up);
    Py_XDECREF(end_watches);
    Py_XDECREF(prefix);
    return result;
}

/* The stored data as the map's value: a new reference; steals data. */
static PyObject *
decoded(LocalReads *self, PyObject *data)
{
    PyObject *decode = self->decode;
    if (!IS_SET(decode)) {
        return data;
    }
    Py_INCREF(decode);
    PyObject *value = PyObject_CallOneArg(decode, data);
    Py_DECREF(decode);
    Py_DECREF(data);
    return value;
}

static void
raise_key_error(PyObject *key)
{
    /* As `raise KeyError(key) from None`: the key is the one argument, even a tuple. */
    PyObject *exc = PyObject_CallOneArg(PyExc_KeyError, key);
    if (exc != NULL) {
        PyException_SetCause(exc, NULL); /* sets __suppress_context__ */
        PyErr_SetObject(PyExc_KeyError, exc);
        Py_DECREF(exc);
    }
}

static PyObject *
reads_subscript(LocalReads *self, PyObject *key)
{
    PyObject *data = NULL;
    switch (find(self, key, OP_ITEM, &data)) {
    case FOUND:
        return decoded(self, data);
    case ABSENT:
        raise_key_error(key);
        return NULL;
    case ERROR:
        return NULL;
    default:
        return PyObject_CallMethodOneArg((PyObject *)self, name_getitem, key);
    }
}

static int
reads_contains(LocalReads *self, PyObject *key)
{
    PyObject *data = NULL;
    switch (find(self, key, OP_CONTAINS, &data)) {
    case FOUND:
        Py_DECREF(data);
        return 1;
    case ABSENT:
        return 0;
    case ERROR:
        return -1;
    default: {
        PyObject *result = PyObject_CallMethodOneArg((PyObject *)self, name_contains, key);
        if (result == NULL) {
            return -1;
        }
        int truth = PyObject_IsTrue(result);
        Py_DECREF(result);
        return truth;
    }
    }
}

/* get(key, default=None), as the Python method's signature. */
static PyObject *
reads_get(LocalReads *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *key = NULL;
    PyObject *dflt = NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "get() takes from 1 to 2 positional arguments but %zd "
                     "were given", nargs);
        return NULL;
    }
    if (nargs > 0) {
        key = args[0];
    }
    if (nargs > 1) {
        dflt = args[1];
    }
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            PyObject *value = args[nargs + i];
            int is_key = PyUnicode_Compare(name, name_key) == 0;
            int is_default = !is_key && PyUnicode_Compare(name, name_default) == 0;
            if (is_key && key == NULL) {
                key = value;
            }
            else if (is_default && dflt == NULL) {
                dflt = value;
            }
            else {
                PyErr_Format(PyExc_TypeError, "get() got %s argument '%U'",
                             is_key || is_default ? "multiple values for"
                                                  : "an unexpected keyword",
                             name);
                return NULL;
            }
        }
    }
    if (key == NULL) {
        PyErr_SetString(PyExc_TypeError, "get() missing 1 required positional argument: 'key'");
        return NULL;
    }
    if (dflt == NULL) {
        dflt = Py_None;
    }
    PyObject *data = NULL;
    switch (find(self, key, OP_GET, &data)) {
    case FOUND:
        return decoded(self, data);
    case ABSENT:
        return Py_NewRef(dflt);
    case ERROR:
        return NULL;
    default: {
        PyObject *call[3] = {(PyObject *)self, key, dflt};
        return PyObject_VectorcallMethod(name_get, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         NULL);
    }
    }
}

static int
reads_traverse(LocalReads *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->lookup);
    Py_VISIT(self->catch_up);
    Py_VISIT(self->end_watches);
    Py_VISIT(self->prefix);
    Py_VISIT(self->gate);
    Py_VISIT(self->key_bytes);
    Py_VISIT(self->decode);
    return 0;
}

static int
reads_clear(LocalReads *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->lookup);
    Py_CLEAR(self->catch_up);
    Py_CLEAR(self->end_watches);
    Py_CLEAR(self->prefix);
    Py_CLEAR(self->gate);
    Py_CLEAR(self->key_bytes);
    Py_CLEAR(self->decode);
    Py_CLEAR(self->probe);
    return 0;
}

static void
reads_dealloc(LocalReads *self)
{
    PyObject_GC_UnTrack(self);
    reads_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef reads_members[] = {
    {"_table", T_OBJECT, offsetof(LocalReads, table), 0, "The store's dict, or None."},
    {"_lookup", T_OBJECT, offsetof(LocalReads, lookup), 0, "The store's lookup, or None."},
    {"_catch_up", T_OBJECT, offsetof(LocalReads, catch_up), 0, "engine.catch_up, or None."},
    {"_end_watches", T_OBJECT, offsetof(LocalReads, end_watches), 0,
     "A tuple of EndWatch (one per partition), or None."},
    {"_prefix", T_OBJECT, offsetof(LocalReads, prefix), 0, "The record-key prefix."},
    {"_gate", T_OBJECT, offsetof(LocalReads, gate), 0, "The engine's ReadGate."},
    {"_key_bytes", T_OBJECT, offsetof(LocalReads, key_bytes), 0, "The key codec's encode."},
    {"_decode", T_OBJECT, offsetof(LocalReads, decode), 0, "The value codec's decode, or None."},
    {NULL},
};

static PyMethodDef reads_methods[] = {
    {"get", (PyCFunction)(void (*)(void))reads_get, METH_FASTCALL | METH_KEYWORDS,
     PyDoc_STR("get($self, key, default=None, /)\n--\n\n"
               "The value of key or default. A local lookup: O(1), no I/O.")},
    {NULL},
};

static PyMappingMethods reads_as_mapping = {
    .mp_subscript = (binaryfunc)reads_subscript,
};

static PySequenceMethods reads_as_sequence = {
    .sq_contains = (objobjproc)reads_contains,
};

static PyTypeObject LocalReadsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kafkakv.map._reads.LocalReads",
    .tp_doc = PyDoc_STR("m[k], m.get(k) and k in m of a replica map (see reads.PyLocalReads)."),
    .tp_basicsize = sizeof(LocalReads),
    /* Py_TPFLAGS_MAPPING: a subclass takes its flags from this, its solid base, so it is
     * what makes a map match mapping patterns in `match`. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC
                | Py_TPFLAGS_MAPPING,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)reads_traverse,
    .tp_clear = (inquiry)reads_clear,
    .tp_dealloc = (destructor)reads_dealloc,
    .tp_members = reads_members,
    .tp_methods = reads_methods,
    .tp_as_mapping = &reads_as_mapping,
    .tp_as_sequence = &reads_as_sequence,
};

/* -- module ----------------------------------------------------------------------------- */

static struct PyModuleDef reads_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kafkakv.map._reads",
    .m_doc = PyDoc_STR("The local read path of a replica map in C (see kafkakv.map.reads)."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__reads(void)
{
    if (PyType_Ready(&ReadGateType) < 0 || PyType_Ready(&EndWatchType) < 0
        || PyType_Ready(&LocalReadsType) < 0) {
        return NULL;
    }
    str_encode = PyDict_GetItemString(PyUnicode_Type.tp_dict, "encode");
    if (str_encode == NULL) {
        PyErr_SetString(PyExc_ImportError, "str.encode not found");
        return NULL;
    }
    Py_INCREF(str_encode);
    /* The probe relies on an ASCII str hashing as its bytes do (see filled_probe). */
    PyObject *as_str = PyUnicode_FromString("kafkakv-probe");
    PyObject *as_bytes = PyBytes_FromString("kafkakv-probe");
    if (as_str == NULL || as_bytes == NULL) {
        Py_XDECREF(as_str);
        Py_XDECREF(as_bytes);
        return NULL;
    }
    probe_hash_agrees = PyObject_Hash(as_str) == PyObject_Hash(as_bytes);
    Py_DECREF(as_str);
    Py_DECREF(as_bytes);
    name_getitem = PyUnicode_InternFromString("_checked_getitem");
    name_get = PyUnicode_InternFromString("_checked_get");
    name_contains = PyUnicode_InternFromString("_checked_contains");
    name_default = PyUnicode_InternFromString("default");
    name_key = PyUnicode_InternFromString("key");
    name_dot_get = PyUnicode_InternFromString("get");
    name_applied = PyUnicode_InternFromString("applied");
    if (!name_getitem || !name_get || !name_contains || !name_default || !name_key
        || !name_dot_get || !name_applied) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&reads_module);
    if (module == NULL) {
        return NULL;
    }
    PyObject *all = Py_BuildValue("[sss]", "EndWatch", "LocalReads", "ReadGate");
    if (all == NULL || PyModule_AddObject(module, "__all__", all) < 0) {
        Py_XDECREF(all);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "ReadGate", (PyObject *)&ReadGateType) < 0
        || PyModule_AddObjectRef(module, "EndWatch", (PyObject *)&EndWatchType) < 0
        || PyModule_AddObjectRef(module, "LocalReads", (PyObject *)&LocalReadsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
